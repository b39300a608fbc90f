"""The stream worker: reads the events stream through a consumer group and applies each entry.

What each entry does: docs/contract.md#what-each-entry-does.

One loop, one thread, in this module; each part it drives lives in a module of its own:

* start (worker/startup.py): create the group at the beginning of the stream (tolerating only BUSYGROUP), load and
  check the index's functions, the user's rights and the keys' types, and first finish this consumer's own pending
  entries (a crashed predecessor's: each counts one more delivery);
* process (worker/processing.py): read -> prepare -> send -> settle -> record, a batch at a time, each outcome
  counted by worker/outcomes.py for the stats, /metrics and the log alike;
* every `claim_interval_ms` (worker/recovery.py): re-read its own pending entries, take over those of silent
  consumers, and remove consumers that have gone;
* keep its heartbeat alive and log a summary now and then (worker/presence.py), run the namespace's upkeep
  (worker/upkeep.py), and reconnect with capped exponential backoff when Redis goes away or cannot serve for now.
"""

from __future__ import annotations

import contextlib
import re
import ssl
import threading
import time

import redis as redis_lib
from redis.backoff import ExponentialBackoff
from redis.exceptions import OutOfMemoryError, ResponseError

from . import startup
from .connection import RedisClient, tls_port_hint
from .errors import (
    CredentialsRefusedError,
    DamagedMetaError,
    LayoutMismatchError,
    PreflightError,
    TlsUnverifiedError,
)
from .index import FingerprintIndex
from .keytypes import diagnose, is_wrong_type
from .library import StreamTarget
from .logs import error_message, get_logger
from .metrics import Metrics
from .outcomes import Outcomes, WorkerStats
from .presence import Presence
from .processing import Processor, waits_out
from .readpath import SnapshotReader
from .recovery import Recovery
from .replies import group_info
from .settings import Settings
from .transport import reply_code
from .upkeep import Upkeep
from .watchdog import Watchdog

__all__ = ["StreamWorker", "WorkerStats"]

_LAST_ID = f"{2**64 - 1}-{2**64 - 1}"
"""The largest entry ID a stream can hold: no entry can follow it."""


RETRYING = "redis unavailable; retrying"


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
        self.index = index or FingerprintIndex(
            redis, settings.namespace, settings.bands, settings.max_distance, max_candidates=settings.max_candidates
        )
        self.metrics = metrics or Metrics()
        self.target = StreamTarget(
            events_stream=settings.events_stream,
            alerts_stream=settings.alerts_stream,
            dead_stream=settings.dead_stream,
            group=settings.group,
            alerts_maxlen=settings.alerts_maxlen,
            dead_maxlen=settings.dead_maxlen,
        )
        self.log = get_logger(consumer=settings.consumer, stream=settings.events_stream)
        self._stop = threading.Event()
        self.stopped = threading.Event()
        """Set when `run` has returned."""
        self.watchdog = watchdog
        self._backoff = ExponentialBackoff(cap=settings.reconnect_max_backoff_s, base=0.05)
        self._next_claim = 0.0
        self._next_summary = 0.0  # at once: the gauges of /metrics (lag, pending, index size) say where things stand
        self._idle_wait = 0.0
        self.upkeep = Upkeep(self.index, settings, self.log, self.metrics)
        self.outcomes = Outcomes(self.metrics, self.log)
        self.stats: WorkerStats = self.outcomes.stats
        parts = (redis, settings, self.index, self.target)
        self.presence = Presence(*parts, self.stats, metrics=self.metrics, log=self.log)
        self.processor = Processor(
            *parts,
            self.outcomes,
            upkeep=self.upkeep,
            heartbeat=lambda: self.presence.beat_after_work(self.processor.snapshot),
            stop=self._stop,
            log=self.log,
            replica=replica,
        )
        self.recovery = Recovery(*parts, self.processor, metrics=self.metrics, stop=self._stop, log=self.log)

    @property
    def snapshot(self) -> SnapshotReader | None:
        """The worker's copy of the index, once it searches one (the snapshot read path)."""
        return self.processor.snapshot

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
            except PreflightError as error:
                if not started:
                    raise  # at the start: exit 2 with what to do (docs/contract.md)
                # a right taken away, or a key replaced, while the worker ran: its calls refuse themselves whole
                # (UNFIT) and its entries stay pending; it waits for the repair, then goes on in stream order
                failures += 1
                ready = False
                self._wait_for_repair(error, failures)
            except DamagedMetaError as error:
                # a hand edit the worker cannot work around (the message says what to run): every worker waits for
                # the repair rather than exit, which would only restart it into the same refusal
                failures += 1
                ready = False
                self._reconnect_pause(error, failures, "the index's meta is damaged; waiting for it to be repaired")
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
                tls = tls_port_hint(self.settings.redis_url.get_secret_value(), error)
                self._reconnect_pause(error, failures, f"redis unavailable; retrying ({tls})" if tls else RETRYING)
            except ResponseError as error:
                if waits_out(error):
                    failures += 1
                    ready = False
                    self._reconnect_pause(error, failures, "redis cannot serve for now; waiting")
                    continue
                lost = "NOGROUP" in str(error) or reply_code(error) == "UNBLOCKED"
                if lost or self.index.handle_error(error):
                    # the stream, the group or the functions went away (deleted, or a server restarted without
                    # persistence): set up again, without spinning should it keep happening
                    failures += 1
                    ready = False
                    self.log.warning("redis lost state; setting up again", error=str(error), attempt=failures)
                    self._stop.wait(self._backoff.compute(failures) if failures > 1 else 0)
                    continue
                refused = reply_code(error) == "UNFIT" or isinstance(error, redis_lib.exceptions.NoPermissionError)
                if started and (refused or is_wrong_type(error)):
                    # a call refused whole (UNFIT: a right taken away or a key replaced while the worker ran), or
                    # such a refusal met outside the calls that check themselves (a copy's read of {N}:changes, an
                    # FCALL itself refused): the start's check names it, and the worker waits for the repair, its
                    # entries pending; a key of another type that the functions do not write stops it, named
                    found = self._still_fit(error)
                    if found is not None:
                        failures += 1
                        ready = False
                        self._wait_for_repair(found, failures)
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
        last = str(group["last-delivered-id"])
        # nothing can follow the largest ID (XADDed by hand), and Redis refuses an interval that starts past it
        later = [] if last == _LAST_ID else self.redis.xrange(self.target.events_stream, min=f"({last}", count=1)
        return not later and not self._inbox_waiting()

    def _inbox_waiting(self) -> bool:
        """Whether producers' events wait in the inbox (worker/inbox.py). An inbox this worker cannot move for now
        (its user lacks LPOP, or it holds another type: the read round logged which) or may not look at says no."""
        if self.processor.inbox.paused:
            return False
        try:
            return bool(self.redis.llen(self.index.keys.inbox))
        except ResponseError:
            return False

    def _still_fit(self, error: ResponseError) -> PreflightError | None:
        """The start's check of a refusal met while running: what it names (or, for a call refused whole or a command
        refused that it does not ask about, the refusal itself), or None when a key of another type is not one the
        functions write."""
        try:
            self.preflight()
        except PreflightError as found:
            return found
        except redis_lib.RedisError:
            pass
        if reply_code(error) == "UNFIT":  # (repaired since, or a race): the entries are tried again
            return PreflightError(f"a call found it could not finish ({error}), and the check passes now; retrying")
        if isinstance(error, redis_lib.exceptions.NoPermissionError):
            named = re.search(r"run the '([a-z|]+)' command", str(error))
            grant = f" (ACL SETUSER <user> +{named.group(1)})" if named else ""
            return PreflightError(
                f"Redis refused the worker's user a command ({error_message(error)}): grant it{grant}, as "
                "deploy/redis/users.acl does for incident-worker"
            )
        return None

    def _wait_for_repair(self, error: PreflightError, failures: int) -> None:
        self.log.error("a call could not finish; waiting for the repair", problem=str(error))
        self._reconnect_pause(error, failures, "waiting for the user's rights or the keys to be repaired")

    def _reconnect_pause(self, error: Exception, failures: int, message: str = RETRYING) -> None:
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
        self.processor.close()
        with contextlib.suppress(redis_lib.RedisError):
            self.presence.leave()
            self.upkeep.release()
        self.log.info(
            "worker stopped",
            processed=self.stats.processed,
            alerts=self.stats.alerts,
            dead_letters=self.stats.dead_letters,
        )

    # -- the parts, as the loop calls them ----------------------------------------------------------------------

    def setup(self) -> None:
        """Create the consumer group at the start of the stream, and load and check the index (worker/startup.py)."""
        startup.open_namespace(self.redis, self.index, self.target, self.log, preflight=self.preflight)
        self.upkeep.configure()
        self.processor.choose_read_path()
        self.heartbeat()

    def preflight(self) -> None:
        """Refuse to start when the Redis user lacks a right or a key holds another type (`startup.preflight`)."""
        startup.preflight(self.redis, self.settings, self.index, self.target)

    def read_and_process(self) -> int:
        """Read new entries and process them (`Processor.read_and_process`); returns how many were read."""
        return self.processor.read_and_process()

    def recover_own_pending(self) -> int:
        """Process this consumer's own pending entries (`Recovery.recover_own_pending`); returns how many."""
        return self.recovery.recover_own_pending()

    def heartbeat(self) -> None:
        """Refresh the heartbeat and this worker's name in `{N}:workers` (`Presence.beat`)."""
        self.presence.beat(self.processor.snapshot)

    def maintain(self) -> None:
        """The periodic work: heartbeat, pending recovery and claims, the summary line, the namespace's upkeep."""
        now = time.monotonic()
        if now >= self.presence.next_beat:
            self.heartbeat()
        if now >= self._next_claim:
            self._next_claim = now + self.settings.claim_interval_ms / 1000
            self.recovery.recover_own_pending()
            self.recovery.claim_stuck()
            self.recovery.forget_gone_consumers()
            self.processor.choose_read_path()
        if now >= self._next_summary:
            self._next_summary = now + self.settings.summary_interval_s
            self.presence.summary(self.processor.snapshot)
        self.upkeep.tick()
