"""`incident-worker stats`: one look at a namespace. `collect_stats` reads everything into a `Stats`; `print_stats`
and `Stats.as_json` show it, for people and for scripts."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from .. import retention, upkeep
from ..bands import DEFAULT_BANDS, copies_bands, expected_candidates, recommend_bands
from ..connection import RedisClient
from ..formats import Heartbeat
from ..index import FingerprintIndex
from ..limits import DEFAULT_MAX_CANDIDATES, DEFAULT_SNAPSHOT_MAX_CANDIDATES
from ..migrate import MigrationStatus, migration_status
from ..replies import consumers_info, entries, group_info, text
from ..settings import Settings
from ._format import duration, json_line, plural, print_table, shown, size
from ._index import stored_index
from ._shared import (
    CONNECTION,
    EXIT_OK,
    LIFECYCLE,
    add_settings_flags,
    command_client,
    describe,
    json_flag,
    positive_arg,
    with_settings,
)
from .check import live_heartbeats

__all__ = ["Stats", "collect_stats", "configure", "print_stats"]

DEAD_SCAN_LIMIT = 10_000
"""Dead letters `stats` reads to count reasons: bounded so that `stats` stays quick on a flooded dead stream."""


@dataclass
class DeadReasons:
    """Dead letters counted by reason, newest first: how many were read, and whether the limit stopped the count."""

    by_reason: Counter[str]
    scanned: int
    capped: bool


@dataclass
class Stats:
    """Everything `stats` shows about a namespace, read at one moment (`now`, Unix seconds)."""

    namespace: str
    redis: str
    now: float
    index: dict[str, Any]
    meta: dict[str, str]
    has_layout: bool
    configured: dict[str, int]
    layout_mismatch: bool
    recommended_bands: int
    recommendation: str
    streams: dict[str, dict[str, Any]]
    inbox: dict[str, Any]
    group_name: str
    group: dict[str, Any] | None
    consumers: list[dict[str, Any]]
    workers: list[Heartbeat]
    dead: DeadReasons
    memory: dict[str, Any] | None = None
    event_groups: list[upkeep.GroupPosition] = field(default_factory=list)
    lifecycle: dict[str, Any] = field(default_factory=dict)
    migration: MigrationStatus | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def incidents(self) -> int:
        return int(self.index["incidents"])

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "redis": self.redis,
            "index": self.index,
            "configured_layout": self.configured,
            "layout_mismatch": self.layout_mismatch,
            "recommended_bands": self.recommended_bands,
            "recommendation": self.recommendation,
            "streams": self.streams,
            "inbox": self.inbox,
            "group": self.group,
            "consumers": self.consumers,
            "workers": [beat.model_dump(exclude_none=True) for beat in self.workers],
            "dead_letters": {
                "by_reason": dict(self.dead.by_reason.most_common()),
                "scanned": self.dead.scanned,
                "capped": self.dead.capped,
            },
            "memory": self.memory,
            "event_groups": [group.as_json() for group in self.event_groups],
            "lifecycle": self.lifecycle,
            "migration": self.migration.as_json() if self.migration else None,
            "warnings": self.warnings,
        }


# -- reading --------------------------------------------------------------------------------------------------


def dead_reasons(client: RedisClient, stream: str, limit: int) -> DeadReasons:
    """Dead letters by reason, newest first, reading at most `limit`."""
    reasons: Counter[str] = Counter()
    scanned = 0
    oldest = None
    for entry_id, fields in entries(client, stream, reverse=True, limit=limit, page=1000):
        reasons[text(fields.get("reason", fields.get(b"reason", b"?")))] += 1
        scanned += 1
        oldest = entry_id
    capped = scanned == limit and bool(client.xrevrange(stream, f"({oldest}", "-", count=1))
    return DeadReasons(reasons, scanned, capped)


def _on_copies(settings: Settings, count: int, workers: list[Heartbeat]) -> bool:
    """Whether the workers search their own copies: as the live ones say, else as these settings would choose."""
    said = {beat.read_path for beat in workers if beat.read_path is not None}
    if said:
        return "snapshot" in said
    return settings.read_path == "snapshot" or (
        settings.read_path == "auto" and count >= settings.snapshot_min_incidents
    )


def recommendation(
    count: int, bands: int, max_distance: int, on_copies: bool = False, budget: int | None = None
) -> tuple[int, str]:
    """The band count that would cost least at this size, and why, for people.

    `on_copies`: the workers search their own copies (the snapshot read path). The primary then only validates,
    at a cost the layout does not change, and a copy searches the default's 16-bit bands fastest (direct tables; 3
    bands of 21 and 22 bits, in a copy's large tiers by direct tables too, take about 1.4x its time a query at 1M and
    about the same from 3M: benchmarks/journal/ten-million.md). So the default is the advice there until its searches
    would meet the copy's `budget` (default: SNAPSHOT_MAX_CANDIDATES' on copies, MAX_CANDIDATES' otherwise): past
    about 29M incidents at the default 60,000, where 4 bands meet more candidates than half of it on uniform
    fingerprints (real data clusters: up to 2x more; 17,000 a query at 10M on the benchmark's workload, 58,830 at
    most), and searches are cut and their alerts incomplete (`bands.copies_bands`). Then the primary path's advice
    (fewer, wider bands) holds.
    """
    if budget is None:
        budget = DEFAULT_SNAPSHOT_MAX_CANDIDATES if on_copies else DEFAULT_MAX_CANDIDATES
    if on_copies and copies_bands(count, max_distance, budget) == DEFAULT_BANDS:
        if bands == DEFAULT_BANDS:
            return bands, f"{bands} bands suit the snapshot read path the workers use: the layout in use"
        return DEFAULT_BANDS, (
            f"{DEFAULT_BANDS} bands would suit the snapshot read path the workers use better than {bands}: the "
            "primary only validates, whatever the layout, and the workers' copies search bands of at most 20 bits "
            f"fastest (and they cost less memory). Move the live index with `incident-worker migrate --bands "
            f"{DEFAULT_BANDS}` (measure first: incident-worker bench)"
        )
    best = recommend_bands(count, max_distance)
    if count == 0:
        return best, "no incidents yet: the best band count depends on the size the index grows to"
    if best == bands:
        return best, f"{bands} bands suit {plural(count, 'incident')}: the layout in use"
    if on_copies and best < bands:
        meets = expected_candidates(best, max_distance, count)
        also = (
            f"; even so, raise SNAPSHOT_MAX_CANDIDATES to about {2 * meets:,.0f} to keep every search exact"
            if 2 * meets > budget
            else ""
        )
        return best, (
            f"{best} bands would cut fewer of the workers' searches at {plural(count, 'incident')}: a search meets "
            f"about {meets:,.0f} candidates with {best} bands and "
            f"{expected_candidates(bands, max_distance, count):,.0f} with {bands} (up to twice that on clustered "
            f"data), and past the per-event budget of {budget:,} a search is cut and its alert incomplete{also}. "
            "The copies search wide bands through direct tables. Move "
            f"the live index with `incident-worker migrate --bands {best}` (measure first: incident-worker bench)"
        )
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
        f"{best} bands would cost less Redis time per query than {bands} at {plural(count, 'incident')}: {why}. "
        f"Move the live index with `incident-worker migrate --bands {best}` (measure first: incident-worker bench)"
    )


def _group(client: RedisClient, settings: Settings) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The consumer group (None before the first worker creates it) and its consumers."""
    if not client.exists(settings.events_stream):
        return None, []
    found = group_info(client, settings.events_stream, settings.group)
    if found is None:
        return None, []
    lag = found.get("lag")
    group = {
        "name": settings.group,
        "lag": None if lag is None else int(lag),
        "pending": int(found.get("pending", 0)),
        "last_delivered_id": str(found.get("last-delivered-id", "")),
        "entries_read": found.get("entries-read"),
    }
    consumers = []
    for row in consumers_info(client, settings.events_stream, settings.group):
        inactive = row.get("inactive")
        consumers.append(
            {
                "name": str(row.get("name")),
                "pending": int(row.get("pending", 0)),
                "idle_ms": int(row.get("idle", 0)),
                "inactive_ms": None if inactive is None else int(inactive),
            }
        )
    return group, consumers


def _memory(index: FingerprintIndex | None, streams: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Memory by part, or None when there is no index yet or the user may not sample it (ACL)."""
    if index is None:
        return None
    try:
        return upkeep.memory_by_part(index, {name: str(stream["key"]) for name, stream in streams.items()})
    except ResponseError:
        return None


def collect_stats(client: RedisClient, settings: Settings, dead_scan: int = DEAD_SCAN_LIMIT) -> Stats:
    """Read the index, its layout and memory, the three streams, the consumer group, the live workers and the dead
    letters' reasons (the newest `dead_scan`). Reads only."""
    index, meta = stored_index(client, settings)
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
    workers = live_heartbeats(client, settings.keys)
    count = int(index_stats["incidents"])
    on_copies = _on_copies(settings, count, workers)
    best, advice = recommendation(
        count,
        *stored,
        on_copies=on_copies,
        budget=settings.snapshot_max_candidates if on_copies else settings.max_candidates,
    )
    streams = {
        name: {"key": key, "length": int(client.xlen(key)), "maxlen": maxlen, "max_memory": budget}
        for name, key, maxlen, budget in (
            # the events stream is bounded by the consumer groups (trimmed below what they still need)
            ("events", settings.events_stream, None, None),
            ("alerts", settings.alerts_stream, settings.alerts_maxlen, settings.alerts_max_memory_bytes),
            ("dead", settings.dead_stream, settings.dead_maxlen, settings.dead_max_memory_bytes),
        )
    }
    group, consumers = _group(client, settings)
    inbox = {"key": settings.keys.inbox, "length": int(client.llen(settings.keys.inbox))}
    positions = upkeep.group_positions(client, settings.events, settings.group, settings.stream_group_max_age_ms)
    kept = retention.state(client, settings.keys)
    lifecycle = {
        "retention": {**kept.as_json(), "configured": settings.retention or None},
        "changes_keep": settings.changes_keep,
        "changes_length": int(client.xlen(settings.keys.changes)),
        "stream_group_max_age": settings.stream_group_max_age,
        "upkeep_lease_holder": text(client.get(settings.keys.lease(upkeep.Upkeep.JOB)) or b"") or None,
    }
    return Stats(
        namespace=settings.namespace,
        redis=settings.safe_redis_url,
        now=now,
        index=index_stats,
        meta=meta,
        has_layout=index is not None,
        configured={"bands": settings.bands, "max_distance": settings.max_distance},
        layout_mismatch=index is not None and (settings.bands, settings.max_distance) != stored,
        recommended_bands=best,
        recommendation=advice,
        streams=streams,
        inbox=inbox,
        group_name=settings.group,
        group=group,
        consumers=consumers,
        workers=workers,
        dead=dead_reasons(client, settings.dead_stream, dead_scan),
        memory=_memory(index, streams),
        event_groups=positions,
        lifecycle=lifecycle,
        migration=migration_status(client, settings.keys),
        warnings=upkeep.warnings(client, settings, positions) + _inbox_warnings(inbox, workers),
    )


def _inbox_warnings(inbox: dict[str, Any], workers: list[Heartbeat]) -> list[str]:
    """Entries that wait in the inbox with no live worker to move them: producers' events not yet in the stream."""
    if not inbox["length"] or workers:
        return []
    return [
        f"{inbox['length']:,} entries wait in the inbox {inbox['key']} and no worker is running to move them into the "
        "events stream: start one (incident-worker run)"
    ]


# -- printing -------------------------------------------------------------------------------------------------


def _print_index(stats: Stats, settings: Settings) -> None:
    print(f"index {settings.keys.tag} at {stats.redis}")
    print(f"  incidents    {stats.incidents:,}")
    if not stats.has_layout:
        print(
            f"  layout       none yet ({settings.keys.meta} is written by the first worker); configured: "
            f"bands={stats.configured['bands']}, max_distance={stats.configured['max_distance']}"
        )
    else:
        meta = stats.meta
        print(
            f"  layout       {stats.index['layout']} (built {meta.get('created_at', '?')}, {meta.get('scheme', '?')}, "
            f"format {meta.get('format_version', '?')})"
        )
        if stats.layout_mismatch:
            moved = f"simhash64-blake2b8le/bands={stats.configured['bands']}/max_distance=" + str(
                stats.configured["max_distance"]
            )
            known = [*meta.get("previous_layouts", "").split(), meta.get("building", "")]
            print(
                f"  WARNING      configured bands={stats.configured['bands']}, "
                f"max_distance={stats.configured['max_distance']} differ from the stored layout: "
                + (
                    "a worker with this configuration uses the index's layout (the index moved)"
                    if any(tag.startswith(moved + "/") for tag in known)
                    else "a worker with this configuration refuses to start"
                )
            )
        if stats.migration is not None:
            m = stats.migration
            print(f"  migration    {m.source} -> {m.target}: {m.progress}")
    if "used_memory" in stats.index:
        per = stats.index.get("used_memory_per_incident")
        memory = f"Redis uses {size(stats.index['used_memory'])} in all"
        if per is not None:
            memory += f", {size(per)} per incident (the whole server, streams included)"
        if "fingerprint_hash_bytes" in stats.index:
            memory += f"; the fingerprint hash {size(stats.index['fingerprint_hash_bytes'])}"
        print(f"  memory       {memory}")
    parts = stats.memory
    if parts is not None:
        streams = ", ".join(f"{name} {size(used)}" for name, used in parts["streams"].items())
        per = parts["index_per_incident"]
        print(
            f"  by part      fingerprints {size(parts['fingerprints'])}, postings ~{size(parts['postings'])} "
            f"(estimated from the sets of {parts['postings_sampled_incidents']} incidents); streams: {streams}, "
            f"changes {size(parts['changes'])}"
            + (f"; the index alone {size(per)} per incident" if per is not None else "")
        )
    print(f"  bands        {stats.recommendation}")
    life = stats.lifecycle
    print(
        f"  upkeep       change log {life['changes_length']:,} entries (keeping {life['changes_keep']}); lease "
        f"{life['upkeep_lease_holder'] or 'free'}"
    )
    kept = life["retention"]
    if not kept["window_ms"]:
        print("  retention    off: every incident stays (RETENTION sets a window)")
    else:
        oldest = "-" if kept["oldest_age_s"] is None else duration(kept["oldest_age_s"])
        line = (
            f"  retention    window {duration(kept['window_ms'] / 1000)}: {kept['tracked']:,} incidents tracked, "
            f"{kept['due']:,} due for expiry, the oldest last changed {oldest} ago"
        )
        if kept["backfill_running"]:
            line += "; still entering the incidents indexed before it was turned on"
        print(line)
    if settings.retention_configured and settings.retention_ms != kept["window_ms"]:
        print(
            f"  WARNING      configured retention {settings.retention} differs from the namespace's "
            f"({duration(kept['window_ms'] / 1000) if kept['window_ms'] else 'off'}): a worker with this "
            "configuration changes it when it starts"
        )


def _print_streams(stats: Stats) -> None:
    print("streams")
    print_table(
        [(name, stream["key"], f"{stream['length']:,}", _bound(stream)) for name, stream in stats.streams.items()],
        ("STREAM", "KEY", "ENTRIES", "BOUNDED BY (this configuration)"),
        "  ",
        right=(2,),
    )
    inbox = stats.inbox
    waiting = "empty" if not inbox["length"] else f"{inbox['length']:,} entries waiting"
    print(
        f"  inbox {inbox['key']}: {waiting} (producers append here; each worker's read round moves up to BATCH_SIZE "
        "into the events stream)"
    )


def _bound(stream: dict[str, Any]) -> str:
    """What keeps a stream from growing: its length cap and memory budget, or the consumer groups' positions."""
    if stream.get("maxlen") is None and stream.get("max_memory") is None:
        return "trimmed below what every consumer group still needs"
    maxlen = f"about {stream['maxlen']:,} entries" if stream["maxlen"] else "no length cap"
    budget = f"{size(stream['max_memory'])} of memory" if stream["max_memory"] else "no memory budget"
    return f"{maxlen}, {budget}"


def _print_group(stats: Stats) -> None:
    group = stats.group
    if group is None:
        print(f"consumer group {stats.group_name!r}: not created yet (the first worker creates it)")
        return
    lag = "unknown (entries were deleted)" if group["lag"] is None else f"{group['lag']:,}"
    print(
        f"consumer group {stats.group_name!r}: lag {lag}, pending {group['pending']:,}, "
        f"last delivered {group['last_delivered_id']}"
    )
    if stats.consumers:
        print_table(
            [(c["name"], c["pending"], duration(c["idle_ms"] / 1000)) for c in stats.consumers],
            ("CONSUMER", "PENDING", "IDLE"),
            "  ",
            right=(1, 2),
        )


def _print_workers(stats: Stats) -> None:
    if not stats.workers:
        print("workers alive (heartbeat keys): none")
        return
    print(f"workers alive (heartbeat keys): {len(stats.workers)}")
    for beat in stats.workers:
        ago = f"last beat {duration(max(0.0, stats.now - beat.at))} ago" if beat.at is not None else "beating"
        up = f", up {duration(max(0.0, stats.now - beat.started))}" if beat.started is not None else ""
        processed = "?" if beat.processed is None else beat.processed
        cut = f", {plural(beat.cut, 'search', 'searches')} cut at the per-event budget" if beat.cut else ""
        path = ""
        if beat.read_path == "snapshot":
            path = f", searches its own copy (snapshot at {beat.snapshot_position})"
        elif beat.read_path is not None:
            path = ", searches on the primary"
        print(f"  {shown(beat.consumer)}: {ago}{up}, processed {processed}{cut}{path}")


def _print_dead(stats: Stats) -> None:
    dead = stats.dead
    if not dead.scanned:
        print("dead letters: none")
        return
    length = stats.streams["dead"]["length"]
    scope = f"the newest {dead.scanned:,} of {length:,} read (--dead-scan)" if dead.capped else f"all {dead.scanned:,}"
    print(f"dead letters by reason ({scope})")
    print_table(list(dead.by_reason.most_common()), ("REASON", "COUNT"), "  ", right=(1,))


def _print_event_groups(stats: Stats, settings: Settings) -> None:
    if not stats.event_groups:
        return
    print(f"consumer groups of {settings.events} (trimmed below the first entry each still needs)")
    print_table(
        [
            (
                g.name,
                g.position,
                duration(g.age_ms / 1000) if g.age_ms else "-",
                "ignored (past stream_group_max_age)" if g.ignored else "holds",
            )
            for g in stats.event_groups
        ],
        ("GROUP", "NEEDS FROM", "OLDEST NEEDED", "TRIMMING"),
        "  ",
    )


def print_stats(stats: Stats, settings: Settings) -> None:
    """The stats for people: the index, the streams, the group, the workers, the dead letters."""
    _print_index(stats, settings)
    _print_streams(stats)
    _print_group(stats)
    _print_event_groups(stats, settings)
    _print_workers(stats)
    _print_dead(stats)
    for warning in stats.warnings:
        print(f"WARNING: {warning}")


@with_settings("stats")
def _stats(args: argparse.Namespace, settings: Settings) -> int:
    stats = collect_stats(command_client(settings, "stats"), settings, args.dead_scan)
    if args.json:
        print(json_line(stats.as_json()))
    else:
        print_stats(stats, settings)
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "One look at a namespace: incidents indexed, the layout stored in {N}:meta, Redis memory per "
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
        type=positive_arg,
        default=DEAD_SCAN_LIMIT,
        metavar="N",
        help=f"read at most the N newest dead letters to count reasons (default {DEAD_SCAN_LIMIT:,})",
    )
    json_flag(parser, "everything as one JSON object")
    add_settings_flags(
        parser,
        only=[
            *CONNECTION,
            "group",
            "events_stream",
            "alerts_stream",
            "dead_stream",
            "bands",
            "max_distance",
            *LIFECYCLE,
        ],
    )
    parser.set_defaults(handler=_stats)
