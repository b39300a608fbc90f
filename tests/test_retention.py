"""Retention: incidents whose last add or upsert is older than the window leave the index, atomically and once.

Windows of about a second on the real server and on fakeredis (both read the wall clock for TIME). The brute-force
oracle (tests/oracle.py) says what the index must hold; `assert_postings_match` that postings and twin groups are
exactly what the remaining fingerprints call for.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from tests.oracle import Oracle, assert_postings_match, clustered
from worker import retention
from worker.index import FingerprintIndex
from worker.library import SnapshotClaim, parse_apply
from worker.readpath import ChangeFollower
from worker.replies import text

WINDOW_MS = 1000


def _index(client: Any, namespace: str = "r") -> FingerprintIndex:
    index = FingerprintIndex(client, namespace, bands=4, max_distance=7)
    index.open()
    return index


def _expiries(client: Any, index: FingerprintIndex) -> Counter[str]:
    """How many `expire` entries the change log holds for each ID."""
    found: Counter[str] = Counter()
    for _, fields in client.xrange(index.keys.changes):
        for name, value in fields.items():
            if text(name) == "expire":
                found[text(value)] += 1
    return found


def _assert_consistent(client: Any, index: FingerprintIndex, expected: dict[str, int] | None = None) -> None:
    """Fingerprints as expected (if given), postings and groups rebuilt from them, one bookkeeping entry each."""
    stored = {text(k): int(text(v), 16) for k, v in client.hgetall(index.keys.fingerprints).items()}
    if expected is not None:
        assert stored == expected
    assert_postings_match(client, index.keys.namespace, index.layout.bands)
    if retention.recorded_window(client, index.keys):
        tracked = {text(m) for m in client.zrange(index.keys.expiry, 0, -1)}
        assert tracked == set(stored)


def _wait_past_window(client: Any, index: FingerprintIndex, since_ms: int) -> None:
    """Sleep until the server's clock is a little past `since_ms` + the window."""
    while True:
        seconds, micros = client.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        if now > since_ms + WINDOW_MS + 20:
            return
        time.sleep((since_ms + WINDOW_MS + 25 - now) / 1000)


def _now(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_window_is_recorded_in_the_meta_and_the_bookkeeping_exists_only_while_it_is_on(
    redis_client: redis.Redis,
) -> None:
    index = _index(redis_client)
    index.add_fingerprint("a", 1)
    assert not redis_client.exists(index.keys.expiry)  # off: no bookkeeping at all
    assert retention.set_window(index, WINDOW_MS) == 0
    meta = FingerprintIndex.read_meta(redis_client, "r")
    assert meta["retention_ms"] == str(WINDOW_MS) and meta["retention_backfill"] == "0"
    index.add_fingerprint("b", 2)  # the apply step keeps the bookkeeping from now on
    assert redis_client.zscore(index.keys.expiry, "b") is not None
    assert redis_client.zscore(index.keys.expiry, "a") is None  # until the backfill reaches it
    assert retention.backfill_step(index) == (False, 1)
    assert redis_client.zscore(index.keys.expiry, "a") == int(meta["retention_since"])
    assert redis_client.zscore(index.keys.expiry, "b") >= int(meta["retention_since"])  # NX: not set back
    assert "retention_backfill" not in FingerprintIndex.read_meta(redis_client, "r")
    assert retention.backfill_step(index) == (False, 0)  # nothing runs
    index.delete("b")
    assert redis_client.zscore(index.keys.expiry, "b") is None
    assert retention.set_window(index, 5 * WINDOW_MS) == WINDOW_MS  # a new window keeps the bookkeeping
    assert redis_client.zcard(index.keys.expiry) == 1
    assert retention.set_window(index, 0) == 5 * WINDOW_MS
    assert not redis_client.exists(index.keys.expiry)
    assert not {"retention_ms", "retention_since"} & set(FingerprintIndex.read_meta(redis_client, "r"))
    index.add_fingerprint("c", 3)
    assert not redis_client.exists(index.keys.expiry)


def test_the_backfill_goes_in_bounded_steps_and_misses_nothing(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    index.bulk_load((f"i{n}", n * 7919) for n in range(700))
    retention.set_window(index, WINDOW_MS)
    steps = 0
    while True:
        more, _ = retention.backfill_step(index, count=50)
        steps += 1
        index.delete(f"i{steps}")  # deletes and adds while it runs
        index.add_fingerprint(f"new{steps}", steps)
        if not more:
            break
    assert steps > 1 or redis_client.hlen(index.keys.fingerprints) < 600  # fakeredis may scan it whole
    _assert_consistent(redis_client, index)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_index_holds_exactly_the_incidents_changed_within_the_window(redis_client: redis.Redis, seed: int) -> None:
    """Ops before and after a window's pause; then a pass: what is left is the oracle of the incidents whose last add
    or upsert is within the window, and every search answers as the oracle's linear scan does.

    Each op is timed by the server's clock before and after it, and the pass too, so that on a slow machine an
    incident whose last change may sit on either side of the cutoff is allowed to go either way (and nothing else)."""
    rng = random.Random(seed)
    pool = clustered(rng, 24, 7, centers=3) + [5] * 4  # exact twins among them
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    oracle = Oracle(7)
    touched: dict[str, tuple[int, int]] = {}  # ID -> server time before and after its last add or upsert

    def run(count: int) -> None:
        for _ in range(count):
            incident_id, fp = f"i{rng.randrange(40)}", rng.choice(pool)
            kind = rng.choice(["add", "add", "upsert", "upsert", "delete"])
            before = _now(redis_client)
            if kind == "add":
                if oracle.add(incident_id, fp) != "duplicate":
                    index.add_fingerprint(incident_id, fp)
                    touched[incident_id] = (before, _now(redis_client))
            elif kind == "upsert":
                index.upsert_fingerprint(incident_id, fp)
                oracle.upsert(incident_id, fp)
                touched[incident_id] = (before, _now(redis_client))
            else:
                index.delete(incident_id)
                oracle.delete(incident_id)
                touched.pop(incident_id, None)

    run(120)
    _wait_past_window(redis_client, index, _now(redis_client))
    run(30)
    started = _now(redis_client)
    result = retention.expire_due(index, batch=7)
    ended = _now(redis_client)
    must_go = {i for i in oracle.fps if touched[i][1] <= started - WINDOW_MS}
    must_stay = {i for i in oracle.fps if touched[i][0] > ended - WINDOW_MS}
    assert must_go and must_stay, "the pause did not separate the two phases"
    stored = {text(k): int(text(v), 16) for k, v in redis_client.hgetall(index.keys.fingerprints).items()}
    assert must_stay <= set(stored) and not must_go & set(stored)
    expected = {i: oracle.fps[i] for i in stored}
    assert result.expired == len(oracle.fps) - len(expected)
    _assert_consistent(redis_client, index, expected)
    assert set(_expiries(redis_client, index)) == set(oracle.fps) - set(expected)
    live = Oracle(7)
    live.fps = dict(expected)
    for fp in pool[:10]:
        assert index.matches_of(fp) == live.matches(fp)
    # an add of an expired ID afterwards is a new incident, with its own alert-worthy matches
    gone = sorted(set(oracle.fps) - set(expected))
    fp = oracle.fps[gone[0]]
    assert index.add_fingerprint(gone[0], fp) == live.matches(fp)


def test_an_upsert_between_the_pick_and_the_expiry_wins(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    for n in range(6):
        index.add_fingerprint(f"i{n}", 1000 + n)
    _wait_past_window(redis_client, index, _now(redis_client))
    picked = retention.pick(index)
    assert len(picked) == 6
    index.upsert_fingerprint("i0", 77)  # a new fingerprint: the picked one is stale
    index.upsert_fingerprint("i1", 1001)  # a repeat: the same fingerprint, the window starts again
    index.add_fingerprint("i2", 1002)  # a repeated add counts too
    index.delete("i3")
    result = retention.expire_picked(index, picked)
    assert (result.expired, result.kept, result.dropped) == (2, 4, 0)  # the delete took i3 out of the bookkeeping
    _assert_consistent(redis_client, index, {"i0": 77, "i1": 1001, "i2": 1002})
    assert set(_expiries(redis_client, index)) == {"i4", "i5"}


def test_expiring_a_representative_promotes_a_twin_that_still_matches(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    index.add_fingerprint("a", 42)  # the representative
    index.add_fingerprint("lone", 42 ^ 0b111)
    _wait_past_window(redis_client, index, _now(redis_client))
    index.add_fingerprint("b", 42)  # twins of a, a window younger
    index.add_fingerprint("c", 42)
    result = retention.expire_due(index)
    assert result.expired == 2  # a and lone
    assert index.twin_group(42) == (2, "b")
    assert index.matches_of(42) == [("b", 0), ("c", 0)]
    assert index.add_fingerprint("d", 42 ^ 1) == [("b", 1), ("c", 1)]
    _assert_consistent(redis_client, index)


def test_several_passes_at_once_never_expire_one_incident_twice(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    index.bulk_load((f"i{n}", (n % 50) * 0x10001) for n in range(600))  # twins of 50 fingerprints
    _wait_past_window(redis_client, index, _now(redis_client))
    threads_seen: list[retention.ExpireResult] = []

    def worker() -> None:
        threads_seen.append(retention.expire_due(_index(redis_client), batch=40))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.expired for r in threads_seen) == 600
    assert set(_expiries(redis_client, index).values()) == {1}
    assert len(_expiries(redis_client, index)) == 600
    _assert_consistent(redis_client, index, {})


def test_racing_upserts_of_expiring_incidents_lose_nothing(real_redis: redis.Redis) -> None:
    """Writers upsert incidents while passes run: every incident whose last upsert finished within the window at
    the end is indexed with its last fingerprint; the rest were expired, each once."""
    index = _index(real_redis)
    retention.set_window(index, WINDOW_MS)
    ids = [f"i{n}" for n in range(300)]
    index.bulk_load((i, n) for n, i in enumerate(ids))
    last: dict[str, tuple[int, int]] = {}  # ID -> (fingerprint, server time before its last upsert was sent)
    stop = threading.Event()
    rng = random.Random(7)

    def writer() -> None:
        own = _index(real_redis)
        while not stop.is_set():
            incident_id = rng.choice(ids[:150])
            fp = rng.getrandbits(64)
            sent = _now(real_redis)
            own.upsert_fingerprint(incident_id, fp)
            last[incident_id] = (fp, sent)

    def expirer() -> None:
        own = _index(real_redis)
        while not stop.is_set():
            retention.expire_due(own, batch=20)

    started = _now(real_redis)
    threads = [threading.Thread(target=writer), threading.Thread(target=expirer), threading.Thread(target=expirer)]
    for thread in threads:
        thread.start()
    _wait_past_window(real_redis, index, started + WINDOW_MS // 2)
    stop.set()
    for thread in threads:
        thread.join()
    ended = _now(real_redis)
    stored = {text(k): int(text(v), 16) for k, v in real_redis.hgetall(index.keys.fingerprints).items()}
    for incident_id, (fp, sent) in last.items():
        if sent > ended - WINDOW_MS:  # upserted within the window: must be there, as last written
            assert stored.get(incident_id) == fp, incident_id
    for incident_id in ids[150:]:  # loaded before the window and never touched: gone
        assert incident_id not in stored
    assert set(_expiries(real_redis, index).values()) <= {1}
    _assert_consistent(real_redis, index, {i: fp for i, fp in stored.items()})


def test_the_snapshot_path_sees_an_expiry_as_a_removal(redis_client: redis.Redis) -> None:
    """A copy loaded before the expiry lists the expired incident; the atomic step validates it away, and the copy
    drops it when it follows the change log."""
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    index.add_fingerprint("old", 0xABC)
    index.add_fingerprint("twin-old", 0xABC ^ 1)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    _wait_past_window(redis_client, index, _now(redis_client))
    index.add_fingerprint("young", 0xABC ^ 3)
    follower_fresh_before = follower.index.position
    assert retention.expire_due(index).expired == 2
    search = follower.index.search(0xABC, exclude="new", limit=100)
    assert [m[0] for m in search.matches] == ["old", "twin-old"]  # the copy is stale: it still has them
    claim = SnapshotClaim(follower_fresh_before, search.match_count, search.matches, True)
    result = parse_apply(
        redis_client.execute_command(*index.apply_command("add", "new", 0xABC, snapshot=claim, max_matches=100))
    )
    assert result.status == "indexed"
    assert result.matches == [("young", 2)] and result.match_count == 1
    follower.catch_up()
    assert follower.index.get("old") is None and follower.index.get("twin-old") is None
    assert dict(follower.index.items()) == {"young": 0xABC ^ 3, "new": 0xABC}


def test_expire_without_a_window_does_nothing(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    index.add_fingerprint("a", 1)
    assert retention.expire_due(index).expired == 0
    assert retention.state(redis_client, index.keys).window_ms == 0
    assert index.get("a") == 1


def test_state_shows_what_is_due_and_what_goes_next(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    index.add_fingerprint("a", 1)
    _wait_past_window(redis_client, index, _now(redis_client))
    index.add_fingerprint("b", 2)
    found = retention.state(redis_client, index.keys, upcoming=5)
    assert (found.window_ms, found.tracked, found.due) == (WINDOW_MS, 2, 1)
    assert found.oldest_age_ms is not None and found.oldest_age_ms > WINDOW_MS
    assert [row["incident_id"] for row in found.upcoming] == ["a", "b"]
    assert found.upcoming[0]["goes_in_s"] == 0 and found.upcoming[1]["goes_in_s"] > 0
    assert found.as_json()["due"] == 1


def test_a_mangled_fingerprint_does_not_block_the_expiries_behind_it(redis_client: redis.Redis) -> None:
    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    index.add_fingerprint("bad", 1)
    index.add_fingerprint("good", 2)
    redis_client.hset(index.keys.fingerprints, "bad", "not hex")  # an operator's mistake with redis-cli
    _wait_past_window(redis_client, index, _now(redis_client))
    assert retention.expire_due(index, batch=1).expired == 2
    assert redis_client.hlen(index.keys.fingerprints) == 0


# -- inside the workers ---------------------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402
from tests.streams import FAST, clean_env, publish, start_worker, stop, wait_until, worker_command  # noqa: E402


def _cli(url: str, *args: str) -> tuple[int, str, str]:
    import subprocess

    done = subprocess.run([*worker_command(), *args], capture_output=True, timeout=60, env=clean_env(redis_url=url))
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.slow
def test_a_worker_expires_by_itself_and_the_commands_show_it(server: RedisServer, tmp_path: Path) -> None:
    """A worker with RETENTION records the window, expires what is due between batches, and `stats` and `expire`
    show it; a worker started without the setting keeps the window, one started with retention off turns it off and
    drops the bookkeeping."""
    client = server.client()
    publish(client, [{"incident_id": f"old{n}", "features": {f"t{n}": 1, "x": 2}} for n in range(50)])
    worker = start_worker(server.url, log=tmp_path / "w.log", retention="1h", **FAST)
    try:
        wait_until(lambda: client.hlen("{incidents}:fp") == 50, 60, "the first events")
        assert client.hget("{incidents}:meta", "retention_ms") == b"3600000"
        assert client.zcard("{incidents}:expiry") == 50
        code, out, _ = _cli(server.url, "expire", "--dry-run")
        assert code == 0 and "50 incidents tracked" in out and "0 due now" in out, out
        assert "old0" in out and re.search(r"in (59\.\d|60\.0) min", out), out  # 1 h less a few seconds, rounded
        code, out, _ = _cli(server.url, "stats")
        assert code == 0 and "retention    window 1.0 h: 50 incidents tracked, 0 due" in out, out
    finally:
        # stopped, not killed: a killed holder keeps the upkeep lease, and the next worker's expiry waits LEASE_TTL_MS
        stop(worker)
    # a worker with a shorter window records it: the 50 are due at once
    worker = start_worker(server.url, log=tmp_path / "short.log", retention="1s", **FAST)
    try:
        wait_until(lambda: client.hlen("{incidents}:fp") == 0, 60, "the expiry of the 50")
        assert sum(1 for _, f in client.xrange("{incidents}:changes") if b"expire" in f) == 50
        # the worker logs what it expired after the call that expired it returns: wait for the lines, not the keys
        wait_until(
            lambda: all(
                line in (tmp_path / "short.log").read_text()
                for line in ("retention window changed for the namespace", "expired incidents")
            ),
            30,
            "the log lines of the window's change and of the expiry",
        )
        publish(client, [{"incident_id": "young", "features": {"y": 1}}])
        wait_until(lambda: client.hexists("{incidents}:fp", "young"), 60, "a new event")
        code, out, _ = _cli(server.url, "expire", "--dry-run", "--json")
        assert json.loads(out)["retention"]["window_ms"] == 1000
        wait_until(lambda: client.hlen("{incidents}:fp") == 0, 60, "its expiry")
    finally:
        stop(worker)
    # a worker started without the setting keeps the namespace's window: it drops nothing
    unset = start_worker(server.url, log=tmp_path / "unset.log", **FAST)
    try:
        publish(client, [{"incident_id": "kept-window", "features": {"k": 1}}])
        added = lambda: any(f.get(b"add") == b"kept-window" for _, f in client.xrange("{incidents}:changes"))  # noqa: E731
        wait_until(added, 60, "an event on the unset worker")
        assert client.hget("{incidents}:meta", "retention_ms") == b"1000"
        assert "retention window changed" not in (tmp_path / "unset.log").read_text()
    finally:
        stop(unset)
    off = start_worker(server.url, log=tmp_path / "off.log", retention="off", **FAST)
    try:
        wait_until(lambda: client.hget("{incidents}:meta", "retention_ms") is None, 30, "retention turned off")
        assert not client.exists("{incidents}:expiry")
        code, out, err = _cli(server.url, "expire")
        assert code == 0 and "retention is off" in err
    finally:
        stop(off)


@pytest.mark.slow
def test_sigkill_during_expiry_leaves_a_consistent_index_and_no_incident_expires_twice(
    server: RedisServer, tmp_path: Path
) -> None:
    """20,000 incidents due at once, three workers expiring them while events arrive; the lease is taken from its
    holder now and then (as when a stalled holder's lease lapses) so that passes overlap, and holders are SIGKILLed
    mid-pass. After each kill the index is consistent; at the end every loaded incident left exactly once."""
    client = server.client()
    rng = random.Random(11)
    index = FingerprintIndex(client)
    index.open()
    retention.set_window(index, 2000)
    pool = clustered(rng, 400, 7, centers=20)
    loaded = {f"i{n}": rng.choice(pool) for n in range(20_000)}  # many exact twins among them
    index.bulk_load(loaded.items())
    _wait_past_window(client, index, _now(client) + 1000)
    lease = index.keys.lease("upkeep")
    workers = [
        start_worker(server.url, log=tmp_path / f"w{n}.log", consumer=f"w{n}", retention="2s", **FAST) for n in range(3)
    ]
    fresh: list[str] = []
    try:
        for round_ in range(4):
            mark = 20_000 - (round_ + 1) * 3000
            deadline = time.monotonic() + 60
            while client.hlen(index.keys.fingerprints) > mark and time.monotonic() < deadline:
                events = [
                    {"incident_id": f"new{len(fresh) + k}", "features": {f"n{len(fresh) + k}": 1}} for k in range(5)
                ]
                fresh += [e["incident_id"] for e in events]
                publish(client, events)
                client.delete(lease)  # the next worker to ask takes it: passes overlap
                time.sleep(0.03)
            holder = client.get(lease)
            victims = [w for n, w in enumerate(workers) if holder == f"w{n}".encode()] or [rng.choice(workers)]
            for victim in victims:
                victim.kill()
                victim.wait()
                slot = workers.index(victim)
                client.delete(lease)
                # the others paused between two calls (each call is atomic): the index as the kill left it
                others = [w for w in workers if w is not victim]
                for other in others:
                    other.send_signal(signal.SIGSTOP)
                # a call a stopped worker sent just before still runs on the server: let it, before reading the
                # index in several commands (one such call once landed between the read of {N}:fp and {N}:expiry)
                time.sleep(0.3)
                try:
                    _assert_consistent(client, index)
                finally:
                    for other in others:
                        other.send_signal(signal.SIGCONT)
                workers[slot] = start_worker(
                    server.url, log=tmp_path / f"w{slot}-{round_}.log", consumer=f"w{slot}", retention="2s", **FAST
                )
        wait_until(lambda: not set(loaded) & {text(k) for k in client.hkeys(index.keys.fingerprints)}, 90, "the rest")
        wait_until(
            lambda: (
                set(fresh) <= {text(k) for k in client.hkeys(index.keys.fingerprints)} | set(_expiries(client, index))
            ),
            90,
            "the events",
        )
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    _assert_consistent(client, index)
    expiries = _expiries(client, index)
    assert set(loaded) <= set(expiries)
    assert set(expiries.values()) == {1}, [i for i, n in expiries.items() if n > 1][:5]
    stored = {text(k) for k in client.hkeys(index.keys.fingerprints)}
    assert stored <= set(fresh)
    assert set(fresh) <= stored | set(expiries)  # every event indexed; what left, left by expiry


def test_the_memory_warning_says_whether_retention_is_on() -> None:
    import fakeredis

    from worker import library, upkeep
    from worker.settings import Settings

    class Full(fakeredis.FakeRedis):
        def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"used_memory": 900, "maxmemory": 1000}

    client = Full(server=fakeredis.FakeServer(version=7))
    library.load(client)
    settings = Settings()
    [warning] = upkeep.warnings(client, settings, positions=[])
    assert "90% of maxmemory" in warning and "retention is off" in warning and "RETENTION" in warning
    retention.set_window(_index(client, settings.namespace), 30 * 86_400_000)
    [warning] = upkeep.warnings(client, settings, positions=[])
    assert "retention window of 30.0 days" in warning


def test_workers_on_the_snapshot_path_never_alert_an_expired_incident(redis_client: redis.Redis) -> None:
    """Two workers searching their own copies, one of them stale (loaded before the expiry and never refreshed):
    an incident expired since is validated away by the atomic step, so no alert lists it."""
    from tests.streams import alerts, pending_count
    from worker.settings import Settings
    from worker.stream import StreamWorker

    if redis_client.get_encoder().decode_responses:  # type: ignore[attr-defined]
        import fakeredis

        from worker import library

        redis_client = fakeredis.FakeRedis(server=fakeredis.FakeServer(version=7))  # the worker wants bytes
        library.load(redis_client)

    def make(consumer: str) -> StreamWorker:
        settings = Settings(consumer=consumer, block_ms=50, read_path="snapshot", retention="1s", batch_size=4)
        return StreamWorker(redis_client, settings)

    dock = {"dock": 3, "scanner": 2, "timeout": 1}
    publish(redis_client, [{"incident_id": f"old{n}", "features": dock} for n in range(5)])
    stale, fresh = make("stale"), make("fresh")
    stale.setup()
    fresh.setup()
    while fresh.read_and_process():
        pass
    assert stale.snapshot is not None
    stale.snapshot.refresh()
    stale.snapshot.refresh = lambda: None  # type: ignore[method-assign]  # it keeps the five old incidents
    assert len(stale.snapshot.index) == 5
    index = fresh.index
    _wait_past_window(redis_client, index, _now(redis_client))
    assert retention.expire_due(index).expired == 5  # as the lease holder does between batches
    before = len(alerts(redis_client))
    publish(redis_client, [{"incident_id": "new1", "features": dock}])
    while stale.read_and_process():
        pass
    assert len(alerts(redis_client)) == before  # its copy matched five; all five had expired
    publish(redis_client, [{"incident_id": "new2", "features": dock}])
    while fresh.read_and_process():
        pass
    [last] = alerts(redis_client)[before:]
    assert (last.incident_id, [m.incident_id for m in last.matches], last.match_count) == ("new2", ["new1"], 1)
    assert pending_count(redis_client) == 0
    _assert_consistent(redis_client, index)


def test_expiry_waits_while_a_migration_builds_and_follows_its_switch(redis_client: redis.Redis) -> None:
    """Nothing expires while a move to another layout builds its postings (the target's would be left behind); after
    the switch, a pass built for the old layout is refused, follows the meta and takes the new layout's postings out."""
    from worker.bands import BandLayout
    from worker.migrate import Migrator, migration_status

    index = _index(redis_client)
    retention.set_window(index, WINDOW_MS)
    for n in range(30):
        index.add_fingerprint(f"i{n}", (n % 10) * 0x1000F)  # twins too
    migrator = Migrator(redis_client, "r", batch=7)
    migrator._start(index, BandLayout(3, 7))
    _wait_past_window(redis_client, index, _now(redis_client))
    paused = retention.expire_due(index, batch=10)
    assert paused.expired == 0  # building: paused
    # and says nothing more can go now, or the upkeep would run its passes again after every event batch
    assert paused.kept == 10 and not paused.more
    while migration_status(redis_client, index.keys) is not None and migration_status(
        redis_client, index.keys
    ).state in ("building", "built"):
        migrator.step()
    fresh = _index(redis_client)  # opened after the switch: the new layout
    assert fresh.layout.bands == 3
    assert index.layout.bands == 4  # the pass below is built for the old layout first
    assert retention.expire_due(index).expired == 30
    assert index.layout.bands == 3
    migrator.migrate(3)  # the old postings go
    assert_postings_match(redis_client, "r", 3, {}, generation=1)
    assert redis_client.hlen(index.keys.fingerprints) == 0


def test_a_backfill_resumed_after_a_redis_restart_misses_nothing(aof_server: RedisServer) -> None:
    """The backfill's HSCAN cursor, stored in {N}:meta, is only good in the server process that gave it (Redis seeds
    its hash function at random at start): resumed after a restart it must not skip incidents, which would then never
    expire."""
    client = aof_server.client()

    index = _index(client)
    index.bulk_load((f"i{n}", n * 7919) for n in range(3000))
    retention.set_window(index, 60_000)
    for _ in range(10):
        assert retention.backfill_step(index, count=50)[0]
    aof_server.kill()
    aof_server.start()
    client = aof_server.client()
    index = _index(client)
    while retention.backfill_step(index, count=50)[0]:
        pass
    tracked = {text(m) for m in client.zrange(index.keys.expiry, 0, -1)}
    assert len(tracked) == 3000, f"{3000 - len(tracked)} incidents never entered the retention bookkeeping"
    _assert_consistent(client, index)
