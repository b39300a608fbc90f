"""The snapshot read path fed from a Redis replica: the copy loaded from it and following the change log there, the
atomic step and its validation on the primary.

Real servers only: a primary and a replica of it (REPLICAOF) started by each test. The invariants are those of the
snapshot tests (every pair within r reported exactly once, nothing pending, each incident indexed once, checked
against the oracle's pairs), here with a replica cut from its primary (a stale copy), one that hangs or dies
mid-run, one promoted mid-run whose log then goes another way, and a copy whose load overlaps trimming of the log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog

from tests.conftest import require_redis_server, sentinel_watching
from tests.redis_server import RedisServer, free_port
from tests.streams import (
    FP,
    alerts,
    assert_pairs_reported_once,
    fingerprints,
    pending_count,
    publish,
    start_worker,
    wait_until,
)
from worker import readpath
from worker.connection import connect_replica
from worker.devtools.workload import Workload
from worker.fingerprint import fingerprint, format_fingerprint
from worker.settings import Settings
from worker.stream import StreamWorker
from worker.upkeep import trim_changes

pytestmark = [pytest.mark.usefixtures("no_worker_env"), pytest.mark.timeout(90)]

CHANGES = "{incidents}:changes"
DOCK = {"dock": 3, "scanner": 2, "timeout": 1}


class Pair:
    """A primary and its replica, each a redis-server of this test's own."""

    def __init__(self, directory: Path) -> None:
        (directory / "primary").mkdir()
        (directory / "replica").mkdir()
        self.primary = RedisServer(directory / "primary")
        # DEBUG SLEEP hangs it as a stuck server does
        self.replica = RedisServer(
            directory / "replica", load_functions=False, extra=["--enable-debug-command", "local"]
        )
        self.primary.start()
        self.replica.start()
        self.client = self.primary.client()
        self.follow()

    def follow(self) -> None:
        """(Re)attach the replica to the primary and wait until it holds what the primary holds."""
        with self.replica.client() as replica:
            replica.replicaof("127.0.0.1", self.primary.port)
        self.wait_synced()

    def wait_synced(self) -> None:
        with self.replica.client() as replica:

            def synced() -> bool:
                info = replica.info("replication")
                if info.get("master_link_status") != "up":
                    return False
                offset = self.client.info("replication")["master_repl_offset"]
                return int(info.get("slave_repl_offset", -1)) >= int(offset)

            wait_until(synced, 20, "the replica to catch up with its primary")

    def cut(self) -> None:
        """Point the replica at a port nobody listens on: it keeps its data, serves it stale, and gets nothing new."""
        with self.replica.client() as replica:
            replica.replicaof("127.0.0.1", free_port())

    def stop(self) -> None:
        self.client.close()
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    require_redis_server()
    servers = Pair(tmp_path)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(autouse=True)
def _quick_replica_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare with the primary and retry a replica left behind within a test's time (tests may change these)."""
    monkeypatch.setattr(readpath, "REPLICA_LAG_S", 0.2)
    monkeypatch.setattr(readpath, "REPLICA_RETRY_S", 0.5)


def worker(pair: Pair, consumer: str = "w1", **overrides: Any) -> StreamWorker:
    values: dict[str, Any] = {
        "consumer": consumer,
        "block_ms": 50,
        "claim_interval_ms": 100,
        "summary_interval_s": 60,
        "read_path": "snapshot",
        "redis_url": pair.primary.url,
        "snapshot_replica_url": pair.replica.url,
        "batch_size": 16,
    }
    values.update(overrides)
    settings = Settings(**values)
    return StreamWorker(pair.primary.client(), settings, replica=connect_replica(settings))


def events_of(seed: int, count: int, prefix: str = "") -> list[dict[str, Any]]:
    return [
        {"incident_id": f"{prefix}{i}", "features": bag}
        for i, bag in Workload(seed=seed, near_duplicates=0.5).take(count)
    ]


def check(pair: Pair, events: list[dict[str, Any]]) -> None:
    """The snapshot tests' invariants, on the primary: each incident indexed once with its fingerprint, every pair
    within r reported exactly once, nothing pending."""
    fps = fingerprints(events)
    stored = {k.decode(): int(v, 16) for k, v in pair.client.hgetall(FP).items()}
    assert stored == fps
    assert_pairs_reported_once(fps, alerts(pair.client))
    assert pending_count(pair.client) == 0


def calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_copy_loaded_from_the_replica_leaves_the_primary_only_the_atomic_step(pair: Pair) -> None:
    events = events_of(7, 600)
    publish(pair.client, events[:300])
    pair.wait_synced()
    pair.client.config_resetstat()
    w = worker(pair)
    w.run(until_idle=True)
    publish(pair.client, events[300:])
    w.run(until_idle=True)
    check(pair, events)
    assert w.snapshot is not None and w.snapshot.source == "replica" and w.snapshot.replica_lost == 0
    with pair.replica.client() as replica:
        assert calls(replica, "hscan") > 0 and calls(replica, "xrange") > 0
    assert calls(pair.client, "hscan") == 0  # the copy was loaded from the replica, not the primary
    assert w.snapshot.describe()["snapshot_source"] == "replica"


def test_workers_on_a_replica_cut_from_its_primary_search_stale_copies_and_miss_no_pair(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers read a replica that stopped replicating (its link cut, its data served stale): every copy is
    behind, the primary validates every claim against the changes since, and nothing is missed or said twice."""
    monkeypatch.setattr(readpath, "REPLICA_LAG_S", 3600.0)  # stay on the stale replica: validation alone
    events = events_of(11, 500)
    publish(pair.client, events[:100])
    a, b = worker(pair, "a"), worker(pair, "b")
    a.run(until_idle=True)
    pair.wait_synced()
    pair.cut()
    b.setup()
    publish(pair.client, events[100:])
    while a.read_and_process() + b.read_and_process():
        pass
    check(pair, events)
    for w in (a, b):
        assert w.snapshot is not None and w.snapshot.source == "replica" and w.snapshot.fallbacks == 0
        assert len(w.snapshot.index) == 100  # stale: the replica stopped at the first 100
    pair.follow()
    more = events_of(12, 200, prefix="m")
    publish(pair.client, more)
    a.run(until_idle=True)
    check(pair, events + more)
    assert a.snapshot is not None and len(a.snapshot.index) >= 600


def test_a_replica_that_falls_behind_is_left_for_the_primary_and_taken_again_once_it_caught_up(pair: Pair) -> None:
    events = events_of(13, 600)
    publish(pair.client, events[:100])
    w = worker(pair)
    w.run(until_idle=True)
    pair.wait_synced()
    pair.cut()
    with structlog.testing.capture_logs() as logs:
        for start in range(100, 400, 50):
            publish(pair.client, events[start : start + 50])
            w.run(until_idle=True)
            time.sleep(0.25)
        assert w.snapshot is not None and w.snapshot.source == "primary" and w.snapshot.replica_lost >= 1
        left = [e for e in logs if e["event"] == "snapshot replica left; the copy reads the primary"]
        assert left and "behind" in left[0]["why"]
        pair.follow()
        time.sleep(0.6)
        publish(pair.client, events[400:])
        w.run(until_idle=True)
        assert w.snapshot.source == "replica"
        assert any(e["event"] == "snapshot reads its replica again" for e in logs)
    check(pair, events)


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_replica_that_dies_or_hangs_mid_run_is_left_for_the_primary(pair: Pair, how: str) -> None:
    events = events_of(17, 500)
    publish(pair.client, events[:200])
    w = worker(pair)
    w.run(until_idle=True)
    pair.wait_synced()
    hang = None
    if how == "killed":
        pair.replica.kill()
    else:  # the replica stops answering for longer than the worker waits for it (REPLICA_TIMEOUT_S)
        sleeper = pair.replica.client()
        hang = threading.Thread(target=lambda: sleeper.execute_command("DEBUG", "SLEEP", "4"), daemon=True)
        hang.start()
        time.sleep(0.2)
    with structlog.testing.capture_logs() as logs:
        publish(pair.client, events[200:])
        w.run(until_idle=True)
    check(pair, events)
    assert w.snapshot is not None and w.snapshot.replica_lost >= 1
    [left, *_] = [e for e in logs if e["event"] == "snapshot replica left; the copy reads the primary"]
    assert left["why"] == "the replica failed"
    assert ("Timeout" if how == "hung" else "Connection") in left["error"]
    assert len(w.snapshot.index) == 500 or w.snapshot.source == "primary"
    if hang is not None:
        hang.join(timeout=10)


def test_a_replica_promoted_and_written_to_makes_the_primary_refuse_the_copy_and_the_worker_load_it_again(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REPLICAOF NO ONE mid-run, then a write to the promoted server's change log (a second primary, as in a split
    brain): the copy follows it and holds a ghost incident the primary never had. The primary refuses the claims of a
    copy at a position its log lacks (the position-entry proof); the worker searches those events in full, leaves
    the replica, and loads its copy again from the primary. No alert names the ghost."""
    monkeypatch.setattr(readpath, "REPLICA_LAG_S", 3600.0)  # only the proof can tell
    events = events_of(19, 200)
    publish(pair.client, events)
    w = worker(pair)
    w.run(until_idle=True)
    pair.wait_synced()
    with pair.replica.client() as promoted:
        promoted.replicaof("NO", "ONE")
        ghost = format_fingerprint(fingerprint(DOCK))
        promoted.xadd(CHANGES, {"add": "ghost", "fp": ghost, "prev": ""})
    assert w.snapshot is not None
    w.snapshot.refresh()
    assert w.snapshot.index.get("ghost") is not None  # the copy followed the promoted server's log
    reloads = w.snapshot.reloads
    near = [{"incident_id": f"n{k}", "features": {**DOCK, f"x{k}": 1}} for k in range(20)]
    with structlog.testing.capture_logs() as logs:
        publish(pair.client, near)
        w.run(until_idle=True)
    check(pair, events + near)
    assert all(m.incident_id != "ghost" for a in alerts(pair.client) for m in a.matches)
    assert w.snapshot.fallbacks >= 1 and w.snapshot.reloads > reloads
    assert w.snapshot.source == "primary" and w.snapshot.index.get("ghost") is None
    assert any("went another way" in e.get("why", "") for e in logs)
    stored = {k.decode(): int(v, 16) for k, v in pair.client.hgetall(FP).items()}
    w.snapshot.refresh()
    assert dict(w.snapshot.index.items()) == stored
    assert w.snapshot.source == "primary"  # the promoted server lacks the primary's position: not taken again


def test_a_replica_promoted_and_left_alone_is_left_for_the_primary(pair: Pair) -> None:
    events = events_of(23, 400)
    publish(pair.client, events[:100])
    w = worker(pair)
    w.run(until_idle=True)
    pair.wait_synced()
    with pair.replica.client() as promoted:
        promoted.replicaof("NO", "ONE")
    for start in range(100, 400, 50):
        publish(pair.client, events[start : start + 50])
        w.run(until_idle=True)
        time.sleep(0.25)
    check(pair, events)
    assert w.snapshot is not None and w.snapshot.source == "primary" and w.snapshot.replica_lost >= 1


class LoadsDuringTrims:
    """A worker's replica client whose first `trims` loads of a copy each meet the upkeep of another worker as they
    scan: that worker indexes more events (changes after the load's position), then the change log is trimmed past
    them (`trim_changes`, as the lease holder does with CHANGES_KEEP), and the replica catches up with both."""

    def __init__(
        self, pair: Pair, replica: Any, other: StreamWorker, chunks: list[list[dict[str, Any]]], trims: int
    ) -> None:
        self.pair, self.replica, self.other, self.chunks, self.trims = pair, replica, other, chunks, trims
        self.loads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.replica, name)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if args[0] == "HSCAN" and int(args[2]) == 0:  # a load's first batch (its scan: HSCAN key cursor ...)
            self.loads += 1
            if self.loads <= self.trims:
                publish(self.pair.client, self.chunks[self.loads - 1])
                self.other.run(until_idle=True)
                time.sleep(0.005)
                trim_changes(self.other.index, keep_ms=1)
                self.pair.wait_synced()
        return self.replica.execute_command(*args, **kwargs)


@pytest.mark.parametrize("trims", [1, 3])
def test_a_copy_whose_load_overlaps_trimming_of_the_change_log_loads_again_or_searches_on_the_primary(
    pair: Pair, trims: int
) -> None:
    """Worker b loads its copy from the replica while worker a indexes events and the change log is trimmed past the
    load's position (CHANGES_KEEP shorter than a load takes). Once: the load starts again and b searches its copy.
    Three times in a row (every try of one load): b searches on the primary for a while, and says what to raise.
    Either way, every pair within r is reported exactly once, nothing is pending, each incident is indexed once."""
    events = events_of(31, 700)
    publish(pair.client, events[:200])
    a = worker(pair, "a")
    a.run(until_idle=True)
    pair.wait_synced()
    chunks = [events[200 + 100 * k : 300 + 100 * k] for k in range(3)]
    settings = Settings(
        consumer="b",
        block_ms=50,
        claim_interval_ms=100,
        summary_interval_s=60,
        read_path="snapshot",
        redis_url=pair.primary.url,
        snapshot_replica_url=pair.replica.url,
        batch_size=16,
    )
    scans = LoadsDuringTrims(pair, connect_replica(settings), a, chunks, trims)
    b = StreamWorker(pair.primary.client(), settings, replica=scans)  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        b.setup()
        publish(pair.client, events[200 + 100 * trims :])
        b.run(until_idle=True)
        a.run(until_idle=True)
    check(pair, events)
    assert pair.client.xlen(CHANGES) < len(events)  # the log was trimmed
    assert b.stats.processed > 0
    off = [e for e in logs if e["event"] == "snapshot read path off; searching on the primary"]
    if trims < 3:
        assert scans.loads == trims + 1 and not off
        assert b.snapshot is not None and b.snapshot.source == "replica" and b.snapshot.reloads == 1
        pair.wait_synced()
        b.snapshot.refresh()
        stored = {k.decode(): int(v, 16) for k, v in pair.client.hgetall(FP).items()}
        assert dict(b.snapshot.index.items()) == stored
    else:
        assert scans.loads == 3 and b.snapshot is None
        assert "trimmed" in off[0]["error"] and "CHANGES_KEEP" in off[0]["hint"]


def test_worker_processes_on_a_replica_that_dies_finish_the_stream_and_say_so(pair: Pair, tmp_path: Path) -> None:
    """`incident-worker run --snapshot-replica-url`: two processes, the replica killed mid-run."""
    events = events_of(29, 1500)
    publish(pair.client, events)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    settings = {
        "read_path": "snapshot",
        "snapshot_replica_url": pair.replica.url,
        "block_ms": 50,
        "claim_idle_ms": 1000,
        "claim_interval_ms": 200,
        "batch_size": 20,
    }
    workers = [
        start_worker(pair.primary.url, "--until-idle", log=log, consumer=f"p{k}", **settings)
        for k, log in enumerate(logs)
    ]
    wait_until(lambda: pair.client.hlen(FP) >= 300, 60, "the workers to index 300 incidents")
    pair.replica.kill()
    for process in workers:
        assert process.wait(timeout=60) == 0
    check(pair, events)
    text = "".join(log.read_text() for log in logs)
    assert '"event": "snapshot copies read a replica"' in text
    assert '"event": "snapshot replica left; the copy reads the primary"' in text


def test_replica_settings_are_checked_and_their_password_is_a_secret() -> None:
    settings = Settings(snapshot_replica_url="redis://reader:s3cret-replica@10.0.0.2:6379/0")
    assert "s3cret-replica" in settings.secrets()
    assert settings.safe_replica_url is not None and "s3cret-replica" not in settings.safe_replica_url
    assert Settings(snapshot_replica_url="off").snapshot_replica_url is None
    on_sentinels = Settings(snapshot_replica_url="Sentinel", sentinels="s1:26379")
    assert on_sentinels.replica_of_sentinels and "sentinel" not in on_sentinels.secrets()
    with pytest.raises(ValueError, match="set sentinels"):
        Settings(snapshot_replica_url="sentinel")
    with pytest.raises(ValueError, match="not supported with cluster"):
        Settings(snapshot_replica_url="redis://r:6379/0", cluster=True)
    with pytest.raises(ValueError) as refused:
        Settings(snapshot_replica_url="http://u:hidden-pw@r:6379/0")
    assert "hidden-pw" not in str(refused.value)


def test_a_replica_of_the_sentinels_is_one_they_name(pair: Pair, tmp_path: Path) -> None:
    """snapshot_replica_url=sentinel: redis-py's slave_for, which asks the Sentinels for the service's replicas."""
    with sentinel_watching(pair.primary.port, tmp_path) as port:
        with redis.Redis(port=port) as asked:
            wait_until(
                lambda: any(int(r["port"]) == pair.replica.port for r in asked.sentinel_slaves("incidents") or []),
                30,
                "the Sentinel to find the replica",
                step=0.2,
            )
        settings = Settings(
            redis_url="redis://127.0.0.1:1/0", sentinels=f"127.0.0.1:{port}", snapshot_replica_url="sentinel"
        )
        replica = connect_replica(settings)
        assert replica is not None
        assert replica.info("server")["tcp_port"] == pair.replica.port
        replica.close()
