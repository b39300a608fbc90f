"""Logging: structlog, one event per line; JSON in production, readable on a terminal; no secret ever printed."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["configure_logging", "error_message", "get_logger", "hide_secrets", "printable", "redact"]

# scheme://user:password@ (the password up to the last '@' of the word, so an unencoded '@' in it is covered too),
# and scheme://password@ (a user-info part without ':')
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s:/@?#]*:)\S*@", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://)[^\s:/@?#]+@(?=\S)", re.IGNORECASE)
# ?password=..., &ssl_password=..., and the like in a query
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?:[a-z0-9_]*(?:password|passwd|secret|token))=)[^&\s#'\"]*", re.IGNORECASE)
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

_MIN_HIDDEN = 4
"""Shorter secrets are not searched for in free text: hiding every `abc` of a log would make it unreadable."""
_hidden: set[str] = set()


def hide_secrets(*secrets: str) -> None:
    """Hide these values wherever they turn up in a log line or a message of this process, in any form."""
    _hidden.update(secret for secret in secrets if len(secret) >= _MIN_HIDDEN)


def redact(text: str) -> str:
    """`text` without secrets: URL passwords and secret query values as `***`, and every value `hide_secrets` named."""
    for secret in sorted(_hidden, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\g<head>***@", text)
        text = _URL_USERINFO.sub(r"\g<head>***@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(r"\g<head>***", text)
    return text


# redis-py's Sentinel errors quote the repr of the client they asked, every option of its connection (some 1,500
# characters: "No master found for 'incidents' : <redis.client.Redis(<redis.connection.ConnectionPool(...)>)>)> -
# network:ConnectionError: ..."); what a person needs is around it
_CLIENT_REPR = re.compile(r"\s*:?\s*<redis\.[\w.]+\(.*\)>(?=\s+-\s|$)")


def error_message(error: BaseException, *, with_type: bool = True) -> str:
    """An exception as `Type: message` (or the message alone) for a person: without secrets, nor the repr of a
    redis-py client."""
    text = _CLIENT_REPR.sub("", str(error))
    return redact(f"{type(error).__name__}: {text}" if with_type else text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # The last line of defence: settings only ever hand out redacted URLs, but an exception text could carry one.
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
        elif value is not None and not isinstance(value, (int, float, bool)):
            shown = str(value)
            if redact(shown) != shown:
                event[key] = redact(shown)
    return event


def printable(text: str, keep: str = "") -> str:
    """`text` with every character a terminal would act on rather than show (control characters such as ESC or
    newline, invisible format characters such as a right-to-left override, surrogate escapes of bytes that were not
    UTF-8) as its Python escape (`\\x1b`, `\\u202e`, `\\udcff`); the characters of `keep` stay as they are."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() or char in keep else char.encode("unicode_escape").decode("ascii") for char in text
    )


def _printable_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # The console renderer writes a value without spaces as it is: an incident ID or a text from a producer must not
    # drive the terminal that shows the log (clear it, set its title, make a line read as another).
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value, keep="\n" if key == "exception" else "")  # a traceback keeps its lines
    return event


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for the process: `fmt` is json, console or auto (console on a terminal)."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redact_processor,
            *([] if fmt == "json" else [_printable_processor]),  # JSON escapes control characters itself
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    """A logger with `context` bound to every line it writes."""
    return structlog.get_logger().bind(**context)
