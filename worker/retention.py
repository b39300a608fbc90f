"""Retention: an incident leaves the index once its last add or upsert is older than the window.

The window is recorded in `{N}:meta`'s `retention_ms` (a worker writes its `retention` setting there when it starts,
`set_window`), so that every worker's atomic step agrees on the bookkeeping whatever its own setting: while the window
is on, the apply step scores each incident in the sorted set `{N}:expiry` with the server's time of its last add or
upsert, and takes it out on delete. Turning the window on for an index that already holds incidents backfills
`{N}:expiry` in bounded steps (`backfill_step`), each of them scored with the time it was turned on; turning it off
drops the set, so an index without retention pays nothing for it.

`expire_batch` is one bounded pass: the oldest entries of `{N}:expiry` older than the window (ZRANGEBYSCORE ...
LIMIT, so its cost follows what expires, not the index's size), their fingerprints read, and one call of the expire
function for the batch, which takes each incident out atomically (postings, twin group, fingerprint, bookkeeping, a
change-log entry `expire <ID>`) only if nothing changed it since it was read. The upkeep lease holder runs passes
between event batches (worker/upkeep.py); `incident-worker expire` runs or previews one.

Retention reads `{N}:expiry`, never the change log: how long `{N}:changes` is kept (`changes_keep`) is independent
of the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import replies
from .fingerprint import format_fingerprint, parse_fingerprint
from .index import FingerprintIndex
from .keys import IndexKeys
from .library import FN_EXPIRE, FN_EXPIRY_BACKFILL, FN_SET_RETENTION

__all__ = [
    "BACKFILL_COUNT",
    "EXPIRE_BATCH",
    "ExpireResult",
    "RetentionState",
    "backfill_step",
    "call_keys",
    "expire_batch",
    "expire_due",
    "expire_picked",
    "pick",
    "recorded_window",
    "set_window",
    "state",
]

EXPIRE_BATCH = 200
"""Incidents one expire call takes out at most: one atomic call of about 1 ms on the server (BENCHMARKS.md)."""

BACKFILL_COUNT = 1000
"""HSCAN COUNT of one backfill step (a hint: Redis may return a few more)."""

WINDOW_FIELD = "retention_ms"
SINCE_FIELD = "retention_since"
BACKFILL_FIELD = "retention_backfill"


def _server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def recorded_window(client: Any, keys: IndexKeys) -> int:
    """The window recorded in `{N}:meta` in ms (0: retention is off)."""
    value = client.hget(keys.meta, WINDOW_FIELD)
    try:
        return max(0, int(replies.text(value))) if value is not None else 0
    except ValueError:
        return 0


def set_window(index: FingerprintIndex, window_ms: int) -> int:
    """Record the window (0: off) for every worker of the namespace; returns the one recorded before.

    Turning it on starts the backfill of `{N}:expiry`; turning it off drops `{N}:expiry`."""
    keys = index.keys
    return int(index.call(FN_SET_RETENTION, [keys.meta, keys.expiry], [index.layout_tag, int(window_ms)]))


def backfill_step(index: FingerprintIndex, count: int = BACKFILL_COUNT) -> tuple[bool, int]:
    """One step of the backfill, if one runs: (whether more is to come, incidents added to `{N}:expiry`)."""
    keys = index.keys
    cursor, added = index.call(FN_EXPIRY_BACKFILL, [keys.meta, keys.fingerprints, keys.expiry], [count])
    return bool(replies.text(cursor)), int(added)


@dataclass
class ExpireResult:
    """What expiry passes did: incidents picked as due, expired, kept (changed since they were picked), and
    bookkeeping entries dropped because their incident was gone already."""

    picked: int = 0
    expired: int = 0
    kept: int = 0
    dropped: int = 0
    more: bool = False  # the last batch was full: more may be due

    def add(self, other: ExpireResult) -> None:
        self.picked += other.picked
        self.expired += other.expired
        self.kept += other.kept
        self.dropped += other.dropped
        self.more = other.more


def due_ids(client: Any, keys: IndexKeys, window_ms: int, limit: int) -> list[Any]:
    """The IDs (as Redis replies them) whose last add or upsert is older than the window, oldest first, at most
    `limit`."""
    return list(client.zrangebyscore(keys.expiry, "-inf", _server_ms(client) - window_ms, start=0, num=limit))


def pick(index: FingerprintIndex, limit: int = EXPIRE_BATCH) -> list[tuple[Any, Any]]:
    """The incidents due (at most `limit`, oldest first), each with its fingerprint as stored (None: none)."""
    client, keys = index.redis, index.keys
    window = recorded_window(client, keys)
    if window <= 0:
        return []
    ids = due_ids(client, keys, window, limit)
    if not ids:
        return []
    return list(zip(ids, client.hmget(keys.fingerprints, ids), strict=True))


def _expire_call(index: FingerprintIndex, picked: list[tuple[Any, Any]]) -> tuple[list[str], list[Any]]:
    """Keys and arguments of one call of the expire function, built for the layout the index uses now."""
    keys = index.keys
    call_keys: list[str] = [keys.meta, keys.fingerprints, keys.changes, keys.expiry]
    args: list[Any] = [index.layout_tag]
    for incident_id, value in picked:
        expected: Any = "-"
        postings: list[str] = []
        fp = 0
        if value is not None:
            expected = value  # as stored: the call compares it byte for byte
            try:
                fp = parse_fingerprint(value)
            except ValueError:
                pass  # mangled by hand: it goes without postings to take out (it was in none it could match through)
            else:
                postings = index.posting_keys(fp)
        call_keys.append(keys.twins(format_fingerprint(fp) if postings else "-"))
        call_keys.extend(postings)
        args += [incident_id, expected, len(postings)]
    return call_keys, args


def call_keys(index: FingerprintIndex, picked: list[tuple[Any, Any]]) -> list[str]:
    """The keys an expire call of these picked incidents touches (their postings and twin groups among them)."""
    return [replies.text(key) for key in _expire_call(index, picked)[0]]


def expire_picked(index: FingerprintIndex, picked: list[tuple[Any, Any]]) -> ExpireResult:
    """Expire the incidents `pick` chose, in one atomic call: each only if it is still due and still holds the
    fingerprint read (see above)."""
    if not picked:
        return ExpireResult()
    # built again if a move to another layout switched it between the building of the call and the call
    reply = index.call(FN_EXPIRE, *_expire_call(index, picked), rebuild=lambda: _expire_call(index, picked))
    expired, kept, dropped = (int(x) for x in reply)
    return ExpireResult(len(picked), expired, kept, dropped)


def expire_batch(index: FingerprintIndex, limit: int = EXPIRE_BATCH) -> ExpireResult:
    """Expire at most `limit` of the incidents due, in one atomic call (each one conditional, see above)."""
    picked = pick(index, limit)
    result = expire_picked(index, picked)
    result.more = len(picked) == limit
    return result


def expire_due(
    index: FingerprintIndex, *, batch: int = EXPIRE_BATCH, budget_s: float | None = None, max_batches: int | None = None
) -> ExpireResult:
    """Batches of `expire_batch` until nothing is due, or `budget_s` seconds or `max_batches` batches are spent."""
    total = ExpireResult()
    started = time.monotonic()
    batches = 0
    while True:
        result = expire_batch(index, batch)
        total.add(result)
        batches += 1
        if not result.more or not (result.expired or result.dropped):
            # a full batch of which nothing went (a move to another layout builds: nothing expires until its switch)
            # is not more to do now: said so, the upkeep would run the same pass again after every event batch
            total.more = False
            return total
        if budget_s is not None and time.monotonic() - started >= budget_s:
            return total
        if max_batches is not None and batches >= max_batches:
            return total


@dataclass
class RetentionState:
    """Where retention stands, for `stats` and `expire --dry-run`: the window recorded (0: off), the incidents the
    bookkeeping tracks, how many are due now, the oldest one's age, a backfill under way, and the next to go."""

    window_ms: int
    tracked: int = 0
    due: int = 0
    oldest_age_ms: int | None = None
    backfill_cursor: str | None = None
    since_ms: int | None = None
    upcoming: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "window_ms": self.window_ms,
            "tracked": self.tracked,
            "due": self.due,
            "oldest_age_s": None if self.oldest_age_ms is None else round(self.oldest_age_ms / 1000, 1),
            "backfill_running": self.backfill_cursor is not None,
            "on_since_ms": self.since_ms,
            "next": self.upcoming,
        }


def state(client: Any, keys: IndexKeys, *, upcoming: int = 0) -> RetentionState:
    """Read where retention stands (reads only). `upcoming`: list that many of the next incidents to go, each with
    its age and the seconds until it goes (0 when due)."""
    meta = {replies.text(k): replies.text(v) for k, v in (client.hgetall(keys.meta) or {}).items()}
    try:
        window = max(0, int(meta.get(WINDOW_FIELD, "0")))
    except ValueError:
        window = 0
    found = RetentionState(window)
    if window <= 0:
        return found
    now = _server_ms(client)
    found.backfill_cursor = meta.get(BACKFILL_FIELD)
    since = meta.get(SINCE_FIELD)
    found.since_ms = int(since) if since and since.isdigit() else None
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.expiry)
    pipe.zcount(keys.expiry, "-inf", now - window)
    pipe.zrange(keys.expiry, 0, max(0, upcoming) - 1 if upcoming else 0, withscores=True)
    tracked, due, first = pipe.execute()
    found.tracked, found.due = int(tracked), int(due)
    if first:
        found.oldest_age_ms = max(0, now - int(first[0][1]))
    for member, score in first[:upcoming] if upcoming else []:
        age = max(0, now - int(score))
        found.upcoming.append(
            {
                "incident_id": replies.text(member),
                "age_s": round(age / 1000, 1),
                "goes_in_s": round(max(0, window - age) / 1000, 1),
            }
        )
    return found
