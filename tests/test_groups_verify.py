"""`incident-worker verify` of group state (docs/contract.md, "Verifying and repairing the index"): group keys damaged
by hand in each way are named with their count, `--repair` fixes them, a second verify is clean, and the groups then
equal the reference's (tests/oracle.py's GroupOracle), on a real Redis and on fakeredis."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import GroupOracle, clustered, flip
from tests.test_groups import _assert_groups
from worker import library
from worker.index import FingerprintIndex
from worker.integrity import KINDS, Verifier

NS = "gv"


def _built(client: Any, seed: int, ops: int = 60) -> tuple[FingerprintIndex, GroupOracle]:
    """An index whose groups the reference knows: adds, upserts, deletes and a few merges."""
    client.flushall()
    rng = random.Random(seed)
    pool = clustered(rng, 15, 7, centers=6)
    index = FingerprintIndex(client, NS, bands=4, max_distance=7)
    index.open()
    oracle = GroupOracle(7)
    for step in range(ops):
        incident_id = f"i{rng.randrange(30)}"
        fp = flip(pool[rng.randrange(len(pool))], rng.randint(0, 2), rng)
        kind = rng.choice(["add", "add", "add", "upsert", "delete"])
        if kind == "delete":
            index.delete(incident_id)
            oracle.delete(incident_id)
        elif kind == "upsert" or incident_id not in oracle.fps:
            index.upsert_fingerprint(incident_id, fp)
            oracle.upsert(incident_id, fp)
        if step == ops // 2 and len({oracle.group(i) for i in oracle.fps}) > 4:
            labels = sorted({oracle.group(i) for i in oracle.fps})
            a, b = rng.sample(labels, 2)
            assert oracle.merge(a, b)
            index.merge_groups(a, b)
    for incident_id, fp in (("lone0", 0), ("lone1", 2**64 - 1)):  # (almost surely) openers alone
        index.upsert_fingerprint(incident_id, fp)
        oracle.upsert(incident_id, fp)
    _assert_groups(index, oracle)
    return index, oracle


def _verify(client: Any, **kwargs: Any) -> Any:
    return Verifier(client, NS, batch=7, **kwargs).run()


def _groups_of(oracle: GroupOracle, size: int) -> list[str]:
    sizes = {label: oracle.size(label) for label in {oracle.group(i) for i in oracle.fps}}
    return sorted(label for label, n in sizes.items() if n >= size)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Each way of damaging group state by hand: (kind it must be reported as, how many, the damage). The damage gets the
# client, index and oracle, and may change the oracle where a hand edit changes what the groups must be after repair.
Damage = Callable[[Any, FingerprintIndex, GroupOracle], int]


def _orphan_entries(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    label = _groups_of(oracle, 2)[0]
    client.hset(index.keys.groups, mapping={"gone1": label, "gone2": "nowhere"})
    return 2


def _self_entry(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    # one opener alone in its group and one whose group has more members: either way no entry reads the same
    openers = sorted(i for i in oracle.fps if oracle.raw[i] == i)
    alone = next(i for i in openers if oracle.size(i) == 1)
    joined = next(i for i in openers if oracle.size(i) > 1)
    client.hset(index.keys.groups, mapping={alone: alone, joined: joined})
    return 2


def _wrong_sizes(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    big = _groups_of(oracle, 2)
    client.hset(index.keys.group_sizes, big[0], 99)  # wrong
    if len(big) > 1:
        client.hdel(index.keys.group_sizes, big[1])  # missing
    client.hset(index.keys.group_sizes, "ended", 4)  # a group with no member
    alone = sorted(i for i in oracle.fps if oracle.raw[i] == i and oracle.size(i) == 1)
    client.hset(index.keys.group_sizes, alone[0], 1)  # an opener alone costs nothing
    return 3 + (len(big) > 1)


def _stale_active(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    client.zadd(index.keys.group_active, {"ended": 5, "i0#77": 6})
    return 2


def _merge_chain(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    # legit merges C <- B and C <- A leave A -> C and B -> C; by hand, A -> B: a chain of two hops
    a, b, c = _groups_of(oracle, 1)[:3]
    for other in (b, a):
        assert oracle.merge(c, other)
        index.merge_groups(c, other)
    client.hset(index.keys.group_merged, a, b)
    return 1


def _merge_loop(client: Any, index: FingerprintIndex, oracle: GroupOracle) -> int:
    # a legit merge A <- B (B -> A, A the smaller label, which the repair keeps as the group); by hand, A -> B too
    a, b = _groups_of(oracle, 1)[:2]
    assert oracle.merge(a, b)
    index.merge_groups(a, b)
    client.hset(index.keys.group_merged, a, b)
    client.hset(index.keys.group_merged, "zz-self", "zz-self")
    return 3  # a, b and zz-self


DAMAGES: dict[str, Damage] = {
    "group_entry_orphan": _orphan_entries,
    "group_entry_self": _self_entry,
    "group_size": _wrong_sizes,
    "group_active_stale": _stale_active,
    "group_merge_chain": _merge_chain,
    "group_merge_loop": _merge_loop,
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_each_damage_is_named_repaired_and_the_groups_are_the_reference_s(redis_client, kind) -> None:
    index, oracle = _built(redis_client, seed=11)
    assert _verify(redis_client).clean
    expected = DAMAGES[kind](redis_client, index, oracle)
    found = _verify(redis_client)
    assert not found.clean
    assert found.counts.get(kind) == expected, found.counts
    assert set(found.counts) <= {kind, "group_size", "group_active_stale"}
    repaired = _verify(redis_client, repair=True)
    assert repaired.clean and repaired.counts.get(kind) == expected
    again = _verify(redis_client)
    assert again.clean and not again.findings, again.counts
    _assert_groups(index, oracle)


def test_every_kind_of_group_finding_is_in_the_kinds_table() -> None:
    assert {*DAMAGES, "group_sizes_unchecked"} <= set(KINDS)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), cuts=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_any_mix_of_damage_is_repaired_in_one_run(redis_client, seed, cuts) -> None:
    """Sizes deleted or changed, entries of gone incidents, stale activity at random: one repair, then clean, and
    the groups the reference's (the sizes are rebuilt from the members, never the labels changed)."""
    index, oracle = _built(redis_client, seed=seed, ops=40)
    rng = random.Random(seed)
    client = redis_client
    sizes = sorted(_s(k) for k in client.hkeys(index.keys.group_sizes))
    for cut in cuts:
        if cut == 0 and sizes:
            client.hdel(index.keys.group_sizes, rng.choice(sizes))
        elif cut == 1 and sizes:
            client.hincrby(index.keys.group_sizes, rng.choice(sizes), rng.choice([-1, 1, 5]))
        elif cut == 2:
            client.hset(index.keys.groups, f"x{rng.randrange(9)}", rng.choice([*sizes, "q"]))
        elif cut == 3:
            client.zadd(index.keys.group_active, {f"stale{rng.randrange(3)}": 1})
        elif cut == 4 and oracle.fps:
            client.hset(index.keys.group_sizes, f"dead{rng.randrange(3)}", rng.randint(1, 9))
        elif cut == 5 and oracle.fps:
            # an incident taken out of {N}:fp by hand: its entry is left behind, and the reference forgets it
            gone = rng.choice(sorted(oracle.fps))
            if oracle.raw[gone] != gone:
                client.hdel(index.keys.fingerprints, gone)
                oracle.fps.pop(gone)
                oracle.raw.pop(gone)
    _verify(client, repair=True)
    again = _verify(client)
    assert not [f for f in again.findings if f.kind.startswith("group")], again.counts
    _assert_groups(index, oracle)


def test_a_count_overtaken_by_changes_leaves_the_sizes_unchecked(redis_client, monkeypatch) -> None:
    """While incidents change during every count, a size that differs is not reported from a count that may be
    stale: the finding says the sizes were not checked, and verify does not pass."""
    import worker.groupcheck as groupcheck

    index, oracle = _built(redis_client, seed=3)
    redis_client.hset(index.keys.group_sizes, _groups_of(oracle, 2)[0], 50)
    counter = iter(range(10_000))
    real = groupcheck.GroupStateChecks._count_members

    def count_with_a_change(self: Any, merged: dict[str, str]) -> Any:
        found = real(self, merged)
        index.add_fingerprint(f"new{next(counter)}", 0x0123_4567_89AB_CDEF)  # a worker's change meanwhile
        return found

    monkeypatch.setattr(groupcheck.GroupStateChecks, "_count_members", count_with_a_change)
    found = _verify(redis_client, repair=True)
    assert found.counts.get("group_sizes_unchecked") == 1 and "group_size" not in found.counts
    assert not found.clean
    monkeypatch.undo()
    assert _verify(redis_client, repair=True).counts == {"group_size": 1}
    assert _verify(redis_client).clean


def test_a_change_between_the_count_and_the_step_that_judges_a_size_is_not_taken_for_damage(
    redis_client, monkeypatch
) -> None:
    """The step that judges a size compares the change marker itself: a change that lands after the count but
    before that step makes the walk count again (here every time), never report a size from the stale count."""
    import worker.groupcheck as groupcheck

    index, oracle = _built(redis_client, seed=5)
    label = _groups_of(oracle, 2)[0]
    redis_client.hset(index.keys.group_sizes, label, 70)
    counter = iter(range(10_000))
    real = groupcheck.GroupStateChecks._group_call

    def judged_after_a_change(self: Any, subjects: Any, marker: str) -> str:
        if any(code == "z" for code, _, _ in subjects):
            index.add_fingerprint(f"late{next(counter)}", 0xFEDC_BA98_7654_3210)
        return real(self, subjects, marker)

    monkeypatch.setattr(groupcheck.GroupStateChecks, "_group_call", judged_after_a_change)
    found = _verify(redis_client)
    assert found.counts == {"group_sizes_unchecked": 1}
    assert _s(redis_client.hget(index.keys.group_sizes, label)) == "70"


@pytest.mark.parametrize("after", ["_walk_merged", "_read_merged"])
def test_a_merge_just_after_the_merged_labels_are_read_is_not_repaired_away(redis_client, monkeypatch, after) -> None:
    """The change marker must be taken before the merged labels the count uses are read: a merge landing between the
    two moved the marker already, so nothing would make the walk count again, and the repair would rewrite the sizes
    from the count without the merge (the merged group's size split back, the folded label given a size again)."""
    import worker.groupcheck as groupcheck

    index, oracle = _built(redis_client, seed=11)
    redis_client.hset(index.keys.group_sizes, "ended", 4)  # some damage, so that the walk counts again once
    a, b = _groups_of(oracle, 2)[:2]
    real = getattr(groupcheck.GroupStateChecks, after)
    # after the first read (the walk's), or after the second (the retry's, once the first count was overtaken)
    reads = iter([None, (a, b)] if after == "_read_merged" else [(a, b)])

    def merged_then_a_merge(self: Any, *args: Any) -> Any:
        found = real(self, *args)
        merge = next(reads, None)
        if merge:
            assert oracle.merge(*merge)
            index.merge_groups(*merge)
        return found

    monkeypatch.setattr(groupcheck.GroupStateChecks, after, merged_then_a_merge)
    if after == "_read_merged":
        # the retry's read: make the first count overtaken, so that the walk reads the merged labels again
        calls = iter(range(10_000))
        real_count = groupcheck.GroupStateChecks._count_members

        def overtaken_once(self: Any, merged: dict[str, str]) -> Any:
            found = real_count(self, merged)
            if next(calls) == 0:
                index.add_fingerprint("late", 0x0123_4567_89AB_CDEF)
                oracle.upsert("late", 0x0123_4567_89AB_CDEF)
            return found

        monkeypatch.setattr(groupcheck.GroupStateChecks, "_count_members", overtaken_once)
    _verify(redis_client, repair=True)
    monkeypatch.undo()
    again = _verify(redis_client)
    assert again.clean, again.counts
    _assert_groups(index, oracle)


def test_a_chain_longer_than_the_hops_followed_keeps_its_end(redis_client) -> None:
    """A chain of merged labels is followed MAX_HOPS (1,000) hops at a time: where it is cut, the label reached is
    merged further, and the repair must point the labels before it there without taking that label's own entry away
    (which would make it a group of its own and lose where the chain ends). Repaired until clean, every label of the
    chain names the group it ends at."""
    index, oracle = _built(redis_client, seed=11)
    end = _groups_of(oracle, 1)[0]
    labels = [f"chain{i:04}" for i in range(1100)]
    redis_client.hset(index.keys.group_merged, mapping=dict(zip(labels, [*labels[1:], end], strict=True)))
    # the chain's first label judged first (the walk's order is the hash's): its path is cut at chain1000
    keys = [index.keys.meta, index.keys.fingerprints, index.keys.changes]
    tag = redis_client.hget(index.keys.meta, "layout")
    redis_client.fcall(library.FN_VERIFY_GROUPS_REPAIR, len(keys), *keys, tag, "1", "", "m", labels[0], "")
    assert _s(redis_client.hget(index.keys.group_merged, labels[1000])) == labels[1001]
    for _ in range(3):
        if _verify(redis_client, repair=True).clean:
            break
    assert _verify(redis_client).clean
    merged = {_s(k): _s(v) for k, v in redis_client.hgetall(index.keys.group_merged).items()}
    assert {merged.get(label) for label in labels} == {end}
    _assert_groups(index, oracle)


def test_a_long_merge_loop_costs_its_check_a_reply_linear_in_its_length(redis_client) -> None:
    """Each label of a loop is a subject of its own: a check reports each label once, with the way shown to its first
    labels, not every label of the loop with the whole loop from every subject (300 labels made 300 x 300 findings of
    300 labels each). The repair still fixes the whole loop from its first subject."""
    index, _ = _built(redis_client, seed=11)
    labels = [f"loop{i:03}" for i in range(300)]
    redis_client.hset(index.keys.group_merged, mapping=dict(zip(labels, [*labels[1:], labels[0]], strict=True)))
    keys = [index.keys.meta, index.keys.fingerprints, index.keys.changes]
    tag = redis_client.hget(index.keys.meta, "layout")
    reply = redis_client.fcall(library.FN_VERIFY_GROUPS_CHECK, len(keys), *keys, tag, "0", "", "m", labels[7], "")
    assert [_s(v) for v in reply[2:4]] == ["group_merge_loop", labels[7]] and len(reply) == 5  # marker, one finding
    assert len(_s(reply[4])) < 40 * 25  # the way's first 20 labels, then how many
    found = _verify(redis_client)
    assert found.counts.get("group_merge_loop") == 300
    assert sum(len(f.detail) for f in found.findings) < 300 * 40 * 25
    assert _verify(redis_client, repair=True).counts.get("group_merge_loop") == 300
    assert _verify(redis_client).clean
    merged = {_s(k): _s(v) for k, v in redis_client.hgetall(index.keys.group_merged).items()}
    assert labels[0] not in merged and {merged[label] for label in labels[1:]} == {labels[0]}
