"""`incident-worker publish`: append incident events to the events stream from a JSON Lines (or text) file or stdin;
with `--inbox`, to the inbox through the library's `submit` (worker/inbox.py), as the shipped producer user must.

Reading (`events_of`: input lines to validated stream fields, `Publisher`: pipelined chunks and a report) is apart
from printing (the progress bar, the per-line errors, the summary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import redis
from pydantic import ValidationError

from ..connection import RedisClient
from ..errors import InvalidLineError
from ..formats import EventLimits, IncidentEvent, event_error
from ..inbox import submit_command
from ..keytypes import another_type, held_type, is_wrong_type
from ..replies import text
from ..settings import Settings
from ._format import json_line, plural, shown
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_settings_flags,
    command_client,
    describe,
    error_text,
    json_flag,
    positive_arg,
    say,
    with_settings,
)

__all__ = ["configure", "event_fields"]

PUBLISH_CHUNK = 500
"""Events per pipelined round trip: large enough to hide latency, small enough to bound a lost chunk."""

SHOWN_ERRORS = 50
"""Invalid input lines reported one by one on stderr; the rest are counted."""

LISTED_ERRORS = 100
"""Invalid input lines listed in `publish --json` output."""


# -- from input lines to stream fields ------------------------------------------------------------------------


def _validated(fields: dict[str, str], limits: EventLimits) -> dict[str, str]:
    """The fields, once the worker's own validation accepts them (the same limits as the worker's settings)."""
    try:
        IncidentEvent.from_fields(fields, limits)
    except ValidationError as error:
        raise InvalidLineError(*event_error(error)) from None
    return fields


def _compact(features: Any) -> str:
    return json.dumps(features, ensure_ascii=False, separators=(",", ":"))


def event_fields(data: dict[str, Any], limits: EventLimits, default_id: str | None) -> dict[str, str]:
    """Stream fields of a JSON event object: incident_id, features (or text) and op."""
    fields: dict[str, str] = {}
    incident_id = data.get("incident_id", default_id)
    if incident_id is not None:
        if not isinstance(incident_id, str):
            raise InvalidLineError(
                "bad_type",
                f"incident_id must be a JSON string, got {type(incident_id).__name__} "
                f"{json.dumps(incident_id)[:40]}; quote it",
            )
        fields["incident_id"] = incident_id
    if "text" in data:
        if "features" in data:
            raise InvalidLineError("features_and_text", "give features or text, not both")
        if not isinstance(data["text"], str):
            raise InvalidLineError("bad_type", f"text must be a JSON string, got {type(data['text']).__name__}")
        fields["text"] = data["text"]  # the worker tokenizes it; validation below checks it yields a bag
    elif "features" in data:
        features = data["features"]
        fields["features"] = features if isinstance(features, str) else _compact(features)
    if "op" in data:
        if not isinstance(data["op"], str):
            raise InvalidLineError(
                "bad_op", f"op must be one of add, upsert, delete, got {json.dumps(data['op'])[:40]}"
            )
        if data["op"] != "add":
            fields["op"] = data["op"]
    return _validated(fields, limits)


def _parse_line(line: str, number: int, *, text_mode: bool, id_prefix: str, limits: EventLimits) -> dict[str, str]:
    if text_mode:
        if line.lstrip().startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            if isinstance(data, dict) and "text" in data:
                return event_fields(data, limits, f"{id_prefix}{number}")
        return _validated({"incident_id": f"{id_prefix}{number}", "text": line}, limits)
    try:
        data = json.loads(line)
    except ValueError as error:
        raise InvalidLineError("bad_json", f"not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise InvalidLineError(
            "bad_type",
            f'a line must be a JSON object like {{"incident_id": "47", "features": {{"disk": 2}}}}, '
            f"got a JSON {type(data).__name__}",
        )
    return event_fields(data, limits, None)


def _read_lines(source: IO[bytes], on_bytes: Callable[[int], None]) -> Iterator[tuple[int, str | InvalidLineError]]:
    """Numbered non-blank lines of the input, decoded (an undecodable line comes as its error)."""
    for number, raw in enumerate(source, 1):
        on_bytes(len(raw))
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield number, InvalidLineError("not_utf8", f"the line is not UTF-8: {error}")
            continue
        if number == 1:
            line = line.removeprefix("\ufeff")
        line = line.rstrip("\r\n")
        if line.strip():
            yield number, line


# -- sending and the report -----------------------------------------------------------------------------------


@dataclass
class PublishReport:
    """What `publish` did: lines read, events sent (and their entry IDs), invalid lines."""

    stream: str
    lines: int = 0
    published: int = 0
    skipped: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    first_entry: str | None = None
    last_entry: str | None = None
    last_line: int = 0
    started: float = field(default_factory=time.monotonic)

    def as_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "lines": self.lines,
            "published": self.published,
            "skipped": self.skipped,
            "seconds": round(time.monotonic() - self.started, 3),
            "first_entry": self.first_entry,
            "last_entry": self.last_entry,
            "errors": self.errors[:LISTED_ERRORS],
            "errors_listed": min(len(self.errors), LISTED_ERRORS),
        }


def _send(
    client: RedisClient, report: PublishReport, chunk: list[tuple[int, dict[str, str]]], inbox_limit: int | None
) -> None:
    """One pipelined round trip of XADDs (or, given the inbox's byte limit, of FCALLs of `submit`); the report then
    covers the chunk. Entries appended to the inbox get their IDs when a worker moves them into the stream."""
    inbox = inbox_limit is not None
    pipe = client.pipeline(transaction=False)
    for _, fields in chunk:
        if inbox:
            pipe.execute_command(*submit_command(report.stream, fields, inbox_limit or 0))
        else:
            pipe.xadd(report.stream, cast(dict[Any, Any], fields))
    replies = pipe.execute()
    if not inbox:
        report.first_entry = report.first_entry or text(replies[0])
        report.last_entry = text(replies[-1])
    report.published += len(chunk)
    report.last_line = chunk[-1][0]


# -- printing -------------------------------------------------------------------------------------------------


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (at most ten times a second)."""

    def __init__(self, total_bytes: int | None, enabled: bool) -> None:
        self.total = total_bytes
        self.enabled = enabled
        self.done_bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._shown = False

    def read(self, count: int) -> None:
        self.done_bytes += count

    def update(self, report: PublishReport) -> None:
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            rate = report.published / max(now - self.started, 1e-9)
            line = f"{report.published:,} published, {report.skipped:,} skipped, {rate:,.0f}/s"
            if self.total:
                share = min(1.0, self.done_bytes / self.total)
                filled = int(share * 30)
                line = f"[{'#' * filled}{'.' * (30 - filled)}] {share:4.0%}  " + line
            sys.stderr.write("\r\x1b[K" + line)
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False
            self._drawn = 0.0


def stopped_message(report: PublishReport, why: str) -> str:
    """What an interrupted or failed publish tells its user: how far it got, and where to send again from."""
    if not report.published:
        return (
            f"{why} before any event was confirmed published; the first chunk may be partly in {report.stream}. "
            "Sending the whole input again is safe: an event repeated with the same bag changes nothing"
        )
    return (
        f"{why} after publishing {plural(report.published, 'event')} (input lines 1 to {report.last_line}); the "
        f"next chunk may be partly in {report.stream}. Sending the rest again from line {report.last_line + 1} is "
        "safe: an event repeated with the same bag changes nothing"
    )


def _wrong_type_message(client: RedisClient, settings: Settings, report: PublishReport) -> str:
    """The events stream (or the inbox) holds another type (every append of the chunk refused, none written): which,
    and from where to send again once it is fixed. (What it holds stays unsaid for the producer's user, which may not
    ask.)"""
    streams = [settings.events_stream, settings.alerts_stream, settings.dead_stream]
    kind = "list" if report.stream == settings.keys.inbox else "stream"
    fix = another_type(settings.keys, report.stream, kind, held_type(client, report.stream), streams=streams)
    if not report.published:
        return f"{fix}. Nothing was published; send the whole input again once it is fixed"
    return (
        f"{fix}. {plural(report.published, 'event')} were published first (input lines 1 to {report.last_line}); "
        f"send the rest again from line {report.last_line + 1} once it is fixed"
    )


def _summary(report: PublishReport) -> str:
    seconds = time.monotonic() - report.started
    rate = f" ({report.published / seconds:,.0f}/s)" if seconds > 0 and report.published else ""
    line = f"published {plural(report.published, 'event')} to {report.stream} in {seconds:.2f} s{rate}"
    if report.skipped:
        line += f"; skipped {plural(report.skipped, 'invalid line')}"
    if report.first_entry:
        line += f"; entries {report.first_entry} .. {report.last_entry}"
    return line


# -- the command ----------------------------------------------------------------------------------------------


def _open_input(name: str) -> tuple[IO[bytes], int | None, str]:
    """The input as bytes, its size when known (for the progress bar), and a name for default incident IDs."""
    if name == "-":
        if sys.stdin.isatty():
            print("reading events from the terminal; end with Ctrl-D", file=sys.stderr)
        return sys.stdin.buffer, None, "stdin"
    path = Path(name)
    try:
        source = path.open("rb")
    except OSError as error:
        raise UsageError(
            f"cannot read {name}: {error.strerror}; give a JSON Lines file, or - to read standard input"
        ) from None
    try:
        size: int | None = os.fstat(source.fileno()).st_size or None
    except OSError:
        size = None
    return source, size, path.name


@with_settings("publish")
def _publish(args: argparse.Namespace, settings: Settings) -> int:
    limits = settings.event_limits
    if args.id_prefix is not None and not args.text:
        raise UsageError("--id-prefix names the incidents of --text lines; JSON lines carry their own incident_id")
    source, size, name = _open_input(args.file)
    id_prefix = args.id_prefix if args.id_prefix is not None else f"{name}:"
    client = command_client(settings, "publish")
    report = PublishReport(settings.keys.inbox if args.inbox else settings.events_stream)
    inbox_limit = settings.max_entry_bytes if args.inbox else None
    progress = _Progress(size, enabled=sys.stderr.isatty())

    def invalid(number: int, error: InvalidLineError) -> None:
        report.skipped += 1
        report.errors.append({"line": number, "reason": error.reason, "detail": error.detail})
        if len(report.errors) <= SHOWN_ERRORS:
            progress.clear()
            say("publish", f"line {number}: {error.reason}: {shown(error.detail)}")
            if len(report.errors) == SHOWN_ERRORS:
                say("publish", "more invalid lines are not shown one by one; the summary counts them")

    def parsed() -> Iterator[tuple[int, dict[str, str]]]:
        for number, line in _read_lines(source, progress.read):
            report.lines += 1
            if isinstance(line, InvalidLineError):
                invalid(number, line)
                continue
            try:
                yield number, _parse_line(line, number, text_mode=args.text, id_prefix=id_prefix, limits=limits)
            except InvalidLineError as error:
                invalid(number, error)

    try:
        events: Iterable[tuple[int, dict[str, str]]] = parsed()
        if args.strict:
            events = list(events)  # every line is checked before anything is sent
            if report.skipped:
                progress.clear()
                say(
                    "publish",
                    f"nothing was published: {plural(report.skipped, 'invalid line')} of "
                    f"{report.lines:,} (--strict); fix them, or drop --strict to skip them",
                )
                if args.json:
                    print(json_line(report.as_json()))
                return EXIT_FAILURE
        chunk: list[tuple[int, dict[str, str]]] = []
        for item in events:
            chunk.append(item)
            if len(chunk) >= args.chunk_size:
                _send(client, report, chunk, inbox_limit)
                progress.update(report)
                chunk = []
        if chunk:
            _send(client, report, chunk, inbox_limit)
    except (redis.RedisError, KeyboardInterrupt) as error:
        progress.clear()
        if is_wrong_type(error):  # the events stream holds another type: no XADD of the chunk was done
            say("publish", _wrong_type_message(client, settings, report))
            if args.json:
                print(json_line(report.as_json()))
            return EXIT_USAGE
        why = "interrupted" if isinstance(error, KeyboardInterrupt) else f"Redis failed ({error_text(error)})"
        if not args.inbox and "'xadd' command" in str(error):
            why += "; this user may not XADD (the shipped producer user appends to the inbox only): add --inbox"
        say("publish", stopped_message(report, why))
        if args.json:
            print(json_line(report.as_json()))
        return EXIT_FAILURE
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    progress.clear()
    print(json_line(report.as_json()) if args.json else _summary(report))
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Append incident events to the events stream, one a line: a JSON object "
        '{"incident_id": "47", "features": {"disk": 2, "full": 1}} with an optional "op" (add, upsert, delete), '
        'or {"incident_id": "47", "text": "disk full on web-3"}, a text event the worker turns into a bag of words. '
        "With --text each line is plain text (a log line, an incident title) sent as a text event, its ID the "
        'prefix and the line number; a JSON line with a "text" key is read as above. Every line is validated as the '
        "worker would validate it: invalid lines are reported with their number and reason and skipped (or, with "
        "--strict, nothing is sent). Events go out in pipelined chunks; a progress bar shows on a terminal.",
        examples="""
  incident-worker publish incidents.jsonl
  incident-worker publish --strict --json incidents.jsonl      # all or nothing; summary as JSON
  tail -n 1000 app.log | incident-worker publish --text --id-prefix app-2024-05-01:
  echo '{"incident_id": "47", "op": "delete"}' | incident-worker publish -
""",
        exits="""
  0  the input was read and every valid line published (invalid ones skipped and reported)
  1  --strict and some line was invalid (nothing sent), or Redis failed part-way (the message says how far)
  2  bad usage: unreadable file, invalid settings; the events stream's key holds another type (which, and what to do)
""",
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="JSON Lines (or, with --text, text) file; - or nothing reads standard input",
    )
    parser.add_argument(
        "--text",
        action="store_true",
        help="each line is plain text, sent as a text event (the worker tokenizes it with worker.text)",
    )
    parser.add_argument(
        "--id-prefix",
        metavar="PREFIX",
        help="with --text: incident ID = PREFIX + line number (default: the file name and a colon, "
        "e.g. app.log:17, or stdin:17); pick a new prefix per batch, since IDs must stay unique",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="check every line first; if any is invalid, report them all, send nothing and exit 1",
    )
    parser.add_argument(
        "--inbox",
        action="store_true",
        help="append to the inbox ({N}:inbox) through the index's submit function, as the producer user of "
        "deploy/redis/users.acl must; the workers move it into the events stream",
    )
    parser.add_argument(
        "--chunk-size",
        type=positive_arg,
        default=PUBLISH_CHUNK,
        metavar="N",
        help=f"events per pipelined round trip (default {PUBLISH_CHUNK})",
    )
    json_flag(parser, "the summary (published, skipped, seconds, first errors) as one JSON object")
    add_settings_flags(parser, only=[*CONNECTION, "events_stream", "max_tokens", "max_token_length", "max_entry_bytes"])
    parser.set_defaults(handler=_publish)
