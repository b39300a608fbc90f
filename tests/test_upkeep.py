"""Bounded streams, the upkeep lease and memory by part, on a real redis-server."""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.redis_server import RedisServer
from tests.streams import EVENTS, GROUP, clean_env, publish, run_in_process
from worker import library, upkeep
from worker.devtools.workload import Workload
from worker.errors import LayoutMismatchError
from worker.index import FingerprintIndex
from worker.library import FN_LEASE
from worker.settings import Settings, parse_duration, parse_size
from worker.stream import StreamWorker


@pytest.fixture(autouse=True)
def _no_worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("INCIDENT_WORKER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    real = redis_server.client()
    real.flushall()
    real.function_flush()
    library.load(real)  # as the deployment's administrator step does
    yield real
    real.close()


def _ids(client: Any, stream: str = EVENTS) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(stream)]


def _key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _needed(client: Any, group: str, ids: list[str]) -> set[str]:
    """Brute force: the entries a group has not acknowledged, or not been given yet."""
    info = {g["name"].decode(): g for g in client.xinfo_groups(EVENTS)}[group]
    last = _key(info["last-delivered-id"].decode())
    pending = {row["message_id"].decode() for row in client.xpending_range(EVENTS, group, "-", "+", 100_000)}
    return pending | {i for i in ids if _key(i) > last}


def test_durations() -> None:
    assert parse_duration("30d") == 30 * 86_400_000
    assert parse_duration("1.5h") == 5_400_000
    assert parse_duration("500ms") == 500
    assert parse_duration("off") == parse_duration("0") == 0
    for bad in ("30", "d", "-1s", "3 fortnights", "0.0001ms"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    assert Settings(changes_keep="2H").changes_keep_ms == 7_200_000


@given(
    st.integers(0, 700),
    st.integers(0, 700),
    st.integers(0, 700),
    st.integers(0, 700),
    st.booleans(),
)
@hsettings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_trim_never_removes_an_entry_a_group_still_needs(
    client: redis.Redis, read_own: int, ack_own: int, read_other: int, ack_other: int, other: bool
) -> None:
    client.flushall()
    ids = publish(client, [{"incident_id": str(n), "features": "{}"} for n in range(700)])
    index = FingerprintIndex(client)
    client.xgroup_create(EVENTS, GROUP, id="0")
    groups = [(GROUP, read_own, ack_own)] + ([("audit", read_other, ack_other)] if other else [])
    for name, read, ack in groups:
        if name != GROUP:
            client.xgroup_create(EVENTS, name, id="0")
        if read:
            got = client.xreadgroup(name, "c", {EVENTS: ">"}, count=read)[0][1]
            acked = [entry_id for entry_id, _ in got][: min(ack, read)]
            if acked:
                client.xack(EVENTS, name, *acked)
    needed = set().union(*(_needed(client, name, ids) for name, _, _ in groups))
    result = upkeep.trim_events(index, EVENTS, GROUP, 0, 100_000)
    left = set(_ids(client))
    assert needed <= left, "an entry a group still needs was trimmed"
    assert len(ids) - len(left) == result.removed
    # approximate trimming removes whole nodes of 100 entries: at most one node's worth below the bound stays
    below = [i for i in ids if i not in needed and _key(i) < min((_key(n) for n in needed), default=(1 << 62, 0))]
    assert len([i for i in below if i in left]) < 100


def test_a_group_that_stopped_reading_holds_the_stream_until_it_is_past_the_max_age(client: redis.Redis) -> None:
    ids = publish(client, [{"incident_id": str(n), "features": "{}"} for n in range(500)])
    index = FingerprintIndex(client)
    client.xgroup_create(EVENTS, GROUP, id="$")  # the workers have read everything
    client.xgroup_create(EVENTS, "audit", id="0")  # a reader that never came back
    kept = upkeep.trim_events(index, EVENTS, GROUP, 0, 100_000)
    assert kept.removed == 0 and _ids(client) == ids
    [audit] = [g for g in upkeep.group_positions(client, EVENTS, GROUP, 0) if g.name == "audit"]
    assert audit.position == "0-1" and not audit.ignored
    time.sleep(0.05)
    [audit] = [g for g in upkeep.group_positions(client, EVENTS, GROUP, 10) if g.name == "audit"]
    assert audit.ignored and audit.age_ms >= 50, "stats and check would not show the group as past its max age"
    trimmed = upkeep.trim_events(index, EVENTS, GROUP, 10, 100_000)
    assert {g.name: g.ignored for g in trimmed.groups} == {GROUP: False, "audit": True}
    assert trimmed.removed >= 400 and client.xlen(EVENTS) < 100


def test_the_workers_own_group_is_never_ignored(client: redis.Redis) -> None:
    ids = publish(client, [{"incident_id": str(n), "features": "{}"} for n in range(300)])
    client.xgroup_create(EVENTS, GROUP, id="0")  # workers down: nothing read yet
    time.sleep(0.05)
    result = upkeep.trim_events(FingerprintIndex(client), EVENTS, GROUP, 1, 100_000)
    assert result.removed == 0 and _ids(client) == ids


def test_a_stream_without_groups_is_not_trimmed(client: redis.Redis) -> None:
    ids = publish(client, [{"incident_id": str(n), "features": "{}"} for n in range(300)])
    assert upkeep.trim_events(FingerprintIndex(client), EVENTS, GROUP, 0, 100_000).bound is None
    assert _ids(client) == ids


def test_one_worker_holds_the_lease_until_it_lets_go_or_dies(client: redis.Redis) -> None:
    index = FingerprintIndex(client)
    key = index.keys.lease("upkeep")
    assert index.call(FN_LEASE, [key], ["a", 200]) == 1
    assert index.call(FN_LEASE, [key], ["b", 200]) == 0
    assert index.call(FN_LEASE, [key], ["a", 200]) == 1, "the holder renews"
    assert 0 < client.pttl(key) <= 200
    time.sleep(0.3)  # a dies without letting go
    assert index.call(FN_LEASE, [key], ["b", 200]) == 1
    assert index.call(FN_LEASE, [key], ["a", 0]) == 0 and client.get(key) == b"b", "only the holder lets go"
    assert index.call(FN_LEASE, [key], ["b", 0]) == 0 and not client.exists(key)


def _settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"consumer": "w1", "block_ms": 50, "claim_interval_ms": 100, "summary_interval_s": 60}
    values.update(overrides)
    return Settings(**values)


def test_workers_trim_the_events_stream_and_the_change_log(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "UPKEEP_INTERVAL_S", 0.0)
    monkeypatch.setattr(upkeep, "TRIM_INTERVAL_S", 0.0)
    publish(client, [{"incident_id": i, "features": bag} for i, bag in Workload(seed=3).take(1500)])
    first = StreamWorker(client, _settings(consumer="w1", changes_keep="off"))
    second = StreamWorker(client, _settings(consumer="w2", changes_keep="off"))
    first.run(until_idle=True)
    assert client.hlen("{incidents}:fp") == 1500
    first.upkeep.tick()  # the first worker released its lease when it stopped
    assert client.xlen(EVENTS) < 200, "the processed events were not trimmed"
    assert client.xlen("{incidents}:changes") == 1500, "changes_keep=off keeps the whole change log"
    second.upkeep.tick()
    assert first.upkeep.holding and not second.upkeep.holding, "two workers held the upkeep lease at once"
    first.upkeep.release()
    second.upkeep.tick()
    first.upkeep.tick()
    assert second.upkeep.holding and not first.upkeep.holding
    second.settings = _settings(consumer="w2", changes_keep="1ms")
    time.sleep(0.01)
    second.upkeep.settings = second.settings
    second.upkeep.tick()
    assert client.xlen("{incidents}:changes") < 200


def test_memory_by_part_adds_up(client: redis.Redis) -> None:
    index = FingerprintIndex(client)
    rng = random.Random(1)
    index.bulk_load((f"i{n}", rng.getrandbits(64)) for n in range(3000))
    parts = upkeep.memory_by_part(index, {"events": EVENTS})
    assert parts["postings_sampled_incidents"] == upkeep.MEMORY_SAMPLE
    assert parts["fingerprints"] > 3000 * 30 and parts["postings"] > 3000 * 8
    assert parts["index"] == parts["fingerprints"] + parts["postings"]
    used = int(client.info("memory")["used_memory"])
    assert parts["index"] + parts["changes"] < used
    exact = sum(int(client.memory_usage(k)) for k in client.scan_iter(match="{incidents}:band:*", count=1000))
    assert abs(parts["postings"] - exact) < 0.15 * exact, "the sampled estimate of the postings is off"
    assert parts["index_per_incident"] == round(parts["index"] / 3000, 1)


def _cli(server: RedisServer, *args: str, **settings: Any) -> subprocess.CompletedProcess[str]:
    """`incident-worker ARGS`, by its entry point in this process (tests/streams.py's `run_in_process`)."""
    done = run_in_process(args, clean_env(redis_url=server.url, **settings))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_stats_and_check_show_memory_by_part_groups_and_warnings(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    publish(client, [{"incident_id": i, "features": bag} for i, bag in Workload(seed=5).take(300)])
    client.xgroup_create(EVENTS, "audit", id="0")  # a reader that never read
    assert _cli(redis_server, "run", "--until-idle", consumer="w1", block_ms=100).returncode == 0
    assert client.xlen(EVENTS) == 300, "the workers trimmed entries another group has not read"
    time.sleep(0.05)
    stats = json.loads(_cli(redis_server, "stats", "--json", stream_group_max_age="10ms").stdout)
    assert stats["memory"]["index"] > 300 * 72 and stats["memory"]["index_per_incident"] > 72
    assert set(stats["memory"]["streams"]) == {"events", "alerts", "dead"}
    groups = {g["name"]: g for g in stats["event_groups"]}
    assert groups["audit"]["ignored_for_trimming"] and not groups[GROUP]["ignored_for_trimming"]
    assert any("'audit'" in w and "stream_group_max_age" in w for w in stats["warnings"])
    assert stats["lifecycle"]["changes_keep"] == "1d"
    human = _cli(redis_server, "stats", stream_group_max_age="10ms").stdout
    assert "by part" in human and "ignored (past stream_group_max_age)" in human and "WARNING" in human

    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(int(used * 1.15)))  # 87% used: past the 80% that warns
    try:
        check = _cli(redis_server, "check", "--redis-only")
        full = _cli(redis_server, "check", "--json", "--capacity")
    finally:
        client.config_set("maxmemory", "0")
    assert check.returncode == 0
    warnings = json.loads(full.stdout)["warnings"]
    assert any("of maxmemory" in w for w in warnings), warnings
    ignored = _cli(redis_server, "check", stream_group_max_age="10ms")
    assert ignored.returncode == 1 and "warning: consumer group 'audit'" in ignored.stderr  # no worker runs now


# -- the memory budgets of the alerts and dead-letter streams ----------------------------------------------------


def test_sizes() -> None:
    assert parse_size("256mb") == 256 * 1024**2
    assert parse_size("64KB") == 65_536 and parse_size("1.5gb") == int(1.5 * 1024**3) and parse_size("4096") == 4096
    assert parse_size("off") == parse_size("0") == 0
    for bad in ("mb", "-1mb", "3 parsecs", "12tb", "0.1b"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    settings = Settings(alerts_max_memory="1MB", dead_max_memory="off")
    assert settings.alerts_max_memory_bytes == 1024**2 and settings.dead_max_memory_bytes == 0
    defaults = Settings()
    assert defaults.alerts_maxlen == 100_000 and defaults.alerts_max_memory_bytes == 256 * 1024**2
    assert defaults.dead_max_memory_bytes == 128 * 1024**2


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))


def test_a_storm_of_alerts_is_trimmed_to_the_memory_budget_oldest_first(client: redis.Redis) -> None:
    """Storm-sized alerts (100 matches, ~5.6 KB) after small ones: the budget holds within a node, the newest stay."""
    index = FingerprintIndex(client)
    alerts, dead = "{incidents}:alerts", "{incidents}:dead"
    matches = json.dumps([{"incident_id": f"storm-{n:06d}", "distance": 0} for n in range(100)])
    pipe = client.pipeline(transaction=False)
    for n in range(40_000):  # an everyday alert: one match
        one = json.dumps([{"incident_id": f"inc-{n - 1}", "distance": 3}])
        small_alert = {"incident_id": f"inc-{n}", "fingerprint": f"{n:016x}", "matches": one, "match_count": 1}
        pipe.xadd(alerts, {**small_alert, "max_distance": 7, "source_entry": f"1796306343015-{n}", "op": "add"})
    pipe.execute()
    small = int(client.memory_usage(alerts, samples=0))
    for n in range(1500):
        pipe.xadd(alerts, {"incident_id": f"storm-{n}", "matches": matches, "match_count": 100 + n})
    for _ in range(200):
        pipe.xadd(dead, {"reason": "too_large", "original.features": "x" * 20_000})
    pipe.execute()
    storm_alert = (int(client.memory_usage(alerts, samples=0)) - small) / 1500
    assert int(client.memory_usage(alerts)) < 0.95 * int(client.memory_usage(alerts, samples=0)), (
        "Redis's default sampling reads the oldest nodes only: it underestimates the storm's larger alerts"
    )
    newest = client.xrevrange(alerts, count=1)[0][0]
    budget = 8 * 1024**2
    settings = _settings(alerts_max_memory="8mb", dead_max_memory="1mb")
    job = upkeep.Upkeep(index, settings, _Log())
    for _ in range(2):  # the oldest alerts, cut first, are the small ones: each later cut learns what one frees
        job.trim_memory()  # measured over every node: Redis's default sample would see only the small alerts
    used = int(client.memory_usage(alerts, samples=0))
    assert budget * 0.8 < used <= budget + 2 * 6000, f"alerts take {used:,} bytes for a budget of {budget:,}"
    assert client.xrevrange(alerts, count=1)[0][0] == newest, "the newest alert was trimmed"
    assert int(client.memory_usage(dead, samples=0)) <= 1024**2 + 25_000
    assert client.xlen(dead) < 200
    removed = [fields for level, event, fields in job.log.lines if "over its memory budget" in event]
    assert any(f["stream"] == dead for f in removed) and any(f["stream"] == alerts for f in removed)
    assert all(level == "warning" for level, event, f in job.log.lines if f.get("stream") == dead)
    assert 5000 < storm_alert < 7000, f"a storm alert takes {storm_alert:.0f} bytes of Redis memory"


def test_the_alerts_consumer_groups_are_listed_each_pass_only_while_the_stream_is_over_its_budget(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XINFO GROUPS returns every group's name, which a subscriber chooses (100 groups of 1.9 MB names: 190 MB a
    reply, every 2 s). Within the budget the upkeep lists the groups once a GROUPS_INTERVAL_S; over it, every pass
    (their pending lists are left out of the budget)."""
    alerts = "{incidents}:alerts"
    for n in range(300):
        client.xadd(alerts, {"incident_id": f"i{n}", "matches": "x" * 200})
    client.xgroup_create(alerts, "team", id="0")
    listed: list[str] = []
    real = upkeep.pending_by_group
    monkeypatch.setattr(upkeep, "pending_by_group", lambda c, stream: listed.append(stream) or real(c, stream))
    job = upkeep.Upkeep(FingerprintIndex(client), _settings(alerts_max_memory="1mb", dead_max_memory="off"), _Log())
    for _ in range(5):
        job.trim_memory()
    assert listed == [alerts], "within the budget: listed once"
    for n in range(6000):
        client.xadd(alerts, {"incident_id": f"j{n}", "matches": "x" * 200})
    # (no trim, so that the stream stays over its budget)
    monkeypatch.setattr(upkeep, "trim_to_memory", lambda *a, **k: upkeep.MemoryTrim(k["measured"], 0, 0))
    for _ in range(3):
        job.trim_memory()
    assert listed == [alerts] * 4, "over the budget: listed each pass"
    monkeypatch.setattr(upkeep, "GROUPS_INTERVAL_S", 0.0)
    job.trim_memory()
    assert len(listed) == 5


def test_workers_keep_the_alerts_of_a_storm_within_budget(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep, "UPKEEP_INTERVAL_S", 0.0)
    monkeypatch.setattr(upkeep, "MEMORY_INTERVAL_S", 0.0)
    bag = {"disk": 3, "full": 2, "db-7": 1}
    publish(client, [{"incident_id": f"s{n}", "features": bag} for n in range(400)])
    worker = StreamWorker(client, _settings(alerts_max_memory="512kb", batch_size=20))
    worker.run(until_idle=True)
    assert client.hlen("{incidents}:fp") == 400
    used = int(client.memory_usage("{incidents}:alerts", samples=0))
    assert used <= 512 * 1024 + 2 * 6000, f"the alerts take {used:,} bytes for a budget of 512 KiB"
    newest = client.xrevrange("{incidents}:alerts", count=1)[0][1]
    assert newest[b"incident_id"] == b"s399" and newest[b"match_count"] == b"399"


def test_a_worker_refused_memory_usage_keeps_the_length_caps_and_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import fakeredis

    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer(version=7))
    library.load(fake)
    fake.xadd("{incidents}:alerts", {"incident_id": "1"})
    job = upkeep.Upkeep(FingerprintIndex(fake), _settings(), _Log())
    job.trim_memory()
    job.trim_memory()
    warned = [fields for level, event, fields in job.log.lines if "cannot measure" in event]
    assert len(warned) == 2 and {f["stream"] for f in warned} == {"{incidents}:alerts", "{incidents}:dead"}
    # fakeredis has no MEMORY command at all: no user to grant it to (a refusal by ACL: tests/test_deploy.py)
    assert all("no MEMORY USAGE command" in f["hint"] and "+memory" not in f["hint"] for f in warned)
    assert {f["hint"].split(":")[1].split("=")[0].strip().split()[-1] for f in warned} == {
        "alerts_max_memory",
        "dead_max_memory",
    }
    assert fake.xlen("{incidents}:alerts") == 1


def test_a_worker_user_refused_memory_usage_is_told_what_to_grant(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    client.acl_setuser("nomemory", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-memory"])
    try:
        with redis.Redis(port=redis_server.port, username="nomemory", password="pw") as user:
            user.xadd("{incidents}:alerts", {"incident_id": "1"})
            job = upkeep.Upkeep(FingerprintIndex(user), _settings(), _Log())
            job.trim_memory()
        warned = [fields for level, event, fields in job.log.lines if "cannot measure" in event]
        assert len(warned) == 2 and all("+memory|usage" in f["hint"] for f in warned)
    finally:
        client.acl_deluser("nomemory")


def test_retention_and_trimming_free_a_full_redis_by_themselves(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis at maxmemory (noeviction) with expired incidents and acknowledged events: the upkeep frees the memory
    (its calls free more than they take) and the worker goes on, with nobody raising maxmemory."""
    import threading

    # No upkeep while the old incidents are indexed: on a busy machine that took longer than the window, and the first
    # ones expired before the last was in.
    monkeypatch.setattr(upkeep, "UPKEEP_INTERVAL_S", 1e9)
    old = [{"incident_id": f"old{i}", "features": bag} for i, bag in Workload(seed=5).take(3000)]
    publish(client, old)
    StreamWorker(client, _settings(retention="1s", reconnect_max_backoff_s=0.2)).run(until_idle=True)
    assert client.hlen("{incidents}:fp") == 3000
    monkeypatch.setattr(upkeep, "UPKEEP_INTERVAL_S", 0.0)
    monkeypatch.setattr(upkeep, "TRIM_INTERVAL_S", 0.0)
    time.sleep(1.2)  # every incident is past the window
    new = [{"incident_id": f"new{i}", "features": bag} for i, bag in Workload(seed=6).take(50)]
    publish(client, new)
    # a consumer gone for good (nothing pending): removing it frees memory too, and must not stop the worker first
    import worker.recovery

    monkeypatch.setattr(worker.recovery, "DEAD_CONSUMER_IDLE_MS", -1)
    client.xgroup_createconsumer(EVENTS, GROUP, "gone")
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) - 20_000))
    worker = StreamWorker(client, _settings(retention="1s", reconnect_max_backoff_s=0.2))
    runner = threading.Thread(target=worker.run, kwargs={"until_idle": True}, daemon=True)
    try:
        runner.start()
        runner.join(30)
        stuck = runner.is_alive()
        worker.stop()
        runner.join(10)
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", policy)
    assert not stuck, "the worker waited for memory that its own upkeep could free"
    stored = {k.decode() for k in client.hkeys("{incidents}:fp")}
    assert {e["incident_id"] for e in new} <= stored


def test_entry_ids_past_a_lua_number_are_trimmed_exactly(client: redis.Redis) -> None:
    """Producers may give their own entry IDs, up to 2**64 - 1 in each part: the group's position is computed exactly
    (a Lua number holds 53 bits), so no undelivered entry goes and a sequence at its largest is no error."""
    big = 2**53 + 3  # the nearest Lua number is 2**53 + 4
    ids = [client.xadd(EVENTS, {"n": str(seq)}, id=f"{big}-{seq}").decode() for seq in range(150)]
    client.xgroup_create(EVENTS, GROUP, id=f"{big}-5")  # delivered and acknowledged up to seq 5
    index = FingerprintIndex(client)
    upkeep.trim_events(index, EVENTS, GROUP, 0, 100_000)
    assert _ids(client)[-144:] == ids[6:], "undelivered entries were trimmed"
    last = f"{2**53 + 9}-{2**64 - 1}"
    client.xadd(EVENTS, {"n": "last"}, id=last)
    client.xgroup_setid(EVENTS, GROUP, id=last)  # everything delivered, the last one at the largest sequence
    result = upkeep.trim_events(index, EVENTS, GROUP, 0, 100_000)
    assert result.bound == f"{2**53 + 10}-0"  # the first ID after it; everything below was delivered and acknowledged
    [position] = upkeep.group_positions(client, EVENTS, GROUP, 0)  # what stats and check show
    assert position.position == result.bound


def test_a_trim_after_redis_lost_the_index_does_not_stop_the_next_start(client: redis.Redis) -> None:
    """A restart without persistence under a running worker: its upkeep's next trim of the change log wrote
    `changes_trimmed_to` into an absent `{N}:meta`, and every start after that stopped (exit 2) on "exists but is not
    the meta of an incident index". The trim now leaves an absent meta absent, and a meta holding only that field
    (an earlier version's) is opened as the index's."""
    index = FingerprintIndex(client)
    index.add("47", {"dock": 3, "scanner": 2, "timeout": 1})
    client.flushall()  # the restart; the functions stay loaded, as an administrator's deployment step loads them
    assert upkeep.trim_changes(index, keep_ms=1) == 0
    assert not client.exists(index.keys.meta)
    client.hset(index.keys.meta, "changes_trimmed_to", "1-0")  # what an earlier version's trim left
    again = FingerprintIndex(client)
    assert again.add("90", {"dock": 3, "scanner": 2, "timeout": 1}) == []
    assert client.hget(index.keys.meta, "layout") == index.layout_tag.encode()
    client.delete(index.keys.meta)
    client.hset(index.keys.meta, mapping={"changes_trimmed_to": "1-0", "owner": "someone else"})
    with pytest.raises(LayoutMismatchError, match="not the meta of an incident index"):
        FingerprintIndex(client).open()
