"""Logging: structlog, one event per line; JSON in production, readable on a terminal; no secret ever printed."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["configure_logging", "get_logger", "redact"]

_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@]+@", re.IGNORECASE)
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def redact(text: str) -> str:
    """Any `scheme://user:password@` in `text` with the password replaced by `***`."""
    return _URL_PASSWORD.sub(r"\g<head>***@", text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # The last line of defence: settings only ever hand out redacted URLs, but an exception text could carry one.
    for key, value in event.items():
        if isinstance(value, str) and "://" in value:
            event[key] = redact(value)
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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    """A logger with `context` bound to every line it writes."""
    return structlog.get_logger().bind(**context)
