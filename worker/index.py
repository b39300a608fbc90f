"""The Redis-backed near-duplicate index (SPEC sections 2 to 4): every Redis access of one index goes through here.

`FingerprintIndex` keeps fingerprints in `{N}:fp` and band postings in `{N}:band:<b>:<v>` sets. Each change is one
call of a Redis Function (worker/lua/index.lua) that finds the matches, indexes, and in stream mode publishes the
alert and acknowledges the entry, all in one atomic step on the server.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from itertools import islice
from typing import Any, TypeVar

from redis import Redis
from redis.exceptions import ResponseError

from .bands import DEFAULT_BANDS, DEFAULT_MAX_DISTANCE, BandLayout
from .connection import RedisClient
from .errors import DuplicateIncidentError, LayoutMismatchError, StaleRetriesExhaustedError
from .fingerprint import fingerprint, format_fingerprint, parse_fingerprint
from .keys import DEFAULT_NAMESPACE, IndexKeys
from .replies import pairs, text

__all__ = [
    "FORMAT_VERSION",
    "SCHEME",
    "STALE_RETRIES",
    "ApplyResult",
    "Calls",
    "FingerprintIndex",
    "Posting",
    "StreamTarget",
    "retry_while_stale",
]

SCHEME = "simhash64-blake2b8le"
"""SPEC section 1: SimHash over 64 bits of BLAKE2b-8 token hashes read little-endian."""

FORMAT_VERSION = 1
"""How the index is laid out in Redis (SPEC section 3); a reader of another version refuses the index."""

STALE_RETRIES = 32
"""Upsert and delete retry when another client changed the incident between their read and their write."""

_Reply = TypeVar("_Reply")


def retry_while_stale(attempt: Callable[[], _Reply], status: Callable[[_Reply], str]) -> _Reply | None:
    """Run `attempt` (read what is stored, then apply) until its `status` is not `stale`; None if it always was.

    An upsert or delete carries the fingerprint it read; another client changing the incident in between makes the
    server refuse it as stale, and reading again settles it unless someone rewrites the incident in a loop.
    """
    for _ in range(STALE_RETRIES):
        reply = attempt()
        if status(reply) != "stale":
            return reply
    return None


def _load_library() -> tuple[str, str]:
    """The Lua library with its name and function names made unique to this code (a hash of it)."""
    source = resources.files(__package__).joinpath("lua/index.lua").read_text(encoding="utf-8")
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    name = f"incident_index_{digest}"
    return name, source.replace("incident_index_v1", name)


LIBRARY_NAME, LIBRARY_SOURCE = _load_library()
FN_APPLY = f"{LIBRARY_NAME}_apply"
FN_NEIGHBOURS = f"{LIBRARY_NAME}_neighbours"
FN_DEAD_LETTER = f"{LIBRARY_NAME}_dead_letter"
FN_ENSURE_META = f"{LIBRARY_NAME}_ensure_meta"
FN_FORGET_CONSUMER = f"{LIBRARY_NAME}_forget_consumer"


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """Where stream-mode calls acknowledge entries and publish alerts and dead letters."""

    events: str
    alerts: str
    dead: str
    group: str
    alerts_maxlen: int = 0
    dead_maxlen: int = 0


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one atomic index step did.

    `status` is one of indexed, repeat, duplicate, stale, deleted, absent, not_pending; `matches` lists the matches
    (at most max_matches of them when that is set), closest first, while `match_count` counts them all.
    """

    status: str
    match_count: int = 0
    candidates: int = 0
    alert_id: str | None = None
    matches: list[tuple[str, int]] = field(default_factory=list)
    stored: int | None = None  # for a duplicate: the fingerprint already indexed


@dataclass(frozen=True, slots=True)
class Posting:
    """One band of a fingerprint: where its bits are, its value, its posting set and whether that holds an ID."""

    band: int
    offset: int
    width: int
    value: int
    key: str
    size: int
    member: bool


def parse_apply(reply: Sequence[Any]) -> ApplyResult:
    """Turn the reply of the apply function into an `ApplyResult`."""
    status = text(reply[0])
    extra = text(reply[3])
    if status == "duplicate":
        return ApplyResult(status, stored=parse_fingerprint(extra))
    return ApplyResult(
        status,
        match_count=int(reply[1]),
        candidates=int(reply[2]),
        alert_id=extra or None,
        matches=pairs(reply[4:]),
    )


def batched(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    """Lists of `size` items (the last one shorter); itertools.batched arrives only with Python 3.12."""
    iterator = iter(items)
    while part := list(islice(iterator, size)):
        yield part


_HEX4 = [f"{v:04x}" for v in range(1 << 16)]


@functools.lru_cache(maxsize=64)
def _key_table(prefix: str, bits: int, digits: int) -> list[str]:
    """`prefix` + each `bits`-bit value in `digits` hex digits; shared by every index of a namespace."""
    return [f"{prefix}{v:0{digits}x}" for v in range(1 << bits)]


class _BandKeys:
    """Builds the posting key names of one band fast: one list lookup (and at most one concatenation) per key.

    Each query builds 68 keys under the default layout and 508 under 3 bands; `format` per key would cost more
    client time than the server spends on the whole call at small index sizes. The probe keys of recent band
    values are kept too: incident fingerprints cluster, so the same band values come back again and again.
    """

    _CACHE_KEYS = 100_000  # per band: ~6,000 band values under the default layout, 400 to 4,700 under 3 bands (~30 MB)

    def __init__(self, prefix: str, width: int, digits: int, masks: Sequence[int]) -> None:
        self.prefix, self.width, self.digits, self.masks = prefix, width, digits, tuple(masks[1:])
        self._cache_size = max(64, self._CACHE_KEYS // max(1, len(self.masks)))
        self._full: list[str] | None = None
        self._high: list[str] | None = None
        self._probes: dict[int, tuple[str, ...]] = {}
        if width <= 16:
            self._full = _key_table(prefix, width, digits)
        elif width <= 32:
            self._high = _key_table(prefix, width - 16, digits - 4)

    def key(self, value: int) -> str:
        if self._full is not None:
            return self._full[value]
        return self.keys(value, (0,))[0]

    def probes(self, value: int) -> tuple[str, ...]:
        """The keys of every other value this band probes around `value` (at its own radius in the layout)."""
        found = self._probes.get(value)
        if found is None:
            if len(self._probes) >= self._cache_size:
                self._probes.clear()
            found = self._probes[value] = tuple(self.keys(value, self.masks))
        return found

    def keys(self, value: int, masks: Sequence[int]) -> list[str]:
        """The key of `value ^ mask` for each mask."""
        if self._full is not None:
            full = self._full
            return [full[value ^ mask] for mask in masks]
        if self._high is not None:
            high, low = self._high, _HEX4
            return [high[(v := value ^ mask) >> 16] + low[v & 0xFFFF] for mask in masks]
        return [f"{self.prefix}{value ^ mask:0{self.digits}x}" for mask in masks]


_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; without it, redis-py's pipeline does the packing
    _pack_command = None


def _is_missing_function(error: ResponseError) -> bool:
    return "function not found" in str(error).lower()


class Calls:
    """Batches of commands pipelined on one connection, with more than one batch in flight.

    A worker sends batch k + 1 before it reads the replies of batch k, so the server always has work while the
    client handles replies and prepares the next batch: on two cores that overlap is worth a third of the
    throughput. Commands are packed by hiredis and written directly: redis-py's pipeline inspects each of ~90
    arguments per event in Python first. Standalone clients only.
    """

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._connection: Any = pool.get_connection()
        self._in_flight: deque[int] = deque()

    def send(self, commands: Sequence[tuple[Any, ...]]) -> None:
        """Write a batch; its replies come from a later `receive`."""
        try:
            # no health check here: its PING would read the replies of the batch in flight
            assert _pack_command is not None
            self._connection.send_packed_command(
                [b"".join([_pack_command(c) for c in commands])],
                check_health=False,
            )
        except BaseException:
            self._broken()
            raise
        self._in_flight.append(len(commands))

    def receive(self) -> list[Any]:
        """The replies of the oldest batch sent, in order: each reply, or the ResponseError it got."""
        count = self._in_flight.popleft()
        replies: list[Any] = []
        try:
            for _ in range(count):
                try:
                    replies.append(self._connection.read_response())
                except ResponseError as error:
                    replies.append(error)
        except BaseException:
            self._broken()
            raise
        return replies

    def _broken(self) -> None:
        # replies may still be on their way: this connection must never be reused
        self._in_flight.clear()
        self._connection.disconnect()

    def close(self) -> None:
        if self._connection is None:
            return
        if self._in_flight:
            self._broken()
        self._pool.release(self._connection)
        self._connection = None

    def __enter__(self) -> Calls:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class FingerprintIndex:
    """A near-duplicate index of incidents in one Redis namespace.

    `redis` is any redis-py client, standalone or cluster, decoding responses or not. The namespace's layout
    (`bands`, `max_distance`) is written to `{N}:meta` on first use; opening the namespace later with another
    layout raises `LayoutMismatchError`.
    """

    def __init__(
        self,
        redis: RedisClient,
        namespace: str = DEFAULT_NAMESPACE,
        bands: int = DEFAULT_BANDS,
        max_distance: int = DEFAULT_MAX_DISTANCE,
    ) -> None:
        self.redis = redis
        self.keys = IndexKeys(namespace)
        self.layout = BandLayout(bands, max_distance)
        self.layout_tag = f"{SCHEME}/bands={bands}/max_distance={max_distance}/format={FORMAT_VERSION}"
        self._opened = False
        self._band_keys = [
            _BandKeys(self.keys.band_prefix(b), width, digits, masks)
            for b, (width, digits, masks) in enumerate(
                zip(self.layout.widths, self.layout.hex_digits, self.layout.probe_masks, strict=True)
            )
        ]

    @classmethod
    def stored(cls, redis: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> FingerprintIndex | None:
        """The namespace's index with the layout recorded in `{N}:meta`, or None before any worker opened it.

        Writes nothing: read-only tools use it, so that a query cannot fix a namespace's layout by accident.
        """
        meta = cls.read_meta(redis, namespace)
        if not meta:
            return None
        try:
            bands, max_distance = int(meta["bands"]), int(meta["max_distance"])
        except (KeyError, ValueError):
            raise LayoutMismatchError(
                f"{IndexKeys(namespace).meta} holds no band layout, so it is not the meta of an incident index"
            ) from None
        return cls(redis, namespace, bands, max_distance)

    @staticmethod
    def read_meta(redis: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
        """`{N}:meta` as text; {} when no worker has opened the namespace yet."""
        return {text(k): text(v) for k, v in (redis.hgetall(IndexKeys(namespace).meta) or {}).items()}

    # -- setting up -------------------------------------------------------------------------------------------

    def meta_fields(self) -> dict[str, str]:
        """What `{N}:meta` records about this layout, readable with `HGETALL`."""
        return {
            "layout": self.layout_tag,
            "scheme": SCHEME,
            "format_version": str(FORMAT_VERSION),
            "bands": str(self.layout.bands),
            "band_widths": ",".join(str(w) for w in self.layout.widths),
            "max_distance": str(self.layout.max_distance),
            "probe_radius": ",".join(str(p) for p in self.layout.radii),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def load_library(self) -> None:
        """Load (or reload) the server-side functions; on a cluster, on every primary."""
        self.redis.function_load(LIBRARY_SOURCE, replace=True)

    def open(self) -> None:
        """Load the functions and check `{N}:meta` (writing it on first use). Called by the first operation."""
        self.load_library()
        fields = self.meta_fields()
        layout = fields.pop("layout")
        args: list[str] = [layout]
        for name, value in fields.items():
            args += [name, value]
        stored = text(self.redis.fcall(FN_ENSURE_META, 1, self.keys.meta, *args))
        if stored != layout:
            raise LayoutMismatchError(self._mismatch_message(stored))
        self._opened = True

    def _mismatch_message(self, stored: str) -> str:
        if not stored:
            return (
                f"{self.keys.meta} exists but is not the meta of an incident index; "
                f"choose another namespace or delete the key"
            )
        return (
            f"namespace {self.keys.namespace!r} was built as {stored!r}, but this index is configured as "
            f"{self.layout_tag!r}; use the stored layout (bands and max distance), or another namespace"
        )

    def _ensure_open(self) -> None:
        if not self._opened:
            self.open()

    def _fcall(self, function: str, keys: Sequence[str], args: Sequence[Any], *, readonly: bool = False) -> Any:
        self._ensure_open()
        call = self.redis.fcall_ro if readonly else self.redis.fcall
        try:
            return call(function, len(keys), *keys, *args)
        except ResponseError as error:
            if self.handle_error(error):
                return call(function, len(keys), *keys, *args)
            raise

    def handle_error(self, error: ResponseError) -> bool:
        """Recover from an error reply of a call if it can be recovered: True means retry the call.

        A server that restarted without persistence has lost the functions and may have lost `{N}:meta`;
        both are put back. A layout mismatch raises `LayoutMismatchError`.
        """
        message = str(error)
        if _is_missing_function(error) or message.startswith("NOMETA"):
            self.open()
            return True
        if message.startswith("LAYOUT"):
            raise LayoutMismatchError(message.removeprefix("LAYOUT ")) from None
        return False

    # -- key building (hot path) ------------------------------------------------------------------------------

    def posting_keys(self, fp: int) -> list[str]:
        """The posting keys of a fingerprint, band 0 first."""
        return [band.key(value) for band, value in zip(self._band_keys, self.layout.values(fp), strict=True)]

    def probe_keys(self, fp: int, max_distance: int | None = None) -> tuple[list[str], int, list[str]]:
        """The fingerprint's posting keys, how many of them (band 0 first) a query probes, and its other probe keys.

        A query within `max_distance` (default: the layout's) probes the bands of `BandLayout.masks`: a prefix of
        them, each at its own radius.
        """
        own: list[str] = []
        others: list[str] = []
        probed = 0
        values = self.layout.values(fp)
        if max_distance is None or max_distance >= self.layout.max_distance:
            for band, value in zip(self._band_keys, values, strict=True):
                own.append(band.key(value))
                others.extend(band.probes(value))
            return own, self.layout.probed_bands, others
        for band, value, masks in zip(self._band_keys, values, self.layout.masks(max_distance), strict=True):
            own.append(band.key(value))
            if masks:
                probed += 1
                others.extend(band.keys(value, masks[1:]))
        return own, probed, others

    def apply_call(
        self,
        op: str,
        incident_id: str,
        fp: int | None,
        *,
        expected: int | str | None = "*",
        stream: StreamTarget | None = None,
        entry_id: str = "",
        max_matches: int = 0,
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of one apply call (see index.lua): for a pipeline, or for `_fcall`.

        `expected` is the fingerprint the caller believes is stored (None: not indexed; "*": don't check).
        """
        if fp is None:
            own: list[str] = []
            others: list[str] = []
            probed = 0
        else:
            own, probed, others = self.probe_keys(fp)
        old = [] if expected in (None, "*") or op == "add" else self.posting_keys(expected)  # type: ignore[arg-type]
        if expected == "*":
            expected_arg = "*"
        elif expected is None:
            expected_arg = "-"
        else:
            expected_arg = format_fingerprint(expected)  # type: ignore[arg-type]
        keys = [
            self.keys.meta,
            self.keys.fingerprints,
            self.keys.changes,
            stream.events if stream else self.keys.events,
            stream.alerts if stream else self.keys.alerts,
            *own,
            *old,
            *others,
        ]
        args = [
            op,
            incident_id,
            "" if fp is None else format_fingerprint(fp),
            expected_arg,
            self.layout_tag,
            self.layout.max_distance,
            len(own),
            len(old),
            stream.group if stream else "",
            entry_id,
            stream.alerts_maxlen if stream else 0,
            max_matches,
            probed,
        ]
        return keys, args

    def apply_command(self, op: str, incident_id: str, fp: int | None, **kwargs: Any) -> tuple[Any, ...]:
        """One apply call as a command for `execute`; parse its reply with `parse_apply`."""
        keys, args = self.apply_call(op, incident_id, fp, **kwargs)
        return ("FCALL", FN_APPLY, len(keys), *keys, *args)

    def dead_letter_command(self, stream: StreamTarget, entry_id: str, fields: Mapping[Any, Any]) -> tuple[Any, ...]:
        """A dead-letter call for `execute`: publish `fields` and acknowledge the entry, if it is still pending.

        Its reply is the dead letter's ID, or '' when the entry was no longer pending.
        """
        flat = [part for name, value in fields.items() for part in (name, value)]
        return (
            "FCALL",
            FN_DEAD_LETTER,
            2,
            stream.events,
            stream.dead,
            stream.group,
            entry_id,
            stream.dead_maxlen,
            *flat,
        )

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send commands in one pipeline, in order; returns each reply, or the ResponseError it got."""
        if not commands:
            return []
        calls = self.calls()
        if calls is None:
            pipe = self.redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))
        with calls:
            calls.send(commands)
            return calls.receive()

    def calls(self) -> Calls | None:
        """A `Calls` on a connection of its own, or None for clients it cannot serve (cluster): use `execute`."""
        client = self.redis
        if (
            _pack_command is None
            or not isinstance(client, Redis)
            or type(client).__name__ not in ("Redis", "StrictRedis")
        ):
            return None
        return Calls(client.connection_pool)

    def forget_consumer(self, stream: StreamTarget, consumer: str) -> bool:
        """Remove a consumer from the group if, at that moment, it has nothing pending."""
        return bool(self._fcall(FN_FORGET_CONSUMER, [stream.events], [stream.group, consumer]))

    def fingerprints_of(self, incident_ids: Sequence[str]) -> dict[str, int | None]:
        """The stored fingerprint of each ID (None when not indexed), in one round trip."""
        if not incident_ids:
            return {}
        stored = self.redis.hmget(self.keys.fingerprints, list(incident_ids))
        return {i: None if v is None else parse_fingerprint(v) for i, v in zip(incident_ids, stored, strict=True)}

    def bulk_load(self, items: Iterable[tuple[str, int]], *, chunk: int = 5000) -> int:
        """Index many (incident ID, fingerprint) pairs without looking for matches; returns how many.

        For loading a new index (a benchmark's pre-load, a migration, a rebuild from another store): pipelined
        HSET and SADD, not atomic per incident, and blind to IDs already indexed with another fingerprint, so use
        it only for IDs the index does not hold yet and while no worker writes to the namespace.
        """
        self._ensure_open()
        total = 0
        for part in batched(items, chunk):
            fingerprints: dict[Any, str] = {}
            postings: dict[str, list[str]] = defaultdict(list)
            for incident_id, fp in part:
                fingerprints[incident_id] = format_fingerprint(self._check_fp(fp))
                for key in self.posting_keys(fp):
                    postings[key].append(incident_id)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(self.keys.fingerprints, mapping=fingerprints)
            for key, members in postings.items():
                pipe.sadd(key, *members)
            for incident_id in fingerprints:
                pipe.xadd(self.keys.changes, {"add": incident_id})
            pipe.execute()
            total += len(fingerprints)
        return total

    # -- the library API --------------------------------------------------------------------------------------

    def _apply(self, op: str, incident_id: str, fp: int | None, **kwargs: Any) -> ApplyResult:
        keys, args = self.apply_call(op, incident_id, fp, **kwargs)
        return parse_apply(self._fcall(FN_APPLY, keys, args))

    @staticmethod
    def _check_id(incident_id: Any) -> str:
        if not isinstance(incident_id, str) or not 1 <= len(incident_id) <= 256:
            raise ValueError(f"incident_id must be a string of 1 to 256 characters, got {incident_id!r:.80}")
        return incident_id

    @staticmethod
    def _check_fp(fp: Any) -> int:
        if type(fp) is not int or not 0 <= fp < 1 << 64:
            raise ValueError(f"a fingerprint is an integer from 0 to 2**64 - 1, got {fp!r:.80}")
        return fp

    def add(self, incident_id: str, features: Mapping[str, int]) -> list[tuple[str, int]]:
        """Find every indexed incident within max_distance, then index this one, in one atomic step.

        Returns the matches sorted by (distance, ID). Adding an ID again with the same fingerprint changes nothing
        and returns []; with another fingerprint it raises `DuplicateIncidentError` and changes nothing.
        """
        return self.add_fingerprint(incident_id, fingerprint(features))

    def add_fingerprint(self, incident_id: str, fp: int) -> list[tuple[str, int]]:
        """`add` for a fingerprint computed elsewhere."""
        self._check_id(incident_id)
        result = self._apply("add", incident_id, self._check_fp(fp))
        if result.status == "duplicate":
            assert result.stored is not None
            raise DuplicateIncidentError(incident_id, result.stored, fp)
        return result.matches

    def upsert(self, incident_id: str, features: Mapping[str, int]) -> list[tuple[str, int]]:
        """Replace the incident's fingerprint and postings (its old self never matches), returning the matches.

        Upserting the fingerprint already stored changes nothing and returns [].
        """
        return self.upsert_fingerprint(incident_id, fingerprint(features))

    def upsert_fingerprint(self, incident_id: str, fp: int) -> list[tuple[str, int]]:
        """`upsert` for a fingerprint computed elsewhere."""
        self._check_id(incident_id)
        return self._retrying("upsert", incident_id, self._check_fp(fp)).matches

    def delete(self, incident_id: str) -> bool:
        """Remove the incident's fingerprint and postings; False when it was not indexed."""
        self._check_id(incident_id)
        return self._retrying("delete", incident_id, None).status == "deleted"

    def _retrying(self, op: str, incident_id: str, fp: int | None) -> ApplyResult:
        result = retry_while_stale(
            lambda: self._apply(op, incident_id, fp, expected=self.get(incident_id)), lambda r: r.status
        )
        if result is None:
            raise StaleRetriesExhaustedError(
                f"incident {incident_id!r} changed under {op} {STALE_RETRIES} times in a row; "
                "another client is rewriting it in a loop"
            )
        return result

    def neighbours(self, features: Mapping[str, int], max_distance: int | None = None) -> list[tuple[str, int]]:
        """Every indexed incident within `max_distance` (at most the configured one) of a bag, without indexing it."""
        return self.neighbours_of(fingerprint(features), max_distance)

    def neighbours_of(self, fp: int, max_distance: int | None = None) -> list[tuple[str, int]]:
        """`neighbours` for a fingerprint."""
        limit = self.layout.max_distance if max_distance is None else max_distance
        if type(limit) is not int or not 0 <= limit <= self.layout.max_distance:
            raise ValueError(
                f"max_distance={max_distance!r}: this index finds neighbours up to {self.layout.max_distance}"
            )
        own, probed, others = self.probe_keys(fp, limit)
        keys = [self.keys.meta, self.keys.fingerprints, *own[:probed], *others]
        reply = self._fcall(FN_NEIGHBOURS, keys, [format_fingerprint(fp), limit, self.layout_tag], readonly=True)
        return pairs(reply[2:])

    def postings(self, incident_id: str, fp: int) -> list[Posting]:
        """Each band's posting set of a fingerprint, its size, and whether it holds the incident (one round trip)."""
        keys = self.posting_keys(fp)
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.scard(key)
            pipe.sismember(key, incident_id)
        replies = pipe.execute()
        layout = self.layout
        return [
            Posting(
                band,
                layout.offsets[band],
                layout.widths[band],
                value,
                key,
                int(replies[2 * band]),
                bool(replies[2 * band + 1]),
            )
            for band, (key, value) in enumerate(zip(keys, layout.values(fp), strict=True))
        ]

    def get(self, incident_id: str) -> int | None:
        """The incident's fingerprint, or None when it is not indexed."""
        stored = self.redis.hget(self.keys.fingerprints, incident_id)
        return None if stored is None else parse_fingerprint(stored)

    def __len__(self) -> int:
        return int(self.redis.hlen(self.keys.fingerprints))

    def _info_memory(self) -> dict[str, Any]:
        """INFO memory of the server holding this index (on a cluster: the node that owns its hash tag)."""
        nodes = getattr(self.redis, "get_node_from_key", None)
        if nodes is not None:
            info = self.redis.info("memory", target_nodes=nodes(self.keys.meta))
        else:
            info = self.redis.info("memory")
        if isinstance(info, dict) and "used_memory" not in info and len(info) == 1:
            info = next(iter(info.values()))  # some cluster clients answer {node: info}
        return info if isinstance(info, dict) else {}

    def stats(self) -> dict[str, Any]:
        """Incidents indexed, the layout, and Redis memory where the server reports it."""
        count = len(self)
        stats: dict[str, Any] = {
            "namespace": self.keys.namespace,
            "incidents": count,
            "layout": self.layout.description,
            "bands": self.layout.bands,
            "band_widths": list(self.layout.widths),
            "max_distance": self.layout.max_distance,
            "probe_radius": list(self.layout.radii),
            "probes_per_query": self.layout.probes,
            "meta": {text(k): text(v) for k, v in (self.redis.hgetall(self.keys.meta) or {}).items()},
        }
        # Each figure on its own: a server, proxy or ACL user may allow one of MEMORY USAGE and INFO and not the other.
        try:
            fp_bytes = self.redis.memory_usage(self.keys.fingerprints)
        except ResponseError:
            fp_bytes = None
        if fp_bytes is not None:
            stats["fingerprint_hash_bytes"] = int(fp_bytes)
        try:
            info = self._info_memory()
        except ResponseError:
            info = {}
        if "used_memory" in info:
            stats["used_memory"] = int(info["used_memory"])
            if count:
                stats["used_memory_per_incident"] = round(int(info["used_memory"]) / count, 1)
        return stats
