"""Operator subcommands of `incident-worker`: publish, query, inspect, stats, alerts, dead (and dead replay), check.

Each reads its settings as `run` does (a flag wins over an INCIDENT_WORKER_* variable, which wins over the default)
and exits 0 (done), 1 (failed: not found, unhealthy, Redis unreachable) or 2 (bad usage or configuration).

The commands that only read the index (query, inspect, stats) use the layout stored in `{N}:meta`, so they work on
any index without repeating its band settings, and they never write `{N}:meta`: a namespace gets its layout from its
first worker, not from a query someone ran before it started.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import redis
from pydantic import ValidationError
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import replies
from .bands import recommend_bands
from .cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, add_settings_flags, settings_from_args
from .connection import RedisClient, connect
from .errors import (
    CommandError,
    InvalidFeaturesError,
    InvalidLineError,
    LayoutError,
    LayoutMismatchError,
    UsageError,
)
from .fingerprint import fingerprint, format_fingerprint
from .formats import DEAD_LETTER_FIELDS, Alert, DeadLetter, EventLimits, Heartbeat, IncidentEvent, event_error
from .index import FingerprintIndex
from .keys import IndexKeys
from .logs import redact
from .settings import ENV_PREFIX, Settings

__all__ = ["register"]

PUBLISH_CHUNK = 500
"""Events per pipelined round trip: large enough to hide latency, small enough to bound a lost chunk."""

DEAD_SCAN_LIMIT = 10_000
"""Dead letters `stats` reads to count reasons: bounded so that `stats` stays quick on a flooded dead stream."""

REPLAY_CHUNK = 100
"""Dead letters moved per MULTI/EXEC: one transaction, so a crash moves all of them or none."""

WATCH_RETRIES = 50
"""Replay re-reads a chunk when the dead stream changed under its WATCH (workers append to it meanwhile)."""

FOLLOW_BLOCK_MS = 1000
"""One blocking read while following: below any socket timeout, and a Ctrl-C is handled at once anyway."""

CHECK_TIMEOUT_S = 2.0
"""Health checks must answer well within a Docker or Kubernetes probe's timeout."""

SHOWN_ERRORS = 50
"""Invalid input lines reported one by one on stderr; the rest are counted."""

LISTED_ERRORS = 100
"""Invalid input lines listed in `publish --json` output."""

_CONNECTION = ["redis_url", "cluster", "namespace"]
_ENTRY_ID = re.compile(r"^\d+-\d+$")
_SINCE = re.compile(r"^\d+(-\d+)?$")


# -- shared helpers -------------------------------------------------------------------------------------------


def _shown(text: str) -> str:
    """Text safe to print on any terminal: bytes that were not UTF-8 (surrogate escapes) shown as `\\udcXX`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json(value: Any) -> str:
    """One line of JSON; Unicode kept readable unless the value holds undecodable bytes (then escaped)."""
    line = json.dumps(value, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(value)
    return line


def _say(command: str, message: str) -> None:
    print(f"incident-worker {command}: {message}", file=sys.stderr, flush=True)


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _size(count: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1024
    return f"{count:,.1f} TB"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _client(settings: Settings, command: str, *, timeout: float | None = None) -> RedisClient:
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


def _guarded(command: str) -> Callable[[Callable[[argparse.Namespace, Settings], int]], Callable[..., int]]:
    """Build the settings, run the command, and turn Redis and layout errors into a message and an exit code."""

    def wrap(run: Callable[[argparse.Namespace, Settings], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(run)
        def handler(args: argparse.Namespace) -> int:
            settings = settings_from_args(args)
            url = settings.safe_redis_url
            try:
                return run(args, settings)
            except LayoutError as error:
                raise UsageError(str(error)) from None
            except LayoutMismatchError as error:
                _say(command, str(error))
                return EXIT_USAGE
            except CommandError as error:
                _say(command, str(error))
                return EXIT_FAILURE
            except (redis.ConnectionError, redis.TimeoutError) as error:
                _say(
                    command,
                    f"cannot reach Redis at {url}: {redact(str(error))}; is it running, and is the URL "
                    f"right (--redis-url or {ENV_PREFIX}REDIS_URL)?",
                )
                return EXIT_FAILURE
            except redis.RedisError as error:
                _say(command, f"Redis at {url} refused a command: {redact(str(error))}")
                return EXIT_FAILURE
            except BrokenPipeError:
                _quiet_stdout()
                return EXIT_OK

        return handler

    return wrap


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps the description as usual; keeps the epilog's example lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _add_parser(
    commands: Any, name: str, *, summary: str, description: str, examples: str, exits: str
) -> argparse.ArgumentParser:
    epilog = "examples:\n" + examples.strip("\n") + "\n\nexit codes:\n" + exits.strip("\n")
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=_HelpFormatter,
    )


def _json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} for scripts instead of text for people")


def _distance_arg(value: str) -> int:
    try:
        distance = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 0 to 64") from None
    if not 0 <= distance <= 64:
        raise argparse.ArgumentTypeError(f"{distance} is not a Hamming distance: use 0 to 64")
    return distance


def _count_arg(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count} is negative; use 0 or more")
    return count


def _positive_arg(value: str) -> int:
    count = _count_arg(value)
    if count == 0:
        raise argparse.ArgumentTypeError("use 1 or more")
    return count


# -- reading the index (read-only helpers in the style of worker/index.py) ------------------------------------


def _stored_index(client: RedisClient, settings: Settings) -> tuple[FingerprintIndex | None, dict[str, str]]:
    """The index with the layout it was built with (None when it has no meta yet), and its meta."""
    try:
        index = FingerprintIndex.stored(client, settings.namespace)
    except LayoutMismatchError as error:
        raise CommandError(f"{error}; check --namespace") from None
    return index, FingerprintIndex.read_meta(client, settings.namespace) if index else {}


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _heartbeats(
    client: RedisClient, keys: IndexKeys, consumer: str | None = None, host: str | None = None
) -> list[Heartbeat]:
    """Live workers' heartbeats: of one consumer, of the consumers named `<host>-*`, or all of the namespace."""
    if consumer is not None:
        names = [keys.heartbeat(consumer)]
    else:
        pattern = _glob_escape(keys.heartbeat("")) + (_glob_escape(host) + "-*" if host else "*")
        names = sorted({replies.text(k) for k in client.scan_iter(match=pattern, count=1000)})[:1000]
    if not names:
        return []
    values = client.mget(names)
    return [
        Heartbeat.from_value(name, name.removeprefix(keys.heartbeat("")), value)
        for name, value in zip(names, values, strict=True)
        if value is not None  # expired between the scan and the read
    ]


def _stream_length(client: RedisClient, stream: str) -> int:
    return int(client.xlen(stream))


def _group_info(client: RedisClient, stream: str, group: str) -> dict[str, Any] | None:
    """XINFO GROUPS of the stream, for one group; None when the stream or the group does not exist."""
    if not client.exists(stream):
        return None
    return replies.group_info(client, stream, group)


# -- publish --------------------------------------------------------------------------------------------------


def _validated(fields: dict[str, str], limits: EventLimits) -> dict[str, str]:
    """The fields, once the worker's own validation accepts them (the same limits as the worker's settings)."""
    try:
        IncidentEvent.from_fields(fields, limits)
    except ValidationError as error:
        raise InvalidLineError(*event_error(error)) from None
    return fields


def _bag_from_text(text: str) -> dict[str, int]:
    from .text import features_from_text

    try:
        return features_from_text(text)
    except ValueError as error:
        raise InvalidLineError("no_token", f"the text has nothing to fingerprint: {error}") from None


def _event_fields(data: dict[str, Any], limits: EventLimits, default_id: str | None) -> dict[str, str]:
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
            raise InvalidLineError("bad_type", "give features or text, not both")
        if not isinstance(data["text"], str):
            raise InvalidLineError("bad_type", f"text must be a JSON string, got {type(data['text']).__name__}")
        fields["features"] = json.dumps(_bag_from_text(data["text"]), ensure_ascii=False, separators=(",", ":"))
    elif "features" in data:
        features = data["features"]
        fields["features"] = (
            features if isinstance(features, str) else json.dumps(features, ensure_ascii=False, separators=(",", ":"))
        )
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
                return _event_fields(data, limits, f"{id_prefix}{number}")
        bag = _bag_from_text(line)
        features = json.dumps(bag, ensure_ascii=False, separators=(",", ":"))
        return _validated({"incident_id": f"{id_prefix}{number}", "features": features}, limits)
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
    return _event_fields(data, limits, None)


def _read_lines(source: IO[bytes], progress: _Progress) -> Iterator[tuple[int, str | InvalidLineError]]:
    """Numbered non-blank lines of the input, decoded (an undecodable line comes as its error)."""
    for number, raw in enumerate(source, 1):
        progress.read(len(raw))
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


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (at most ten times a second)."""

    def __init__(self, total_bytes: int | None, enabled: bool) -> None:
        self.total = total_bytes
        self.enabled = enabled
        self.done_bytes = 0
        self.published = 0
        self.skipped = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._shown = False

    def read(self, count: int) -> None:
        self.done_bytes += count

    def update(self, published: int, skipped: int) -> None:
        self.published, self.skipped = published, skipped
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.published / max(now - self.started, 1e-9)
        text = f"{self.published:,} published, {self.skipped:,} skipped, {rate:,.0f}/s"
        if self.total:
            share = min(1.0, self.done_bytes / self.total)
            filled = int(share * 30)
            text = f"[{'#' * filled}{'.' * (30 - filled)}] {share:4.0%}  " + text
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False
            self._drawn = 0.0


@dataclass
class _PublishReport:
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


def cmd_publish(args: argparse.Namespace, settings: Settings) -> int:
    limits = settings.event_limits
    if args.id_prefix is not None and not args.text:
        raise UsageError("--id-prefix names the incidents of --text lines; JSON lines carry their own incident_id")
    source, size, name = _open_input(args.file)
    id_prefix = args.id_prefix if args.id_prefix is not None else f"{name}:"
    client = _client(settings, "publish")
    report = _PublishReport(settings.events)
    progress = _Progress(size, enabled=sys.stderr.isatty())

    def invalid(number: int, error: InvalidLineError) -> None:
        report.skipped += 1
        report.errors.append({"line": number, "reason": error.reason, "detail": error.detail})
        if len(report.errors) <= SHOWN_ERRORS:
            progress.clear()
            _say("publish", f"line {number}: {error.reason}: {_shown(error.detail)}")
            if len(report.errors) == SHOWN_ERRORS:
                _say("publish", "more invalid lines are not shown one by one; the summary counts them")

    def parsed() -> Iterator[tuple[int, dict[str, str]]]:
        for number, line in _read_lines(source, progress):
            report.lines += 1
            if isinstance(line, InvalidLineError):
                invalid(number, line)
                continue
            try:
                yield number, _parse_line(line, number, text_mode=args.text, id_prefix=id_prefix, limits=limits)
            except InvalidLineError as error:
                invalid(number, error)

    def send(chunk: list[tuple[int, dict[str, str]]]) -> None:
        pipe = client.pipeline(transaction=False)
        for _, fields in chunk:
            pipe.xadd(settings.events, cast(dict[Any, Any], fields))
        entry_ids = [replies.text(entry_id) for entry_id in pipe.execute()]
        report.first_entry = report.first_entry or entry_ids[0]
        report.last_entry = entry_ids[-1]
        report.published += len(chunk)
        report.last_line = chunk[-1][0]
        progress.update(report.published, report.skipped)

    try:
        events: Iterable[tuple[int, dict[str, str]]] = parsed()
        if args.strict:
            events = list(events)  # every line is checked before anything is sent
            if report.skipped:
                progress.clear()
                _say(
                    "publish",
                    f"nothing was published: {_plural(report.skipped, 'invalid line')} of "
                    f"{report.lines:,} (--strict); fix them, or drop --strict to skip them",
                )
                if args.json:
                    print(_json(report.as_json()))
                return EXIT_FAILURE
        chunk: list[tuple[int, dict[str, str]]] = []
        for item in events:
            chunk.append(item)
            if len(chunk) >= args.chunk_size:
                send(chunk)
                chunk = []
        if chunk:
            send(chunk)
    except (redis.RedisError, KeyboardInterrupt) as error:
        progress.clear()
        what = "interrupted" if isinstance(error, KeyboardInterrupt) else f"Redis failed: {redact(str(error))}"
        _say(
            "publish",
            f"{what} after publishing {_plural(report.published, 'event')} (input lines 1 to {report.last_line}); "
            f"the next chunk may be partly in {settings.events}. Sending the rest again from line "
            f"{report.last_line + 1} is safe: an event repeated with the same bag changes nothing",
        )
        if args.json:
            print(_json(report.as_json()))
        return EXIT_FAILURE
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    progress.clear()
    if args.json:
        print(_json(report.as_json()))
        return EXIT_OK
    seconds = time.monotonic() - report.started
    rate = f" ({report.published / seconds:,.0f}/s)" if seconds > 0 and report.published else ""
    summary = f"published {_plural(report.published, 'event')} to {settings.events} in {seconds:.2f} s{rate}"
    if report.skipped:
        summary += f"; skipped {_plural(report.skipped, 'invalid line')}"
    if report.first_entry:
        summary += f"; entries {report.first_entry} .. {report.last_entry}"
    print(summary)
    return EXIT_OK


def _register_publish(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "publish",
        summary="append incident events to the events stream from a JSON Lines file or stdin",
        description="Append incident events to the events stream, one a line: a JSON object "
        '{"incident_id": "47", "features": {"disk": 2, "full": 1}} with an optional "op" (add, upsert, delete), '
        'or {"incident_id": "47", "text": "disk full on web-3"} whose text becomes the bag. With --text each line '
        "is plain text (a log line, an incident title) turned into a bag of words, its ID the prefix and the line "
        'number; a JSON line with a "text" key is read as above. Every line is validated as the worker would '
        "validate it: invalid lines are reported with their number and reason and skipped (or, with --strict, "
        "nothing is sent). Events go out in pipelined chunks; a progress bar shows on a terminal.",
        examples="""
  incident-worker publish incidents.jsonl
  incident-worker publish --strict --json incidents.jsonl      # all or nothing; summary as JSON
  tail -n 1000 app.log | incident-worker publish --text --id-prefix app-2024-05-01:
  echo '{"incident_id": "47", "op": "delete"}' | incident-worker publish -
""",
        exits="""
  0  the input was read and every valid line published (invalid ones skipped and reported)
  1  --strict and some line was invalid (nothing sent), or Redis failed part-way (the message says how far)
  2  bad usage: unreadable file, invalid settings
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
        help="each line is plain text, turned into a bag of words (worker.text.features_from_text)",
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
        "--chunk-size",
        type=_positive_arg,
        default=PUBLISH_CHUNK,
        metavar="N",
        help=f"events per pipelined round trip (default {PUBLISH_CHUNK})",
    )
    _json_flag(parser, "the summary (published, skipped, seconds, first errors) as one JSON object")
    add_settings_flags(
        parser, only=[*_CONNECTION, "events_stream", "max_tokens", "max_token_length", "max_entry_bytes"]
    )
    parser.set_defaults(handler=_guarded("publish")(cmd_publish))


# -- query ----------------------------------------------------------------------------------------------------


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():
        raise UsageError(
            f"no {what} given: pass --features '{{\"disk\": 2, \"full\": 1}}' or --text 'disk full on web-3', "
            "or pipe the bag (JSON) into standard input"
        )
    return sys.stdin.read()


def _query_bag(args: argparse.Namespace) -> dict[str, int]:
    """The bag to look up, from --features (JSON), --text, or standard input (JSON)."""
    if args.text is not None:
        text = _read_stdin("text") if args.text == "-" else args.text
        try:
            return _bag_from_text(text)
        except InvalidLineError as error:
            raise UsageError(f"--text: {error.detail}") from None
    raw = args.features if args.features not in (None, "-") else _read_stdin("bag")
    try:
        bag = json.loads(raw)
    except ValueError as error:
        raise UsageError(
            f"the bag is not valid JSON ({error}); give an object of token -> weight, "
            'e.g. --features \'{"disk": 2, "full": 1}\''
        ) from None
    try:
        fingerprint(bag)
    except InvalidFeaturesError as error:
        raise UsageError(f"invalid bag: {error}") from None
    return bag


def _match_rows(index: FingerprintIndex, matches: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    stored = index.fingerprints_of([incident_id for incident_id, _ in matches])
    return [
        {
            "incident_id": incident_id,
            "distance": dist,
            "fingerprint": format_fingerprint(fp) if (fp := stored.get(incident_id)) is not None else None,
        }
        for incident_id, dist in matches
    ]


def _print_table(
    rows: Sequence[Sequence[Any]], header: Sequence[str], indent: str = "", right: Sequence[int] = ()
) -> None:
    """Columns padded to their widest cell; the columns numbered in `right` (numbers) aligned right."""
    shown = [[_shown(str(cell)) for cell in row] for row in rows]
    widths = [max(len(header[i]), *(len(row[i]) for row in shown)) for i in range(len(header))]
    for cells in [list(header), *shown]:
        padded = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        print(indent + "  ".join(padded).rstrip())


def _print_matches(rows: list[dict[str, Any]], indent: str = "") -> None:
    _print_table(
        [(r["incident_id"], r["distance"], r["fingerprint"] or "?") for r in rows],
        ("INCIDENT_ID", "DISTANCE", "FINGERPRINT"),
        indent,
        right=(1,),
    )


def cmd_query(args: argparse.Namespace, settings: Settings) -> int:
    bag = _query_bag(args)
    fp = fingerprint(bag)
    client = _client(settings, "query")
    index, _ = _stored_index(client, settings)
    limit = args.limit
    rows: list[dict[str, Any]] = []
    indexed = 0
    if index is None:
        limit = settings.max_distance if limit is None else limit
    else:
        if limit is None:
            limit = index.layout.max_distance
        elif limit > index.layout.max_distance:
            raise UsageError(
                f"--max-distance {limit} is beyond this index's max distance {index.layout.max_distance}: its bands "
                f"only guarantee finding neighbours up to {index.layout.max_distance}; use 0 to "
                f"{index.layout.max_distance}"
            )
        rows = _match_rows(index, index.neighbours_of(fp, limit))
        indexed = len(index)
    if args.json:
        print(
            _json(
                {
                    "namespace": settings.namespace,
                    "fingerprint": format_fingerprint(fp),
                    "features": bag,
                    "max_distance": limit,
                    "indexed": indexed,
                    "match_count": len(rows),
                    "matches": rows,
                }
            )
        )
        return EXIT_OK
    print(
        f"bag of {_plural(len(bag), 'token')}, fingerprint {format_fingerprint(fp)}; "
        f"index {settings.keys.tag} holds {_plural(indexed, 'incident')}"
    )
    if index is None:
        print(
            f"no match within {limit}: the index has no layout yet ({settings.keys.meta} is missing; "
            "the first worker writes it)"
        )
    elif not rows:
        print(f"no match within {limit}")
    else:
        _print_matches(rows)
        print(f"{_plural(len(rows), 'match', 'matches')} within {limit}")
    return EXIT_OK


def _register_query(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "query",
        summary="the indexed incidents near a bag or a text, without indexing it",
        description="Print every indexed incident within the max distance of a bag of features (or of a text's bag "
        "of words), closest first, without indexing anything. The bag is JSON: --features, or standard input. "
        "Uses the layout the index was built with ({N}:meta).",
        examples="""
  incident-worker query --features '{"dock": 3, "scanner": 2, "timeout": 1}'
  incident-worker query --text 'Disk full on /var/log at web-3' --max-distance 3
  jq -c .features incident.json | incident-worker query --json
""",
        exits="""
  0  the query ran, whether or not anything matched ("no match within N")
  1  Redis failed
  2  bad usage: invalid bag or text, --max-distance beyond the index's
""",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--features", metavar="JSON", help="the bag: a JSON object token -> weight (- = stdin)")
    source.add_argument(
        "--text", metavar="TEXT", help="a text (log line, title) whose bag of words is looked up (- = stdin)"
    )
    parser.add_argument(
        "--max-distance",
        dest="limit",
        type=_distance_arg,
        metavar="N",
        help="report matches within N only (at most the index's max distance, which is the default)",
    )
    _json_flag(parser, "the fingerprint, the bag and the matches as one JSON object")
    add_settings_flags(parser, only=_CONNECTION)
    parser.set_defaults(handler=_guarded("query")(cmd_query))


# -- inspect --------------------------------------------------------------------------------------------------


def _bits(fp: int, index: FingerprintIndex) -> str:
    """The 64 bits, most significant first, a space between bands (the last band first)."""
    layout = index.layout
    groups = [format(value, f"0{width}b") for value, width in zip(layout.values(fp), layout.widths, strict=True)]
    return " ".join(reversed(groups))


def cmd_inspect(args: argparse.Namespace, settings: Settings) -> int:
    client = _client(settings, "inspect")
    index, _ = _stored_index(client, settings)
    fp = index.get(args.incident_id) if index is not None else None
    if index is None or fp is None:
        raise CommandError(
            f"incident {_shown(args.incident_id)!r} is not indexed in namespace {settings.namespace!r} "
            f"(no field in {settings.keys.fingerprints}); if it was published, see `incident-worker dead` "
            "for why it may not have been processed"
        )
    postings = index.postings(args.incident_id, fp)
    rows = _match_rows(index, [m for m in index.neighbours_of(fp) if m[0] != args.incident_id])
    if args.json:
        print(
            _json(
                {
                    "namespace": settings.namespace,
                    "incident_id": args.incident_id,
                    "fingerprint": format_fingerprint(fp),
                    "bits": _bits(fp, index),
                    "layout": index.layout.description,
                    "bands": [
                        {
                            "band": p.band,
                            "offset": p.offset,
                            "width": p.width,
                            "value": f"{p.value:0{-(-p.width // 4)}x}",
                            "bits": format(p.value, f"0{p.width}b"),
                            "key": p.key,
                            "size": p.size,
                            "member": p.member,
                        }
                        for p in postings
                    ],
                    "max_distance": index.layout.max_distance,
                    "neighbours": rows,
                }
            )
        )
        return EXIT_OK
    print(f"incident {_shown(args.incident_id)} in {settings.keys.tag}")
    print(f"  fingerprint  {format_fingerprint(fp)}")
    print(f"  bits         {_bits(fp, index)}")
    print(f"               (band {index.layout.bands - 1} .. band 0, most significant bit first)")
    print(f"  layout       {index.layout.description}")
    print()
    _print_table(
        [
            (
                p.band,
                f"{p.offset}..{p.offset + p.width - 1}",
                f"{p.value:0{-(-p.width // 4)}x}",
                p.key,
                p.size,
                "yes" if p.member else "NO (index inconsistent)",
            )
            for p in postings
        ],
        ("BAND", "BITS", "VALUE", "POSTING KEY", "SIZE", "MEMBER"),
        "  ",
        right=(0, 4),
    )
    print()
    if rows:
        print(f"{_plural(len(rows), 'neighbour')} within {index.layout.max_distance}:")
        _print_matches(rows, "  ")
    else:
        print(f"no other incident within {index.layout.max_distance}")
    missing = [p.key for p in postings if not p.member]
    if missing:
        _say("inspect", f"the incident is missing from {len(missing)} of its posting sets; queries may miss it")
        return EXIT_FAILURE
    return EXIT_OK


def _register_inspect(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "inspect",
        summary="an indexed incident: fingerprint, bands, posting sets, neighbours",
        description="Show what the index holds for one incident: its fingerprint (hex, and the 64 bits grouped by "
        "band), each band's value with its posting key and that set's size, and its current neighbours.",
        examples="""
  incident-worker inspect 47
  incident-worker inspect --namespace staging INC-2024-0042 --json | jq .neighbours
""",
        exits="""
  0  shown
  1  the incident is not indexed (or is missing from a posting set of its own), or Redis failed
  2  bad usage
""",
    )
    parser.add_argument("incident_id", metavar="ID", help="the incident ID, as in the events")
    _json_flag(parser, "the fingerprint, bands and neighbours as one JSON object")
    add_settings_flags(parser, only=_CONNECTION)
    parser.set_defaults(handler=_guarded("inspect")(cmd_inspect))


# -- stats ----------------------------------------------------------------------------------------------------


def _dead_reasons(client: RedisClient, stream: str, limit: int) -> tuple[Counter[str], int, bool]:
    """Dead letters by reason, newest first, reading at most `limit`; also how many were read and if that capped."""
    reasons: Counter[str] = Counter()
    scanned = 0
    for _, fields in replies.entries(client, stream, reverse=True, limit=limit + 1, page=1000):
        if scanned == limit:
            return reasons, scanned, True
        reasons[replies.text(fields.get(b"reason", fields.get("reason", b"?")))] += 1
        scanned += 1
    return reasons, scanned, False


def _recommendation(count: int, bands: int, max_distance: int) -> tuple[int, str]:
    best = recommend_bands(count, max_distance)
    if count == 0:
        return best, "no incidents yet: the best band count depends on the size the index grows to"
    if best == bands:
        return best, f"{bands} bands suit {_plural(count, 'incident')}: the layout in use"
    if best < bands:
        why = (
            "fewer, wider bands mean fewer candidates to verify per query, at the price of more and smaller "
            "posting sets: more memory per incident"
        )
    else:
        why = (
            "more, narrower bands mean fewer probe keys per query, at the price of one more posting-set "
            "membership per incident for each band added: more memory per incident"
        )
    return best, (
        f"{best} bands would cost less Redis time per query than {bands} at {_plural(count, 'incident')}: {why}. "
        "A new layout needs a new namespace, built by replaying the events (measure first: incident-worker bench)"
    )


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    client = _client(settings, "stats")
    index, meta = _stored_index(client, settings)
    now = time.time()
    if index is not None:
        index_stats = index.stats()
        stored = (index.layout.bands, index.layout.max_distance)
    else:
        index_stats = {
            "namespace": settings.namespace,
            "incidents": int(client.hlen(settings.keys.fingerprints)),
            "layout": None,
            "meta": {},
        }
        stored = (settings.bands, settings.max_distance)
    count = int(index_stats["incidents"])
    best, advice = _recommendation(count, *stored)
    configured = {"bands": settings.bands, "max_distance": settings.max_distance}
    mismatch = index is not None and (settings.bands, settings.max_distance) != stored
    streams: dict[str, dict[str, Any]] = {
        "events": {"key": settings.events, "length": _stream_length(client, settings.events)},
        "alerts": {"key": settings.alerts, "length": _stream_length(client, settings.alerts)},
        "dead": {"key": settings.dead, "length": _stream_length(client, settings.dead)},
    }
    group = _group_info(client, settings.events, settings.group)
    consumers: list[dict[str, Any]] = []
    group_json: dict[str, Any] | None = None
    if group is not None:
        lag = group.get("lag")
        group_json = {
            "name": settings.group,
            "lag": None if lag is None else int(lag),
            "pending": int(group.get("pending", 0)),
            "last_delivered_id": group.get("last-delivered-id", ""),
            "entries_read": group.get("entries-read"),
        }
        for info in replies.consumers_info(client, settings.events, settings.group):
            inactive = info.get("inactive")
            consumers.append(
                {
                    "name": info["name"],
                    "pending": int(info.get("pending", 0)),
                    "idle_ms": int(info.get("idle", 0)),
                    "inactive_ms": None if inactive is None else int(inactive),
                }
            )
    reasons, scanned, capped = _dead_reasons(client, settings.dead, args.dead_scan)
    beats = _heartbeats(client, settings.keys)
    if args.json:
        print(
            _json(
                {
                    "namespace": settings.namespace,
                    "redis": settings.safe_redis_url,
                    "index": index_stats,
                    "configured_layout": configured,
                    "layout_mismatch": mismatch,
                    "recommended_bands": best,
                    "recommendation": advice,
                    "streams": streams,
                    "group": group_json,
                    "consumers": consumers,
                    "workers": [beat.model_dump(exclude_none=True) for beat in beats],
                    "dead_letters": {"by_reason": dict(reasons.most_common()), "scanned": scanned, "capped": capped},
                }
            )
        )
        return EXIT_OK
    print(f"index {settings.keys.tag} at {settings.safe_redis_url}")
    print(f"  incidents    {count:,}")
    if index is None:
        print(
            f"  layout       none yet ({settings.keys.meta} is written by the first worker); configured: "
            f"bands={settings.bands}, max_distance={settings.max_distance}"
        )
    else:
        built = meta.get("created_at", "?")
        print(
            f"  layout       {index_stats['layout']} (built {built}, {meta.get('scheme', '?')}, format "
            f"{meta.get('format_version', '?')})"
        )
        if mismatch:
            print(
                f"  WARNING      configured bands={settings.bands}, max_distance={settings.max_distance} differ "
                "from the stored layout: a worker with this configuration refuses to start"
            )
    if "used_memory" in index_stats:
        per = index_stats.get("used_memory_per_incident")
        memory = f"Redis uses {_size(index_stats['used_memory'])} in all"
        if per is not None:
            memory += f", {_size(per)} per incident (the whole server, streams included)"
        if "fingerprint_hash_bytes" in index_stats:
            memory += f"; the fingerprint hash {_size(index_stats['fingerprint_hash_bytes'])}"
        print(f"  memory       {memory}")
    print(f"  bands        {advice}")
    print("streams")
    _print_table(
        [(name, stream["key"], f"{stream['length']:,}") for name, stream in streams.items()],
        ("STREAM", "KEY", "ENTRIES"),
        "  ",
        right=(2,),
    )
    if group_json is None:
        print(f"consumer group {settings.group!r}: not created yet (the first worker creates it)")
    else:
        lag_text = "unknown (entries were deleted)" if group_json["lag"] is None else f"{group_json['lag']:,}"
        print(
            f"consumer group {settings.group!r}: lag {lag_text}, pending {group_json['pending']:,}, "
            f"last delivered {group_json['last_delivered_id']}"
        )
        if consumers:
            _print_table(
                [(c["name"], c["pending"], _duration(c["idle_ms"] / 1000)) for c in consumers],
                ("CONSUMER", "PENDING", "IDLE"),
                "  ",
                right=(1, 2),
            )
    if beats:
        print(f"workers alive (heartbeat keys): {len(beats)}")
        for beat in beats:
            at, started = beat.at, beat.started
            ago = "beating" if at is None else f"last beat {_duration(max(0.0, now - at))} ago"
            up = "" if started is None else f", up {_duration(max(0.0, now - started))}"
            processed = "?" if beat.processed is None else beat.processed
            print(f"  {_shown(beat.consumer)}: {ago}{up}, processed {processed}")
    else:
        print("workers alive (heartbeat keys): none")
    if not scanned:
        print("dead letters: none")
    else:
        scope = (
            f"the newest {scanned:,} of {streams['dead']['length']:,} read (--dead-scan)"
            if capped
            else f"all {scanned:,}"
        )
        print(f"dead letters by reason ({scope})")
        _print_table(list(reasons.most_common()), ("REASON", "COUNT"), "  ", right=(1,))
    return EXIT_OK


def _register_stats(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "stats",
        summary="index size, layout, memory, band advice, streams, consumer group, workers, dead letters",
        description="One look at a namespace: incidents indexed, the layout stored in {N}:meta, Redis memory per "
        "incident, the band count that would cost least at this size, the length of the events, alerts and dead "
        "streams, the consumer group's lag and pending entries, each consumer's pending count and idle time, the "
        "workers whose heartbeat is alive, and the dead letters counted by reason.",
        examples="""
  incident-worker stats
  incident-worker stats --json | jq '.group.lag, .dead_letters.by_reason'
  INCIDENT_WORKER_REDIS_URL=redis://redis:6379/0 incident-worker stats --namespace staging
""",
        exits="""
  0  shown
  1  Redis failed
  2  bad usage or settings
""",
    )
    parser.add_argument(
        "--dead-scan",
        type=_positive_arg,
        default=DEAD_SCAN_LIMIT,
        metavar="N",
        help=f"read at most the N newest dead letters to count reasons (default {DEAD_SCAN_LIMIT:,})",
    )
    _json_flag(parser, "everything as one JSON object")
    add_settings_flags(
        parser, only=[*_CONNECTION, "group", "events_stream", "alerts_stream", "dead_stream", "bands", "max_distance"]
    )
    parser.set_defaults(handler=_guarded("stats")(cmd_stats))


# -- alerts ---------------------------------------------------------------------------------------------------


class _AlertPrinter:
    """Prints one alert entry the way a subscriber reads it; an entry that is not an alert is reported, not shown."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.printed = 0

    def __call__(self, entry_id: str, fields: Mapping[Any, Any] | None) -> None:
        if fields is None:  # deleted from the stream while pending in our group
            return
        try:
            alert = Alert.from_fields(fields)
        except ValidationError as error:
            _say("alerts", f"entry {entry_id} is not a valid alert, skipped: {error.errors()[0]['msg']}")
            return
        self.printed += 1
        if self.as_json:
            print(
                _json({"entry_id": entry_id, "time": replies.entry_time_text(entry_id), **alert.model_dump()}),
                flush=True,
            )
            return
        shown = ", ".join(f"{_shown(m.incident_id)} ({m.distance})" for m in alert.matches[:5])
        more = alert.match_count - min(5, len(alert.matches))
        if more > 0:
            shown += f" and {more:,} more"
        print(
            f"{replies.entry_time_text(entry_id)}  {entry_id}  incident {_shown(alert.incident_id)} ({alert.op}, "
            f"fp {alert.fingerprint}): {_plural(alert.match_count, 'match', 'matches')} within "
            f"{alert.max_distance}: {shown}",
            flush=True,
        )


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _alerts_backlog(client: RedisClient, stream: str, args: argparse.Namespace, emit: _AlertPrinter) -> str:
    """Print the newest --count alerts, or those after --since; returns the ID to follow from."""
    if args.since is not None:
        if "-" in args.since:  # an entry ID: what came after it
            start, last = "(" + args.since, args.since
        else:  # a time in milliseconds: from that time on; following starts just before it
            millis = int(args.since)
            start, last = f"{millis}-0", f"{millis - 1}-{2**64 - 1}" if millis else "0-0"
        for last, fields in replies.entries(client, stream, start, limit=args.count):
            emit(last, fields)
        return last
    count = 10 if args.count is None else args.count
    newest = client.xrevrange(stream, "+", "-", count=max(count, 1))
    if not newest:
        return "0-0"  # nothing yet: follow from the very start, so an alert added now is not missed
    for entry_id, raw in reversed(newest[:count]):
        emit(replies.text(entry_id), raw or {})
    return replies.text(newest[0][0])


def _alerts_group(client: RedisClient, stream: str, args: argparse.Namespace, emit: _AlertPrinter) -> None:
    """Read as a consumer of a group of the alerts stream: own pending alerts first, then new ones; ack each batch."""
    group, consumer = args.subscriber_group, args.consumer_name
    try:
        client.xgroup_create(stream, group, id="0" if args.from_start else "$", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise
        if args.from_start:
            _say("alerts", f"group {group!r} exists already; --from-start applies only when creating it")
    left = args.count
    cursor = "0"  # first this consumer's pending alerts (printed before a crash, never acknowledged), then new ones
    while left is None or left > 0:
        block = FOLLOW_BLOCK_MS if args.follow and cursor == ">" else None
        size = 100 if left is None else min(100, left)
        entries = replies.stream_entries(client.xreadgroup(group, consumer, {stream: cursor}, count=size, block=block))
        if not entries:
            if cursor != ">":
                cursor = ">"
                continue
            if args.follow:
                continue
            return
        for entry_id, fields in entries:
            emit(entry_id, fields)
        client.xack(stream, group, *[entry_id for entry_id, _ in entries])
        if cursor != ">":
            cursor = entries[-1][0]
        if left is not None:
            left -= len(entries)


def cmd_alerts(args: argparse.Namespace, settings: Settings) -> int:
    if args.since is not None and not _SINCE.match(args.since):
        raise UsageError(
            f"--since {args.since!r} is not a stream entry ID like 1714564800123-0 (or a time in "
            "milliseconds like 1714564800123); use the entry_id of the last alert you saw"
        )
    if args.subscriber_group is not None:
        if args.since is not None:
            raise UsageError(
                "--since does not apply with --group: the group remembers what it has read; "
                "use --from-start when the group is first created to begin with the oldest alert"
            )
        if not args.subscriber_group or any(c.isspace() for c in args.subscriber_group):
            raise UsageError(f"--group {args.subscriber_group!r} must be a non-empty name without spaces")
    elif args.from_start:
        raise UsageError(
            "--from-start needs --group (it sets where a new group starts); without a group, "
            "use --since 0 for every alert"
        )
    client = _client(settings, "alerts")
    emit = _AlertPrinter(args.json)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.subscriber_group is not None:
            _alerts_group(client, settings.alerts, args, emit)
            if not emit.printed and not args.json:
                _say("alerts", f"no new alerts for group {args.subscriber_group!r} in {settings.alerts}")
            return EXIT_OK
        last = _alerts_backlog(client, settings.alerts, args, emit)
        if not emit.printed and not args.json:
            waiting = "; waiting for new ones (Ctrl-C to stop)" if args.follow else ""
            _say(
                "alerts", f"no alerts {'after ' + args.since + ' ' if args.since else ''}in {settings.alerts}" + waiting
            )
        while args.follow:
            for entry_id, fields in replies.stream_entries(
                client.xread({settings.alerts: last}, count=100, block=FOLLOW_BLOCK_MS)
            ):
                emit(entry_id, fields)
                last = entry_id
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def _register_alerts(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "alerts",
        summary="print the alerts stream as a subscriber sees it (newest, since an ID, following, or as a group)",
        description="Print near-duplicate alerts, one a line: the newest --count (default 10), or every alert "
        "after --since ID. --follow keeps waiting for new ones until Ctrl-C or SIGTERM (exit 0). --group NAME reads "
        "as a consumer group of its own on the alerts stream (created at the stream's end, or at its start with "
        "--from-start), acknowledging each alert once printed: every subscriber group sees each alert, each "
        "alert is printed once per group, and an alert printed just before a crash is printed again on restart.",
        examples="""
  incident-worker alerts --count 20
  incident-worker alerts --since 1714564800123-0 --json
  incident-worker alerts --follow --json | jq -c 'select(.match_count > 3)'
  incident-worker alerts --group pager --follow          # one group per subscribing system
""",
        exits="""
  0  printed (also after Ctrl-C or SIGTERM while following)
  1  Redis failed
  2  bad usage: --since not an entry ID, --since with --group, --from-start without --group
""",
    )
    parser.add_argument(
        "--count",
        type=_count_arg,
        metavar="N",
        help="newest N alerts (default 10); with --since, at most N; with --group, take at most N alerts then exit",
    )
    parser.add_argument(
        "--since",
        metavar="ID",
        help="alerts after this entry ID (exclusive), e.g. the last "
        "entry_id seen; a bare millisecond time means from that time on; 0 for all",
    )
    parser.add_argument("--follow", "-f", action="store_true", help="after the backlog, wait for new alerts")
    parser.add_argument(
        "--group",
        dest="subscriber_group",
        metavar="NAME",
        help="read as this consumer group of the alerts stream, acknowledging what is printed "
        "(each alert once per group)",
    )
    parser.add_argument(
        "--consumer",
        dest="consumer_name",
        default=socket.gethostname(),
        metavar="NAME",
        help="with --group: this reader's name in the group; keep it stable across restarts so "
        "unacknowledged alerts come back (default: the host name)",
    )
    parser.add_argument(
        "--from-start",
        action="store_true",
        help="with --group: create the group at the oldest alert instead of the stream's end",
    )
    _json_flag(parser, "each alert as a JSON object, one a line (JSON Lines)")
    add_settings_flags(parser, only=[*_CONNECTION, "alerts_stream"])
    parser.set_defaults(handler=_guarded("alerts")(cmd_alerts))


# -- dead and dead replay -------------------------------------------------------------------------------------

_OWN_FIELDS = {name.encode() for name in DEAD_LETTER_FIELDS}


def _original_fields(raw: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """The dead-lettered entry's own fields, raw, with their names as they were (see DeadLetter.to_fields)."""
    return {name.removeprefix(b"original_"): value for name, value in raw.items() if name not in _OWN_FIELDS}


def _letter_json(entry_id: str, letter: DeadLetter) -> dict[str, Any]:
    return {"entry_id": entry_id, "time": replies.entry_time_text(entry_id), **letter.model_dump()}


def _print_letter(entry_id: str, letter: DeadLetter) -> None:
    print(f"{replies.entry_time_text(entry_id)}  {entry_id}  {letter.reason}: {_shown(letter.detail)}")
    print(
        f"    from {letter.source_stream} entry {letter.source_entry}, consumer {_shown(letter.consumer)}, "
        f"delivered {_plural(letter.deliveries, 'time')}"
    )
    if not letter.original:
        print("    original: (no fields: the entry was gone before it was processed)")
    for name, value in letter.original.items():
        text = _shown(value)
        if len(text) > 200:
            text = text[:200] + f"... ({len(value):,} characters)"
        print(f"    {_shown(name)} = {text}")


def cmd_dead(args: argparse.Namespace, settings: Settings) -> int:
    client = _client(settings, "dead")
    total = _stream_length(client, settings.dead)
    found: list[tuple[str, DeadLetter]] = []
    for entry_id, fields in replies.entries(client, settings.dead, reverse=True):
        try:
            letter = DeadLetter.from_fields(fields)
        except ValidationError as error:
            _say("dead", f"entry {entry_id} is not a dead letter, skipped: {error.errors()[0]['msg']}")
            continue
        if args.reason is None or letter.reason == args.reason:
            found.append((entry_id, letter))
            if args.count and len(found) >= args.count:
                break
    found.reverse()
    for entry_id, letter in found:
        if args.json:
            print(_json(_letter_json(entry_id, letter)))
        else:
            _print_letter(entry_id, letter)
    if not args.json:
        which = f" with reason {args.reason!r}" if args.reason else ""
        if not found:
            print(f"no dead letters{which} in {settings.dead} ({_plural(total, 'entry', 'entries')} in all)")
        else:
            print(
                f"{_plural(len(found), 'dead letter')}{which} shown, newest last; {settings.dead} holds "
                f"{_plural(total, 'entry', 'entries')}. After fixing the cause, re-queue them with: "
                "incident-worker dead replay ID... | --reason R | --all"
            )
    return EXIT_OK


@dataclass
class _Replay:
    replayed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


def _replay_transaction(
    client: RedisClient,
    settings: Settings,
    read: Callable[[Any], list[tuple[str, Any]]],
    wanted: Callable[[DeadLetter], bool],
    dry_run: bool,
    report: _Replay,
) -> list[tuple[str, Any]]:
    """Read dead letters under WATCH, then re-add their originals to the events stream and delete them, in one
    MULTI/EXEC: a crash or a concurrent replay can neither lose a letter nor queue it twice. Returns what was read."""
    with client.pipeline(transaction=True) as pipe:
        for _ in range(WATCH_RETRIES):
            try:
                pipe.watch(settings.dead)
                entries = read(pipe)
                chosen: list[tuple[str, DeadLetter, dict[bytes, bytes]]] = []
                skipped: list[dict[str, Any]] = []
                for entry_id, fields in entries:
                    if fields is None:
                        skipped.append({"dead_entry": entry_id, "why": "not found in the dead-letter stream"})
                        continue
                    try:
                        letter = DeadLetter.from_fields(fields)
                    except ValidationError:
                        skipped.append({"dead_entry": entry_id, "why": "not a dead letter"})
                        continue
                    if not wanted(letter):
                        continue
                    original = _original_fields(fields)
                    if not original:
                        skipped.append(
                            {
                                "dead_entry": entry_id,
                                "why": "no original fields to replay (the entry was deleted before it was processed)",
                            }
                        )
                        continue
                    chosen.append((entry_id, letter, original))
                if dry_run or not chosen:
                    pipe.unwatch()
                    new_ids: list[str | None] = [None] * len(chosen)
                else:
                    pipe.multi()
                    for entry_id, _, original in chosen:
                        pipe.xadd(settings.events, cast(dict[Any, Any], original))
                        pipe.xdel(settings.dead, entry_id)
                    results = pipe.execute()
                    new_ids = [replies.text(result) for result in results[0::2]]
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
                    }
                )
            return entries
    raise CommandError(
        f"{settings.dead} changed under every one of {WATCH_RETRIES} attempts to replay a chunk; "
        "try again when the workers are quieter"
    )


def cmd_dead_replay(args: argparse.Namespace, settings: Settings) -> int:
    selectors = sum([bool(args.ids), args.replay_reason is not None, args.all])
    if selectors != 1:
        raise UsageError(
            "choose what to replay, one way: dead-letter entry IDs (as `incident-worker dead` shows "
            "them), --reason R, or --all"
        )
    bad = [entry_id for entry_id in args.ids if not _ENTRY_ID.match(entry_id)]
    if bad:
        raise UsageError(
            f"{bad[0]!r} is not a stream entry ID like 1714564800123-0; copy the IDs from `incident-worker dead`"
        )
    client = _client(settings, "dead replay")
    report = _Replay()
    if args.ids:
        ids = list(dict.fromkeys(args.ids))
        for start in range(0, len(ids), REPLAY_CHUNK):
            chunk = ids[start : start + REPLAY_CHUNK]

            def read_ids(pipe: Any, chunk: list[str] = chunk) -> list[tuple[str, Any]]:
                found = []
                for entry_id in chunk:
                    page = pipe.xrange(settings.dead, entry_id, entry_id)
                    found.append((entry_id, page[0][1] if page else None))
                return found

            _replay_transaction(client, settings, read_ids, lambda letter: True, args.dry_run, report)
    else:
        newest = client.xrevrange(settings.dead, "+", "-", count=1)
        # Only what is there now: an entry replayed now may fail again and come back, and must not loop.
        end = replies.text(newest[0][0]) if newest else None
        cursor = "-"
        while end is not None:

            def read_page(pipe: Any, cursor: str = cursor, end: str = end) -> list[tuple[str, Any]]:
                return [(replies.text(i), f) for i, f in pipe.xrange(settings.dead, cursor, end, count=REPLAY_CHUNK)]

            def wanted(letter: DeadLetter) -> bool:
                return args.all or letter.reason == args.replay_reason

            page = _replay_transaction(client, settings, read_page, wanted, args.dry_run, report)
            if len(page) < REPLAY_CHUNK:
                break
            cursor = "(" + page[-1][0]
    if args.json:
        print(
            _json(
                {
                    "dry_run": args.dry_run,
                    "events_stream": settings.events,
                    "replayed": report.replayed,
                    "skipped": report.skipped,
                }
            )
        )
    else:
        verb = "would replay" if args.dry_run else "replayed"
        for item in report.replayed:
            target = f" as {settings.events} {item['event_entry']}" if item["event_entry"] else ""
            incident = item["incident_id"]
            about = f", incident {_shown(incident)}" if incident is not None else ""
            print(f"{verb} {item['dead_entry']} ({item['reason']}{about}){target}")
        for item in report.skipped:
            _say("dead replay", f"{item['dead_entry']}: {item['why']}")
        count = _plural(len(report.replayed), "dead letter")
        if args.dry_run:
            print(f"dry run: {verb} {count}; nothing changed")
        elif report.replayed:
            print(f"{verb} {count} to {settings.events}: the workers process them as new entries")
        else:
            print("nothing to replay")
    return EXIT_FAILURE if report.skipped else EXIT_OK


def _register_dead(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "dead",
        summary="list dead letters (entries the worker could not process); `dead replay` re-queues them",
        description="List the dead-letter stream, newest last: each entry's reason (a machine code such as "
        "bad_json, bad_weight, duplicate_id, poison), the detail for people, the events-stream entry it came from, "
        "and the entry's original fields. After fixing the cause (the producer, a setting, a conflicting "
        "incident), `incident-worker dead replay` puts them back on the events stream.",
        examples="""
  incident-worker dead
  incident-worker dead --reason duplicate_id --count 0 --json | jq -r .original.incident_id
  incident-worker dead replay 1714564800123-0 1714564800456-0
  incident-worker dead replay --reason too_many_tokens --dry-run
""",
        exits="""
  0  listed
  1  Redis failed
  2  bad usage
""",
    )
    parser.add_argument("--reason", metavar="R", help="only dead letters with this reason")
    parser.add_argument(
        "--count",
        type=_count_arg,
        default=50,
        metavar="N",
        help="the newest N matching dead letters (default 50; 0 = all)",
    )
    _json_flag(parser, "each dead letter as a JSON object, one a line (JSON Lines)")
    add_settings_flags(parser, only=[*_CONNECTION, "dead_stream"])
    parser.set_defaults(handler=_guarded("dead")(cmd_dead))

    actions = parser.add_subparsers(dest="dead_action", metavar="ACTION")
    replay = _add_parser(
        actions,
        "replay",
        summary="re-queue dead letters on the events stream after a fix",
        description="Re-add the original fields of chosen dead letters to the events stream, exactly as they came "
        "(bytes and field names included), and delete each dead letter in the same MULTI/EXEC transaction: a "
        "crash or a second replay running at the same time can neither lose one nor queue it twice. Only the dead "
        "letters present when the command starts are considered, so entries that fail again are not looped.",
        examples="""
  incident-worker dead replay 1714564800123-0
  incident-worker dead replay --reason duplicate_id --dry-run
  incident-worker dead replay --all --json
""",
        exits="""
  0  every chosen dead letter was replayed (or would be, with --dry-run), or none matched
  1  a given ID was not found or had nothing to replay, or Redis failed
  2  bad usage: nothing chosen, more than one way of choosing, an ID that is not an entry ID
""",
    )
    replay.add_argument("ids", nargs="*", metavar="ID", help="dead-letter entry IDs, as `incident-worker dead` shows")
    replay.add_argument("--reason", dest="replay_reason", metavar="R", help="every dead letter with this reason")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    replay.add_argument("--dry-run", action="store_true", help="show what would be replayed; change nothing")
    _json_flag(replay, "what was replayed (and skipped) as one JSON object")
    add_settings_flags(replay, only=[*_CONNECTION, "events_stream", "dead_stream"])
    replay.set_defaults(handler=_guarded("dead replay")(cmd_dead_replay))


# -- check ----------------------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    explicit = "consumer" in vars(args) or f"{ENV_PREFIX}CONSUMER" in os.environ
    host = socket.gethostname()
    url = settings.safe_redis_url
    result: dict[str, Any] = {"healthy": False, "redis": url, "namespace": settings.namespace, "workers": []}

    def done(healthy: bool, message: str) -> int:
        result["healthy"], result["message"] = healthy, message
        if args.json:
            print(_json(result))
        elif healthy:
            print(f"healthy: {message}")
        else:
            print(f"unhealthy: {message}", file=sys.stderr)
        return EXIT_OK if healthy else EXIT_FAILURE

    try:
        client = _client(settings, "check", timeout=CHECK_TIMEOUT_S)
        client.ping()
        if args.redis_only:
            return done(True, f"Redis answers at {url}")
        if explicit:
            beats = _heartbeats(client, settings.keys, consumer=settings.consumer)
        else:
            beats = _heartbeats(client, settings.keys, host=host)
    except redis.RedisError as error:
        return done(False, f"Redis at {url} does not answer: {redact(str(error))}")
    result["workers"] = [beat.model_dump(exclude_none=True) for beat in beats]
    if not beats:
        where = settings.keys.heartbeat(settings.consumer) if explicit else settings.keys.heartbeat(f"{host}-*")
        whom = f"consumer {settings.consumer!r}" if explicit else f"any worker on host {host!r}"
        return done(
            False,
            f"no live heartbeat of {whom} ({where}): the worker is not running, has not started "
            "yet (use --redis-only for readiness), or stopped beating for longer than heartbeat_ttl_ms",
        )
    now = time.time()
    parts = []
    for beat in beats:
        at = beat.at
        ago = "beating" if at is None else f"beat {max(0.0, now - at):.1f} s ago"
        processed = "?" if beat.processed is None else beat.processed
        parts.append(f"{_shown(beat.consumer)} {ago}, processed {processed}")
    return done(True, f"Redis answers at {url}; " + "; ".join(parts))


def _register_check(commands: Any) -> None:
    parser = _add_parser(
        commands,
        "check",
        summary="health check for Docker HEALTHCHECK and Kubernetes probes",
        description="Exit 0 when Redis answers PING and this worker's heartbeat key is alive, else exit 1 with a "
        "one-line reason on stderr. The worker refreshes {N}:heartbeat:<consumer> (a key with a TTL of "
        "heartbeat_ttl_ms) while its loop runs and deletes it on a clean stop. With --consumer or "
        f"{ENV_PREFIX}CONSUMER set, that consumer's key is checked; otherwise any worker of this host (consumer "
        "names <hostname>-<pid>, the default) counts. Socket timeouts are 2 s.",
        examples="""
  HEALTHCHECK --interval=30s --timeout=5s CMD incident-worker check
  livenessProbe:  exec: {command: [incident-worker, check]}
  readinessProbe: exec: {command: [incident-worker, check, --redis-only]}
  incident-worker check --consumer worker-0 --json
""",
        exits="""
  0  healthy
  1  unhealthy: Redis does not answer, or no live heartbeat (reason on stderr)
  2  bad usage or settings
""",
    )
    parser.add_argument(
        "--redis-only",
        action="store_true",
        help="only check that Redis answers (readiness before the worker's first heartbeat)",
    )
    _json_flag(parser, "the verdict and the live heartbeats as one JSON object")
    add_settings_flags(parser, only=[*_CONNECTION, "consumer"])
    parser.set_defaults(handler=_guarded("check")(cmd_check))


# -- registration ---------------------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add the operator subcommands to the `incident-worker` parser's subparsers."""
    _register_publish(commands)
    _register_query(commands)
    _register_inspect(commands)
    _register_stats(commands)
    _register_alerts(commands)
    _register_dead(commands)
    _register_check(commands)
