"""The stream worker: reads the events stream through a consumer group and applies each entry.

What each entry does: docs/contract.md#what-each-entry-does.

One loop, one thread:

* start: create the group at the beginning of the stream (tolerating only BUSYGROUP), load the index's functions,
  and first finish this consumer's own pending entries (a crashed predecessor's: each counts one more delivery);
* read a batch through the `read_new` function (worker/entries.py: each entry sized on the server, a huge one sent
  only as a summary; the stream is polled, at most `block_ms` apart, when it is idle), validate and fingerprint it,
  and pipeline one atomic server-side call per entry (check, index, alert, acknowledge; or dead-letter and
  acknowledge);
* every `claim_interval_ms`: re-read its own pending entries (replies lost to a dropped connection end up there;
  re-reading them counts no delivery), take over entries idle longer than `claim_idle_ms`, and dead-letter entries
  delivered more than `max_deliveries` times as poison (a delivery: the first read, a takeover, a restart, a failed
  call);
* keep a heartbeat key alive, log a summary now and then, and reconnect with capped exponential backoff when Redis
  goes away. Nothing is acknowledged that was not done: every acknowledgement is part of the atomic call.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib
from pydantic import ValidationError
from redis.backoff import ExponentialBackoff
from redis.connection import parse_url
from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, ResponseError, TryAgainError

from .connection import RedisClient
from .entries import Entry, next_id, parse_entries
from .errors import (
    CredentialsRefusedError,
    DuplicateIncidentError,
    KeyTypeError,
    LayoutMismatchError,
    PreflightError,
    TlsUnverifiedError,
)
from .fingerprint import format_fingerprint
from .formats import MAX_INCIDENT_ID_LENGTH, DeadLetter, Heartbeat, IncidentEvent, event_error
from .index import FingerprintIndex, retry_while_stale
from .keys import IndexKeys
from .keytypes import another_type, diagnose, held_type, incident_keys, is_wrong_type, search_keys
from .library import (
    FN_APPLY,
    FN_CLAIM,
    FN_PREFLIGHT,
    FN_READ_NEW,
    FN_READ_PENDING,
    SnapshotClaim,
    StreamTarget,
    apply_batch,
    dead_letter_command,
    parse_apply,
)
from .logs import error_message, get_logger
from .metrics import Metrics
from .readpath import SNAPSHOT_SEND, SnapshotReader
from .replies import consumers_info, entry_time_ms, group_info, text
from .settings import Settings
from .text import TOKENIZER_VERSION
from .transport import Command
from .upkeep import Upkeep
from .watchdog import Watchdog

__all__ = ["StreamWorker", "WorkerStats"]

_DEAD_CONSUMER_IDLE_MS = 3_600_000
"""A consumer with nothing pending and silent for an hour has gone; its name is removed from the group."""

_FORGET_WORKER_MS = 3_600_000
"""A name in `{N}:workers` whose heartbeat expired an hour ago (a crashed worker's) is removed by the next beat of any
worker: the registry holds the workers of the last hour, and `check` reads a bounded number of them."""


_WAIT_OUT_CODES = frozenset({"BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"})
"""Replies of a server that cannot serve for now (a long script, loading, a replica, a failover, too few replicas):
waited out with backoff like a lost connection. None of them says anything about the entry that got it."""


def waits_out(error: BaseException) -> bool:
    """Whether an error reply means "not now" rather than "this call failed" (see _WAIT_OUT_CODES)."""
    if isinstance(error, ReadOnlyError | TryAgainError | ClusterDownError | redis_lib.BusyLoadingError):
        return True  # redis-py strips the code from these
    return isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in _WAIT_OUT_CODES


@dataclass
class _Item:
    """One stream entry on its way through a batch."""

    entry_id: str
    fields: Mapping[Any, Any]  # for validation: a repeated field name counts with its last value
    deliveries: int = 1
    event: IncidentEvent | None = None
    dead: tuple[str, str] | None = None  # (reason, detail)
    full_search: bool = False  # the snapshot's claim was not validated: search inside the atomic step
    entry: Entry | None = None  # as read: every field in order, or an oversized entry's summary


@dataclass
class WorkerStats:
    """Counters since start, for the summary line and for tests."""

    processed: int = 0
    alerts: int = 0
    dead_letters: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    reconnects: int = 0

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def _start_refused_on_another_type(
    error: ResponseError, redis: RedisClient, keys: IndexKeys, key: str, kind: str
) -> Exception:
    """A WRONGTYPE reply about `key` as the PreflightError that stops the worker (exit 2), naming it, the type it
    holds and what to do (`keytypes.another_type`); other errors as they are."""
    if not is_wrong_type(error):
        return error
    return PreflightError(another_type(keys, key, kind, held_type(redis, key)) + "; so the worker does not start")


def tls_unverified(error: BaseException) -> bool:
    """Whether a connection failed because a server's TLS certificate could not be verified (redis-py wraps the
    ssl module's error in a ConnectionError, and a Sentinel client's MasterNotFoundError quotes it)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError) or "certificate verify failed" in str(current).lower():
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class StreamWorker:
    """Consumes `settings.events_stream` as `settings.consumer` of `settings.group` until `stop()` is called."""

    def __init__(
        self,
        redis: RedisClient,
        settings: Settings,
        *,
        index: FingerprintIndex | None = None,
        metrics: Metrics | None = None,
        watchdog: Watchdog | None = None,
        replica: RedisClient | None = None,
    ) -> None:
        encoder = getattr(redis, "get_encoder", None)
        if encoder is not None and encoder().decode_responses:
            raise ValueError(
                "the worker needs a Redis client with decode_responses=False: with decoding on, one entry that is "
                "not UTF-8 would make every read of the stream fail"
            )
        self.redis = redis
        self.settings = settings
        self.index = index or FingerprintIndex(redis, settings.namespace, settings.bands, settings.max_distance)
        self.metrics = metrics or Metrics()
        self.target = StreamTarget(
            events_stream=settings.events_stream,
            alerts_stream=settings.alerts_stream,
            dead_stream=settings.dead_stream,
            group=settings.group,
            alerts_maxlen=settings.alerts_maxlen,
            dead_maxlen=settings.dead_maxlen,
        )
        self.limits = settings.event_limits
        self.stats = WorkerStats()
        self.log = get_logger(consumer=settings.consumer, stream=settings.events_stream)
        self._stop = threading.Event()
        self.stopped = threading.Event()
        """Set when `run` has returned."""
        self.watchdog = watchdog
        self._reader = _reader()
        self._backoff = ExponentialBackoff(cap=settings.reconnect_max_backoff_s, base=0.05)
        self._heartbeat_key = settings.keys.heartbeat(settings.consumer)
        self._next_heartbeat = 0.0
        self._next_claim = 0.0
        self._next_summary = 0.0  # at once: the gauges of /metrics (lag, pending, index size) say where things stand
        self._started = time.time()
        self.upkeep = Upkeep(self.index, settings, self.log, self.metrics)
        self.snapshot: SnapshotReader | None = None
        self.replica = replica  # where the snapshot path reads its copy, when not the primary (readpath.py)
        self._restarted = True  # the first recovery finds what a previous run of this consumer left: deliveries
        self._idle_wait = 0.0
        self._tokenizer = str(TOKENIZER_VERSION)
        self._layout_seen: tuple[str, str] | None = None
        self._outcomes: dict[str, int] = {}  # of the replies handled since the last _count_outcomes

    # -- control ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the current batch, then return from `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, until_idle: bool = False) -> WorkerStats:
        """Process entries until `stop()`; with `until_idle`, also return once the stream has nothing left for us."""
        self.log.info(
            "worker starting",
            group=self.settings.group,
            redis=self.settings.safe_redis_url,
            layout=self.index.layout.description,
            alerts=self.target.alerts_stream,
            dead=self.target.dead_stream,
        )
        self.stopped.clear()
        if self.watchdog is not None:
            self.watchdog.start()
        try:
            self._loop(until_idle)
            self._shutdown()
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.stopped.set()
        return self.stats

    def _loop(self, until_idle: bool) -> None:
        failures = 0
        ready = False
        started = False  # set up once: a refusal of the credentials after that is waited out like an outage
        while not self.stopping:
            try:
                if not ready:
                    self.setup()
                    ready = started = True
                    self.recover_own_pending()
                self.maintain()
                read = self.read_and_process()
                failures = 0
                if read:
                    self._idle_wait = 0.0
                    continue
                if until_idle and self._idle():
                    break
                # an idle stream is polled, 5 ms after the last entry and then less and less often, up to block_ms
                self._idle_wait = min(self.settings.block_ms / 1000, max(0.005, self._idle_wait * 2))
                self._stop.wait(self._idle_wait)
            except LayoutMismatchError:
                raise
            except redis_lib.AuthenticationError as error:
                if not started:
                    raise CredentialsRefusedError(
                        f"Redis at {self.settings.safe_redis_url} refused the worker's credentials "
                        f"({error_message(error)}): check the user name and password of REDIS_URL (or the secret it "
                        "comes from) against the server's users (ACL LIST; deploy/ holds the worker's)"
                    ) from None
                failures += 1
                ready = False
                self._reconnect_pause(error, failures, "redis refused the worker's credentials; retrying")
            except (
                redis_lib.ConnectionError,
                redis_lib.TimeoutError,
                redis_lib.BusyLoadingError,
                OutOfMemoryError,
            ) as error:
                if not started and tls_unverified(error):
                    raise TlsUnverifiedError(
                        f"the TLS certificate of Redis at {self.settings.safe_redis_url} (or of its Sentinels) could "
                        f"not be verified ({error_message(error)}): check ssl_ca_certs in REDIS_URL (the authority "
                        "that signed the server's certificate), the host name or address the certificate holds, and "
                        "its dates"
                    ) from None
                failures += 1
                ready = False
                self._reconnect_pause(error, failures)
            except ResponseError as error:
                if waits_out(error):
                    failures += 1
                    ready = False
                    self._reconnect_pause(error, failures, "redis cannot serve for now; waiting")
                    continue
                lost = "NOGROUP" in str(error) or str(error).startswith("UNBLOCKED")
                if lost or self.index.handle_error(error):
                    # the stream, the group or the functions went away (deleted, or a server restarted without
                    # persistence): set up again, without spinning should it keep happening
                    failures += 1
                    ready = False
                    self.log.warning("redis lost state; setting up again", error=str(error), attempt=failures)
                    self._stop.wait(self._backoff.compute(failures) if failures > 1 else 0)
                    continue
                if is_wrong_type(error):  # a key of fixed name (the lease, a stream) holds another type: name it
                    streams = [self.target.events_stream, self.target.alerts_stream, self.target.dead_stream]
                    raise diagnose(self.redis, self.index.keys, streams=streams) from None
                raise

    def _idle(self) -> bool:
        """Nothing pending and nothing undelivered, group-wide. Looks past the group's last delivered ID itself rather
        than trust XINFO's `lag`, which is an estimate (and unknown after deletions).

        The pending count and the last delivered ID come from one reply (XINFO GROUPS), so they describe one moment:
        read apart (XPENDING, then XINFO), another worker's read in between made a group look idle while that worker
        held the entries it had just read, and this worker left; had that one died then, nobody was left to take its
        entries over. Entries after the position seen cannot have been read since without it moving: if there are
        none now, there were none then."""
        group = group_info(self.redis, self.target.events_stream, self.target.group)
        if group is None:
            return True
        if int(group.get("pending", 0)) != 0:
            return False
        later = self.redis.xrange(self.target.events_stream, min=f"({group['last-delivered-id']}", count=1)
        return not later

    def _reconnect_pause(self, error: Exception, failures: int, message: str = "redis unavailable; retrying") -> None:
        delay = self._backoff.compute(failures)
        self.stats.reconnects += 1
        self.metrics.reconnects.inc()
        self.log.warning(
            message,
            error=error_message(error),
            attempt=failures,
            retry_in_s=round(delay, 2),
            redis=self.settings.safe_redis_url,
        )
        self._stop.wait(delay)

    def _shutdown(self) -> None:
        self._reader.shutdown(wait=True)
        self._reader = _reader()  # a worker can be run again (tests do)
        with contextlib.suppress(redis_lib.RedisError):
            self.redis.delete(self._heartbeat_key)
            self.redis.zrem(self.index.keys.workers, self.settings.consumer)
            self.upkeep.release()
        self.log.info(
            "worker stopped",
            processed=self.stats.processed,
            alerts=self.stats.alerts,
            dead_letters=self.stats.dead_letters,
        )

    # -- setup and maintenance --------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the consumer group at the start of the stream, and load and check the index."""
        try:
            self.redis.xgroup_create(self.target.events_stream, self.target.group, id="0", mkstream=True)
            self.log.info("consumer group created", group=self.target.group)
        except OutOfMemoryError:
            # refused before Redis looks for the group (maxmemory): go on when it exists, to reach the upkeep that may
            # free the memory
            if group_info(self.redis, self.target.events_stream, self.target.group) is None:
                raise
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise _start_refused_on_another_type(
                    error, self.redis, self.index.keys, self.target.events_stream, "stream"
                ) from None
        try:
            self.index.open()
        except ResponseError as error:
            raise _start_refused_on_another_type(
                error, self.redis, self.index.keys, self.index.keys.meta, "hash"
            ) from None
        self.preflight()
        if self.index.adopted:
            self.log.warning(
                "the index was moved to another layout (incident-worker migrate); using the index's",
                configured=self.index.configured_tag,
                index_layout=self.index.layout.description,
                hint="set the bands and max distance to the index's layout",
            )
        self.index.check_tokenizer()
        self.upkeep.configure()
        self.choose_read_path()
        self.heartbeat()

    def preflight(self) -> None:
        """Refuse to start (PreflightError) when this worker's Redis user may not run a command the index's functions
        send, or one of the namespace's keys holds another type: a call would stop there, keeping what it wrote before
        (an incident indexed without its change-log entry or its alert, which its retry takes for a repeat)."""
        keys, target = self.index.keys, self.target
        reply = self.index.call(
            FN_PREFLIGHT,
            [
                *(keys.meta, keys.fingerprints, keys.changes),
                *(target.events_stream, target.alerts_stream, target.dead_stream),
                *(self.index.posting_keys(0)[0], keys.twins("0" * 16), keys.expiry),
            ],
            [target.group],
        )
        found = [text(value) for value in reply]
        problems = []
        denied = [(found[k + 1], found[k + 2]) for k in range(0, len(found), 3) if found[k] == "denied"]
        if denied:
            user = parse_url(self.settings.redis_url.get_secret_value()).get("username") or "default"
            refused = ", ".join(f"{command} on {key}" if key else command for command, key in denied)
            grants = " ".join(sorted({f"+{command.lower()}" for command, _ in denied}))
            problems.append(
                f"the Redis user {user!r} may not run {refused}, which the index's functions send; grant them "
                f"(ACL SETUSER {user} {grants}; the user's keys must include {keys.tag}:*), as deploy/redis/users.acl "
                "does for incident-worker"
            )
        problems += [
            another_type(keys, found[k + 1], found[k + 2], held_type(self.redis, found[k + 1]))
            for k in range(0, len(found), 3)
            if found[k] == "type"
        ]
        if problems:
            raise PreflightError(
                "; and ".join(problems) + ". A call refused midway would keep what it wrote before (an incident "
                "indexed without its alert), so the worker does not start"
            )

    def choose_read_path(self) -> None:
        """Search a copy of the index in this worker once the settings (or, with auto, the index's size) ask for it.

        Auto never switches back: a copy that is loaded stays correct however small the index gets.
        """
        if self.snapshot is not None or self.settings.read_path == "primary":
            return
        if self.settings.read_path == "auto":
            try:
                size = len(self.index)
            except ResponseError:  # a damaged fingerprint hash: the primary path reports it entry by entry
                return
            if size < self.settings.snapshot_min_incidents:
                return
        self.snapshot = SnapshotReader(
            self.redis, self.index.keys, self.index.layout, log=self.log, replica=self.replica
        )
        self.snapshot.refresh()

    def maintain(self) -> None:
        """The periodic work: heartbeat, pending recovery and claims, the summary line, the namespace's upkeep."""
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self.heartbeat()
        if now >= self._next_claim:
            self._next_claim = now + self.settings.claim_interval_ms / 1000
            self.recover_own_pending()
            self.claim_stuck()
            self.forget_gone_consumers()
            self.choose_read_path()
        if now >= self._next_summary:
            self._next_summary = now + self.settings.summary_interval_s
            self.summary()
        self.upkeep.tick()

    def heartbeat(self) -> None:
        """Refresh the heartbeat key (a JSON value with a TTL) that `incident-worker check` reads, and this worker's
        entry in `{N}:workers`, by which `check` and `stats` find it without scanning the keyspace; forget the names
        of workers whose heartbeat expired over an hour ago. One round trip."""
        ttl = self.settings.heartbeat_ttl_ms
        value = Heartbeat(
            consumer=self.settings.consumer,
            at=round(time.time(), 3),
            started=round(self._started, 3),
            processed=self.stats.processed,
            read_path="primary" if self.snapshot is None else "snapshot",
            snapshot_position=None if self.snapshot is None else self.snapshot.index.position,
        ).to_value()
        now_ms = int(time.time() * 1000)
        workers = self.index.keys.workers
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self._heartbeat_key, value, px=ttl)
        pipe.zadd(workers, {self.settings.consumer: now_ms + ttl})
        pipe.zremrangebyscore(workers, "-inf", now_ms - _FORGET_WORKER_MS)
        beat, *registered = pipe.execute(raise_on_error=False)  # (SET replaces a value of any type)
        for reply in (beat, *registered):
            if is_wrong_type(reply):
                raise self._stop_on_another_type(workers)
            if isinstance(reply, Exception) and not isinstance(reply, OutOfMemoryError):
                raise reply
        if isinstance(beat, OutOfMemoryError):
            # SET and ZADD are refused at maxmemory; extending a TTL is not (the registry keeps the name an hour)
            self.redis.pexpire(self._heartbeat_key, ttl)
        self._next_heartbeat = time.monotonic() + ttl / 3000

    def _stop_on_another_type(self, key: str) -> KeyTypeError:
        """A KeyTypeError naming `key`, what it holds and what to do: the worker stops (exit 2)."""
        keys = self.index.keys
        expected = keys.kind_of(key) or "string"
        message = another_type(keys, key, expected, held_type(self.redis, key)) + "; so the worker stops"
        return KeyTypeError(message, key, expected)

    def _group_lag(self) -> int:
        """Entries not yet delivered to the group (at least 1 when Redis cannot count them exactly)."""
        group = group_info(self.redis, self.target.events_stream, self.target.group)
        if group is None:
            return 0
        if group.get("lag") is not None:
            return int(group["lag"])
        # Redis 7 cannot count after deletions or trimming in the range: look past the last delivered
        return len(self.redis.xrange(self.target.events_stream, min=f"({group['last-delivered-id']}", count=1) or [])

    def summary(self) -> None:
        """One log line with what this worker did and where the group stands."""
        try:
            lag = self._group_lag()
            pending = int(self.redis.xpending(self.target.events_stream, self.target.group)["pending"])
            size = len(self.index)
        except ResponseError:
            return
        self.metrics.group_lag.set(lag)
        self.metrics.group_pending.set(pending)
        self.metrics.index_size.set(size)
        self.log.info(
            "summary",
            processed=self.stats.processed,
            alerts=self.stats.alerts,
            dead_letters=self.stats.dead_letters,
            lag=lag,
            pending=pending,
            indexed=size,
            outcomes=dict(self.stats.outcomes),
            **(self.snapshot.describe() if self.snapshot is not None else {"read_path": "primary"}),
        )

    # -- reading ----------------------------------------------------------------------------------------------

    def _sizes(self) -> list[int]:
        """The byte budget of one read, the largest entry sent whole, the bytes kept of a larger one's fields."""
        return [self.settings.max_batch_bytes, self.settings.max_entry_bytes, self.settings.dead_letter_prefix_bytes]

    def _read_new(self) -> list[Entry]:
        """Deliver and read the group's next entries: at most batch_size of them, and about max_batch_bytes."""
        group, consumer = self.target.group, self.settings.consumer
        reply = self.redis.fcall(
            FN_READ_NEW, 1, self.target.events_stream, group, consumer, self.settings.batch_size, *self._sizes()
        )
        return parse_entries(reply)[1]

    def read_and_process(self) -> int:
        """Read new entries (blocking up to block_ms) and process them; returns how many were read.

        Two things keep both the client and the server busy. While one batch runs on the server, the next is read
        and validated in a helper thread. And batches of adds are pipelined one ahead: batch k + 1 is sent before
        the replies of batch k are read (on one connection, so the server still applies them in stream order).
        It stops reading ahead when the stream has nothing more, after a second (to let the periodic work run), or
        when asked to stop; whatever it read is finished before it returns, so a stopping worker leaves nothing
        pending.
        """
        entries = self._read_new()
        if not entries:
            return 0
        items = self._prepare(entries)
        total = 0
        until = time.monotonic() + 1.0
        sent: deque[tuple[list[_Item], float]] = deque()
        with self.index.transport() as calls:
            while items:
                ahead = None
                if not self.stopping and time.monotonic() < until:
                    ahead = self._reader.submit(self._read_ahead)
                # a snapshot is validated from the moment it is sent: no batch goes out with a copy one batch behind
                if self.snapshot is None and all(item.event is None or item.event.op == "add" for item in items):
                    calls.send([self._command(item, {}) for item in items])
                    sent.append((items, time.perf_counter()))
                    if len(sent) > 1:
                        self._finish_sent(sent.popleft(), calls.receive())
                else:  # upserts and deletes read what they replace first: no batch may be in flight
                    while sent:
                        self._finish_sent(sent.popleft(), calls.receive())
                    self._apply(items)
                total += len(items)
                items = ahead.result() if ahead is not None else []
            while sent:
                self._finish_sent(sent.popleft(), calls.receive())
        return total

    def _finish_sent(self, batch: tuple[list[_Item], float], replies: list[Any]) -> None:
        items, started = batch
        self._finish(items, replies)
        self.stats.batches += 1
        self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _read_ahead(self) -> list[_Item]:
        entries = self._read_new()
        return self._prepare(entries) if entries else []

    def recover_own_pending(self) -> int:
        """Process this consumer's own pending entries (from a crash, a lost reply, a failed call).

        Reading them again counts no delivery, except on the first call of a run: what is pending then was left by a
        previous run of this consumer that crashed or was killed, perhaps by one of these entries.
        """
        total = 0
        start = "-"
        restarted, self._restarted = self._restarted, False
        while not self.stopping:
            reply = self.redis.fcall(
                FN_READ_PENDING,
                1,
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                start,
                self.settings.batch_size,
                *self._sizes(),
                "1" if restarted else "0",
            )
            entries = parse_entries(reply)[1]
            if not entries:
                break
            start = next_id(entries[-1].entry_id)
            self.process(entries)
            total += len(entries)
        if total:
            self.log.info("recovered own pending entries", count=total, counted_as_delivery=restarted)
        return total

    def claim_stuck(self) -> int:
        """Take over entries pending longer than claim_idle_ms with any consumer (XAUTOCLAIM to 0-0)."""
        total = 0
        cursor = "0-0"
        while not self.stopping:
            reply = self.redis.fcall(
                FN_CLAIM,
                1,
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                self.settings.claim_idle_ms,
                cursor,
                self.settings.batch_size,
                *self._sizes(),
            )
            cursor, entries = parse_entries(reply)
            if entries:
                total += len(entries)
                self.metrics.claimed.inc(len(entries))
                self.process(entries)
            if cursor == "0-0":
                break
        if total:
            self.log.info("claimed entries of silent consumers", count=total, idle_ms=self.settings.claim_idle_ms)
        return total

    def forget_gone_consumers(self) -> None:
        """Remove consumers that have nothing pending and have been silent for an hour (crashed workers' names)."""
        for consumer in consumers_info(self.redis, self.target.events_stream, self.target.group):
            name = consumer["name"]
            pending = int(consumer.get("pending", 0))
            idle = int(consumer.get("idle", 0))
            gone = name != self.settings.consumer and pending == 0 and idle > _DEAD_CONSUMER_IDLE_MS
            if gone and self.index.forget_consumer(self.target, name):
                self.log.info("removed gone consumer", gone=name, idle_ms=idle)

    # -- processing -------------------------------------------------------------------------------------------

    def process(self, entries: Sequence[Entry | tuple[Any, Any]]) -> None:
        """Validate, fingerprint and apply a batch of entries in stream order (as read, or XREADGROUP pairs)."""
        self._apply(self._prepare(entries))

    def _prepare(self, entries: Sequence[Entry | tuple[Any, Any]]) -> list[_Item]:
        """Validate and fingerprint entries; an oversized, deleted or poison one is marked for a dead letter."""
        items: list[_Item] = []
        for read in entries:
            entry = read if isinstance(read, Entry) else _entry_of(*read)
            item = _Item(entry.entry_id, dict(entry.fields), entry.deliveries, entry=entry)
            if entry.oversized is not None:
                size = entry.oversized
                item.dead = (
                    "too_large",
                    f"the entry is {size.total_bytes} bytes in {size.field_count} fields, over the limit of "
                    f"max_entry_bytes={self.settings.max_entry_bytes}; this dead letter keeps the first "
                    f"{self.settings.dead_letter_prefix_bytes} bytes of each field, original_sizes their full sizes",
                )
            elif entry.missing:  # deleted from the stream while pending (no entry can have zero fields)
                item.dead = ("missing_entry", "the entry was deleted from the stream before it was processed")
            elif item.deliveries > self.settings.max_deliveries:
                item.dead = (
                    "poison",
                    f"delivered {item.deliveries} times, more than max_deliveries={self.settings.max_deliveries}; "
                    "the workers' logs say why each attempt failed",
                )
            else:
                try:
                    item.event = IncidentEvent.from_fields(item.fields, self.limits)
                except ValidationError as error:
                    item.dead = event_error(error)
                except Exception as error:
                    item.dead = ("invalid", f"the entry could not be read: {type(error).__name__}: {error}"[:500])
            items.append(item)
        return items

    def _apply(self, items: list[_Item]) -> None:
        started = time.perf_counter()
        for segment in _segments(items):
            self._apply_segment(segment)
        self.stats.batches += 1
        self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _apply_segment(self, items: list[_Item], *, attempt: int = 0) -> None:
        self._finish(items, self._send(items), attempt=attempt)

    def _send(self, items: list[_Item]) -> list[Any]:
        """Run one call per item (upserts and deletes with what they replace, read first); returns the replies."""
        changing = [item.event.incident_id for item in items if item.event and item.event.op != "add"]
        expected = self.index.stored_values(changing)
        if self.snapshot is not None and self.snapshot.layout != self.index.layout:
            self.snapshot.relayout(self.index.layout)  # a migration switched the layout (the max distance, say)
        if self.snapshot is None:
            return self.index.execute([self._command(item, expected) for item in items])
        # The calls of one send share their copy's position and go as one apply_batch call, which reads the changes
        # after it once; each call is validated against those and the earlier calls of its send. Short sends, each
        # after a refresh, keep that to a few changes an event.
        replies: list[Any] = []
        for start in range(0, len(items), SNAPSHOT_SEND):
            self.snapshot.refresh()
            send = items[start : start + SNAPSHOT_SEND]
            claims = self._claims(send)
            replies += self._send_batched(
                [self._command(item, expected, claim) for item, claim in zip(send, claims, strict=True)]
            )
        return replies

    def _claims(self, items: list[_Item]) -> list[SnapshotClaim | None]:
        """What the snapshot finds for each item that indexes a fingerprint (None for the others), searched together."""
        assert self.snapshot is not None
        wanted = {
            k: (item.event.incident_id, item.event.fingerprint)
            for k, item in enumerate(items)
            if item.dead is None
            and item.event is not None
            and item.event.fingerprint is not None
            and not item.full_search
        }
        found = self.snapshot.claims(list(wanted.values()), self.settings.max_matches) if wanted else []
        claims: list[SnapshotClaim | None] = [None] * len(items)
        for k, claim in zip(wanted, found, strict=True):
            claims[k] = claim
        return claims

    def _note_layout(self) -> None:
        """Log once each time the worker follows the index to another layout (a migration's start, switch or abort,
        met as a refused call mid-run), so that an operator sees every worker take the step."""
        building = self.index.building.tag if self.index.building else ""
        seen = (self.index.layout_tag, building)
        if self._layout_seen is not None and seen != self._layout_seen:
            self.log.info(
                "following the index's layout",
                layout=seen[0],
                building=building or None,
                layout_before=self._layout_seen[0],
                building_before=self._layout_seen[1] or None,
            )
        self._layout_seen = seen

    def _send_batched(self, commands: list[Command]) -> list[Any]:
        """Send the apply calls among `commands` as one apply_batch call (the others as they are); one reply each."""
        applies = [k for k, command in enumerate(commands) if command[1] == FN_APPLY]
        others = [k for k, command in enumerate(commands) if command[1] != FN_APPLY]
        sent = [apply_batch([commands[k] for k in applies])] if applies else []
        answers = self.index.execute(sent + [commands[k] for k in others])
        replies: list[Any] = [None] * len(commands)
        if applies:
            batch = answers[0]
            for n, k in enumerate(applies):
                replies[k] = batch if isinstance(batch, Exception) else batch[n]
        for k, reply in zip(others, answers[len(sent) :], strict=True):
            replies[k] = reply
        return replies

    def _finish(self, items: list[_Item], replies: list[Any], *, attempt: int = 0) -> None:
        """Act on the replies of a batch's calls: log, count, dead-letter duplicates, retry what can be retried."""
        # a call refused for a lost state (functions, meta) or a layout change (a migration's start, switch or
        # abort) changed nothing: it is sent again, built for the state just read, a few times at most
        self._note_layout()  # the layout these calls were built for (the first batch's sets where it started)
        held, again = self._settle(items, replies, retry=attempt < 3)
        self._note_layout()  # and the one a refusal made it follow
        if again:
            self._apply_segment(again, attempt=attempt + 1)
        if held:
            self._hold_until_memory(held)

    def _settle(self, items: list[_Item], replies: list[Any], *, retry: bool) -> tuple[list[_Item], list[_Item]]:
        """Handle each reply. Returns the items Redis refused for want of memory, and (when `retry`) those whose call
        met a lost state the index has just restored (functions or meta gone): nothing of either happened."""
        held: list[_Item] = []
        again: list[_Item] = []
        later: ResponseError | None = None
        try:
            for item, reply in zip(items, replies, strict=True):
                if isinstance(reply, OutOfMemoryError):
                    held.append(item)
                elif isinstance(reply, ResponseError) and waits_out(reply):
                    later = later or reply  # nothing of this call happened; the entry stays pending, uncounted
                elif isinstance(reply, ResponseError):
                    if self.index.handle_error(reply) and retry:
                        again.append(item)
                    else:
                        self._failed(item, reply)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    self._handle(item, reply)
        finally:
            self._count_outcomes()
        if later is not None:
            raise later  # the run loop waits it out, then finishes the entries from the pending list
        return held, again

    def _hold_until_memory(self, items: list[_Item]) -> None:
        """Redis refuses writes (maxmemory with noeviction), so nothing of these calls happened: retry them.

        The worker reads nothing more meanwhile. It keeps the entries its own (XCLAIM JUSTID resets their idle time
        without counting a delivery, so no peer takes them over and none turns to poison) and its heartbeat alive,
        and retries with capped exponential backoff until the writes go through or it is asked to stop.
        """
        failures = 0
        while items and not self.stopping:
            failures += 1
            delay = self._backoff.compute(failures)
            if failures == 1 or failures % 10 == 0:
                self.log.warning(
                    "redis is out of memory (maxmemory); holding the entries and retrying",
                    entries=len(items),
                    attempt=failures,
                    retry_in_s=round(delay, 2),
                    hint="raise maxmemory or free memory; nothing is lost while the worker waits",
                )
            self._stop.wait(delay)
            if self.stopping:
                break
            self.upkeep.tick()  # expiry and trimming free memory, and run while Redis is full
            self.redis.xclaim(
                self.target.events_stream,
                self.target.group,
                self.settings.consumer,
                0,
                [item.entry_id for item in items],
                justid=True,
            )
            self.heartbeat()
            held, again = self._settle(items, self._send(items), retry=True)
            left = {id(item) for item in held + again}
            items = [item for item in items if id(item) in left]  # in stream order
        if items:
            self.log.warning("stopping while redis is out of memory; the entries stay pending", entries=len(items))

    def _command(
        self, item: _Item, expected: Mapping[str, int | str | None], claim: SnapshotClaim | None = None
    ) -> Command:
        """The call of one item: its dead letter, or its apply call (validating `claim` on the snapshot path)."""
        if item.dead is not None:
            return self._dead_command(item, *item.dead)
        event = item.event
        assert event is not None
        return self.index.apply_command(
            event.op,
            event.incident_id,
            event.fingerprint,
            expected="*" if event.op == "add" else expected.get(event.incident_id),
            stream=self.target,
            entry_id=item.entry_id,
            max_matches=self.settings.max_matches,
            alert_text=event.text[: self.settings.alert_text_chars] if event.text else "",
            tokenizer=self._tokenizer if event.text is not None and event.op != "delete" else "",
            snapshot=claim,
        )

    def _dead_command(self, item: _Item, reason: str, detail: str) -> Command:
        entry = item.entry
        oversized = entry.oversized if entry is not None else None
        letter = DeadLetter(
            reason=reason,
            detail=detail,
            source_entry=item.entry_id,
            source_stream=self.target.events_stream,
            consumer=self.settings.consumer,
            deliveries=item.deliveries,
            original_bytes=oversized.total_bytes if oversized else None,
            original_sizes=oversized.sizes if oversized else None,
        )
        dropped = oversized.field_count - len(oversized.sizes) if oversized else 0
        original = entry.fields if entry is not None else item.fields
        return dead_letter_command(self.target, item.entry_id, letter.to_pairs(original, dropped=dropped))

    def _handle(self, item: _Item, reply: Any) -> None:
        if item.dead is not None:
            self._dead_lettered(item, reply)
            return
        event = item.event
        assert event is not None
        result = parse_apply(reply)
        if result.status == "stale":
            self._retry_stale(item)
            return
        if result.status == "unvalidated":  # the copy could not be validated: nothing happened, search in full
            assert self.snapshot is not None
            self.snapshot.fallbacks += 1
            item.full_search = True
            self._retry_stale(item)
            return
        if result.status == "duplicate":
            assert result.stored is not None and event.fingerprint is not None
            error = DuplicateIncidentError(event.incident_id, result.stored, event.fingerprint)
            item.dead = ("duplicate_id", str(error))
            [reply] = self.index.execute([self._dead_command(item, *item.dead)])
            if isinstance(reply, ResponseError):
                self._failed(item, reply)  # stays pending: retried, and dead-lettered as poison at worst
            else:
                self._dead_lettered(item, reply)
            return
        outcomes = self._outcomes  # counted in /metrics at the end of the batch (_count_outcomes)
        if result.status == "not_pending":
            if self._logs_debug():
                self.log.debug(
                    "entry already processed by another consumer",
                    entry_id=item.entry_id,
                    incident_id=event.incident_id,
                )
            self.stats.count("not_pending")
            outcomes["not_pending"] = outcomes.get("not_pending", 0) + 1
            return
        self.stats.processed += 1
        self.stats.count(result.status)
        outcomes[result.status] = outcomes.get(result.status, 0) + 1
        self.metrics.candidates.observe(result.candidates)
        self.metrics.end_to_end_seconds.observe(max(0.0, time.time() - entry_time_ms(item.entry_id) / 1000))
        if result.alert_id:
            self.stats.alerts += 1
            self.metrics.alerts.inc()
            self.log.info(
                "alert",
                entry_id=item.entry_id,
                incident_id=event.incident_id,
                op=event.op,
                fingerprint=format_fingerprint(event.fingerprint or 0),
                match_count=result.match_count,
                closest=[f"{i}@{d}" for i, d in result.matches[:5]],
                alert_entry=result.alert_id,
            )
        elif self._logs_debug():  # the line's arguments are built only when it is written
            self.log.debug(
                result.status,
                entry_id=item.entry_id,
                incident_id=event.incident_id,
                op=event.op,
                candidates=result.candidates,
            )

    def _logs_debug(self) -> bool:
        """Whether the worker's logger writes debug lines (structlog's filtering loggers say so; others: assume)."""
        enabled = getattr(self.log, "is_enabled_for", None)
        return enabled is None or bool(enabled(logging.DEBUG))

    def _count_outcomes(self) -> None:
        """Add the outcomes `_handle` counted to /metrics: one increment a status and batch, not one an event."""
        for status, count in self._outcomes.items():
            self.metrics.events.labels(status).inc(count)
        self._outcomes.clear()

    def _retry_stale(self, item: _Item) -> None:
        """An upsert or delete raced with another consumer changing the same incident: read again, apply again."""
        event = item.event
        assert event is not None

        def attempt() -> Any:
            expected = self.index.stored_values([event.incident_id])
            [reply] = self.index.execute([self._command(item, expected)])
            if isinstance(reply, Exception):
                raise reply
            return reply

        reply = retry_while_stale(attempt, lambda reply: text(reply[0]))
        if reply is not None:
            self._handle(item, reply)
            return
        self.log.error(
            "incident keeps changing under this entry; leaving it pending",
            entry_id=item.entry_id,
            incident_id=event.incident_id,
        )

    def _dead_lettered(self, item: _Item, reply: Any) -> None:
        assert item.dead is not None
        reason, detail = item.dead
        if not text(reply):
            self.stats.count("not_pending")
            self.metrics.events.labels("not_pending").inc()
            return
        self.stats.processed += 1
        self.stats.dead_letters += 1
        self.stats.count("dead")
        self.metrics.events.labels("dead").inc()
        self.metrics.dead_letters.labels(reason).inc()
        incident_id = item.fields.get(b"incident_id", item.fields.get("incident_id"))  # a prefix, when oversized
        self.log.warning(
            "dead letter",
            entry_id=item.entry_id,
            incident_id=text(incident_id)[:MAX_INCIDENT_ID_LENGTH] if incident_id is not None else None,
            reason=reason,
            detail=detail,
            dead_entry=text(reply),
        )

    def _failed(self, item: _Item, error: ResponseError) -> None:
        """The call of an entry failed: it stays pending, and the failure counts as a delivery toward poison."""
        if waits_out(error):
            raise error
        self.stats.count("failed")
        self.metrics.events.labels("failed").inc()
        item.deliveries += 1
        # XCLAIM JUSTID RETRYCOUNT sets the count without sending the entry; re-reading it later adds nothing
        self.redis.xclaim(
            self.target.events_stream,
            self.target.group,
            self.settings.consumer,
            0,
            [item.entry_id],
            retrycount=item.deliveries,
            justid=True,
        )
        hint = self._wrong_type_hint(item) if is_wrong_type(error) else None
        self.log.error(
            "entry failed; it stays pending and will be retried",
            entry_id=item.entry_id,
            error=str(error),
            deliveries=item.deliveries,
            max_deliveries=self.settings.max_deliveries,
            **({"hint": hint} if hint else {}),
        )

    def _wrong_type_hint(self, item: _Item) -> str | None:
        """Which key of the namespace an entry's call met holding another type (Redis's WRONGTYPE names none), and
        what to do: the keys of fixed names, and those of the incident's fingerprint and of its search."""
        fp = item.event.fingerprint if item.event is not None else None
        try:
            extra = [] if fp is None else [*incident_keys(self.index, fp), *search_keys(self.index, fp)]
            streams = [self.target.events_stream, self.target.alerts_stream, self.target.dead_stream]
            return str(diagnose(self.redis, self.index.keys, streams=streams, extra=extra))
        except redis_lib.RedisError:
            return None


def _entry_of(entry_id: Any, fields: Mapping[Any, Any] | None) -> Entry:
    """An entry as XREADGROUP or XRANGE gives it (fields as a mapping; None or empty once deleted)."""
    return Entry(text(entry_id), 1, [(k, v) for k, v in (fields or {}).items()])


def _reader() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead")


def _segments(items: Iterable[_Item]) -> list[list[_Item]]:
    """Cut a batch where an incident ID comes back after an upsert or delete of it, or before one.

    Upserts and deletes carry the fingerprint they expect to replace, read before their segment is sent; two changes
    of one incident in one pipelined segment would both expect the old one. Adds need no expectation.
    """
    segments: list[list[_Item]] = [[]]
    ops: dict[str, str] = {}
    for item in items:
        event = item.event
        if event is not None:
            previous = ops.get(event.incident_id)
            if previous is not None and (previous != "add" or event.op != "add"):
                segments.append([])
                ops = {}
            ops[event.incident_id] = event.op
        segments[-1].append(item)
    return [segment for segment in segments if segment]
