"""`incident-worker expire`: what the retention window takes out of the index, and when (`--dry-run`); without it,
one pass that expires everything due now (the workers do this by themselves; this is for operators)."""

from __future__ import annotations

import argparse
from typing import Any

from redis.exceptions import ResponseError

from .. import retention
from ..keytypes import is_wrong_type
from ..settings import Settings
from ._format import duration, json_line, plural, print_table, shown
from ._index import stored_index
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    add_settings_flags,
    command_client,
    count_arg,
    describe,
    json_flag,
    say,
    with_settings,
    wrong_type_error,
)

__all__ = ["configure"]

SHOWN = 10
"""Incidents `--dry-run` lists, the next to go first."""


def _off_message(settings: Settings) -> str:
    return (
        f"retention is off for namespace {settings.namespace!r} ({settings.keys.meta} records no retention_ms): "
        "nothing expires. Start the workers with INCIDENT_WORKER_RETENTION (such as 30d) to turn it on"
    )


def _print_state(state: retention.RetentionState, settings: Settings) -> None:
    print(f"retention window {duration(state.window_ms / 1000)} for {settings.keys.tag}")
    oldest = "-" if state.oldest_age_ms is None else duration(state.oldest_age_ms / 1000)
    print(
        f"  {plural(state.tracked, 'incident')} tracked in {settings.keys.expiry}, {state.due:,} due now "
        f"(last add or upsert older than the window); the oldest is {oldest} old"
    )
    if state.backfill_cursor is not None:
        print(
            "  the incidents indexed before retention was turned on are still being entered (the workers do it in "
            "steps): the counts are not complete yet"
        )
    if state.upcoming:
        print(f"  the next {plural(len(state.upcoming), 'incident')} to go:")
        print_table(
            [
                (
                    shown(row["incident_id"]),
                    duration(row["age_s"]),
                    "due now" if row["goes_in_s"] <= 0 else f"in {duration(row['goes_in_s'])}",
                )
                for row in state.upcoming
            ],
            ("INCIDENT_ID", "AGE", "GOES"),
            "    ",
        )


@with_settings("expire")
def _expire(args: argparse.Namespace, settings: Settings) -> int:
    client = command_client(settings, "expire")
    index, _ = stored_index(client, settings)
    if index is None:
        say("expire", f"namespace {settings.namespace!r} has no index yet ({settings.keys.meta} is missing)")
        return EXIT_FAILURE
    state = retention.state(client, settings.keys, upcoming=args.show)
    if state.window_ms <= 0:
        if args.json:
            print(json_line({"namespace": settings.namespace, "retention": state.as_json(), "expired": 0}))
        else:
            say("expire", _off_message(settings))
        return EXIT_OK
    if args.dry_run:
        if args.json:
            print(json_line({"namespace": settings.namespace, "retention": state.as_json()}))
        else:
            _print_state(state, settings)
        return EXIT_OK
    try:
        result = retention.expire_due(index)
    except ResponseError as error:
        if not is_wrong_type(error):
            raise
        # the incidents due are picked again (a read): the keys of their postings and twin groups are the suspects
        raise wrong_type_error(client, settings, retention.call_keys(index, retention.pick(index))) from None
    out: dict[str, Any] = {
        "namespace": settings.namespace,
        "expired": result.expired,
        "kept": result.kept,
        "dropped": result.dropped,
    }
    if args.json:
        print(json_line(out))
    else:
        print(
            f"expired {plural(result.expired, 'incident')} whose last add or upsert was older than "
            f"{duration(state.window_ms / 1000)}"
            + (f"; kept {result.kept:,} changed since they were picked" if result.kept else "")
        )
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "The retention window of a namespace (recorded in {N}:meta by its workers, from INCIDENT_WORKER_RETENTION): "
        "with --dry-run, how many incidents it tracks, how many are due, the oldest one's age and the next to go "
        "with their age and when they go; without it, one pass that expires every incident due now, each atomically "
        "and only if no add or upsert changed it meanwhile. The workers run these passes by themselves (the holder "
        "of {N}:lease:upkeep); running one by hand is safe beside them.",
        examples="""
  incident-worker expire --dry-run
  incident-worker expire --dry-run --show 50 --json | jq '.retention.due'
  incident-worker expire --namespace staging
""",
        exits="""
  0  shown, or the pass ran (retention off: nothing to do)
  1  no index in the namespace, or Redis failed
  2  bad usage or settings
""",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would go and when; change nothing")
    parser.add_argument(
        "--show",
        type=count_arg,
        default=SHOWN,
        metavar="N",
        help=f"with --dry-run, list the next N incidents to go (default {SHOWN})",
    )
    json_flag(parser, "the figures as one JSON object")
    add_settings_flags(parser, only=CONNECTION)
    parser.set_defaults(handler=_expire)
