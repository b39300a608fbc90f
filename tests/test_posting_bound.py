"""`{N}:meta`'s posting_bound (worker/lua/meta.lua): while it is present, no posting set of the index holds more
members than it, whatever wrote them (the atomic add and upsert, a bulk load, a layout move, a repair); a search on
the primary skips measuring its probe sets only while probes x bound <= its budget, and then answers exactly as the
measured search does; a snapshot-path write takes it away; a bound too low costs a search its cut, never an answer.
"""

from __future__ import annotations

import random

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import Oracle, flip
from tests.streams import publish
from worker.index import FingerprintIndex
from worker.integrity import Verifier
from worker.library import ApplyResult, parse_apply
from worker.migrate import Migrator
from worker.settings import Settings
from worker.stream import StreamWorker

BASE = 0x5A5A_F0F0_1234_8001


def _bound(client: redis.Redis, namespace: str) -> int | None:
    value = client.hget(f"{{{namespace}}}:meta", "posting_bound")
    return None if value is None else int(value)


def _largest(client: redis.Redis, namespace: str) -> int:
    """The largest posting set of the namespace, of any layout (every set under its `band:` prefix)."""
    sizes = [client.scard(key) for key in client.scan_iter(match=f"{{{namespace}}}:band:*", count=1000)]
    return max(sizes, default=0)


def _pool(rng: random.Random) -> list[int]:
    """Near twins of one fingerprint (many share band values, so sets of several members), a flood sharing band 0's
    value, and a few far ones."""
    near = [flip(BASE, rng.randint(0, 3), rng) for _ in range(16)]
    flood = [(BASE & 0xFFFF) | (rng.getrandbits(48) << 16) for _ in range(12)]
    return near + flood + [rng.getrandbits(64) for _ in range(4)]


def _apply(index: FingerprintIndex, op: str, incident_id: str, fp: int | None, budget: int) -> ApplyResult:
    expected = "*" if op == "add" else index.stored_values([incident_id])[incident_id]
    command = index.apply_command(op, incident_id, fp, expected=expected, max_matches=0, max_candidates=budget)
    [reply] = index.execute([command])
    return parse_apply(reply)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "add", "upsert", "delete", "load"]), st.integers(0, 30), st.integers(0, 40)),
        min_size=1,
        max_size=40,
    ),
)
def test_the_bound_holds_every_posting_set_whatever_wrote_it(
    redis_client: redis.Redis, seed: int, ops: list[tuple[str, int, int]]
) -> None:
    redis_client.flushall()
    rng = random.Random(seed)
    pool = _pool(rng)
    index = FingerprintIndex(redis_client, "p", bands=4, max_distance=7)
    index.open()
    assert _bound(redis_client, "p") == 0  # a new index starts it
    loaded = 0
    for op, n, which in ops:
        incident_id, fp = f"i{n:02d}", pool[which % len(pool)]
        stored = index.stored_values([incident_id])[incident_id]
        if op == "load":
            loaded += 1
            index.bulk_load([(f"load{loaded}-{k}", pool[(which + k) % len(pool)]) for k in range(3)])
        elif op == "delete":
            _apply(index, "delete", incident_id, None, 3000)
        elif (op == "add" and stored is None) or (op == "upsert" and stored is not None):
            _apply(index, op, incident_id, fp, 3000)
        bound = _bound(redis_client, "p")
        assert bound is not None and bound >= _largest(redis_client, "p"), (op, bound)


@pytest.mark.parametrize("budget", [70, 400, 3000])
def test_a_search_skipping_the_sizes_answers_as_one_that_measures_them(redis_client: redis.Redis, budget: int) -> None:
    """The same events into two indexes, one keeping its bound and one without (every search measures its sets):
    every reply the same, cuts included; and the oracle's answer whenever not cut."""
    redis_client.flushall()
    rng = random.Random(budget)
    pool = _pool(rng)
    kept = FingerprintIndex(redis_client, "k", bands=4, max_distance=7)
    measured = FingerprintIndex(redis_client, "m", bands=4, max_distance=7)
    kept.open()
    measured.open()
    oracle = Oracle(7)
    skipped = 0
    for k in range(120):
        incident_id, fp = f"i{k}", rng.choice(pool) if k % 5 else flip(rng.choice(pool), 2, rng)
        redis_client.hdel("{m}:meta", "posting_bound")
        bound = _bound(redis_client, "k")
        assert bound is not None
        skipped += bound * 68 <= budget
        expected = oracle.matches(fp, exclude=incident_id)
        oracle.fps[incident_id] = fp
        one, other = _apply(kept, "add", incident_id, fp, budget), _apply(measured, "add", incident_id, fp, budget)
        assert (one.match_count, one.matches, one.incomplete, one.candidates) == (
            other.match_count,
            other.matches,
            other.incomplete,
            other.candidates,
        )
        if not one.incomplete:
            assert (one.match_count, one.matches) == (len(expected), expected)
    assert skipped, "no search skipped measuring its sets: the test did not test the skip"


def test_a_bound_too_low_costs_the_cut_never_an_answer(redis_client: redis.Redis) -> None:
    """A bound edited down by hand under a flood: the search is not cut (it reads every set) and is exact."""
    redis_client.flushall()
    rng = random.Random(3)
    index = FingerprintIndex(redis_client, "f", bands=4, max_distance=7)
    index.open()
    oracle = Oracle(7)
    flood = [(BASE & 0xFFFF) | (rng.getrandbits(48) << 16) for _ in range(150)]
    index.bulk_load([(f"f{k}", fp) for k, fp in enumerate(flood)])
    oracle.fps.update({f"f{k}": fp for k, fp in enumerate(flood)})
    assert _bound(redis_client, "f") == _largest(redis_client, "f") >= 150
    first = flood[0] ^ (0b111 << 40)  # (band 0 kept: the flood's set is among its probes)
    cut = _apply(index, "add", "q1", first, 100)
    assert cut.incomplete and cut.candidates <= 100  # measured: the flood's set is larger than the budget
    oracle.fps["q1"] = first
    redis_client.hset("{f}:meta", "posting_bound", 0)
    query = flood[1] ^ (0b111 << 50)
    whole = _apply(index, "add", "q2", query, 100)
    expected = oracle.matches(query, exclude="q2")
    assert not whole.incomplete and whole.candidates > 100
    assert (whole.match_count, whole.matches) == (len(expected), expected)


def test_a_primary_path_add_measures_only_its_own_sets(real_redis: redis.Redis) -> None:
    """On a real Redis: an add into an index with a bound reads the size of the 4 sets it adds to, not of the 68 it
    searches; without the bound, its search measures all 68, as before."""
    real_redis.flushall()
    rng = random.Random(4)
    index = FingerprintIndex(real_redis, "s", bands=4, max_distance=7)
    index.open()
    real_redis.config_resetstat()
    for k in range(30):
        _apply(index, "add", f"a{k}", rng.getrandbits(64), 3000)
    with_bound = int(real_redis.info("commandstats").get("cmdstat_scard", {}).get("calls", 0))
    assert with_bound <= 4 * 30
    real_redis.hdel("{s}:meta", "posting_bound")
    real_redis.config_resetstat()
    for k in range(30):
        _apply(index, "add", f"b{k}", rng.getrandbits(64), 3000)
    assert int(real_redis.info("commandstats")["cmdstat_scard"]["calls"]) >= 68 * 30
    assert _bound(real_redis, "s") is None  # (an index without one does not make one)


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


def test_a_snapshot_path_write_takes_the_bound_away(redis_client: redis.Redis) -> None:
    """The snapshot path's adds are searched by the copy, and the primary does not measure their sets: the first one
    takes the bound away; the primary path's keep it."""
    redis_client.flushall()
    events = [{"op": "add", "incident_id": f"e{k}", "features": {"word": 1, f"own-{k}": 1}} for k in range(6)]
    publish(redis_client, events[:3])
    settings_ = {"consumer": "w1", "block_ms": 50, "claim_interval_ms": 100, "summary_interval_s": 60}
    StreamWorker(redis_client, Settings(read_path="primary", **settings_)).run(until_idle=True)
    bound = _bound(redis_client, "incidents")
    assert bound is not None and bound >= _largest(redis_client, "incidents")
    publish(redis_client, events[3:])
    StreamWorker(redis_client, Settings(read_path="snapshot", **settings_)).run(until_idle=True)
    assert _bound(redis_client, "incidents") is None


def test_a_layout_move_and_a_repair_raise_the_bound(redis_client: redis.Redis) -> None:
    """A move to 3 bands builds sets the 4 bands never had: 48 incidents sharing the 3-band layout's band 1 (bits 22
    to 42), which the 4 bands' sets split. And a repair that puts a missing posting back grows its set again."""
    redis_client.flushall()
    rng = random.Random(7)
    shared = rng.getrandbits(21) << 22
    index = FingerprintIndex(redis_client, "incidents", bands=4, max_distance=7)
    index.open()
    for k in range(48):
        fp = shared | (rng.getrandbits(22)) | (rng.getrandbits(21) << 43)
        _apply(index, "add", f"m{k}", fp, 3000)
    assert _largest(redis_client, "incidents") < 48
    assert Migrator(redis_client, "incidents", batch=10).migrate(3).startswith("moved from")
    bound = _bound(redis_client, "incidents")
    assert bound is not None and bound >= _largest(redis_client, "incidents") == 48
    # a repair: a posting taken out of the largest set, the bound edited down to what is left, then put back
    largest = max(redis_client.scan_iter(match="{incidents}:band:*"), key=redis_client.scard)
    redis_client.srem(largest, redis_client.srandmember(largest))
    redis_client.hset("{incidents}:meta", "posting_bound", _largest(redis_client, "incidents"))
    report = Verifier(redis_client, "incidents", repair=True, default_layout=(3, 7)).run()
    assert report.findings and all(f.repaired for f in report.findings)
    bound = _bound(redis_client, "incidents")
    assert bound is not None and bound >= _largest(redis_client, "incidents") == 48


def test_probe_sets_holding_more_than_the_budget_in_all_are_measured_and_cut(redis_client: redis.Redis) -> None:
    """Every one of a query's 64 one-bit probe sets holds 2 incidents (random elsewhere): no set is large (the bound
    is about 2), yet they hold 128 in all, more than a budget of 100; 68 x 2 > 100, so the search measures them and
    is cut. Skipping the measure on a looser test would not cut it."""
    redis_client.flushall()
    rng = random.Random(8)
    query = rng.getrandbits(64)
    index = FingerprintIndex(redis_client, "c", bands=4, max_distance=7)
    index.open()
    items = []
    for band in range(4):
        for bit in range(16):
            value = ((query >> (16 * band)) & 0xFFFF) ^ (1 << bit)
            for copy in range(2):
                fp = (rng.getrandbits(64) & ~(0xFFFF << (16 * band))) | (value << (16 * band))
                items.append((f"b{band}-{bit}-{copy}", fp))
    for incident_id, fp in items:
        _apply(index, "add", incident_id, fp, 3000)
    bound = _bound(redis_client, "c")
    assert bound is not None and bound >= 2 and bound * 68 > 100
    result = _apply(index, "add", "q", query, 100)
    assert result.incomplete and result.candidates <= 100
