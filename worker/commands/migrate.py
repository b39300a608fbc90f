"""`incident-worker migrate`: move a live index to another band layout (or maximum distance), or abort the move.

The work is worker/migrate.py's; this prints its progress and the outcome.
"""

from __future__ import annotations

import argparse
import time

from ..errors import UsageError
from ..migrate import DEFAULT_BATCH, MigrationStatus, Migrator
from ..settings import Settings
from ._shared import (
    CONNECTION,
    EXIT_OK,
    add_settings_flags,
    command_client,
    describe,
    distance_arg,
    positive_arg,
    say,
    with_settings,
)

__all__ = ["configure"]


@with_settings("migrate")
def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    client = command_client(settings, "migrate")
    started = time.monotonic()

    def report(status: MigrationStatus) -> None:
        if not args.quiet:
            say("migrate", f"{status.progress} [{time.monotonic() - started:.1f} s]")

    migrator = Migrator(client, settings.namespace, batch=args.batch, pause_s=args.pause_ms / 1000, report=report)
    if args.abort:
        if args.bands is not None or args.max_distance is not None:
            raise UsageError("--abort takes no --bands or --max-distance: it stops the move under way")
        outcome = migrator.abort()
    else:
        if args.bands is None:
            raise UsageError("say which layout to move to: --bands M (and --max-distance R to change the distance)")
        outcome = migrator.migrate(args.bands, args.max_distance)
    print(f"{settings.keys.tag}: {outcome} ({time.monotonic() - started:.1f} s)")
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Move a live index to another band layout (or maximum distance) while the workers keep processing: the new "
        "layout's postings are built from the fingerprints in bounded batches while every change writes both "
        "layouts, one atomic step switches, and the old postings are removed in bounded batches. Killed at any "
        "moment, it resumes where it stopped when run again with the same layout; --abort stops a move before its "
        "switch and removes what it built. `incident-worker stats` shows the progress. See docs/contract.md, "
        "'Moving to another layout'.",
        examples="""
  incident-worker migrate --bands 3                    # the layout stats recommends
  incident-worker migrate --bands 4 --max-distance 9   # a larger distance, from the switch on
  incident-worker migrate --bands 3 --pause-ms 5       # leave Redis more time for the workers
  incident-worker migrate --abort                      # before the switch only
""",
        exits="""
  0  moved (or aborted), or the index already uses that layout (nothing to do)
  1  Redis failed, or another move is under way (the message says which)
  2  bad usage, or a layout that cannot be used
""",
    )
    parser.add_argument("--bands", type=positive_arg, metavar="M", help="the band count to move to")
    parser.add_argument(
        "--max-distance", type=distance_arg, metavar="R", help="the maximum distance to move to (default: the current)"
    )
    parser.add_argument("--abort", action="store_true", help="stop the move under way (before its switch)")
    parser.add_argument(
        "--batch",
        type=positive_arg,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"incidents per build step and keys per removal step (default {DEFAULT_BATCH:,})",
    )
    parser.add_argument("--pause-ms", type=float, default=0.0, metavar="MS", help="wait between steps (default 0)")
    parser.add_argument("--quiet", action="store_true", help="print only the outcome")
    add_settings_flags(parser, only=CONNECTION)
    parser.set_defaults(handler=_migrate)
