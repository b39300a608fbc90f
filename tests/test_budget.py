"""The per-event budget (docs/contract.md, "The per-event budget"): a search that would verify more
than MAX_CANDIDATES candidates stops there and says so. Compared with the brute-force oracle: an event whose search
stayed within the budget is answered exactly; one cut at it lists real matches only, counts at least those and at
most every match, and says `incomplete` (the alert, the reply, the metric).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import Oracle, assert_postings_match, flip
from tests.streams import alerts, fingerprints, publish
from worker.fingerprint import format_fingerprint
from worker.index import FingerprintIndex
from worker.library import ApplyResult, SnapshotClaim, parse_apply
from worker.readpath import ChangeFollower
from worker.settings import Settings
from worker.snapshot import MemoryIndex
from worker.stream import StreamWorker

BUDGET = 6
BASE = 0x5A5A_F0F0_1234_8001


def _storm(rng: random.Random, count: int) -> list[int]:
    """Near twins of one fingerprint (each 0 to 3 bits away, so many within 7 of each other), and a few far ones."""
    near = [flip(BASE, rng.randint(0, 3), rng) for _ in range(count)]
    return near + [rng.getrandbits(64) for _ in range(count // 4)]


def _apply(index: FingerprintIndex, op: str, incident_id: str, fp: int, cap: int, budget: int) -> ApplyResult:
    expected: Any = "*" if op == "add" else index.get(incident_id)
    command = index.apply_command(op, incident_id, fp, expected=expected, max_matches=cap, max_candidates=budget)
    [reply] = index.execute([command])
    return parse_apply(reply)


def _check(result: ApplyResult, expected: list[tuple[str, int]], cap: int, distinct_others: int) -> None:
    """Exact when the search stayed within the budget; otherwise real matches, flagged, the count a lower bound."""
    if not result.incomplete:
        assert result.match_count == len(expected)
        assert result.matches == (expected[:cap] if cap else expected)
        return
    assert distinct_others > BUDGET, "a search cut though the index held no more representatives than the budget"
    assert result.candidates <= BUDGET
    assert set(result.matches) <= set(expected), "a cut search listed something that is not a match"
    assert len(result.matches) <= result.match_count <= len(expected)
    assert result.matches == sorted(result.matches, key=lambda m: (m[1], m[0]))
    if cap:
        assert len(result.matches) <= cap


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "add", "upsert", "delete"]), st.integers(0, 40), st.integers(0, 40)),
        min_size=1,
        max_size=60,
    ),
    cap=st.sampled_from([0, 1, 3, 100]),
)
def test_every_event_within_the_budget_is_exact_and_every_cut_one_lists_only_matches(
    redis_client: redis.Redis, seed: int, ops: list[tuple[str, int, int]], cap: int
) -> None:
    redis_client.flushall()
    rng = random.Random(seed)
    pool = _storm(rng, 32)
    index = FingerprintIndex(redis_client, "b", bands=4, max_distance=7, max_candidates=BUDGET)
    index.open()
    oracle = Oracle(7)
    for op, n, which in ops:
        incident_id, fp = f"i{n:02d}", pool[which % len(pool)]
        if op == "delete":
            assert index.delete(incident_id) == oracle.delete(incident_id)
            continue
        distinct_others = len({v for k, v in oracle.fps.items() if k != incident_id})
        if op == "add" and incident_id in oracle.fps:
            continue
        if oracle.fps.get(incident_id) == fp:
            continue
        expected = oracle.matches(fp, exclude=incident_id)
        oracle.fps[incident_id] = fp
        result = _apply(index, op, incident_id, fp, cap, BUDGET)
        assert result.status == "indexed"
        _check(result, expected, cap, distinct_others)
        # a cut search still indexes under the right representative: one per fingerprint, every twin grouped
        assert_postings_match(redis_client, "b", 4, oracle.fps)
    for fp in pool[:5]:
        found = index.search(fp)
        _check(found, oracle.matches(fp), 0, len(set(oracle.fps.values())))


def _near_storm_events(count: int) -> list[dict[str, Any]]:
    """One alert reworded by a counter: the same 30 tokens and one of its own each."""
    common = {f"word{k}": 1 for k in range(30)}
    return [{"op": "add", "incident_id": f"s{k:02d}", "features": {**common, f"request-{k}": 1}} for k in range(count)]


def _storm_through_a_worker(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, read_path: str, **budgets: int
) -> tuple[list[dict[str, Any]], dict[str, int], StreamWorker]:
    """40 events of a near storm published and run through one worker (batches of 4, the copy's rows in tiers of 3,
    where a budget applies) with `budgets` (max_candidates, snapshot_max_candidates); the events, their fingerprints,
    the worker."""
    import worker.snapshot

    monkeypatch.setattr(worker.snapshot, "_SEAL_AT", 3)
    events = _near_storm_events(40)
    fps = fingerprints(events)
    publish(redis_client, events)
    worker = StreamWorker(
        redis_client,
        Settings(
            consumer="w1",
            block_ms=50,
            claim_interval_ms=100,
            summary_interval_s=60,
            read_path=read_path,
            batch_size=4,
            **budgets,
        ),
    )
    worker.run(until_idle=True)
    return events, fps, worker


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_a_storm_past_the_budget_is_cut_and_its_alert_says_incomplete(
    redis_client: redis.Redis, read_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the copy's own budget too (on the snapshot path the primary's is not read)
    events, fps, worker = _storm_through_a_worker(
        redis_client, monkeypatch, read_path, max_candidates=BUDGET, snapshot_max_candidates=BUDGET
    )
    published = alerts(redis_client)
    cut = [alert for alert in published if alert.incomplete]
    whole = [alert for alert in published if not alert.incomplete]
    assert cut and whole, "the first events fit the budget, the later ones do not"
    order = [event["incident_id"] for event in events]
    for alert in published:
        earlier = order[: order.index(alert.incident_id)]
        truth = {(other, (fps[alert.incident_id] ^ fps[other]).bit_count()) for other in earlier}
        truth = {(other, d) for other, d in truth if d <= 7}
        listed = {(m.incident_id, m.distance) for m in alert.matches}
        assert listed <= truth, "an alert listed something that is not a match"
        if alert.incomplete:
            assert len(listed) <= alert.match_count <= len(truth)
        else:
            assert alert.match_count == len(truth) and len(listed) == min(len(truth), 100)
    assert worker.outcomes.stats.budget_exceeded >= len(cut)
    counted = worker.metrics.registry.get_sample_value("incident_worker_budget_exceeded_total")
    assert counted == worker.outcomes.stats.budget_exceeded


@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_the_copys_search_has_its_own_budget(
    redis_client: redis.Redis, read_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_CANDIDATES bounds the searches that run in Redis; the copy's search, which costs the worker's CPU, goes by
    SNAPSHOT_MAX_CANDIDATES. The same storm and the same small MAX_CANDIDATES: cut on the primary path, answered
    exactly (the brute-force truth) on the snapshot path, whose budget is its default."""
    events, fps, worker = _storm_through_a_worker(redis_client, monkeypatch, read_path, max_candidates=BUDGET)
    published = alerts(redis_client)
    order = [event["incident_id"] for event in events]
    alert_of = {alert.incident_id: alert for alert in published}
    exact = 0
    for position, incident_id in enumerate(order):
        truth = sorted(
            ((other, d) for other in order[:position] if (d := (fps[incident_id] ^ fps[other]).bit_count()) <= 7),
            key=lambda match: (match[1], match[0]),
        )
        alert = alert_of.get(incident_id)
        if alert is None:
            exact += not truth
            continue
        listed = [(m.incident_id, m.distance) for m in alert.matches]
        if not alert.incomplete and alert.match_count == len(truth) and listed == truth[:100]:
            exact += 1
    if read_path == "snapshot":
        assert exact == len(events) and worker.outcomes.stats.budget_exceeded == 0
    else:
        assert worker.outcomes.stats.budget_exceeded > 0 and exact < len(published)


# -- the snapshot path ------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), budget=st.sampled_from([1, 4, 10, 1000]), size=st.integers(0, 60))
def test_the_copys_search_within_its_budget_is_exact_and_a_cut_one_lists_only_matches(
    seed: int, budget: int, size: int
) -> None:
    from worker.bands import BandLayout

    rng = random.Random(seed)
    pool = _storm(rng, 40)
    copy = MemoryIndex(BandLayout(4, 7))
    oracle = Oracle(7)
    pairs = {f"i{k:02d}": rng.choice(pool) for k in range(size)}
    copy.load(pairs)
    oracle.fps.update(pairs)
    for k in range(10):  # and a tail
        copy.set(f"t{k}", pool[k])
        oracle.fps[f"t{k}"] = pool[k]
    for fp in pool[:8]:
        result = copy.search(fp, budget=budget)
        expected = oracle.matches(fp)
        if not result.cut:
            assert (result.match_count, result.matches) == (len(expected), expected)
        else:
            assert set(result.matches) <= set(expected)
            assert len(result.matches) == result.match_count <= len(expected)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    after=st.lists(st.tuples(st.sampled_from(["add", "upsert", "delete"]), st.integers(0, 30), st.integers(0, 30))),
    cap=st.sampled_from([0, 1, 2, 5]),
    op=st.sampled_from(["add", "upsert"]),
)
def test_a_cut_claim_is_validated_into_real_matches_flagged_incomplete(
    redis_client: redis.Redis, seed: int, after: list[tuple[str, int, int]], cap: int, op: str
) -> None:
    redis_client.flushall()
    rng = random.Random(seed)
    pool = _storm(rng, 24)
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    oracle = Oracle(7)
    for k in range(24):
        index.add_fingerprint(f"i{k}", pool[k])
        oracle.fps[f"i{k}"] = pool[k]
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    for kind, n, which in after:  # changes the copy has not seen
        incident_id, fp = f"i{n}", pool[which % len(pool)]
        if kind == "delete":
            index.delete(incident_id)
            oracle.delete(incident_id)
        elif kind == "upsert" or incident_id not in oracle.fps:
            index.upsert_fingerprint(incident_id, fp)
            oracle.fps[incident_id] = fp
    new_id = "i3" if op == "upsert" else "new"
    fp = flip(pool[rng.randrange(24)], rng.randint(0, 2), rng)
    found = follower.index.search(fp, exclude=new_id, limit=cap + 2 if cap else 0, budget=3)
    claim = SnapshotClaim(
        follower.index.position, found.match_count, found.matches, len(found.matches) == found.match_count, found.cut
    )
    expected = oracle.matches(fp, exclude=new_id)
    command = index.apply_command(
        op, new_id, fp, expected="*" if op == "add" else index.get(new_id), max_matches=cap, snapshot=claim
    )
    result = parse_apply(redis_client.execute_command(*command))
    if result.status == "unvalidated":
        assert not claim.complete and not claim.cut
        return
    if op == "upsert" and oracle.fps.get(new_id) == fp:
        assert result.status == "repeat"
        return
    assert result.status == "indexed"
    assert result.incomplete == found.cut
    if found.cut:
        assert set(result.matches) <= set(expected)
        assert len(result.matches) <= result.match_count <= len(expected)
        if cap:
            assert len(result.matches) <= cap
    else:
        assert result.match_count == len(expected)
        assert result.matches == (expected[:cap] if cap else expected)
    oracle.fps[new_id] = fp
    assert_postings_match(redis_client, "v", 4, oracle.fps)


@pytest.mark.parametrize("budget", [0, 50])
def test_the_read_only_search_takes_the_budget_too(redis_client: redis.Redis, budget: int) -> None:
    index = FingerprintIndex(redis_client, "r", bands=4, max_distance=7, max_candidates=budget)
    rng = random.Random(9)
    fps = [flip(BASE, rng.randint(1, 3), rng) for _ in range(120)]
    for k, fp in enumerate(fps):
        index.add_fingerprint(f"r{k:03d}", fp, max_matches=1)
    found = index.search(BASE)
    truth = sorted(((f"r{k:03d}", (fp ^ BASE).bit_count()) for k, fp in enumerate(fps)), key=lambda m: (m[1], m[0]))
    assert found.incomplete == (budget > 0)
    if budget:
        assert found.candidates <= budget and set(found.matches) <= set(truth)
    else:
        assert found.matches == truth
    assert format_fingerprint(BASE)
