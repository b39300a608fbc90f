"""`incident-worker check`, the health probe, costs the same whatever the size of the keyspace.

Plain `check` (no consumer name: the Docker image's HEALTHCHECK) looked for the heartbeat keys of the workers on its
host with SCAN MATCH {N}:heartbeat:*, which walks every key of the database: 1,000 SCAN calls and about 0.5 s of the
server's one thread per probe at a million keys, every 20 s per container. The workers now enter themselves in
`{N}:workers` (a sorted set: consumer name -> when its heartbeat expires) with each heartbeat, so `check` and `stats`
read at most LISTED_HEARTBEATS names of it and their heartbeat keys: a bounded number of commands of bounded cost.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.redis_server import RedisServer
from worker.cli import main
from worker.commands.check import LISTED_HEARTBEATS, check_health, live_heartbeats
from worker.formats import Heartbeat
from worker.keys import IndexKeys
from worker.settings import Settings
from worker.stream import StreamWorker

KEYS = IndexKeys("incidents")
HOUR_MS = 3_600_000


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker writes its heartbeat: it needs bytes


def beating_worker(client: Any, consumer: str = "w1", **settings: Any) -> StreamWorker:
    """A worker that has beaten once (its heartbeat and its entry in {N}:workers), without processing anything."""
    worker = StreamWorker(client, Settings(consumer=consumer, **settings))
    worker.heartbeat()
    return worker


class NoScan:
    """A client that refuses to walk the keyspace: SCAN or KEYS from a health check fail the test."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name in {"scan", "scan_iter", "keys"}:
            raise AssertionError(f"the health check called {name.upper()}")
        return getattr(self._client, name)


def test_a_beating_worker_is_in_the_registry_until_it_stops(redis_client: redis.Redis) -> None:
    worker = beating_worker(redis_client, "w1", heartbeat_ttl_ms=30_000)
    score = redis_client.zscore(KEYS.workers, "w1")
    assert score is not None and abs(score - (time.time() * 1000 + 30_000)) < 5_000, "scored with its expiry"
    assert redis_client.pttl(KEYS.heartbeat("w1")) > 0
    worker._shutdown()
    assert redis_client.zscore(KEYS.workers, "w1") is None, "a clean stop leaves the registry"
    assert not redis_client.exists(KEYS.heartbeat("w1"))


def test_a_crashed_workers_name_is_forgotten_an_hour_after_its_heartbeat_expired(redis_client: redis.Redis) -> None:
    now_ms = time.time() * 1000
    redis_client.zadd(KEYS.workers, {"crashed-long-ago": now_ms - HOUR_MS - 60_000, "crashed-lately": now_ms - 60_000})
    beating_worker(redis_client, "w1")
    names = {name.decode() if isinstance(name, bytes) else name for name in redis_client.zrange(KEYS.workers, 0, -1)}
    assert names == {"w1", "crashed-lately"}, "each beat forgets names whose heartbeat expired over an hour ago"


def test_check_reads_the_registry_never_the_keyspace(redis_client: redis.Redis) -> None:
    beating_worker(redis_client, "named-worker")
    redis_client.zadd(KEYS.workers, {"gone": time.time() * 1000 - 60_000})  # crashed: its heartbeat has expired
    elsewhere = Heartbeat(consumer="far-away", at=time.time(), host="another-host").to_value()
    redis_client.set(KEYS.heartbeat("far-away"), elsewhere, px=60_000)
    redis_client.zadd(KEYS.workers, {"far-away": time.time() * 1000 + 60_000})
    settings = Settings()
    health = check_health(NoScan(redis_client), settings, consumer=None, redis_only=False, host=socket.gethostname())
    assert health.healthy, health.message
    assert [beat.consumer for beat in health.workers] == ["named-worker"]
    beats = live_heartbeats(NoScan(redis_client), KEYS)
    assert sorted(beat.consumer for beat in beats) == ["far-away", "named-worker"], "gone is not alive"
    lonely = check_health(NoScan(redis_client), settings, consumer=None, redis_only=False, host="a-third-host")
    assert not lonely.healthy and "far-away on another-host" in lonely.message


def test_check_reads_at_most_listed_heartbeats(redis_client: redis.Redis) -> None:
    """However many names the registry holds (a crash loop's default names, within the hour), one read is bounded;
    the newest heartbeats come first, so the live workers are among those read."""
    now_ms = time.time() * 1000
    redis_client.zadd(KEYS.workers, {f"crashed-{n}": now_ms - 1_000 - n for n in range(LISTED_HEARTBEATS + 500)})
    beating_worker(redis_client, "w1")
    calls: list[tuple[str, Any]] = []

    class Counting(NoScan):
        def __getattr__(self, name: str) -> Any:
            method = super().__getattr__(name)
            if not callable(method):
                return method

            def counted(*args: Any, **kwargs: Any) -> Any:
                reply = method(*args, **kwargs)
                calls.append((name, reply))
                return reply

            return counted

    beats = live_heartbeats(Counting(redis_client), KEYS)
    assert [beat.consumer for beat in beats] == ["w1"]
    assert [name for name, _ in calls] == ["execute_command", "mget"]  # ZRANGE ... REV, then MGET
    assert len(calls[1][1]) == LISTED_HEARTBEATS


@pytest.mark.parametrize("batch_size", [4, 100])
def test_check_and_stats_show_the_count_of_the_last_batch(
    server: RedisServer,
    client: redis.Redis,
    no_worker_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    batch_size: int,
) -> None:
    """A worker that has just processed 10 events shows 10 in `check --json` and `stats --json` at once: it beats
    after each batch, not only every third of its heartbeat's TTL (which showed 0 until the next beat)."""
    from tests.streams import publish

    monkeypatch.setenv("INCIDENT_WORKER_REDIS_URL", server.url)
    worker = StreamWorker(client, Settings(consumer="w1", batch_size=batch_size, heartbeat_ttl_ms=600_000))
    worker.setup()  # beats once: processed 0, and no other beat due for 200 s
    publish(client, [{"incident_id": f"i{n}", "features": {f"t{n}": 1, "shared": 2}} for n in range(10)])
    assert worker.read_and_process() == 10 and worker.stats.processed == 10
    capsys.readouterr()  # the worker's log lines
    assert main(["check", "--consumer", "w1", "--json"]) == 0
    [beat] = json.loads(capsys.readouterr().out)["workers"]
    assert beat["consumer"] == "w1" and beat["processed"] == 10
    assert main(["stats", "--json"]) == 0
    [beat] = json.loads(capsys.readouterr().out)["workers"]
    assert beat["consumer"] == "w1" and beat["processed"] == 10


def test_short_rounds_beat_once_and_the_count_follows_within_the_work_beat(
    server: RedisServer, client: redis.Redis, no_worker_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady load a worker's rounds are a few events each: it shows the first round's count at once, and
    the later ones within WORK_BEAT_S (the next beat brought forward), not with three commands on the primary a round,
    which every worker of a fleet paid."""
    from tests.streams import publish
    from worker import presence

    monkeypatch.setattr(presence, "WORK_BEAT_S", 3600.0)  # every round below falls within one
    worker = StreamWorker(client, Settings(consumer="w1", heartbeat_ttl_ms=600_000))
    worker.setup()
    key = IndexKeys("incidents").heartbeat("w1")
    for n in range(20):
        publish(client, [{"incident_id": f"i{n}", "features": {f"t{n}": 1, "shared": 2}}])
        if n == 1:
            client.config_resetstat()
        assert worker.read_and_process() == 1
        if n == 0:  # the first round after a pause: at once
            assert Heartbeat.from_value(key, "w1", client.get(key)).processed == 1
    assert _commands(client).get("set", 0) == 0  # the 19 rounds after it: no beat
    assert worker.presence.next_beat <= time.monotonic() + 3600.0
    worker.presence.next_beat = 0.0  # as WORK_BEAT_S after the first round's beat
    worker.maintain()
    assert Heartbeat.from_value(key, "w1", client.get(key)).processed == 20


# -- the cost on a real server, measured by the server ------------------------------------------------------------


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (INFO commandstats)."""
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in client.info("commandstats").items()}


def _filled(client: redis.Redis, keys: int) -> None:
    for start in range(0, keys, 10_000):
        client.mset({f"filler:{n}": "x" for n in range(start, min(keys, start + 10_000))})


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    with server.client() as connection:
        yield connection


@pytest.mark.timeout(120)
def test_plain_check_sends_the_same_few_commands_whatever_the_keyspace_holds(
    server: RedisServer,
    client: redis.Redis,
    no_worker_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server's own count of what one `check` sent, in a keyspace of 10 keys and of 50,010: the same commands,
    and no SCAN (which needed 1,000 calls at a million keys)."""
    monkeypatch.setenv("INCIDENT_WORKER_REDIS_URL", server.url)
    beating_worker(client, "w1")
    counts = []
    for size in (10, 50_000):
        _filled(client, size)
        client.config_resetstat()
        assert main(["check"]) == 0, capsys.readouterr()
        counts.append(_commands(client))
        assert "healthy" in capsys.readouterr().out
    assert "scan" not in counts[1], counts[1]
    assert counts[0] == counts[1], counts
    assert sum(counts[1].values()) <= 12, counts[1]  # ping, the registry, the heartbeats, the warnings' reads


def test_the_healthcheck_of_the_image_and_of_compose_is_plain_check() -> None:
    """The probes run the cheap form: plain `check` reads the registry (or one key, with a consumer name)."""
    from tests.test_deploy import COMPOSE, dockerfile_stages

    instructions = dict(dockerfile_stages()[-1])
    healthcheck = instructions["HEALTHCHECK"]
    assert json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip()) == ["incident-worker", "check"]
    import yaml

    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["x-worker"]["healthcheck"]["test"] == ["CMD", "incident-worker", "check"]
