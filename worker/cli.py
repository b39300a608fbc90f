"""`incident-worker`: one entry point, a subcommand per job. Exit codes: 0 ok, 1 failure, 2 bad usage or config."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args, get_origin

from pydantic import SecretStr, ValidationError

from . import __version__
from .errors import UsageError
from .settings import ENV_PREFIX, Settings, shown_default

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


# -- settings as flags ----------------------------------------------------------------------------------------


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any] | None, list[str] | None]:
    origin = get_origin(annotation)
    if origin is Literal:
        return str, [str(choice) for choice in get_args(annotation)]
    if origin in (types.UnionType, __import__("typing").Union):
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
        if info.annotation is bool:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
            )
            continue
        kind, choices = _flag_type(info.annotation)
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


# -- run ------------------------------------------------------------------------------------------------------


def _install_signals(stop: Callable[[], None]) -> None:
    """First SIGTERM or SIGINT: finish the batch and exit 0. A second one: exit at once, entries stay pending."""
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if received:
            os._exit(128 + signum)
        received.append(signum)
        # not stop() itself: it takes a lock the interrupted main thread may hold at this very moment
        threading.Thread(target=stop, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def cmd_run(args: argparse.Namespace) -> int:
    from .connection import connect
    from .errors import LayoutMismatchError
    from .logs import configure_logging, get_logger
    from .stream import StreamWorker

    settings = settings_from_args(args)
    configure_logging(settings.log_format, settings.log_level)
    log = get_logger(consumer=settings.consumer)
    worker = StreamWorker(connect(settings), settings)
    if settings.metrics_port:
        worker.metrics.serve(settings.metrics_port)
        log.info("metrics endpoint listening", port=settings.metrics_port, path="/metrics")
    _install_signals(worker.stop)
    try:
        worker.run(until_idle=args.until_idle)
    except LayoutMismatchError as error:
        log.error("index layout mismatch; not starting", error=str(error))
        return EXIT_USAGE
    return EXIT_OK


# -- the parser -----------------------------------------------------------------------------------------------


SUBCOMMAND_MODULES = ("worker.ops", "worker.demo", "worker.bench")
"""Modules that add subcommands: each has `register(commands)` adding its parsers with `set_defaults(handler=...)`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="incident-worker",
        description="Finds near-duplicate incidents in a Redis stream (SimHash-64 fingerprints, banded index).",
        epilog="Exit codes: 0 ok, 1 failure (or unhealthy, for check), 2 bad usage or configuration.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="consume the events stream: index incidents, publish alerts (the main job)",
        description="Consume the events stream through the consumer group: fingerprint each incident, find every "
        "indexed incident within max_distance, index it, publish an alert, acknowledge; dead-letter bad input. "
        "SIGTERM or SIGINT finishes the batch and exits 0; a second signal exits at once.",
    )
    run.add_argument(
        "--until-idle",
        action="store_true",
        help="exit 0 once nothing is left to read or pending (for batch jobs and tests)",
    )
    add_settings_flags(run)
    run.set_defaults(handler=cmd_run)

    import importlib

    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_OK
    try:
        return int(handler(args))
    except UsageError as error:
        print(f"incident-worker {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
