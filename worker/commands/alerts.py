"""`incident-worker alerts`: the alerts stream as a subscriber sees it (newest, since an ID, following, or as a
consumer group). The readers hand each entry to an `AlertPrinter`; `alert_line` is how an alert reads as text."""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any

import redis
from pydantic import ValidationError

from ..connection import RedisClient
from ..fingerprint import format_fingerprint
from ..formats import Alert
from ..replies import entries, entry_time_text, stream_entries, text
from ..settings import Settings
from ._format import json_line, matches_text, plural, shown
from ._shared import (
    CONNECTION,
    EXIT_OK,
    UsageError,
    add_settings_flags,
    command_client,
    count_arg,
    describe,
    entry_id_in_range,
    error_text,
    json_flag,
    say,
    with_settings,
)

__all__ = ["AlertPrinter", "alert_line", "configure"]

FOLLOW_BLOCK_MS = 1000
"""One blocking read while following: below any socket timeout, and a Ctrl-C is handled at once anyway."""

FOLLOW_RETRY_MAX_S = 2.0
"""Longest pause between two attempts to reach a lost Redis while following."""

_SINCE = re.compile(r"^\d+(-\d+)?$")


def alert_line(entry_id: str, alert: Alert) -> str:
    """An alert as one line for people: when, which incident, and its closest matches (an incomplete alert's count
    as the lower bound it is, and why)."""
    at_least = "at least " if alert.incomplete else ""
    return (
        f"{entry_time_text(entry_id)}  {entry_id}  incident {shown(alert.incident_id)} ({alert.op}, "
        f"fp {format_fingerprint(alert.fingerprint)}): {at_least}{plural(alert.match_count, 'match', 'matches')} "
        f"within {alert.max_distance}: {matches_text(alert.matches, alert.match_count, at_least=alert.incomplete)}"
        + ("  (incomplete: the search stopped at the per-event budget)" if alert.incomplete else "")
        + (f"  text: {alert.text!r}" if alert.text is not None else "")
    )


class AlertPrinter:
    """Prints one alert entry the way a subscriber reads it; an entry that is not an alert is reported, not shown."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.printed = 0

    def __call__(self, entry_id: str, fields: Mapping[Any, Any] | None) -> None:
        if not fields:  # deleted from the stream while pending in our group
            return
        try:
            alert = Alert.from_fields(fields)
        except ValidationError as error:
            say("alerts", f"entry {entry_id} is not a valid alert, skipped: {error.errors()[0]['msg']}")
            return
        self.printed += 1
        if self.as_json:
            print(
                json_line({"entry_id": entry_id, "time": entry_time_text(entry_id), **alert.model_dump()}), flush=True
            )
        else:
            print(alert_line(entry_id, alert), flush=True)


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


class _Outage:
    """While following, a lost Redis (a restart, a failover, a dropped connection) is waited for with capped
    backoff, as the worker does, instead of ending the command: `--follow` stops only on Ctrl-C or SIGTERM.
    A refused password is no outage: it ends the command as any other error does."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.delay = 0.0

    def wait(self, error: redis.RedisError) -> None:
        if isinstance(error, redis.AuthenticationError | redis.exceptions.AuthorizationError):
            raise error
        if not self.delay:
            say("alerts", f"lost Redis at {self.url} ({error_text(error)}); waiting for it, to resume where it stopped")
        self.delay = min(FOLLOW_RETRY_MAX_S, max(0.1, self.delay * 2))
        time.sleep(self.delay)

    def over(self) -> None:
        if self.delay:
            say("alerts", f"Redis at {self.url} answers again; following")
        self.delay = 0.0


def read_backlog(client: RedisClient, stream: str, since: str | None, count: int | None, emit: AlertPrinter) -> str:
    """Emit the newest `count` alerts (default 10), or those after `since`; returns the ID to follow from."""
    if since is not None:
        if "-" in since:  # an entry ID: what came after it
            start, last = "(" + since, since
        else:  # a time in milliseconds: from that time on; following starts just before it
            millis = int(since)
            start, last = f"{millis}-0", f"{millis - 1}-{2**64 - 1}" if millis else "0-0"
        for entry_id, fields in entries(client, stream, start, limit=count):
            last = entry_id
            emit(entry_id, fields)
        return last
    count = 10 if count is None else count
    newest = client.xrevrange(stream, "+", "-", count=max(count, 1))
    if not newest:
        return "0-0"  # nothing yet: follow from the very start, so an alert added now is not missed
    for raw_id, raw_fields in reversed(newest[:count]):
        emit(text(raw_id), raw_fields)
    return text(newest[0][0])


def read_as_group(
    client: RedisClient, stream: str, args: argparse.Namespace, emit: AlertPrinter, outage: _Outage
) -> None:
    """Read as a consumer of a group of the alerts stream: own pending alerts first, then new ones; ack each batch.
    Following, a lost Redis is waited for, then this consumer's pending alerts are read again (printed, never
    acknowledged); a group gone with Redis's data is created again at the stream's start (every alert since)."""
    group, consumer = args.subscriber_group, args.consumer_name
    try:
        client.xgroup_create(stream, group, id="0" if args.from_start else "$", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise
        if args.from_start:
            say("alerts", f"group {group!r} exists already; --from-start applies only when creating it")
    left = args.count
    cursor = "0"  # first this consumer's pending alerts (printed before a crash, never acknowledged), then new ones
    while left is None or left > 0:
        block = FOLLOW_BLOCK_MS if args.follow and cursor == ">" else None
        size = 100 if left is None else min(100, left)
        try:
            found = stream_entries(client.xreadgroup(group, consumer, {stream: cursor}, count=size, block=block))
            outage.over()
        except (redis.ConnectionError, redis.TimeoutError) as error:
            if not args.follow:
                raise
            outage.wait(error)
            cursor = "0"
            continue
        except redis.ResponseError as error:
            if not args.follow or "NOGROUP" not in str(error):
                raise
            say("alerts", f"group {group!r} is gone (Redis restarted without its data?); created again at the start")
            with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: another reader of the group was first
                client.xgroup_create(stream, group, id="0", mkstream=True)
            cursor = "0"
            continue
        if not found:
            if cursor != ">":
                cursor = ">"
                continue
            if args.follow:
                continue
            return
        for entry_id, fields in found:
            emit(entry_id, fields)
        try:
            client.xack(stream, group, *[entry_id for entry_id, _ in found])
        except (redis.ConnectionError, redis.TimeoutError) as error:
            if not args.follow:
                raise
            outage.wait(error)  # unacknowledged: printed again from the pending list, as after a crash
            cursor = "0"
            continue
        if cursor != ">":
            cursor = found[-1][0]
        if left is not None:
            left -= len(found)


def _check_usage(args: argparse.Namespace) -> None:
    if args.since is not None and not (_SINCE.match(args.since) and entry_id_in_range(args.since)):
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


@with_settings("alerts", keys=lambda settings: [settings.alerts_stream])  # the subscriber reads no other
def _alerts(args: argparse.Namespace, settings: Settings) -> int:
    _check_usage(args)
    client = command_client(settings, "alerts")
    emit = AlertPrinter(args.json)
    outage = _Outage(settings.safe_redis_url)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.subscriber_group is not None:
            read_as_group(client, settings.alerts_stream, args, emit, outage)
            if not emit.printed and not args.json:
                say("alerts", f"no new alerts for group {args.subscriber_group!r} in {settings.alerts_stream}")
            return EXIT_OK
        last = read_backlog(client, settings.alerts_stream, args.since, args.count, emit)
        if not emit.printed and not args.json:
            waiting = "; waiting for new ones (Ctrl-C to stop)" if args.follow else ""
            after = f"after {args.since} " if args.since else ""
            say("alerts", f"no alerts {after}in {settings.alerts_stream}{waiting}")
        while args.follow:
            try:
                reply = client.xread({settings.alerts_stream: last}, count=100, block=FOLLOW_BLOCK_MS)
                outage.over()
            except (redis.ConnectionError, redis.TimeoutError) as error:
                outage.wait(error)  # then on from the last alert printed: none twice, none skipped
                continue
            for entry_id, fields in stream_entries(reply):
                emit(entry_id, fields)
                last = entry_id
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Print near-duplicate alerts, one a line: the newest --count (default 10), or every alert "
        "after --since ID. --follow keeps waiting for new ones until Ctrl-C or SIGTERM (exit 0), and waits out a lost "
        "Redis (a restart, a failover), then resumes after the last alert printed. --group NAME reads "
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
  1  Redis failed (while following, a lost Redis is waited for: only a refused login or command ends it)
  2  bad usage: --since not an entry ID, --since with --group, --from-start without --group
""",
    )
    parser.add_argument(
        "--count",
        type=count_arg,
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
    json_flag(parser, "each alert as a JSON object, one a line (JSON Lines)")
    add_settings_flags(parser, only=[*CONNECTION, "alerts_stream"])
    parser.set_defaults(handler=_alerts)
