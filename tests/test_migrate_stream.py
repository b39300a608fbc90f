"""A migration of a live index under a worker fleet, with SIGKILLs of the migrator and of a worker, on a real Redis.

The index is seeded with incidents (bulk_load: no alerts), then two worker processes (one searching the primary,
one its own snapshot copy) process a stream of new incidents (near duplicates of seeded ones and of each other, and
storms of exact twins) published while `incident-worker migrate` moves the index to another band layout. The
migrator is killed at random moments and run again until it finishes; one worker is killed mid-way and restarted.
The end state is checked against brute force: every pair within r that involves a new incident is reported exactly
once, no pair of two seeded incidents is, each incident is indexed once, nothing is dead-lettered or left pending,
only the new layout's postings exist and are exact, and queries equal a linear scan.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import Oracle, assert_postings_match
from tests.redis_server import RedisServer
from tests.streams import (
    EVENTS,
    GROUP,
    alerts,
    clean_env,
    dead_letters,
    pairs_within,
    pending_count,
    publish,
    spawn,
    worker_command,
)
from worker.fingerprint import fingerprint
from worker.index import FingerprintIndex
from worker.keys import IndexKeys
from worker.replies import text

NS = "incidents"
R = 7


def _bag(rng: random.Random, cluster: int) -> dict[str, int]:
    """A bag of a cluster's tokens with a random part of them and random weights: near duplicates within a cluster."""
    tokens = [f"c{cluster}-t{i}" for i in range(12)]
    return {t: rng.randint(1, 3) for t in tokens if rng.random() < 0.85} or {tokens[0]: 1}


def _events(rng: random.Random, count: int, clusters: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for i in range(count):
        if events and rng.random() < 0.15:  # a storm: an exact copy of an earlier event's bag under a new ID
            features = rng.choice(events)["features"]
        else:
            features = _bag(rng, rng.randrange(clusters))
        events.append({"incident_id": f"e{i}", "features": features})
    return events


def _start_worker(url: str, log: Path, consumer: str, **settings: Any) -> subprocess.Popen[bytes]:
    env = clean_env(
        redis_url=url,
        log_format="json",
        consumer=consumer,
        max_matches=0,
        block_ms=50,
        claim_idle_ms=1000,
        claim_interval_ms=200,
        bands=4,
        max_distance=R,
        **settings,
    )
    with open(log, "ab") as out:
        return spawn([*worker_command(), "run"], env=env, stdout=out, stderr=out)


def _migrate(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = clean_env(redis_url=url)
    with open(log, "ab") as out:
        return spawn([*worker_command(), "migrate", *args], env=env, stdout=out, stderr=out)


def _drained(client: Any, published: int) -> bool:
    """Every published entry delivered to the group and acknowledged. (Not "up to the stream's last entry": the
    workers trim what they processed, so the stream may be empty.)"""
    if pending_count(client) != 0:
        return False
    groups = {text(g["name"]): g for g in client.xinfo_groups(EVENTS)}
    return int(groups[GROUP].get("entries-read") or 0) >= published


@pytest.mark.slow
@pytest.mark.parametrize(("to_bands", "seed"), [(3, 1), (8, 2)])
def test_migration_under_a_killed_fleet_keeps_every_invariant(
    server: RedisServer, tmp_path: Path, to_bands: int, seed: int
) -> None:
    rng = random.Random(seed)
    client = server.client()
    clusters = 150
    seeded = {f"s{i}": fingerprint(_bag(rng, rng.randrange(clusters))) for i in range(4_000)}
    FingerprintIndex(client, NS, 4, R).bulk_load(seeded.items(), chunk=5000)
    events = _events(rng, 1000, clusters)
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    workers = [
        _start_worker(server.url, logs[0], "w0", read_path="primary"),
        _start_worker(server.url, logs[1], "w1", read_path="snapshot"),
    ]

    def publish_slowly() -> None:  # the events arrive while the migration runs
        for start in range(0, len(events), 100):
            publish(client, events[start : start + 100])
            time.sleep(0.05)

    publisher = threading.Thread(target=publish_slowly)
    publisher.start()
    mlog = tmp_path / "migrate.log"
    kills = 0
    worker_killed = False
    deadline = time.monotonic() + 240
    while True:
        migrator = _migrate(server.url, mlog, "--bands", str(to_bands), "--batch", "100", "--pause-ms", "1")
        if kills < 5:
            time.sleep(rng.uniform(0.2, 1.2))
            if migrator.poll() is None:
                migrator.send_signal(signal.SIGKILL)
                migrator.wait()
                kills += 1
                if kills == 1 and not worker_killed:  # and a worker, mid-migration
                    workers[0].send_signal(signal.SIGKILL)
                    workers[0].wait()
                    workers[0] = _start_worker(server.url, logs[0], "w0", read_path="primary")
                    worker_killed = True
                continue
        code = migrator.wait(timeout=max(1, deadline - time.monotonic()))
        assert code == 0, mlog.read_text()[-3000:]
        break
    publisher.join()
    while not _drained(client, len(events)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, [log.read_text()[-2000:] for log in logs]
    assert kills >= 1 and worker_killed

    # each incident indexed once, with its fingerprint; nothing dead, nothing pending
    expected = dict(seeded)
    for event in events:
        expected.setdefault(event["incident_id"], fingerprint(event["features"]))
    stored = {text(k): int(v, 16) for k, v in client.hgetall(IndexKeys(NS).fingerprints).items()}
    assert stored == expected
    assert dead_letters(client) == []
    assert pending_count(client) == 0

    # every pair within R with a new incident in it is reported exactly once, and no other
    reported: dict[tuple[str, str], int] = defaultdict(int)
    published = alerts(client)
    assert len({a.incident_id for a in published}) == len(published), "an incident was alerted twice"
    for alert in published:
        assert alert.match_count == len(alert.matches)
        for match in alert.matches:
            x, y = alert.incident_id, match.incident_id
            assert match.distance == (stored[x] ^ stored[y]).bit_count() <= R
            reported[(min(x, y), max(x, y))] += 1
    assert all(count == 1 for count in reported.values()), "a pair was reported twice"
    new_ids = {e["incident_id"] for e in events}
    wanted = {pair for pair in pairs_within(stored, R) if pair[0] in new_ids or pair[1] in new_ids}
    assert set(reported) == wanted

    # the index is the new layout's, exact, and answers as a linear scan does
    meta = FingerprintIndex.read_meta(client, NS)
    assert meta["bands"] == str(to_bands) and meta["generation"] == "1" and "building" not in meta
    assert not client.exists(IndexKeys(NS).migration)
    assert_postings_match(client, NS, to_bands, stored, generation=1)
    oracle = Oracle(R)
    oracle.fps = stored
    index = FingerprintIndex(client, NS, 4, R)  # configured with the old layout: follows the index
    for incident_id in rng.sample(sorted(stored), 50):
        assert index.matches_of(stored[incident_id]) == oracle.matches(stored[incident_id])
    assert index.layout.bands == to_bands
