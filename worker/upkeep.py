"""The index's upkeep over months: bounded streams, retention, and where the memory goes.

One worker at a time does it, the holder of the lease `{N}:lease:upkeep` (a key with a TTL of `LEASE_TTL_MS`, renewed
while the holder lives, so that another worker takes the job over within that time when the holder dies). Between
two event batches the holder:

* every `TRIM_INTERVAL_S`: trims the events stream below the oldest entry any consumer group still needs (one atomic
  call: no group can move between the reading of the groups and the trimming), and the change log to `changes_keep`;
* every `MEMORY_INTERVAL_S`: trims the oldest alerts and dead letters while their stream takes more Redis memory than
  `alerts_max_memory` / `dead_max_memory` (their length caps are applied by the atomic step at every XADD).
* every `UPKEEP_INTERVAL_S`, while a retention window is on (worker/retention.py): a step of the backfill of
  `{N}:expiry` if one runs, then expiry passes for at most `RETENTION_BUDGET_S`; while more is due, the next tick
  comes after the next event batch instead of a second later.

Every step is safe to run twice or from two workers at once (a lease can lapse under a stalled holder): the lease
saves work, it is not what keeps the index right.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import OutOfMemoryError, ResponseError

from . import replies, retention
from .errors import DamagedMetaError
from .index import FingerprintIndex
from .library import FN_LEASE, FN_TRIM_CHANGES, FN_TRIM_EVENTS
from .metafields import changes_floor

__all__ = [
    "LEASE_TTL_MS",
    "STREAM_LABELS",
    "GroupPosition",
    "Upkeep",
    "group_positions",
    "groups_past_the_end",
    "memory_by_part",
    "pending_by_group",
    "server_time_ms",
    "trim_changes",
    "trim_events",
    "trim_to_memory",
]

STREAM_LABELS = {"alerts": "alerts", "dead letters": "dead_letters"}
"""The `stream` label of the memory gauges (worker/metrics.py), by the upkeep's name for each budgeted stream."""

LEASE_TTL_MS = 30_000
"""A dead holder keeps the upkeep job for at most this long; a live one renews the lease every `UPKEEP_INTERVAL_S`."""

UPKEEP_INTERVAL_S = 1.0
"""How often a worker tries for the lease."""

TRIM_INTERVAL_S = 10.0
"""How often the lease holder trims the events stream and the change log."""

MEMORY_INTERVAL_S = 2.0
"""How often the lease holder measures the alerts and dead-letter streams against their memory budgets."""

MEMORY_ROUNDS = 4
"""Measure-and-cut rounds of one memory trim of a stream."""

TRIM_LIMIT = 10_000
"""Stream entries removed by one trim call at most (whole nodes of 100 entries): a backlog goes over several calls."""

RETENTION_BUDGET_S = 0.05
"""Longest the lease holder spends on retention between two event batches (events wait that long at most)."""

MEMORY_SAMPLE = 200
"""Incidents whose posting sets `stats` measures (MEMORY USAGE) to estimate the postings' memory."""


def server_time_ms(client: Any) -> int:
    """The Redis server's clock in milliseconds: the clock of stream entry IDs."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


_LAST_PART = 2**64 - 1


def _id_after(ms: int, seq: int) -> str:
    """The first entry ID after ms-seq (itself for the last possible one), as trim_events in upkeep.lua has it."""
    if seq < _LAST_PART:
        return f"{ms}-{seq + 1}"
    return f"{ms + 1}-0" if ms < _LAST_PART else f"{ms}-{seq}"


# -- the events stream ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPosition:
    """Where one consumer group of the events stream stands, for trimming.

    `position` is the first entry ID the group still needs (its oldest pending entry, or the one after its last
    delivered); `age_ms` the age of the oldest entry at or after it (0: the group needs nothing that exists);
    `ignored` whether it is past `stream_group_max_age` and no longer holds the trimming back; `lag` as Redis
    reports it (None when Redis cannot count it after deletions).
    """

    name: str
    position: str
    age_ms: int
    ignored: bool
    lag: int | None
    pending: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "position": self.position,
            "oldest_needed_age_s": round(self.age_ms / 1000, 1),
            "ignored_for_trimming": self.ignored,
            "lag": self.lag,
            "pending": self.pending,
        }


@dataclass(frozen=True)
class TrimResult:
    removed: int
    bound: str | None
    groups: list[GroupPosition] = field(default_factory=list)


def trim_events(index: FingerprintIndex, stream: str, own_group: str, max_age_ms: int, limit: int) -> TrimResult:
    """Trim `stream` below the oldest entry any consumer group needs (see trim_events in worker/lua/upkeep.lua)."""
    reply = index.call(FN_TRIM_EVENTS, [stream], [own_group, max_age_ms, limit])
    groups = [
        GroupPosition(
            replies.text(reply[i]),
            replies.text(reply[i + 1]),
            int(reply[i + 2]),
            bool(int(reply[i + 3])),
            None if int(reply[i + 4]) < 0 else int(reply[i + 4]),
        )
        for i in range(2, len(reply), 5)
    ]
    bound = replies.text(reply[1])
    return TrimResult(int(reply[0]), bound or None, groups)


def group_positions(client: Any, stream: str, own_group: str, max_age_ms: int) -> list[GroupPosition]:
    """The positions `trim_events` would compute, read without writing (for `stats` and `check`)."""
    if not client.exists(stream):
        return []
    now = server_time_ms(client)
    positions: list[GroupPosition] = []
    for row in client.xinfo_groups(stream):
        info = replies.info(row)
        name = info["name"]
        ms, seq = _id_key(info.get("last-delivered-id", "0-0"))
        position = _id_after(ms, seq)
        pending = int(info.get("pending", 0))
        if pending:
            summary = client.xpending(stream, name)
            oldest = summary.get("min")
            if oldest is not None and _id_key(replies.text(oldest)) < _id_key(position):
                position = replies.text(oldest)
        first = client.xrange(stream, min=position, count=1)
        age = max(0, now - replies.entry_time_ms(replies.text(first[0][0]))) if first else 0
        lag = info.get("lag")
        ignored = name != own_group and max_age_ms > 0 and age > max_age_ms
        positions.append(GroupPosition(name, position, age, ignored, None if lag is None else int(lag), pending))
    return positions


def groups_past_the_end(client: Any, stream: str) -> list[tuple[str, str, str]]:
    """(group, its last delivered ID, the stream's last ID) of each consumer group of `stream` that was delivered
    past the stream's last ID: what an entry added with an ID chosen by hand (up to 2^64-1) leaves behind when it is
    deleted and the stream's ID set back (XSETID). XREADGROUP then delivers such a group nothing, silently."""
    try:
        if not client.exists(stream):
            return []
        last = replies.text(replies.info(client.xinfo_stream(stream)).get("last-generated-id", "0-0"))
    except ResponseError:  # a user made from an older users.acl, without XINFO STREAM: nothing to say
        return []
    past = []
    for row in client.xinfo_groups(stream):
        info = replies.info(row)
        delivered = replies.text(info.get("last-delivered-id", "0-0"))
        if _id_key(delivered) > _id_key(last):
            past.append((info["name"], delivered, last))
    return past


def trim_changes(index: FingerprintIndex, keep_ms: int, limit: int = TRIM_LIMIT) -> int:
    """Trim `{N}:changes` to the last `keep_ms` (approximately: whole nodes), recording the bound in `{N}:meta`'s
    `changes_trimmed_to` first so that no older snapshot is validated; returns the entries removed."""
    if keep_ms <= 0:
        return 0
    bound = server_time_ms(index.redis) - keep_ms
    if bound <= 0:
        return 0
    keys = index.keys
    changes_floor(index.redis, keys, index.redis.hget(keys.meta, "changes_trimmed_to"))  # a hand edit: named
    return int(index.call(FN_TRIM_CHANGES, [keys.meta, keys.changes], [f"{bound}-0", limit]))


# -- the alerts and dead-letter streams: a memory budget ------------------------------------------------------


class MeasureRefusedError(Exception):
    """The server would not measure a stream (MEMORY USAGE refused, or unknown to fakeredis)."""


PENDING_ENTRY_BYTES = 1_200
"""What MEMORY USAGE counts for one entry pending in a consumer group (its place in the group's and its consumer's
pending lists): 546 to 1,160 bytes on Redis 7.0, by how far apart the entry IDs are. Trimming cannot free it (the
pending lists keep the IDs of trimmed entries), so the memory budgets leave it out, at the upper end: a subscriber
that never acknowledges must not make the budget trim everyone's entries."""

PENDING_WARN_SHARE = 0.1
"""The upkeep names the consumer groups whose pending lists take more than this share of a stream's budget."""

NODE_BYTES = 10 * 1024 + 512
"""The most a node of alerts takes in Redis: a stream node holds entries up to stream-node-max-bytes (4096, Redis's
default, which deploy/redis/redis.conf keeps), or one larger entry alone, and an alert is under 10 KiB (8 KiB of
matches at most; tests/test_attacks.py), plus the node's master entry and place in the tree. So the alerts' entries
take at most their node count (XINFO STREAM's radix-tree-keys) times this, and where the stream is over budget by
more than that, the excess is not the entries': it is what MEMORY USAGE counts beside them and their pending lists
(consumer and group names, which a subscriber chooses, each up to proto-max-bulk-len). Before, 21 consumers of
1.9 MB names made every pass trim every alert."""

GROUPS_INTERVAL_S = 60.0
"""How often the lease holder lists a stream's consumer groups (XINFO GROUPS, to leave their pending lists out of its
budget and name the heavy ones) while the stream is within its budget; over it, every pass. A reply that holds
every group's name is the subscribers' to size: the listing is kept off the 2 s path."""


def pending_by_group(client: Any, stream: str) -> dict[str, int]:
    """The entries pending in each consumer group of `stream` (none when it does not exist)."""
    try:
        rows = client.xinfo_groups(stream)
    except ResponseError:
        return {}
    pending = {}
    for row in rows:
        info = replies.info(row)
        pending[info["name"]] = int(info.get("pending", 0))
    return pending


@dataclass(frozen=True)
class MemoryTrim:
    """What one memory trim of a stream did: the stream's memory before (bytes, less what its groups' pending lists
    hold), the entries removed, and the bytes found to lie outside the entries, at least (0 unless the trim removed
    none for them: see NODE_BYTES)."""

    used: int
    removed: int
    outside: int


def entries_bound(client: Any, stream: str) -> int | None:
    """The most the entries of `stream` can take, were each node full (NODE_BYTES a node); None when the server does
    not say how many nodes it has."""
    nodes = replies.info(client.xinfo_stream(stream)).get("radix-tree-keys")
    return None if nodes is None else int(nodes) * NODE_BYTES


def trim_to_memory(
    client: Any,
    stream: str,
    max_bytes: int,
    limit: int = TRIM_LIMIT,
    *,
    held_bytes: int = 0,
    measured: int | None = None,
    bounded: bool = False,
) -> MemoryTrim:
    """Trim the oldest entries of `stream` while its entries take more than `max_bytes` of Redis memory. `held_bytes`
    is what its consumer groups' pending lists take, which trimming cannot free: it is left out of the measure.
    `measured` is the stream's MEMORY USAGE if the caller has just read it; `bounded`, whether its entries are
    alerts, whose nodes take at most NODE_BYTES.

    The memory is MEMORY USAGE with every stream node counted (SAMPLES 0: Redis's default samples only the oldest
    nodes, which underestimates a stream whose newest entries are larger, as a storm's alerts are); it costs about
    0.1 us a node, 10 ms for 100,000 alerts of 5 KB. The first cut assumes the excess is spread evenly over the
    entries; each later cut divides the excess left by the bytes an entry of the previous cut freed (the oldest
    entries, cut first, are often smaller than the average), up to twice the previous cut. Cuts are in whole nodes
    (XTRIM MAXLEN ~), at most `limit` entries each and `MEMORY_ROUNDS` of them a call: a stream far over budget
    shrinks over several calls. Of a `bounded` stream, none is removed where removing every entry would still leave
    it over budget (entries_bound): the excess is then outside the entries.
    """
    if max_bytes <= 0:
        return MemoryTrim(0, 0, 0)
    before, removed, per_entry = 0, 0, 0.0
    last_used, removed_last = 0, 0
    for _ in range(MEMORY_ROUNDS):
        used = max(0, (_measure(client, stream) if measured is None else measured) - held_bytes)
        measured = None
        if removed_last and last_used > used:
            per_entry = (last_used - used) / removed_last
        before = before or used
        if used <= max_bytes:
            break
        length = int(client.xlen(stream))
        if bounded and not removed:
            most = entries_bound(client, stream)
            if most is not None and used - most > max_bytes:
                return MemoryTrim(before, 0, used - most)
        excess = used - max_bytes
        even = length * excess / used
        # at most twice the last cut: where the small oldest entries give way to large ones, a cut sized by the
        # small ones would remove far more bytes than the excess
        cut = max(even, min(excess / per_entry, 2 * removed_last)) if per_entry > 0 else even
        keep = max(0, length - max(1, math.ceil(cut)))
        removed_last = int(client.xtrim(stream, maxlen=keep, approximate=True, limit=limit) or 0)
        last_used = used
        removed += removed_last
        if not removed_last:
            break
    return MemoryTrim(before, removed, 0)


def _measure(client: Any, stream: str) -> int:
    try:
        return int(client.memory_usage(stream, samples=0) or 0)
    except ResponseError as error:
        raise MeasureRefusedError(str(error)) from None


# -- memory -----------------------------------------------------------------------------------------------------


def _usage(client: Any, key: str) -> int:
    try:
        return int(client.memory_usage(key) or 0)
    except ResponseError:
        return 0


def memory_by_part(index: FingerprintIndex, streams: Mapping[str, str], sample: int = MEMORY_SAMPLE) -> dict[str, Any]:
    """Redis memory of the index by part, in bytes: fingerprints, postings, each stream.

    Postings are estimated: the posting sets of `sample` random incidents are measured with MEMORY USAGE, each set's
    bytes shared out among its members, and the mean share per incident scaled to the index (exact for sets in the
    compact encodings; Redis itself samples the members of larger sets).
    """
    client, keys = index.redis, index.keys
    count = len(index)
    parts: dict[str, Any] = {"fingerprints": _usage(client, keys.fingerprints)}
    postings = 0.0
    measured = 0
    if count:
        rows = client.hrandfield(keys.fingerprints, min(sample, count), withvalues=True) or []
        pairs = [(replies.text(rows[i]), replies.text(rows[i + 1])) for i in range(0, len(rows), 2)]
        posting_keys: list[str] = []
        for _, hex_fp in pairs:
            try:
                posting_keys.extend(index.posting_keys(int(hex_fp, 16)))
            except ValueError:
                continue
        pipe = client.pipeline(transaction=False)
        for key in posting_keys:
            pipe.memory_usage(key)
            pipe.scard(key)
        answers = pipe.execute(raise_on_error=False)
        share = 0.0
        for i in range(0, len(answers), 2):
            used, size = answers[i], answers[i + 1]
            if isinstance(used, int) and isinstance(size, int) and size > 0:
                share += used / size
        measured = len(pairs)
        if measured:
            postings = share / measured * count
    parts["postings"] = round(postings)
    parts["postings_sampled_incidents"] = measured
    parts["streams"] = {name: _usage(client, key) for name, key in streams.items()}
    parts["changes"] = _usage(client, keys.changes)
    index_bytes = parts["fingerprints"] + parts["postings"]
    parts["index"] = index_bytes
    parts["index_per_incident"] = round(index_bytes / count, 1) if count else None
    return parts


# -- the job inside the workers ---------------------------------------------------------------------------------


class Upkeep:
    """The upkeep job of one worker: takes the lease when free and, holding it, does a little at each `tick`."""

    JOB = "upkeep"

    def __init__(self, index: FingerprintIndex, settings: Any, log: Any, metrics: Any = None) -> None:
        self.index = index
        self.settings = settings
        self.log = log
        self.metrics = metrics
        self.expired = 0
        self.key = index.keys.lease(self.JOB)
        self.holding = False
        self.trimmed = 0
        # spread the workers' first tries a little, so that one of them usually wins at once
        self._next = time.monotonic() + random.uniform(0, UPKEEP_INTERVAL_S)
        self._next_trim = 0.0
        self._next_memory = 0.0
        self._ignored: set[str] = set()
        self._unmeasured: set[str] = set()
        self._silent: dict[str, set[str]] = {}
        self._groups: dict[str, tuple[float, dict[str, int]]] = {}
        self._outside: set[str] = set()

    def tick(self) -> None:
        """Called between event batches: renew or take the lease, then one bounded step of each job that is due."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + UPKEEP_INTERVAL_S
        if not self._take_lease():
            return
        if now >= self._next_trim:
            self._next_trim = now + TRIM_INTERVAL_S
            self.trim()
        if now >= self._next_memory:
            self._next_memory = now + MEMORY_INTERVAL_S
            self.trim_memory()
        if self.retain():
            self._next = now  # more is due: go on after the next event batch

    def trim_memory(self) -> None:
        """Keep the alerts and dead-letter streams within their memory budgets (one bounded step each)."""
        settings = self.settings
        for kind, stream, budget, setting in (
            ("alerts", settings.alerts_stream, settings.alerts_max_memory_bytes, "alerts_max_memory"),
            ("dead letters", settings.dead_stream, settings.dead_max_memory_bytes, "dead_max_memory"),
        ):
            if not budget or stream in self._unmeasured:
                continue
            try:
                measured = _measure(self.index.redis, stream)
                pending = self._pending(stream, budget, measured)
                self._warn_unacknowledged(kind, stream, budget, pending)
                trimmed = trim_to_memory(
                    self.index.redis,
                    stream,
                    budget,
                    held_bytes=sum(pending.values()) * PENDING_ENTRY_BYTES,
                    measured=measured,
                    bounded=kind == "alerts",
                )
                self._report_memory(kind, trimmed.used, budget)
                self._warn_outside(kind, stream, setting, trimmed.outside)
            except MeasureRefusedError as error:
                # asked once per worker: each refusal would land in Redis's ACL log
                self._unmeasured.add(stream)
                self.log.warning(
                    f"cannot measure the {kind} stream's memory; its {setting} budget is not enforced",
                    stream=stream,
                    error=str(error),
                    hint=(
                        f"this Redis has no MEMORY USAGE command (disabled or renamed): set {setting}=off to rely on "
                        "the length cap alone, which still applies"
                        if "unknown command" in str(error).lower()
                        else "grant the worker's Redis user +memory|usage (deploy/redis/users.acl); its length cap "
                        "still applies"
                    ),
                )
                continue
            if trimmed.removed:
                log = self.log.info if kind == "alerts" else self.log.warning
                log(
                    f"{kind} stream over its memory budget; removed the oldest",
                    stream=stream,
                    removed=trimmed.removed,
                    used_bytes=trimmed.used,
                    **{setting: getattr(settings, setting)},
                )

    def _pending(self, stream: str, budget: int, measured: int) -> dict[str, int]:
        """The entries pending in each consumer group of `stream` (whose MEMORY USAGE is `measured`): listed every
        pass while the stream measures over its budget, else at most every GROUPS_INTERVAL_S (the last listing
        meanwhile)."""
        now = time.monotonic()
        listed_at, pending = self._groups.get(stream, (None, {}))
        due = listed_at is None or now - listed_at >= GROUPS_INTERVAL_S
        if not due and measured - sum(pending.values()) * PENDING_ENTRY_BYTES <= budget:
            return pending
        pending = pending_by_group(self.index.redis, stream)
        self._groups[stream] = (now, pending)
        return pending

    def _warn_outside(self, kind: str, stream: str, setting: str, outside: int) -> None:
        """Say, once until it passes, that a stream's excess lies outside its entries (see NODE_BYTES)."""
        if not outside:
            self._outside.discard(stream)
            return
        if stream in self._outside:
            return
        self._outside.add(stream)
        self.log.warning(
            f"the {kind} stream is over its memory budget by what lies outside its entries; none of them removed",
            stream=stream,
            outside_bytes=outside,
            hint=f"its consumer groups' or consumers' names are the likely holders (XINFO GROUPS {stream}; XINFO "
            f"CONSUMERS {stream} <group>): remove the ones nothing reads (XGROUP DELCONSUMER, XGROUP DESTROY), or "
            f"raise {setting}",
        )

    def _report_memory(self, kind: str, used: int, budget: int) -> None:
        if self.metrics is not None:
            stream = STREAM_LABELS[kind]
            self.metrics.stream_memory.labels(stream).set(used)
            self.metrics.stream_memory_budget.labels(stream).set(budget)

    def _warn_unacknowledged(self, kind: str, stream: str, budget: int, pending: Mapping[str, int]) -> None:
        """Name, once each, the consumer groups of `stream` whose pending lists take a good share of its budget: the
        memory they hold is theirs (left out of the budget) and only they can free it."""
        heavy = {
            name: count for name, count in pending.items() if count * PENDING_ENTRY_BYTES > PENDING_WARN_SHARE * budget
        }
        new = set(heavy) - self._silent.get(stream, set())
        self._silent[stream] = set(heavy)
        if new:
            self.log.warning(
                f"consumer groups of the {kind} stream hold entries never acknowledged; the memory of their pending "
                "lists is left out of the budget",
                stream=stream,
                groups=heavy,
                pending_bytes=sum(heavy.values()) * PENDING_ENTRY_BYTES,
                hint=f"each pending entry takes up to {PENDING_ENTRY_BYTES} bytes that trimming cannot free: have the "
                f"group acknowledge what it read (XACK), or remove a group that nothing reads (XGROUP DESTROY {stream} "
                "<group>)",
            )

    def configure(self) -> None:
        """Record this worker's retention window in `{N}:meta` if another one is recorded (at start): the window is
        the namespace's, so that every worker's atomic step keeps the same bookkeeping."""
        recorded = retention.recorded_window(self.index.redis, self.index.keys)
        window = self.settings.retention_ms if self.settings.retention_configured else recorded
        if self.metrics is not None:  # the alert on Redis memory near maxmemory asks whether retention is on
            self.metrics.retention_seconds.set(window / 1000)
        if not self.settings.retention_configured:
            return  # unset: the namespace's window stands (a worker started without the setting drops nothing)
        if recorded == window:
            return
        retention.set_window(self.index, window)
        self.log.warning(
            "retention window changed for the namespace",
            retention=self.settings.retention,
            recorded_ms_before=recorded,
            hint="every worker of the namespace should run with the same INCIDENT_WORKER_RETENTION; one with "
            "another value changes it back when it starts",
        )

    def retain(self) -> bool:
        """One bounded round of retention: a backfill step, then expiry passes. True while more is due."""
        try:
            more, added = retention.backfill_step(self.index)
        except OutOfMemoryError:
            more, added = False, 0  # it adds to {N}:expiry: it waits for memory, the expiries below free some
        if added or more:
            self.log.debug("retention backfill", added=added, more=more)
        result = retention.expire_due(self.index, budget_s=RETENTION_BUDGET_S)
        if result.expired:
            self.expired += result.expired
            if self.metrics is not None:
                self.metrics.expired.inc(result.expired)
            self.log.info(
                "expired incidents",
                expired=result.expired,
                kept=result.kept,
                dropped=result.dropped,
                more=result.more,
                total=self.expired,
            )
        return more or result.more

    def trim(self) -> None:
        """Trim the events stream and the change log (one bounded step of each)."""
        result = trim_events(
            self.index,
            self.settings.events,
            self.settings.group,
            self.settings.stream_group_max_age_ms,
            TRIM_LIMIT,
        )
        self.trimmed += result.removed
        ignored = {group.name for group in result.groups if group.ignored}
        for name in sorted(ignored - self._ignored):
            self.log.warning(
                "consumer group no longer holds back the events stream",
                group=name,
                stream_group_max_age=self.settings.stream_group_max_age,
                hint="its entries older than that may be trimmed before it reads them; delete the group if unused",
            )
        self._ignored = ignored
        try:
            removed = trim_changes(self.index, self.settings.changes_keep_ms)
        except DamagedMetaError as error:
            self.log.error("the change log is not trimmed: the index's meta is damaged", error=str(error))
            removed = 0
        if result.removed or removed:
            self.log.debug("trimmed streams", events=result.removed, changes=removed, events_bound=result.bound)

    def _take_lease(self) -> bool:
        held = bool(self.index.call(FN_LEASE, [self.key], [self.settings.consumer, LEASE_TTL_MS]))
        if self.metrics is not None:
            self.metrics.upkeep_lease_held.set(int(held))
            if not held:  # the holder measures the streams: a former holder's last figures would go stale
                self.metrics.stream_memory.clear()
                self.metrics.stream_memory_budget.clear()
        if held != self.holding:
            self.log.info("upkeep lease " + ("taken" if held else "held by another worker"), lease=self.key)
            self.holding = held
        return held

    def release(self) -> None:
        """Give the lease up (on a clean stop), so that another worker takes the job at once."""
        if self.holding:
            self.index.call(FN_LEASE, [self.key], [self.settings.consumer, 0])
            self.holding = False
            if self.metrics is not None:
                self.metrics.upkeep_lease_held.set(0)
                self.metrics.stream_memory.clear()
                self.metrics.stream_memory_budget.clear()


def positions_summary(groups: Sequence[GroupPosition]) -> str:
    """One line about the groups for people: which one holds the stream back, and how far."""
    if not groups:
        return "no consumer group"
    held = [g for g in groups if not g.ignored]
    if not held:
        return "every group is ignored for trimming"
    oldest = max(held, key=lambda g: g.age_ms)
    return f"held back by group {oldest.name!r} (its oldest needed entry is {oldest.age_ms / 1000:.0f} s old)"


MEMORY_WARN_FRACTION = 0.8
"""`stats` and `check --capacity` warn when Redis uses this much of maxmemory."""

GROUP_WARN_AGE_MS = 3_600_000
"""`stats` and `check` warn about another consumer group whose oldest needed entry is older than this (1 hour)."""


def _ago(ms: int) -> str:
    seconds = ms / 1000
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def warnings(
    client: Any, settings: Any, positions: Sequence[GroupPosition] | None = None, *, memory: bool | str = True
) -> list[str]:
    """What an operator should act on before the namespace fills Redis: for `stats` and `check`.

    `memory` reads INFO (refused to the least-privilege worker user, and every refusal lands in the ACL log);
    "asked" (`check --capacity`) also says so when INFO is refused."""
    found: list[str] = []
    if memory:
        try:
            info = client.info("memory")
        except ResponseError as error:
            info = {}
            if memory == "asked":  # `check --capacity`: the one question it was asked, not answered, is said so
                found.append(
                    f"memory not checked: Redis refused INFO to this user ({str(error)[:80]}); run it with an "
                    "administrator's REDIS_URL, or `redis-cli INFO memory`"
                )
        used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        if limit and used >= MEMORY_WARN_FRACTION * limit:
            try:
                window = retention.recorded_window(client, settings.keys)
            except ResponseError:
                window = 0
            usage = f"Redis uses {used * 100 // limit}% of maxmemory ({used:,} of {limit:,} bytes)"
            if window:
                found.append(
                    f"{usage} with a retention window of {_ago(window)}: shorten the window (RETENTION), or raise "
                    "maxmemory"
                )
            else:
                found.append(
                    f"{usage}, and retention is off, so the index only grows: set a retention window (RETENTION, "
                    "such as 30d) so that old incidents leave it, or raise maxmemory"
                )
    found += [
        f"consumer group {name!r} of {settings.events} has delivered up to {delivered}, past the stream's last entry "
        f"ID {last} (an entry added with an ID chosen by hand, then removed): Redis delivers it nothing until new "
        f"entries pass that ID. Set it back, as an administrator, to the last entry it processed (at most {last}): "
        f"XGROUP SETID {settings.events} {name} <that entry's ID>"
        for name, delivered, last in groups_past_the_end(client, settings.events)
    ]
    if positions is None:
        positions = group_positions(client, settings.events, settings.group, settings.stream_group_max_age_ms)
    for group in positions:
        if group.name == settings.group:
            continue
        if group.ignored:
            found.append(
                f"consumer group {group.name!r} of {settings.events} is past stream_group_max_age "
                f"({settings.stream_group_max_age}): entries it has not read are trimmed without it"
            )
        elif group.age_ms > GROUP_WARN_AGE_MS:
            found.append(
                f"consumer group {group.name!r} of {settings.events} still needs entries {_ago(group.age_ms)} old "
                "and keeps the stream from being trimmed; delete it if nothing reads it any more "
                f"(XGROUP DESTROY {settings.events} {group.name}) or set stream_group_max_age"
            )
    return found
