"""What every subcommand shares: exit codes, the errors that end a command, settings as flags, parser helpers,
the Redis client of a command, and the wrapper that turns Redis and layout errors into a message and an exit code.

Light on purpose: `check` (the liveness probe) imports this and nothing of the index, the metrics or the benchmark.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import socket
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args, get_origin

import redis
from pydantic import SecretStr, ValidationError
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..connection import connect, tls_port_hint
from ..errors import (
    CommandError,
    DamagedMetaError,
    FingerprintIndexError,
    FunctionsMissingError,
    KeyTypeError,
    LayoutError,
    LayoutMismatchError,
    UsageError,
)
from ..logs import error_message, redact
from ..settings import ENV_PREFIX, Settings, shown_default

__all__ = [
    "CONNECTION",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "LIFECYCLE",
    "CommandError",
    "Handler",
    "UsageError",
    "add_settings_flags",
    "command_client",
    "count_arg",
    "describe",
    "distance_arg",
    "entry_id_in_range",
    "error_text",
    "json_flag",
    "positive_arg",
    "say",
    "settings_from_args",
    "streams_of",
    "with_settings",
    "wrong_type_error",
    "wrong_type_message",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]
"""A subcommand's handler: the parsed arguments in, an exit code out (EXIT_OK, EXIT_FAILURE or EXIT_USAGE)."""

CONNECTION = ["redis_url", "cluster", "namespace"]
"""The settings every command that talks to Redis takes as flags."""

LIFECYCLE = ["retention", "changes_keep", "stream_group_max_age"]
"""The settings of the namespace's upkeep (trimming), for the commands that report or run it."""


def say(command: str, message: str) -> None:
    """One line for people on stderr, naming the command."""
    print(redact(f"incident-worker {command}: {message}"), file=sys.stderr, flush=True)


def refused_permission(settings: Settings, error: BaseException, advice: str = "") -> str:
    """A NOPERM reply for people: which user, which command (or that a key is outside its patterns), what to grant
    (or `advice`). Redis names neither the user ("this user has no permissions...") nor the key."""
    from redis.connection import parse_url

    user = parse_url(settings.redis_url.get_secret_value()).get("username") or "default"
    shown = f"Redis at {settings.safe_redis_url} refused user {user!r}"
    named = re.search(r"run the '([^']+)' command", str(error))
    if named:
        name = named.group(1).lower()
        return f"{shown} the command {name.replace('|', ' ').upper()} (no permission): " + (
            advice
            or f"grant it (ACL SETUSER {user} +{name}), as deploy/redis/users.acl does for the role that needs it, or "
            "run this with a user that has it"
        )
    tag = settings.keys.tag
    return f"{shown} a key or channel this command uses (no permission: {error_text(error)}): " + (
        advice
        or f"its keys must include {tag}:* (ACL SETUSER {user} ~{tag}:*), as deploy/redis/users.acl grants the "
        "worker's user"
    )


def error_text(error: BaseException) -> str:
    """An exception's message for a sentence of ours: secrets redacted, no full stop of its own before our `;`."""
    return error_message(error, with_type=False).rstrip(" .")


# -- settings as flags ----------------------------------------------------------------------------------------


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any] | None, list[str] | None]:
    origin = get_origin(annotation)
    if origin is Literal:
        return str, [str(choice) for choice in get_args(annotation)]
    if origin in (types.UnionType, typing.Union):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return _flag_type(inner[0])
    if annotation in (int, float, str):
        return annotation, None
    if annotation is SecretStr:
        return str, None
    return None, None


def add_settings_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """A flag for each setting (or those named in `only`); a flag given wins over the environment."""
    group = parser.add_argument_group("settings (flags override INCIDENT_WORKER_* environment variables)")
    names = [name for name in Settings.model_fields if only is None or name in only]
    # settings_from_args reads only these, so a subcommand's own flag (alerts --group) never becomes a setting
    parser.set_defaults(_setting_names=tuple(names))
    for name, info in Settings.model_fields.items():
        if name not in names:
            continue
        flag = "--" + name.replace("_", "-")
        env = ENV_PREFIX + name.upper()
        help_text = f"{info.description} [env {env}; default {shown_default(name)}]"
        if info.annotation in (bool, bool | None):  # --sentinel-tls, --no-sentinel-tls; neither: the default
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
            )
            continue
        kind, choices = _flag_type(info.annotation)
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("flag_takes_words"):
            kind = str  # a number or a word (max_matches all): the settings check both
        assert kind is not None, f"setting {name} has a type the command line cannot parse"
        group.add_argument(
            flag,
            dest=name,
            type=kind,
            choices=choices,
            default=argparse.SUPPRESS,
            help=help_text,
            metavar=None if choices else name.upper(),
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings: defaults, then the environment, then the flags given. Raises UsageError with every problem."""
    names = getattr(args, "_setting_names", ())
    overrides = {name: getattr(args, name) for name in names if hasattr(args, name)}
    unknown_environment()
    try:
        return Settings(**overrides)
    except ValidationError as error:
        # Our own messages only: pydantic's default rendering would echo input values, and a URL may hold a password.
        problems = []
        for item in error.errors(include_url=False, include_input=False):
            message = item["msg"].removeprefix("Value error, ")
            where = ".".join(str(part) for part in item["loc"])
            if not where:  # a check across settings (the layout, the stream names): its message names them
                problems.append(f"  {message}")
                continue
            problems.append(f"  {where}: {message} (flag --{where.replace('_', '-')}, env {ENV_PREFIX}{where.upper()})")
        raise UsageError("invalid settings:\n" + "\n".join(problems)) from None


def unknown_environment() -> None:
    """Refuse an INCIDENT_WORKER_* variable that is no setting (UsageError, exit 2): pydantic-settings ignores it, so
    a mistyped INCIDENT_WORKER_REDIS_UR left the worker on redis://localhost:6379/0 without a word. Named, with the
    setting meant when one is close; its value is never shown (it may be a URL with its password)."""
    import difflib

    known = [f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields]
    unknown = sorted(name for name in os.environ if name.upper().startswith(ENV_PREFIX) and name.upper() not in known)
    if not unknown:
        return
    problems = []
    fields = list(Settings.model_fields)
    for name in unknown:
        meant = difflib.get_close_matches(name.upper().removeprefix(ENV_PREFIX).lower(), fields, n=1, cutoff=0.75)
        problems.append(
            f"  {name} is not a setting" + (f"; did you mean {ENV_PREFIX}{meant[0].upper()}?" if meant else "")
        )
    raise UsageError(
        "invalid settings:\n"
        + "\n".join(problems)
        + f"\n  (incident-worker run --help lists every {ENV_PREFIX}* variable)"
    )


def setting_given(args: argparse.Namespace, name: str) -> bool:
    """Whether a setting was chosen (as a flag, or in the environment) rather than left at its default."""
    return name in vars(args) or f"{ENV_PREFIX}{name.upper()}" in os.environ


# -- the parser -----------------------------------------------------------------------------------------------


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps the description as usual; keeps the epilog's example lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def describe(parser: argparse.ArgumentParser, description: str, *, examples: str, exits: str) -> None:
    """The subcommand's --help: what it does, then examples and exit codes, kept as written."""
    parser.description = description
    parser.epilog = "examples:\n" + examples.strip("\n") + "\n\nexit codes:\n" + exits.strip("\n")
    parser.formatter_class = _HelpFormatter


def json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} for scripts instead of text for people")


def distance_arg(value: str) -> int:
    try:
        distance = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 0 to 64") from None
    if not 0 <= distance <= 64:
        raise argparse.ArgumentTypeError(f"{distance} is not a Hamming distance: use 0 to 64")
    return distance


def count_arg(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count} is negative; use 0 or more")
    return count


def entry_id_in_range(entry_id: str) -> bool:
    """Whether each part of a stream entry ID of digits (`ms` or `ms-seq`) fits the 64 bits Redis gives it."""
    return all(int(part) < 2**64 for part in entry_id.split("-"))


def positive_arg(value: str) -> int:
    count = count_arg(value)
    if count == 0:
        raise argparse.ArgumentTypeError("use 1 or more")
    return count


# -- talking to Redis -----------------------------------------------------------------------------------------


def command_client(settings: Settings, command: str, *, timeout: float | None = None) -> Any:
    """A client that never decodes: dead letters may hold bytes that are not UTF-8, and one would fail a read."""
    if timeout is not None:
        settings = settings.model_copy(update={"socket_timeout_s": timeout, "reconnect_max_backoff_s": 0.1})
    name = f"incident-worker-{command}:{socket.gethostname()}-{os.getpid()}"
    client = connect(settings, decode_responses=False, client_name=re.sub(r"\s", "_", name))
    if timeout is not None:  # one attempt: a probe that retries can outlast the probe's own timeout
        client.set_retry(Retry(NoBackoff(), 0))
    return client


def _quiet_stdout() -> None:
    """After a closed pipe (`... | head`), point stdout at /dev/null so the interpreter's final flush stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def streams_of(settings: Settings) -> list[str]:
    """The configured events, alerts and dead-letter streams."""
    return [settings.events_stream, settings.alerts_stream, settings.dead_stream]


def wrong_type_error(client: Any, settings: Settings, extra: Sequence[str] = ()) -> KeyTypeError:
    """What a WRONGTYPE reply a command got means: the key of the namespace that holds another type, among those of
    fixed names and `extra` (the keys the command read beside them), what it holds and what to do."""
    from ..keytypes import diagnose  # only now: `check` stays light

    return diagnose(client, settings.keys, streams=streams_of(settings), extra=extra)


def wrong_type_message(settings: Settings, command: str, keys: Sequence[str] | None = None) -> str:
    """`wrong_type_error`'s message, asked on a connection of its own (among `keys` only, when given: the keys a
    command's Redis user may read, such as the subscriber's for `alerts`)."""
    from ..keytypes import diagnose

    try:
        client = command_client(settings, command, timeout=5.0)
    except redis.RedisError:
        return str(diagnose(None, settings.keys, streams=streams_of(settings), only=()))
    try:
        return str(diagnose(client, settings.keys, streams=streams_of(settings), only=keys))
    finally:
        client.close()


def with_settings(
    command: str, *, keys: Callable[[Settings], Sequence[str]] | None = None
) -> Callable[[Callable[[argparse.Namespace, Settings], int]], Handler]:
    """Make a handler of `run(args, settings)`: build the settings from the flags and the environment, run it, and
    turn Redis, layout and command errors into one line on stderr and an exit code. A key of the namespace that holds
    another type (Redis's WRONGTYPE) is named, with what to do, exit 2 (`keys`: the keys the command may read, when
    its Redis user may read no others, such as the subscriber's for `alerts`; by default all of fixed names)."""

    def wrap(run: Callable[[argparse.Namespace, Settings], int]) -> Handler:
        @functools.wraps(run)
        def handler(args: argparse.Namespace) -> int:
            settings = settings_from_args(args)
            url = settings.safe_redis_url
            try:
                return run(args, settings)
            except LayoutError as error:
                raise UsageError(str(error)) from None
            except (LayoutMismatchError, KeyTypeError, DamagedMetaError) as error:
                say(command, str(error))
                return EXIT_USAGE
            except (CommandError, FunctionsMissingError, FingerprintIndexError) as error:
                say(command, str(error))  # (the index's other errors: what was found, and what to run)
                return EXIT_FAILURE
            except (redis.ConnectionError, redis.TimeoutError) as error:
                tls = tls_port_hint(settings.redis_url.get_secret_value(), error)
                say(
                    command,
                    f"cannot reach Redis at {url}: {error_text(error)}; is it running, and is the URL "
                    f"right (--redis-url or {ENV_PREFIX}REDIS_URL)?" + (f" ({tls})" if tls else ""),
                )
                return EXIT_FAILURE
            except redis.exceptions.NoPermissionError as error:
                say(command, refused_permission(settings, error))
                return EXIT_FAILURE
            except redis.RedisError as error:
                from ..library import is_missing_function, missing_message  # only now: `check` stays light

                if isinstance(error, redis.ResponseError) and is_missing_function(error):
                    say(command, missing_message())  # (an upgrade before load-functions ran): what to run
                    return EXIT_FAILURE
                if isinstance(error, redis.ResponseError) and "WRONGTYPE" in str(error):
                    say(command, wrong_type_message(settings, command, None if keys is None else keys(settings)))
                    return EXIT_USAGE
                say(command, f"Redis at {url} refused a command: {error_text(error)}")
                return EXIT_FAILURE
            except BrokenPipeError:
                _quiet_stdout()
                return EXIT_OK

        return handler

    return wrap
