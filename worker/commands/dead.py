"""`incident-worker dead` (list dead letters) and `dead replay` (re-queue them after a fix).

`read_dead_letters` and `replay` read and write; `print_letter` and the handlers print.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import ValidationError

from ..connection import RedisClient
from ..errors import KeyTypeError
from ..formats import DEAD_LETTER_FIELDS, REASONS, DeadLetter
from ..keytypes import another_type, held_type, is_wrong_type
from ..replies import entries, entry_time_text, text
from ..settings import Settings
from ._format import json_line, plural, shown
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    UsageError,
    add_settings_flags,
    command_client,
    count_arg,
    describe,
    entry_id_in_range,
    error_text,
    json_flag,
    say,
    streams_of,
    with_settings,
)

__all__ = ["ReplayReport", "configure", "read_dead_letters", "replay"]

REPLAY_CHUNK = 100
"""Dead letters moved per MULTI/EXEC: one transaction, so a crash moves all of them or none."""

WATCH_RETRIES = 50
"""Replay re-reads a chunk when the dead stream changed under its WATCH (workers append to it meanwhile)."""

_ENTRY_ID = re.compile(r"^\d+-\d+$")
_OWN_FIELDS = {name.encode() for name in DEAD_LETTER_FIELDS}


def known_reason(reason: str | None, flag: str) -> None:
    """UsageError unless `reason` is None or one of the dead-letter reasons (which the message lists)."""
    if reason is None or reason in REASONS:
        return
    raise UsageError(
        f"{flag} {reason!r}: no dead letter has that reason; the reasons are " + ", ".join(sorted(REASONS))
    )


# -- listing --------------------------------------------------------------------------------------------------


@dataclass
class DeadListing:
    """The dead letters found (oldest first), how many the stream holds, and entries that were not dead letters."""

    letters: list[tuple[str, DeadLetter]]
    total: int
    not_letters: list[tuple[str, str]] = field(default_factory=list)


def read_dead_letters(client: RedisClient, stream: str, reason: str | None, count: int) -> DeadListing:
    """The newest `count` dead letters (0: all) with this reason (None: any), oldest first."""
    listing = DeadListing([], int(client.xlen(stream)))
    for entry_id, fields in entries(client, stream, reverse=True):
        try:
            letter = _letter(fields)
        except ValidationError as error:
            listing.not_letters.append((entry_id, error.errors()[0]["msg"]))
            continue
        if reason is None or letter.reason == reason:
            listing.letters.append((entry_id, letter))
            if count and len(listing.letters) >= count:
                break
    listing.letters.reverse()
    return listing


def letter_json(entry_id: str, letter: DeadLetter) -> dict[str, Any]:
    return {"entry_id": entry_id, "time": entry_time_text(entry_id), **letter.model_dump()}


def print_letter(entry_id: str, letter: DeadLetter) -> None:
    print(f"{entry_time_text(entry_id)}  {entry_id}  {letter.reason}: {shown(letter.detail)}")
    print(
        f"    from {shown(letter.source_stream) or '(no source_stream)'} entry {shown(letter.source_entry)}, "
        f"consumer {shown(letter.consumer)}, "
        f"delivered {plural(letter.deliveries, 'time')}"
    )
    if not letter.original:
        print("    original: (no fields: the entry was gone before it was processed)")
    for name, value in letter.original.items():
        line = shown(value)
        if len(line) > 200:
            line = line[:200] + f"... ({len(value):,} characters)"
        print(f"    {shown(name)} = {line}")


@with_settings("dead")
def _dead(args: argparse.Namespace, settings: Settings) -> int:
    known_reason(args.reason, "--reason")
    listing = read_dead_letters(command_client(settings, "dead"), settings.dead_stream, args.reason, args.count)
    for entry_id, why in listing.not_letters:
        say("dead", f"entry {entry_id} is not a dead letter, skipped: {why}")
    for entry_id, letter in listing.letters:
        if args.json:
            print(json_line(letter_json(entry_id, letter)))
        else:
            print_letter(entry_id, letter)
    if args.json:
        return EXIT_OK
    which = f" with reason {args.reason!r}" if args.reason else ""
    in_all = plural(listing.total, "entry", "entries")
    if not listing.letters:
        print(f"no dead letters{which} in {settings.dead_stream} ({in_all} in all)")
    else:
        print(
            f"{plural(len(listing.letters), 'dead letter')}{which} shown, newest last; {settings.dead_stream} holds "
            f"{in_all}. After fixing the cause, re-queue them with: "
            "incident-worker dead replay ID... | --reason R | --all"
        )
    return EXIT_OK


# -- replay ---------------------------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    """What a replay moved (or, dry, would move) back to the events stream, and what it skipped and why."""

    replayed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


def _original_fields(raw: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """The dead-lettered entry's own fields, raw, with their names as they were (see DeadLetter.to_fields)."""
    return {name.removeprefix(b"original_"): value for name, value in raw.items() if name not in _OWN_FIELDS}


_Chosen = tuple[str, DeadLetter, dict[bytes, bytes]]
"""A dead letter to replay: its entry ID, the letter, and the original fields to re-add."""


def _letter(fields: Mapping[Any, Any]) -> DeadLetter:
    """A dead letter as read; one whose `source_stream` field is missing (removed by hand) reads as one from an
    unknown stream (''), which a replay keeps unless told where to send it (--any-source)."""
    try:
        return DeadLetter.from_fields(fields)
    except ValidationError as error:
        if not all(item["loc"] == ("source_stream",) and item["type"] == "missing" for item in error.errors()):
            raise
        name = b"source_stream" if any(isinstance(key, bytes) for key in fields) else "source_stream"
        return DeadLetter.from_fields({**fields, name: ""})


def _elsewhere(source: str, settings: Settings) -> str | None:
    """Why a dead letter that came from `source` is not replayed to the configured events stream, and what to do
    (None: it came from that stream). A letter's field never chooses the key a replay writes: only the operator's
    settings (--events-stream) do, and only a stream of the namespace that no other part of the index uses is
    suggested there."""
    target = settings.events_stream
    if source == target:
        return None
    anyway = f"add --any-source to send it to {target} all the same"
    if not source:
        return f"its source_stream is not recorded, so where it came from is unknown: {anyway}"
    keys = settings.keys
    taken = {settings.alerts_stream, settings.dead_stream, keys.alerts_stream, keys.dead_stream, keys.changes}
    suggestible = (
        keys.owns(source)
        and keys.kind_of(source) in (None, "stream")
        and source not in taken
        and shown(source) == source
        and not any(c.isspace() or c in "'\\" for c in source)
    )
    if not suggestible:
        return (
            f"its source_stream '{shown(source[:120])}' is not an events stream of namespace {settings.namespace!r}, "
            f"so it is not written to: {anyway}"
        )
    return (
        f"came from {source}, not {target}, the events stream this replay writes to: send it back there with "
        f"--events-stream '{source}' (where the workers that read that stream process it), or {anyway}"
    )


def _choose(
    found: list[tuple[str, Any]], wanted: Callable[[DeadLetter], bool], settings: Settings, any_source: bool
) -> tuple[list[_Chosen], list[dict[str, Any]]]:
    """The wanted dead letters among those read, and the entries skipped with why (unknown, not a letter, empty,
    from another stream than the configured events stream and not `any_source`)."""
    chosen: list[_Chosen] = []
    skipped: list[dict[str, Any]] = []
    for entry_id, fields in found:
        if fields is None:
            skipped.append({"dead_entry": entry_id, "why": "not found in the dead-letter stream"})
            continue
        try:
            letter = _letter(fields)
        except ValidationError:
            skipped.append({"dead_entry": entry_id, "why": "not a dead letter"})
            continue
        if not wanted(letter):
            continue
        source = {"source_stream": letter.source_stream}
        elsewhere = None if any_source else _elsewhere(letter.source_stream, settings)
        if elsewhere is not None:
            skipped.append({"dead_entry": entry_id, "why": elsewhere, **source})
            continue
        original = _original_fields(fields)
        if not original:
            why = "no original fields to replay (the entry was deleted before it was processed)"
            skipped.append({"dead_entry": entry_id, "why": why, **source})
            continue
        if not _whole(letter, original):
            why = (
                "keeps only the first bytes of the entry's fields (it was over max_entry_bytes): replaying them would "
                "queue another event; send the event again from its producer"
            )
            skipped.append({"dead_entry": entry_id, "why": why, **source})
            continue
        chosen.append((entry_id, letter, original))
    return chosen, skipped


def _whole(letter: DeadLetter, original: dict[bytes, bytes]) -> bool:
    """Whether a dead letter holds its entry whole: not one of an oversized entry with a field cut to its prefix or
    fields past the first 1,000 dropped (`original_sizes` gives each kept field's full size)."""
    if letter.original_fields_dropped:
        return False
    if letter.original_sizes is None:
        return True
    kept = [(len(name), len(value)) for name, value in original.items()]
    return kept == [tuple(size) for size in letter.original_sizes]


def _writable(client: RedisClient, settings: Settings, stream: str) -> None:
    """Raise KeyTypeError, before anything is written, when `stream` holds another type than a stream: MULTI/EXEC does
    not roll back, so an XADD refused inside it would leave its XDEL done, and the dead letter lost."""
    try:
        client.xrevrange(stream, "+", "-", count=1)
    except redis.ResponseError as error:
        if not is_wrong_type(error):
            raise
        held = held_type(client, stream)
        fix = another_type(settings.keys, stream, "stream", held, streams=streams_of(settings))
        kept = f"{fix}. The dead letters are kept: replay them once it is fixed"
        raise KeyTypeError(kept, stream, "stream", held) from None


def _replay_transaction(
    client: RedisClient,
    settings: Settings,
    read: Callable[[Any], list[tuple[str, Any]]],
    wanted: Callable[[DeadLetter], bool],
    dry_run: bool,
    report: ReplayReport,
    any_source: bool = False,
) -> list[tuple[str, Any]]:
    """Read dead letters under WATCH, then re-add their originals to the events stream and delete them, in one
    MULTI/EXEC: a crash or a concurrent replay can neither lose a letter nor queue it twice. Returns what was read.

    The stream written is the configured events stream, never a letter's `source_stream`; a letter that came from
    another is kept unless `any_source` (see `_elsewhere`)."""
    target = settings.events_stream
    with client.pipeline(transaction=True) as pipe:
        for _ in range(WATCH_RETRIES):
            try:
                pipe.watch(settings.dead_stream)
                found = read(pipe)
                chosen, skipped = _choose(found, wanted, settings, any_source)
                if chosen:
                    _writable(client, settings, target)
                if dry_run or not chosen:
                    pipe.unwatch()
                    new_ids: list[str | None] = [None] * len(chosen)
                else:
                    pipe.multi()
                    for entry_id, _, original in chosen:
                        pipe.xadd(target, original)  # type: ignore[arg-type]
                        pipe.xdel(settings.dead_stream, entry_id)
                    replies = pipe.execute(raise_on_error=False)
                    _keep_unwritten(client, settings, found, chosen, replies)
                    new_ids = [text(reply) for reply in replies[0::2]]
            except redis.WatchError:
                continue
            report.skipped.extend(skipped)
            for (entry_id, letter, _), new_id in zip(chosen, new_ids, strict=True):
                report.replayed.append(
                    {
                        "dead_entry": entry_id,
                        "event_entry": new_id,
                        "reason": letter.reason,
                        "incident_id": letter.original.get("incident_id"),
                        "source_entry": letter.source_entry,
                        "source_stream": letter.source_stream,
                    }
                )
            return found
    raise CommandError(
        f"{settings.dead_stream} changed under every one of {WATCH_RETRIES} attempts to replay a chunk; "
        "try again when the workers are quieter"
    )


def _keep_unwritten(
    client: RedisClient, settings: Settings, found: list[tuple[str, Any]], chosen: list[_Chosen], replies: list[Any]
) -> None:
    """After EXEC: a letter whose XADD Redis refused (the stream's type changed after `_writable` looked) was deleted
    all the same, as MULTI/EXEC does not roll back; it is written back to the dead-letter stream, whole, and the
    command fails saying why."""
    raw = dict(found)
    failed = []
    for (entry_id, _, _), added, deleted in zip(chosen, replies[0::2], replies[1::2], strict=True):
        if not isinstance(added, Exception):
            continue
        if deleted == 1:
            client.xadd(settings.dead_stream, raw[entry_id])
        failed.append((entry_id, added))
    if not failed:
        return
    entry_id, error = failed[0]
    if is_wrong_type(error):
        _writable(client, settings, settings.events_stream)
    raise CommandError(
        f"Redis refused to re-add dead letter {entry_id} ({error_text(error)}); it is kept in {settings.dead_stream} "
        f"(as a new entry), with {plural(len(failed) - 1, 'other')} refused the same way"
    )


def replay(
    client: RedisClient,
    settings: Settings,
    *,
    ids: list[str],
    reason: str | None,
    dry_run: bool,
    any_source: bool = False,
) -> ReplayReport:
    """Move dead letters back to the configured events stream: those of `ids`, or (no IDs) every one with `reason`
    (None: all) present when the replay starts, chunk by chunk, each chunk in one transaction. A letter that came
    from another stream is kept, with why and what to do, unless `any_source`."""
    report = ReplayReport()
    if ids:
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), REPLAY_CHUNK):
            chunk = unique[start : start + REPLAY_CHUNK]

            def read_ids(pipe: Any, chunk: list[str] = chunk) -> list[tuple[str, Any]]:
                found = []
                for entry_id in chunk:
                    page = pipe.xrange(settings.dead_stream, entry_id, entry_id)
                    found.append((entry_id, page[0][1] if page else None))
                return found

            _replay_transaction(client, settings, read_ids, lambda letter: True, dry_run, report, any_source)
        return report

    def wanted(letter: DeadLetter) -> bool:
        return reason is None or letter.reason == reason

    newest = client.xrevrange(settings.dead_stream, "+", "-", count=1)
    # Only what is there now: an entry replayed now may fail again and come back, and must not loop.
    end = text(newest[0][0]) if newest else None
    cursor = "-"
    while end is not None:

        def read_page(pipe: Any, cursor: str = cursor, end: str = end) -> list[tuple[str, Any]]:
            return [(text(i), f) for i, f in pipe.xrange(settings.dead_stream, cursor, end, count=REPLAY_CHUNK)]

        page = _replay_transaction(client, settings, read_page, wanted, dry_run, report, any_source)
        if len(page) < REPLAY_CHUNK:
            break
        cursor = "(" + page[-1][0]
    return report


def print_replay(report: ReplayReport, settings: Settings, dry_run: bool) -> None:
    verb = "would replay" if dry_run else "replayed"
    for item in report.replayed:
        target = f" as {settings.events_stream} {item['event_entry']}" if item["event_entry"] else ""
        incident = item["incident_id"]
        about = f", incident {shown(incident)}" if incident is not None else ""
        print(f"{verb} {item['dead_entry']} ({item['reason']}{about}){target}")
    for item in report.skipped:
        say("dead replay", f"{item['dead_entry']}: {item['why']}")
    count = plural(len(report.replayed), "dead letter")
    kept = f"; {len(report.skipped):,} kept (why above)" if report.skipped else ""
    if dry_run:
        print(f"dry run: {verb} {count} to {settings.events_stream}{kept}; nothing changed")
    elif report.replayed:
        print(f"{verb} {count} to {settings.events_stream}: the workers process them as new entries{kept}")
    else:
        print(f"nothing to replay{kept}")


@with_settings("dead replay")
def _replay(args: argparse.Namespace, settings: Settings) -> int:
    selectors = sum([bool(args.ids), args.replay_reason is not None, args.all])
    if selectors != 1:
        raise UsageError(
            "choose what to replay, one way: dead-letter entry IDs (as `incident-worker dead` shows "
            "them), --reason R, or --all"
        )
    known_reason(args.replay_reason, "--reason")
    bad = [entry_id for entry_id in args.ids if not (_ENTRY_ID.match(entry_id) and entry_id_in_range(entry_id))]
    if bad:
        raise UsageError(
            f"{bad[0]!r} is not a stream entry ID like 1714564800123-0; copy the IDs from `incident-worker dead`"
        )
    client = command_client(settings, "dead replay")
    report = replay(
        client, settings, ids=args.ids, reason=args.replay_reason, dry_run=args.dry_run, any_source=args.any_source
    )
    if args.json:
        print(
            json_line(
                {
                    "dry_run": args.dry_run,
                    "events_stream": settings.events_stream,
                    "replayed": report.replayed,
                    "skipped": report.skipped,
                }
            )
        )
    else:
        print_replay(report, settings, args.dry_run)
    return EXIT_FAILURE if report.skipped else EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "List the dead-letter stream, newest last: each entry's reason (a machine code such as "
        "bad_json, bad_weight, duplicate_id, poison), the detail for people, the events-stream entry it came from, "
        "and the entry's original fields. After fixing the cause (the producer, a setting, a conflicting "
        "incident), `incident-worker dead replay` puts them back on the events stream. The reasons: "
        + ", ".join(sorted(REASONS))
        + ".",
        examples="""
  incident-worker dead
  incident-worker dead --reason duplicate_id --count 0 --json | jq -r .original.incident_id
  incident-worker dead replay 1714564800123-0 1714564800456-0
  incident-worker dead replay --reason too_many_tokens --dry-run
""",
        exits="""
  0  listed
  1  Redis failed
  2  bad usage: an unknown --reason
""",
    )
    parser.add_argument("--reason", metavar="R", help="only dead letters with this reason")
    parser.add_argument(
        "--count",
        type=count_arg,
        default=50,
        metavar="N",
        help="the newest N matching dead letters (default 50; 0 = all)",
    )
    json_flag(parser, "each dead letter as a JSON object, one a line (JSON Lines)")
    add_settings_flags(parser, only=[*CONNECTION, "dead_stream"])
    parser.set_defaults(handler=_dead)

    actions = parser.add_subparsers(dest="dead_action", metavar="ACTION")
    replay_parser = actions.add_parser("replay", help="re-queue dead letters on the events stream after a fix")
    describe(
        replay_parser,
        "Re-add the original fields of chosen dead letters to the events stream, exactly as they came "
        "(bytes and field names included), and delete each dead letter in the same MULTI/EXEC transaction: a "
        "crash or a second replay running at the same time can neither lose one nor queue it twice. Only the dead "
        "letters present when the command starts are considered, so entries that fail again are not looped. "
        "The stream written is the configured events stream (--events-stream), never the one a letter names: "
        "a letter whose source_stream is another (another set of workers' stream, the stream before a change of "
        "the setting, or a missing or mangled value) is kept, with what to do: replay it with --events-stream "
        "set to its stream, or add --any-source to send it to the configured one.",
        examples="""
  incident-worker dead replay 1714564800123-0
  incident-worker dead replay --reason duplicate_id --dry-run
  incident-worker dead replay --all --json
  incident-worker dead replay --all --events-stream '{incidents}:events-b'   # the letters of the workers of -b
  incident-worker dead replay --all --any-source     # after EVENTS_STREAM changed: the old stream's letters too
""",
        exits="""
  0  every chosen dead letter was replayed (or would be, with --dry-run), or none matched
  1  a chosen dead letter was skipped (not found, nothing to replay, only prefixes of an entry over
     max_entry_bytes: send that event again; or from another stream than --events-stream), or Redis failed
  2  bad usage: nothing chosen, more than one way of choosing, an ID that is not an entry ID, an unknown --reason;
     the events or dead-letter stream's key holds another type
""",
    )
    replay_parser.add_argument(
        "ids", nargs="*", metavar="ID", help="dead-letter entry IDs, as `incident-worker dead` shows"
    )
    replay_parser.add_argument("--reason", dest="replay_reason", metavar="R", help="every dead letter with this reason")
    replay_parser.add_argument("--all", action="store_true", help="every dead letter")
    replay_parser.add_argument("--dry-run", action="store_true", help="show what would be replayed; change nothing")
    replay_parser.add_argument(
        "--any-source",
        action="store_true",
        help="also replay the chosen letters that came from another stream (or name none) to the configured "
        "events stream, as after a change of its name; without it they are kept",
    )
    json_flag(replay_parser, "what was replayed (and skipped) as one JSON object")
    add_settings_flags(replay_parser, only=[*CONNECTION, "events_stream", "dead_stream"])
    replay_parser.set_defaults(handler=_replay)
