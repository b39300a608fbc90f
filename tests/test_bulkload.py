"""`FingerprintIndex.bulk_load`'s raw way (worker/bulkload.py) writes what its general way writes, key for key."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker.bulkload
from tests.oracle import Oracle, assert_postings_match
from worker.devtools.redis_server import RedisServer
from worker.devtools.workload import Workload, _bag
from worker.fingerprint import fingerprint
from worker.index import FingerprintIndex

POOL = [0x0123456789ABCDEF, 0x0123456789ABCDEE, 0xFFFF000000000000, 5, 2**64 - 1]


def _state(client: redis.Redis) -> dict[str, Any]:
    """Every key of the namespace and what it holds (the change log's entries without their IDs)."""
    state: dict[str, Any] = {}
    for key in client.scan_iter(match="*"):
        kind = client.type(key)
        if kind == b"hash":
            value: Any = client.hgetall(key)
        elif kind == b"set":
            value = client.smembers(key)
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            value = [fields for _, fields in client.xrange(key)]
        else:
            value = client.get(key)
        state[key] = value
    meta = state.get(b"{incidents}:meta")
    if meta is not None:
        meta.pop(b"created_at", None)
    return state


def _load(client: redis.Redis, items: list[tuple[str, int]], chunk: int, *, general: bool) -> Any:
    client.flushall()
    if general:
        index = FingerprintIndex(client)
        index._ensure_open()
        touched: set[Any] = set()
        loaded = worker.bulkload._general(index, worker.index.batched(items, chunk), False, touched)
        worker.bulkload._raise_bound(index, touched)  # (as bulk_load does after either way)
    else:
        loaded = FingerprintIndex(client).bulk_load(items, chunk=chunk)
    return loaded, _state(client)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "é", "x" * 30]), st.sampled_from(POOL)), max_size=25),
    chunk=st.integers(1, 8),
)
def test_the_raw_way_writes_what_the_general_way_writes(real_redis: redis.Redis, items, chunk) -> None:
    raw = _load(real_redis, items, chunk, general=False)
    general = _load(real_redis, items, chunk, general=True)
    assert raw == general


def test_the_raw_way_indexes_a_workload_as_the_oracle(real_redis: redis.Redis) -> None:
    workload = Workload(seed=4, memory=3000)
    ids, fps = workload.fingerprints(2500, chunk=900)
    items = list(zip(ids, fps.tolist(), strict=True))
    items += [(f"twin{k}", items[k][1]) for k in range(0, 300, 7)]  # exact twins of loaded incidents
    index = FingerprintIndex(real_redis)
    assert index.bulk_load(items, chunk=1000) == len(items)
    oracle = Oracle(7)
    oracle.fps.update(items)
    assert_postings_match(real_redis, "incidents", index.layout.bands, oracle.fps)
    assert real_redis.xlen("{incidents}:changes") == len(items)
    rng = random.Random(1)
    for _, fp in rng.sample(items, 40):
        assert index.matches_of(fp) == oracle.matches(fp)


def test_an_error_reply_stops_the_load_and_leaves_the_client_usable(real_redis: redis.Redis) -> None:
    index = FingerprintIndex(real_redis)
    index._ensure_open()
    real_redis.set(index.posting_keys(POOL[0])[2], "not a set")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        index.bulk_load([("a", POOL[0]), ("b", POOL[2])] * 3, chunk=1)
    assert real_redis.ping()
    assert real_redis.hget("{incidents}:fp", "a") == b"0123456789abcdef"


def test_the_general_way_serves_a_namespace_holding_fingerprints(monkeypatch: pytest.MonkeyPatch, real_redis) -> None:
    index = FingerprintIndex(real_redis)
    index.add_fingerprint("first", POOL[0])
    monkeypatch.setattr(worker.bulkload, "_RawLoad", None)  # would fail if used
    assert index.bulk_load([("b", POOL[0]), ("c", POOL[1])]) == 2
    assert index.twin_group(POOL[0]) == (2, "first")


def test_a_workload_s_preload_fingerprints_are_those_of_its_bags() -> None:
    workload = Workload(seed=9, memory=4000)
    ids, fps = workload.fingerprints(4000, chunk=1500)
    assert ids[0] == "1" and ids[-1] == "4000" and workload.next()[0] == "4001"
    bags = workload._recent[:-1]  # all of them (the one `next` may have replaced aside)
    matching = sum(fingerprint(bag) == int(fp) for bag, fp in zip(bags, fps[: len(bags)], strict=True))
    assert matching >= len(bags) - 1
    # about a fifth are near duplicates: a bag a weight, a token or two away from another one before it
    near = sum(
        1 for k in range(1, 1000) if any(len(set(bags[k].items()) ^ set(bags[j].items())) <= 4 for j in range(k))
    )
    assert 120 < near < 320
    # bags as `take` draws them: distinct tokens, each weight 1 to 5, as many tokens on average
    assert max(weight for bag in bags for weight in bag.values()) == workload.max_weight
    dict_bags = [bag for _, bag in Workload(seed=9).take(4000)]
    sizes = [sum(len(bag) for bag in group) / len(group) for group in (bags, dict_bags)]
    assert abs(sizes[0] - sizes[1]) < 0.03 * sizes[1]
    assert _bag(["t0", "t1"], [0, 1, 0], [2, 3, 0]) == {"t0": 2, "t1": 3}
    assert len(np.unique(fps)) > 0.95 * len(fps)


@pytest.mark.parametrize("decode", [False, True])
def test_a_copy_loads_from_a_decoding_client_or_not(redis_server: RedisServer, decode: bool) -> None:
    from worker.bands import BandLayout
    from worker.keys import IndexKeys
    from worker.readpath import ChangeFollower

    with redis_server.client() as client:
        client.flushall()
        client.function_flush()
        worker.library.load(client)
        items = [(f"i{k}", k * 0x9E3779B97F4A7C15 % 2**64) for k in range(3000)] + [("é", 5), ("twin", 5)]
        FingerprintIndex(client).bulk_load(items)
        client.hset("{incidents}:fp", "mangled", "not hex")
    decoding = redis.Redis(port=redis_server.port, decode_responses=decode)
    follower = ChangeFollower(decoding, IndexKeys("incidents"), BandLayout(4, 7), batch=500)
    follower.load()
    assert dict(follower.index.items()) == dict(items)
    decoding.close()
