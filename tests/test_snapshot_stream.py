"""The stream worker on the snapshot read path: searches on the worker's own copy, validated by the atomic step.

The invariants are those of the primary path (every pair within r reported exactly once, each incident indexed
once, nothing pending), here with copies made stale on purpose, concurrent workers, upserts and deletes of listed
matches between a copy's search and its validation, a change log trimmed under a reader, and storms.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
import redis

from tests.oracle import Oracle
from tests.redis_server import RedisServer
from tests.streams import FP, alerts, assert_pairs_reported_once, dead_letters, fingerprints, pending_count, publish
from worker.devtools.workload import Workload
from worker.errors import PreflightError
from worker.fingerprint import fingerprint
from worker.readpath import CHANGES_FLOOR_FIELD
from worker.settings import Settings
from worker.stream import StreamWorker

DOCK = {"dock": 3, "scanner": 2, "timeout": 1}


pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


def worker(client: Any, consumer: str = "w1", **overrides: Any) -> StreamWorker:
    values: dict[str, Any] = {
        "consumer": consumer,
        "block_ms": 50,
        "claim_interval_ms": 100,
        "summary_interval_s": 60,
        "read_path": "snapshot",
    }
    values.update(overrides)
    return StreamWorker(client, Settings(**values))


def test_snapshot_path_reports_every_pair_once_on_the_synthetic_workload(client: redis.Redis, seal_at: int) -> None:
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=7).take(500)]
    publish(client, events)
    w = worker(client, batch_size=32)
    w.run(until_idle=True)
    assert w.snapshot is not None
    assert_pairs_reported_once(fingerprints(events), alerts(client))
    assert client.hlen(FP) == 500
    assert pending_count(client) == 0
    assert w.snapshot.index.position != "0-0"


def test_two_workers_with_stale_copies_miss_no_pair_and_report_none_twice(client: redis.Redis, seal_at: int) -> None:
    """Two consumers take turns; one never refreshes its copy after loading it, so every claim it makes is stale."""
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=11, near_duplicates=0.5).take(400)]
    a, b = worker(client, "a", batch_size=16), worker(client, "b", batch_size=16)
    a.setup()
    b.setup()
    assert a.snapshot is not None and b.snapshot is not None
    a.snapshot.refresh()
    a.snapshot.refresh = lambda: None  # type: ignore[method-assign]  # a stays at its first position
    publish(client, events)
    while a.read_and_process() + b.read_and_process():
        pass
    assert_pairs_reported_once(fingerprints(events), alerts(client))
    assert client.hlen(FP) == 400
    assert pending_count(client) == 0
    assert a.snapshot.index.position < b.snapshot.index.position or len(a.snapshot.index) == 0


def test_listed_matches_deleted_or_moved_after_the_copy_are_not_alerted(client: redis.Redis, seal_at: int) -> None:
    rng = random.Random(3)
    base = fingerprint(DOCK)
    w = worker(client, batch_size=8, max_matches=2)
    publish(client, [{"incident_id": f"m{n}", "features": {**DOCK, f"x{n}": 1}} for n in range(6)])
    w.run(until_idle=True)
    assert w.snapshot is not None
    w.snapshot.refresh()
    w.snapshot.refresh = lambda: None  # type: ignore[method-assign]
    # behind the copy's back: delete two listed matches, move one away, add two new ones
    other = worker(client, "other", read_path="primary")
    publish(
        client,
        [
            {"incident_id": "m0", "op": "delete"},
            {"incident_id": "m1", "op": "delete"},
            {"incident_id": "m2", "op": "upsert", "features": {"far": 1, "away": 9, "q": rng.randint(1, 9)}},
            {"incident_id": "n1", "features": DOCK},
            {"incident_id": "n2", "features": {**DOCK, "y": 1}},
        ],
    )
    other.run(until_idle=True)
    before = len(alerts(client))
    publish(client, [{"incident_id": "probe", "features": DOCK}])
    w.run(until_idle=True)
    alert = alerts(client)[before:]
    stored = {k.decode(): int(v, 16) for k, v in client.hgetall(FP).items()}
    oracle = Oracle(7)
    oracle.fps = {k: v for k, v in stored.items() if k != "probe"}
    expected = oracle.matches(base)
    assert len(alert) == 1 and alert[0].incident_id == "probe"
    assert alert[0].match_count == len(expected)
    assert [(m.incident_id, m.distance) for m in alert[0].matches] == expected[:2]


def test_a_change_log_trimmed_under_a_reader_falls_back_to_the_full_search(client: redis.Redis) -> None:
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=13).take(200)]
    w = worker(client, batch_size=20)
    publish(client, events[:100])
    w.run(until_idle=True)
    assert w.snapshot is not None
    w.snapshot.refresh = lambda: None  # type: ignore[method-assign]
    client.hset("{incidents}:meta", CHANGES_FLOOR_FIELD, "99999999999999-0")
    publish(client, events[100:])
    w.run(until_idle=True)
    assert w.snapshot.fallbacks == 100
    assert_pairs_reported_once(fingerprints(events), alerts(client))
    assert pending_count(client) == 0


@pytest.mark.parametrize("sends_alone", [1, 4])
def test_a_fallback_is_applied_in_stream_order_before_the_rest_of_its_send(
    client: redis.Redis, sends_alone: int
) -> None:
    """Every claim of a copy held behind a trimmed change log falls back. A send of [delete, add, delete, add, ...]
    used to apply its deletes first and each add after them, searched in full: an add's alert missed the incidents
    deleted after it in the stream. The rest of a send waits (`deferred`) until the fallback is applied, so every
    alert is the one stream order gives, against the oracle replayed in that order."""
    rng = random.Random(3)
    base = {f"tok{k}": rng.randint(1, 12) for k in range(12)}  # near one another: most pairs within 7
    bags = [dict(base, **{f"v{n}": rng.choice([1, 2, 3])}) for n in range(80)]
    first = [{"incident_id": f"i{n:02d}", "features": bags[n]} for n in range(40)]
    w = worker(client, batch_size=10, snapshot_sends_alone=sends_alone)
    publish(client, first)
    w.run(until_idle=True)
    assert w.snapshot is not None
    w.snapshot.refresh = lambda: None  # type: ignore[method-assign]
    client.hset("{incidents}:meta", CHANGES_FLOOR_FIELD, "99999999999999-0")
    then: list[dict[str, Any]] = []
    for n in range(40):
        then += [{"incident_id": f"i{n:02d}", "op": "delete"}, {"incident_id": f"j{n:02d}", "features": bags[40 + n]}]
    publish(client, then)
    w.run(until_idle=True)
    assert w.snapshot.fallbacks >= 4
    oracle = Oracle(7)
    for event in first:
        oracle.add(event["incident_id"], fingerprint(event["features"]))
    expected = {}
    for event in then:
        if event.get("op") == "delete":
            oracle.delete(event["incident_id"])
        else:
            expected[event["incident_id"]] = oracle.add(event["incident_id"], fingerprint(event["features"]))
    got = {a.incident_id: (a.match_count, [(m.incident_id, m.distance) for m in a.matches]) for a in alerts(client)}
    for incident_id, matches in expected.items():
        assert got.get(incident_id, (0, [])) == (len(matches), matches), incident_id
    assert pending_count(client) == 0


def _rewind(client: redis.Redis, saved: dict[bytes, bytes], reset: bool) -> None:
    """Take every key back to `saved` (DUMPs of an earlier moment), as a restart from an older save does; or, with
    `reset`, delete every key, as a FLUSHALL or a deleted namespace does."""
    client.flushdb()
    if not reset:
        for key, value in saved.items():
            client.restore(key, 0, value)


@pytest.mark.parametrize("reset", [False, True], ids=["went-back", "reset"])
def test_a_copy_of_an_index_that_went_back_or_was_reset_names_no_lost_incident(
    client: redis.Redis, reset: bool
) -> None:
    """The worker's copy holds incidents that the index lost (Redis restarted from an older save, or its keys were
    deleted) while the worker ran. The new events are near duplicates of the lost incidents; no alert may name one,
    and every pair of what the index holds is reported once, as if the lost events had never been."""
    bags = [bag for _, bag in Workload(seed=21, near_duplicates=0.5).take(240)]
    kept = [{"incident_id": f"a{n}", "features": bag} for n, bag in enumerate(bags[:80])]
    lost = [{"incident_id": f"b{n}", "features": bag} for n, bag in enumerate(bags[80:160])]
    # the new events: the lost ones' bags (exact twins) and the rest of the workload
    new = [{"incident_id": f"c{n}", "features": bag} for n, bag in enumerate(bags[80:120] + bags[160:])]
    w = worker(client, batch_size=16)
    publish(client, kept)
    w.run(until_idle=True)
    saved = {key: client.dump(key) for key in client.scan_iter()}
    publish(client, lost)
    w.run(until_idle=True)
    assert w.snapshot is not None
    w.snapshot.refresh()  # (a copy is brought up to date before each send, not after)
    assert len(w.snapshot.index) == 160
    # (a copy of an empty log, at '0-0', may also be loaded again when the upkeep first records a trim floor)
    loads = w.snapshot.reloads
    _rewind(client, saved, reset)
    publish(client, new)
    w.run(until_idle=True)
    survivors = ([] if reset else kept) + new
    stored = {k.decode(): int(v, 16) for k, v in client.hgetall(FP).items()}
    assert stored == fingerprints(survivors)
    assert_pairs_reported_once(fingerprints(survivors), alerts(client))
    assert w.snapshot.reloads > loads  # the worker saw that its copy followed another log, and loaded it again
    w.snapshot.refresh()
    assert dict(w.snapshot.index.items()) == stored
    assert pending_count(client) == 0


def test_storm_of_twins_on_the_snapshot_path_counts_every_twin(client: redis.Redis) -> None:
    publish(client, [{"incident_id": f"s{n:04d}", "features": DOCK} for n in range(300)])
    w = worker(client, batch_size=50, max_matches=10)
    w.run(until_idle=True)
    got = alerts(client)
    assert len(got) == 299
    assert [a.match_count for a in got] == list(range(1, 300))
    assert all(len(a.matches) == min(10, a.match_count) for a in got)
    assert got[-1].matches[0].incident_id == "s0000"
    assert dead_letters(client) == []


@pytest.mark.slow
def test_snapshot_workers_killed_at_random_moments_lose_and_duplicate_nothing(server, tmp_path) -> None:
    """Two worker processes on the snapshot path, one SIGKILLed and restarted three times mid-run, then a last
    worker to finish: the stream invariants hold against the oracle as on the primary path."""
    from tests.streams import FAST, kill_once_indexed, start_worker
    from tests.test_worker_process import _check_run, _wait, _workload

    client = server.client()
    events, bad = _workload(4000, seed=8, bad_every=101)
    publish(client, events)
    rng = random.Random(8)
    steady = start_worker(server.url, log=tmp_path / "steady.log", consumer="steady", read_path="snapshot", **FAST)
    kills = 0
    for round_, mark in enumerate(sorted(rng.sample(range(300, 3000), 3))):
        worker = start_worker(
            server.url, log=tmp_path / f"k{round_}.log", consumer="killed", read_path="snapshot", batch_size=20, **FAST
        )
        kills += kill_once_indexed(client, worker, mark, rng)
    assert kills == 3
    final = start_worker(server.url, "--until-idle", log=tmp_path / "final.log", read_path="snapshot", **FAST)
    assert _wait(final, 240) == 0
    steady.terminate()
    assert steady.wait(timeout=30) == 0
    _check_run(client, events, bad)
    assert '"event": "snapshot loaded"' in (tmp_path / "steady.log").read_text()


@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_a_stream_key_of_another_type_stops_the_worker_before_it_indexes(client: redis.Redis, read_path: str) -> None:
    """A function stops at the first command that fails and keeps what it wrote before: with the alerts key holding
    a string, the apply call indexed the incident, then failed at its XADD; the retry found it indexed, a repeat,
    and acknowledged it without an alert (the pair was lost), and the change log missed it too."""
    client.set("{incidents}:alerts", "not a stream")
    publish(client, [{"incident_id": n, "features": DOCK} for n in ("a", "b")])
    with pytest.raises(PreflightError, match=r"\{incidents\}:alerts holds a string, not the stream the index keeps"):
        worker(client, read_path=read_path).run(until_idle=True)
    assert client.hlen(FP) == 0


@pytest.mark.parametrize(
    ("key", "kind"), [("{incidents}:fp", "hash"), ("{incidents}:meta", "hash"), ("{incidents}:events", "stream")]
)
def test_an_index_key_of_another_type_stops_the_worker_and_names_it(client: redis.Redis, key: str, kind: str) -> None:
    """Every call reads {N}:fp first: a string there failed each call whole, so every event of the stream went to the
    dead letters as poison. {N}:meta or the events stream of another type ended the worker with a bare WRONGTYPE
    (exit 1). Each now stops the worker at its start (exit 2), naming the key, the type it holds, the type it must
    be, and what to do."""
    publish(client, [{"incident_id": n, "features": DOCK} for n in ("a", "b")])
    if key.endswith(":events"):
        client.delete(key)
    client.set(key, "not ours")
    with pytest.raises(PreflightError, match=rf"{re.escape(key)} holds a string, not the {kind} the index keeps") as e:
        worker(client, max_deliveries=1).run(until_idle=True)
    assert "redis-cli" in str(e.value)
    assert client.xlen("{incidents}:dead") == 0


def test_a_user_refused_a_command_the_functions_send_stops_the_worker_before_it_indexes(
    real_redis: redis.Redis, redis_server: RedisServer
) -> None:
    """The worker's user may not XADD (an ACL written by hand, missing one grant): the apply call indexed the
    incident, then was refused its change-log entry; the retry took it for a repeat and acknowledged it, without an
    alert or a change a snapshot copy could follow. The worker now refuses to start, naming user, command and grant."""
    real_redis.execute_command(
        "ACL", "SETUSER", "lim", "reset", "on", ">lim-pw-1234", "~{incidents}:*", "+@all", "-xadd"
    )
    try:
        publish(real_redis, [{"incident_id": n, "features": DOCK} for n in ("a", "b")])
        limited = redis.Redis(port=redis_server.port, username="lim", password="lim-pw-1234")
        url = f"redis://lim:lim-pw-1234@127.0.0.1:{redis_server.port}/0"
        with pytest.raises(PreflightError) as refused:
            worker(limited, redis_url=url).run(until_idle=True)
        message = str(refused.value)
        assert "'lim' may not run XADD on {incidents}:changes" in message
        assert "ACL SETUSER lim +xadd" in message
        assert real_redis.hlen(FP) == 0
        limited.close()
    finally:
        real_redis.execute_command("ACL", "DELUSER", "lim")


def test_a_user_refused_a_command_outside_the_functions_is_told_what_to_grant(
    real_redis: redis.Redis,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The snapshot path loads its copy with HSCAN, which a hand-written ACL may lack: Redis says only "this user has
    no permissions to run the 'hscan' command". The worker says which user, which command, and the grant; a user whose
    keys leave out the namespace is told the pattern it needs."""
    from worker.cli import main

    real_redis.execute_command(
        "ACL", "SETUSER", "lim", "reset", "on", ">lim-pw-1234", "~{incidents}:*", "+@all", "-hscan"
    )
    real_redis.execute_command("ACL", "SETUSER", "far", "reset", "on", ">far-pw-1234", "~{other}:*", "+@all")
    try:
        publish(real_redis, [{"incident_id": "a", "features": DOCK}])
        for name in ("lim", "far"):
            monkeypatch.setenv(
                "INCIDENT_WORKER_REDIS_URL", f"redis://{name}:{name}-pw-1234@127.0.0.1:{redis_server.port}/0"
            )
            assert main(["run", "--until-idle", "--read-path", "snapshot", "--log-format", "json"]) == 1
        shown = capsys.readouterr().err
        assert "refused user 'lim' the command HSCAN (no permission): grant it (ACL SETUSER lim +hscan)" in shown, shown
        assert "refused user 'far' a key" in shown and "ACL SETUSER far ~{incidents}:*" in shown, shown
        assert "pw-1234" not in shown
    finally:
        real_redis.execute_command("ACL", "DELUSER", "lim", "far")
