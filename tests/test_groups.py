"""Groups (docs/contract.md, "Groups"): the group of every incident equals a brute-force reference (tests/oracle.py's
GroupOracle: stream order, the closest earlier match, its tie rule, merges), on both read paths, with upserts,
deletes, merges and expiry; and what the index stores for them is exactly what the contract says."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from tests.oracle import GroupOracle, clustered, flip
from worker.index import FingerprintIndex, Group
from worker.library import SnapshotClaim, apply_batch, parse_apply
from worker.readpath import ChangeFollower
from worker.transport import execute


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _assert_groups(index: FingerprintIndex, oracle: GroupOracle) -> None:
    """Every incident's group and size as the oracle's, and the stored group state exactly the oracle's."""
    ids = sorted(oracle.fps)
    found = index.groups_of(ids)
    assert {i: (g.label, g.size) if g else None for i, g in found.items()} == oracle.groups()
    entries, sizes = oracle.stored()
    client = index.redis
    assert {_text(k): _text(v) for k, v in client.hgetall(index.keys.groups).items()} == entries
    assert {_text(k): int(v) for k, v in client.hgetall(index.keys.group_sizes).items()} == sizes
    # the most recently joined groups are live groups of more than one
    active = {_text(m) for m in client.zrange(index.keys.group_active, 0, -1)}
    assert active <= set(sizes)
    for label in {g for g, _ in oracle.groups().values()}:
        assert index.group_members(label) == sorted(i for i in oracle.fps if oracle.group(i) == label)


def _claim(follower: ChangeFollower, fp: int, exclude: str, cap: int) -> SnapshotClaim:
    result = follower.index.search(fp, exclude=exclude, limit=cap)
    return SnapshotClaim(
        follower.index.position, result.match_count, result.matches, len(result.matches) == result.match_count
    )


_OP = st.tuples(
    st.sampled_from(["add", "add", "add", "upsert", "delete", "merge"]),
    st.integers(0, 24),
    st.integers(0, 11),
    st.integers(0, 24),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), ops=st.lists(_OP, max_size=60), cap=st.sampled_from([0, 1, 3]), path=st.booleans())
def test_every_incident_is_in_the_group_the_reference_gives(redis_client, seed, ops, cap, path) -> None:
    """Adds, upserts, deletes and merges in any order, on the primary read path or the snapshot path (a copy that
    lags a few changes, validated by the atomic step): after each, every incident's group is the reference's, and
    {N}:group and {N}:groupsize hold exactly what the contract says (nothing for an incident alone in the group it
    opened). A cap on the matches listed does not change the group: the closest match is always listed."""
    redis_client.flushall()
    rng = random.Random(seed)
    pool = clustered(rng, 12, 7, centers=3)
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=7)
    index.open()
    oracle = GroupOracle(7)
    follower = ChangeFollower(redis_client, index.keys, index.layout) if path else None
    if follower is not None:
        follower.load()
    for step, (kind, n, which, other) in enumerate(ops):
        incident_id = f"i{n}"
        if kind == "merge":
            if oracle.fps:
                a, b = oracle.group(rng.choice(sorted(oracle.fps))), f"i{other}"
                b = oracle.group(b) if b in oracle.fps else b
                if oracle.merge(a, b):
                    index.merge_groups(a, b)
                else:
                    with pytest.raises(ResponseError, match="NOGROUP"):
                        index.merge_groups(a, b)
            continue
        fp = flip(pool[which], rng.randint(0, 2), rng)
        if kind == "delete":
            assert index.delete(incident_id) == oracle.delete(incident_id)
        elif follower is None or (kind == "add" and incident_id in oracle.fps):
            if kind == "add":
                result = oracle.add(incident_id, fp)
                if result != "duplicate":
                    found = index.add_fingerprint(incident_id, fp, max_matches=cap)
                    assert found == (result[:cap] if cap else result)
                    # the reply carries the group the step decided (a repeat's as it stands), as the alert does
                    assert found.group == Group(*oracle.groups()[incident_id])
            else:
                found = index.upsert_fingerprint(incident_id, fp, max_matches=cap)
                oracle.upsert(incident_id, fp)
                assert found.group == Group(*oracle.groups()[incident_id])
        else:
            if step % 3 == 0:
                follower.catch_up()  # otherwise the copy lags: the atomic step validates it against the log
            stored = index.get(incident_id)
            if stored == fp:
                continue
            claim = _claim(follower, fp, incident_id, cap)
            expected = "*" if kind == "add" else stored
            command = index.apply_command(kind, incident_id, fp, expected=expected, max_matches=cap, snapshot=claim)
            [reply] = index.execute([command])
            result = parse_apply(reply)
            if result.status == "unvalidated":
                [reply] = index.execute(
                    [index.apply_command(kind, incident_id, fp, expected=expected, max_matches=cap)]
                )
                result = parse_apply(reply)
            assert result.status == "indexed"
            expect = oracle.add(incident_id, fp) if kind == "add" else oracle.upsert(incident_id, fp)
            assert result.match_count == len(expect)
            assert (result.group_id, result.group_size) == oracle.groups()[incident_id]
        _assert_groups(index, oracle)
    _assert_groups(index, oracle)


def test_one_batch_keeps_the_active_groups_of_every_join_after_a_group_ends(redis_client) -> None:
    """The calls of one apply_batch share their group keys, resolved labels and the labels they scored in
    {N}:groupactive: a group joined, back to its opener alone (taken out of the active groups) and joined again in
    the same batch is active again at the end, and every incident's group is the reference's."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=7)
    index.open()
    oracle = GroupOracle(7)
    fp = 0x0F0F_0000_FFFF_1234
    for incident_id, bits in (("a", 0), ("b", 1)):
        index.add_fingerprint(incident_id, fp ^ bits)
        oracle.add(incident_id, fp ^ bits)
    commands = []
    for op, incident_id, bits in (("add", "c", 2), ("delete", "b", None), ("delete", "c", None), ("add", "d", 4)):
        if op == "add":
            commands.append(index.apply_command("add", incident_id, fp ^ bits))
            oracle.add(incident_id, fp ^ bits)
        else:
            commands.append(index.apply_command("delete", incident_id, None))
            oracle.delete(incident_id)
    replies = [parse_apply(reply) for reply in execute(redis_client, [apply_batch(commands)])[0]]
    assert [r.status for r in replies] == ["indexed", "deleted", "deleted", "indexed"]
    assert (replies[-1].group_id, replies[-1].group_size) == ("a", 2)
    _assert_groups(index, oracle)
    assert [_text(m) for m in redis_client.zrange(index.keys.group_active, 0, -1)] == ["a"]


def test_a_batch_joins_a_group_again_after_the_trim_its_own_join_set_off(redis_client) -> None:
    """A join whose ZADD trims {N}:groupactive may trim its own label (its score the lowest: a server clock stepped
    back behind the scores kept, or labels that tie at one batch's time); the batch's next join of that group must
    add it again, as a call of its own would."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=7)
    index.open()
    fp = 0x0F0F_0000_FFFF_1234
    index.add_fingerprint("a", fp)
    # 1,100 groups last joined later than the server's clock now says (kept: the trim starts at 1,100 + 1)
    redis_client.zadd(index.keys.group_active, {f"z{k:05d}": 9e15 for k in range(1100)})
    commands = [index.apply_command("add", "c", fp ^ 1), index.apply_command("add", "d", fp ^ 2)]
    replies = [parse_apply(reply) for reply in execute(redis_client, [apply_batch(commands)])[0]]
    assert [(r.group_id, r.group_size) for r in replies] == [("a", 2), ("a", 3)]
    assert redis_client.zscore(index.keys.group_active, "a") is not None


def test_a_group_keeps_its_label_when_its_opener_leaves_and_ends_with_its_last_member(redis_client) -> None:
    """The opener's ID stays the label; a new incident with that ID opens a group of its own under another label
    (the old one is live); the last member leaving ends the group: nothing of it is left in Redis."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=7)
    index.open()
    base = 0x0123456789ABCDEF
    index.add_fingerprint("a", base)
    assert index.group_of("a") == Group("a", 1)
    assert redis_client.hlen(index.keys.groups) == 0 and redis_client.hlen(index.keys.group_sizes) == 0
    index.add_fingerprint("b", base ^ 0b11)
    index.add_fingerprint("c", base ^ 0b1)
    assert index.group_of("c") == Group("a", 3)
    index.delete("a")
    assert index.groups_of(["a", "b", "c"]) == {"a": None, "b": Group("a", 2), "c": Group("a", 2)}
    index.add_fingerprint("a", ~base & (2**64 - 1))  # far from both: opens a group, but the label a is taken
    assert index.group_of("a") == Group("a#1", 1)
    index.delete("b")
    index.delete("c")
    index.delete("a")
    for key in (index.keys.groups, index.keys.group_sizes, index.keys.group_active):
        assert redis_client.exists(key) == 0


@pytest.mark.parametrize("opener", ["a", "é" * 250])
def test_incidents_named_like_the_next_labels_cannot_make_one_event_walk_them_all(redis_client, opener) -> None:
    """A producer that indexes `a#1` ... `a#40` ahead makes the next group opened under `a` meet those numbers in use:
    after 8 of them the label is the next number padded with zeros past any ID's 256 characters (counted as
    characters, not bytes), so one event reads 9 numbers, not 41; the oracle gives the same labels."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=7)
    index.open()
    oracle = GroupOracle(7)
    rng = random.Random(5)
    base = 0x0123456789ABCDEF

    def add(incident_id: str, fp: int) -> None:
        index.add_fingerprint(incident_id, fp)
        oracle.add(incident_id, fp)

    add(opener, base)
    add("b", base ^ 0b11)  # keeps the group `opener` live once its opener leaves
    for n in range(1, 41):
        add(f"{opener}#{n}", rng.getrandbits(64))
    index.delete(opener)
    oracle.delete(opener)
    add(opener, ~base & (2**64 - 1))  # far from everything: it opens a group, and its own ID names a live one
    label = index.group_of(opener).label
    assert label == opener + "#" + "9".zfill(256 - len(opener))
    assert len(label) == 257
    assert int(redis_client.hget(index.keys.meta, "group_seq")) == 9
    add(f"{opener}x", ~base & (2**64 - 1))  # a twin joins it
    assert index.group_of(f"{opener}x") == Group(label, 2)
    _assert_groups(index, oracle)


def test_a_merge_folds_one_group_into_the_other_for_later_incidents_too(redis_client) -> None:
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "g", bands=4, max_distance=3)
    index.open()
    x, y = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    index.add_fingerprint("x1", x)
    index.add_fingerprint("x2", x ^ 1)
    index.add_fingerprint("y1", y)
    assert index.merge_groups("x1", "y1") == (Group("x1", 3), Group("y1", 1))
    assert index.group_of("y1") == Group("x1", 3)
    index.add_fingerprint("y2", y ^ 1)  # its closest match is in the group merged away: it joins the survivor
    assert index.group_of("y2") == Group("x1", 4)
    assert index.group_members("y1") == ["x1", "x2", "y1", "y2"]
    with pytest.raises(ResponseError, match="NOGROUP"):
        index.merge_groups("x1", "nobody")


# -- through the stream ---------------------------------------------------------------------------------------------

from tests.conftest import fast_settings  # noqa: E402
from tests.streams import alerts, publish  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.stream import StreamWorker  # noqa: E402


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a redis_client that decodes replies


def _bag(rng: random.Random, base: list[str]) -> dict[str, int]:
    """`base`'s tokens with one or two swapped for others: near the other variants of `base`, far from other bases."""
    tokens = list(base)
    for _ in range(rng.randint(0, 2)):
        tokens[rng.randrange(len(tokens))] = f"t{rng.randrange(1000)}"
    return {t: 1 + k % 3 for k, t in enumerate(tokens)}


@pytest.mark.usefixtures("no_worker_env")
@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
@pytest.mark.parametrize("seed", [1, 2])
def test_alerts_carry_the_group_the_reference_gives_in_stream_order(redis_client, read_path, seed) -> None:
    """A worker reading a stream of adds, upserts and deletes, with GROUP_OPEN_ALERTS: every indexed event has an
    alert, with the group and size the reference gives at that point of the stream (an opener's: match_count 0,
    opens_group); ALERT_EVENT_FIELDS copies the named fields, cut to their bound."""
    rng = random.Random(seed)
    bases = [[f"b{b}w{k}" for k in range(24)] for b in range(6)]
    events: list[dict] = []
    bags: dict[str, dict[str, int]] = {}
    for n in range(160):
        incident_id = f"i{rng.randrange(60)}"
        kind = rng.choice(["add", "add", "add", "upsert", "delete"])
        if kind == "delete":
            events.append({"incident_id": incident_id, "op": "delete"})
            continue
        bag = _bag(rng, rng.choice(bases))
        bags[f"{n}"] = bag
        events.append({"incident_id": incident_id, "op": kind, "features": bag, "service": f"s{n}", "title": "x" * 300})
    publish(redis_client, events)
    worker = StreamWorker(
        redis_client,
        fast_settings(
            read_path=read_path, group_open_alerts=True, alert_event_fields="service,title", snapshot_min_incidents=0
        ),
    )
    worker.run(until_idle=True)
    assert (worker.processor.snapshot is not None) == (read_path == "snapshot")

    oracle = GroupOracle(7)
    expected = []
    for event in events:
        incident_id, op = event["incident_id"], event["op"]
        if op == "delete":
            oracle.delete(incident_id)
            continue
        fp = fingerprint(event["features"])
        if oracle.fps.get(incident_id) == fp or (op == "add" and incident_id in oracle.fps):
            continue  # a repeat, or a duplicate add (dead-lettered): no alert
        matches = oracle.add(incident_id, fp) if op == "add" else oracle.upsert(incident_id, fp)
        label = oracle.group(incident_id)
        expected.append((incident_id, len(matches), label, oracle.size(label), not matches, event["service"]))
    got = [
        (a.incident_id, a.match_count, a.group_id, a.group_size, a.opens_group, a.event_fields["service"])
        for a in alerts(redis_client)
    ]
    assert got == expected
    assert {len(a.event_fields["title"]) for a in alerts(redis_client)} == {256}
    assert any(not opens for *_, opens, _ in expected) and any(opens for *_, opens, _ in expected)
    index = FingerprintIndex(redis_client)
    assert {i: (g.label, g.size) if g else None for i, g in index.groups_of(sorted(oracle.fps)).items()} == (
        oracle.groups()
    )


def test_alerts_without_group_open_alerts_are_for_matches_only(redis_client) -> None:
    """Off by default: an incident that opens a group publishes nothing, as before groups."""
    redis_client.flushall()
    dock = {"dock": 3, "scanner": 2, "timeout": 1}
    publish(redis_client, [{"incident_id": "47", "features": dock}, {"incident_id": "90", "features": dock}])
    StreamWorker(redis_client, fast_settings()).run(until_idle=True)
    [alert] = alerts(redis_client)
    assert (alert.incident_id, alert.group_id, alert.group_size, alert.opens_group) == ("90", "47", 2, False)
    assert alert.event_fields == {}


def test_expiry_takes_incidents_out_of_their_groups(redis_client) -> None:
    """Retention expiring members: the group keeps its label without its opener, shrinks, and ends with its last."""
    from tests.test_retention import WINDOW_MS, _now, _wait_past_window
    from worker import retention

    redis_client.flushall()
    index = FingerprintIndex(redis_client, "r", bands=4, max_distance=7)
    index.open()
    retention.set_window(index, WINDOW_MS)
    oracle = GroupOracle(7)
    for incident_id, fp in (("a", 42), ("b", 42 ^ 1), ("lone", ~42 & (2**64 - 1))):
        index.add_fingerprint(incident_id, fp)
        oracle.add(incident_id, fp)
    _wait_past_window(redis_client, index, _now(redis_client))
    index.add_fingerprint("c", 42 ^ 3)  # joins a's group, a window younger
    oracle.add("c", 42 ^ 3)
    assert retention.expire_due(index).expired == 3
    for incident_id in ("a", "b", "lone"):
        oracle.delete(incident_id)
    assert index.group_of("c") == Group("a", 1)
    _assert_groups(index, oracle)
    index.delete("c")
    for key in (index.keys.groups, index.keys.group_sizes, index.keys.group_active):
        assert redis_client.exists(key) == 0


@pytest.mark.usefixtures("no_worker_env")
def test_metrics_count_groups_opened_joined_and_merged(redis_client) -> None:
    redis_client.flushall()
    dock, road = {"dock": 3, "scanner": 2, "timeout": 1}, {"weather": 4, "road": 2}
    publish(redis_client, [{"incident_id": i, "features": dock} for i in ("47", "90", "91")])
    publish(redis_client, [{"incident_id": "83", "features": road}])
    worker = StreamWorker(redis_client, fast_settings())
    worker.run(until_idle=True)
    FingerprintIndex(redis_client).merge_groups("47", "83")
    worker.presence.summary(None)
    registry = worker.metrics.registry
    assert registry.get_sample_value("incident_worker_groups_opened_total") == 2
    assert registry.get_sample_value("incident_worker_groups_joined_total") == 2
    assert registry.get_sample_value("incident_worker_group_merges_total") == 1


def _replayed(client, keys) -> GroupOracle:
    """The reference, fed the index's changes in the order the atomic steps made them ({N}:changes)."""
    oracle = GroupOracle(7)
    for _, fields in client.xrange(keys.changes):
        fields = {_text(k): _text(v) for k, v in fields.items()}
        op = next(name for name in fields if name not in ("fp", "prev"))
        incident_id, fp = fields[op], fields["fp"]
        if op in ("delete", "expire"):
            oracle.delete(incident_id)
        elif op == "add":
            oracle.add(incident_id, int(fp, 16))
        else:
            oracle.upsert(incident_id, int(fp, 16))
    return oracle


def test_two_workers_at_once_give_the_groups_of_the_order_they_indexed_in(real_redis) -> None:
    """Two workers, one on each read path, sharing a stream: the groups are those of the order in which the atomic
    steps ran (the change log's), whatever the interleaving; each alert carries its group as it stood then."""
    import threading

    real_redis.flushall()
    rng = random.Random(5)
    bases = [[f"b{b}w{k}" for k in range(24)] for b in range(5)]
    events = []
    for _ in range(400):
        incident_id = f"i{rng.randrange(150)}"
        kind = rng.choice(["add", "add", "add", "upsert", "delete"])
        if kind == "delete":
            events.append({"incident_id": incident_id, "op": "delete"})
        else:
            events.append({"incident_id": incident_id, "op": kind, "features": _bag(rng, rng.choice(bases))})
    publish(real_redis, events)
    workers = [
        StreamWorker(
            real_redis,
            fast_settings(
                consumer=f"w{k}", read_path=path, group_open_alerts=True, snapshot_min_incidents=0, batch_size=7
            ),
        )
        for k, path in enumerate(("primary", "snapshot"))
    ]
    for w in workers:  # (set up first, copy loaded: the snapshot worker's start-up, on a busy machine, had let the
        w.setup()  # other one take every event before its first read)
    threads = [threading.Thread(target=w.run, kwargs={"until_idle": True}) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(w.stats.processed for w in workers), "both workers took part"
    index = FingerprintIndex(real_redis)
    oracle = _replayed(real_redis, index.keys)
    _assert_groups(index, oracle)


@pytest.mark.parametrize(("to_bands", "to_r"), [(3, 7), (4, 9)])
def test_a_migration_carries_the_groups_and_later_incidents_join_by_the_same_rule(redis_client, to_bands, to_r) -> None:
    """Changes between every step of a move to another layout: the groups stay the reference's throughout (their
    keys belong to the namespace, not to a layout), and after the switch incidents join by the new max distance."""
    from tests.test_migrate import _random_ops
    from worker.bands import BandLayout
    from worker.keys import IndexKeys
    from worker.migrate import Migrator, migration_status

    redis_client.flushall()
    rng = random.Random(to_bands * 10 + to_r)
    index = FingerprintIndex(redis_client, "mig", 4, 7)
    oracle = GroupOracle(7)
    fake = "fake" in type(redis_client).__module__
    fps = clustered(rng, 80 if fake else 300, 7, centers=6)
    for i, fp in enumerate(fps):
        assert index.add_fingerprint(f"s{i}", fp) == oracle.add(f"s{i}", fp)
    centers = list(dict.fromkeys(oracle.fps.values()))[:6]
    migrator = Migrator(redis_client, "mig", batch=40)
    migrator._start(index, BandLayout(to_bands, to_r))
    steps = 0
    while (status := migration_status(redis_client, IndexKeys("mig"))) is not None:
        if status.state == "cleaning":
            oracle.max_distance = to_r
        _random_ops(index, oracle, rng, 3, centers)
        migrator.step()
        steps += 1
        assert steps < 500
    assert index.layout.max_distance == to_r
    _random_ops(index, oracle, rng, 20, centers)
    _assert_groups(index, oracle)


@pytest.mark.slow
@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_workers_sigkilled_mid_run_leave_every_group_as_the_reference_replayed(server, tmp_path, read_path) -> None:
    """Worker processes SIGKILLed at random moments mid-run and started again, beside a steady one, then a last one
    to finish: every incident's group (and the stored group state) equals the reference fed the change log's order,
    each alert's group is the reference's as of that incident's add, and every pair is reported exactly once."""
    from tests.streams import FAST, alerts, kill_once_indexed, start_worker
    from tests.test_worker_process import _check_run, _wait, _workload

    client = server.client()
    events, bad = _workload(2500, seed=24, bad_every=97)
    publish(client, events)
    rng = random.Random(24)
    env = {"read_path": read_path, "group_open_alerts": "true", **FAST}
    steady = start_worker(server.url, log=tmp_path / "steady.log", consumer="steady", batch_size=13, **env)
    kills = 0
    for round_, mark in enumerate(sorted(rng.sample(range(200, 2000), 3))):
        killed = start_worker(server.url, log=tmp_path / f"k{round_}.log", consumer="killed", batch_size=20, **env)
        kills += kill_once_indexed(client, killed, mark, rng)
    assert kills == 3
    final = start_worker(server.url, "--until-idle", log=tmp_path / "final.log", **env)
    assert _wait(final, 240) == 0
    steady.terminate()
    assert steady.wait(timeout=30) == 0
    if read_path == "snapshot":
        assert '"event": "snapshot loaded"' in (tmp_path / "steady.log").read_text()
    published = alerts(client)
    # the pair invariant, on the alerts with matches (GROUP_OPEN_ALERTS adds one without for each opener)
    _check_run(client, events, bad)
    index = FingerprintIndex(client)
    oracle = _replayed(client, index.keys)
    _assert_groups(index, oracle)
    from worker.integrity import Verifier

    assert Verifier(client, index.keys.namespace).run().counts == {}, "verify finds the groups whole too"
    # each alert's group as the reference had it right after that incident's add, in the change log's order
    replay, as_of = GroupOracle(7), {}
    for _, fields in client.xrange(index.keys.changes):
        fields = {_text(k): _text(v) for k, v in fields.items()}
        incident_id = fields["add"]
        replay.add(incident_id, int(fields["fp"], 16))
        label = replay.group(incident_id)
        as_of[incident_id] = (label, replay.size(label))
    assert len(published) == len(as_of), "one alert an indexed incident (opening a group or joining one)"
    assert {a.incident_id: (a.group_id, a.group_size) for a in published} == as_of
