"""`incident-worker`: one entry point, a subcommand per job (worker/commands/). Exit codes: 0 ok, 1 failure, 2 bad
usage or configuration; 130 or 143 when a second Ctrl-C or SIGTERM stops `run` or `demo` at once.

Only the chosen subcommand's module is imported: the liveness probe (`check`) stays light.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import traceback
import types
import typing
from collections.abc import Sequence

from . import __version__
from .commands import SUBCOMMANDS
from .commands._shared import EXIT_OK, EXIT_USAGE, UsageError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors show no secret: "unrecognized arguments: --redis_url redis://:PASSWORD@host" (a flag
    mistyped, its value then unrecognized too) quoted every word, a password among them. Such values are left out,
    and any message is redacted."""

    def error(self, message: str) -> typing.NoReturn:
        from .logs import redact

        head = "unrecognized arguments: "
        if message.startswith(head):
            words = message[len(head) :].split(" ")
            shown = [word.split("=", 1)[0] + ("=..." if "=" in word else "") for word in words if word.startswith("-")]
            hidden = len(words) - len(shown)
            if hidden:
                shown.append(f"({hidden} value{'s' if hidden > 1 else ''}, not shown)")
            message = head + " ".join(shown)
        message = re.sub(r"explicit argument '.*'", "explicit argument (not shown)", message)
        super().error(redact(message))


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand (`chosen` None), or of the top level and `chosen` only, the others listed
    by name and summary without importing their modules."""
    parser = _Parser(
        prog="incident-worker",
        description="Finds near-duplicate incidents in a Redis stream (SimHash-64 fingerprints, banded index).",
        epilog="Exit codes: 0 ok, 1 failure (or unhealthy, for check), 2 bad usage or configuration; 130 (143) "
        "when a second Ctrl-C (SIGTERM) stops run or demo at once. `incident-worker COMMAND --help` for more.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for subcommand in SUBCOMMANDS:
        sub = commands.add_parser(subcommand.name, help=subcommand.summary, description=subcommand.summary)
        if chosen is None or chosen == subcommand.name:
            importlib.import_module(subcommand.module).configure(sub)
    return parser


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first argument that is not an option (the top level's
    options, --help and --version, take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_chosen(argv) or "")
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_OK
    from .logs import redact

    def excepthook(kind: type[BaseException], error: BaseException, trace: types.TracebackType | None) -> None:
        # a bug's traceback quotes exception texts, which may quote a URL: shown without secrets like everything else
        sys.stderr.write(redact("".join(traceback.format_exception(kind, error, trace))))

    sys.excepthook = excepthook
    try:
        return int(handler(args))
    except UsageError as error:
        print(redact(f"incident-worker {args.command}: {error}"), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
