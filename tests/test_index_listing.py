"""The primary's search in a storm: the count and the listed closest matches, compared with the brute-force oracle.

A storm puts many representatives at one distance, many with twin groups, so that the list of the closest `cap`
is cut inside one distance, among IDs of several groups and lone representatives interleaved in byte order: what
search.lua's listing (first_of_distance: a merge of each group's first members and the lone ones' first, read
further only as taken; first_sorted: a heap past a few dozen) must get exactly as a full sort would. Twin groups
larger than the merge's first read, representatives that are not their group's first ID, and non-ASCII IDs (byte
order is code point order) are all drawn.
"""

from __future__ import annotations

import random

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import Oracle, assert_postings_match, flip
from worker.index import FingerprintIndex

QUERY = 0x0123_4567_89AB_CDEF
ALPHABET = "abcdez09-é中"


def _ids(rng: random.Random, count: int) -> list[str]:
    """`count` distinct IDs of 1 to 4 characters, so that byte order interleaves them across groups."""
    ids: set[str] = set()
    while len(ids) < count:
        ids.add("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))))
    return list(ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    distinct=st.integers(1, 150),
    distances=st.lists(st.integers(0, 8), min_size=1, max_size=3),
    twins=st.sampled_from([0, 1, 3, 12]),
    cap=st.sampled_from([0, 1, 2, 3, 5, 10, 100]),
)
def test_a_storm_lists_the_closest_in_order_and_counts_every_twin(
    redis_client: redis.Redis, seed: int, distinct: int, distances: list[int], twins: int, cap: int
) -> None:
    redis_client.flushall()
    rng = random.Random(seed)
    # `distinct` fingerprints at a few distances of QUERY (a draw may repeat one: a twin too), each held by up to
    # `twins` more incidents
    fps = [flip(QUERY, rng.choice(distances), rng) for _ in range(distinct)]
    holders = [fp for fp in fps for _ in range(1 + rng.randint(0, twins))]
    ids = _ids(rng, len(holders) + 1)
    pairs = list(zip(ids, holders, strict=False))
    rng.shuffle(pairs)  # a representative is whichever came first, not its group's first ID
    index = FingerprintIndex(redis_client, "l", bands=4, max_distance=7, max_candidates=0)
    index.open()
    oracle = Oracle(7)
    split = len(pairs) // 2
    index.bulk_load(pairs[:split])
    for incident_id, fp in pairs[:split]:
        oracle.fps[incident_id] = fp
    for incident_id, fp in pairs[split:]:  # added one by one too: each add's own search checked as it goes
        expected = oracle.add(incident_id, fp)
        assert index.add_fingerprint(incident_id, fp, max_matches=cap) == (expected[:cap] if cap else expected)
    assert_postings_match(redis_client, "l", 4, oracle.fps)

    expected = oracle.matches(QUERY)
    for limit in (7, 3):
        found = index.search(QUERY, limit, max_matches=cap)
        wanted = oracle.matches(QUERY, limit)
        assert not found.incomplete
        assert found.match_count == len(wanted), f"limit {limit}: every twin counted"
        assert found.matches == (wanted[:cap] if cap else wanted), f"limit {limit}: the closest, in order"
    # the apply step lists and counts the same (and puts the new incident in its closest match's group)
    last = ids[-1]
    result = index._retrying("add", last, QUERY, cap)
    assert result.match_count == len(expected)
    assert result.matches == (expected[:cap] if cap else expected)


def test_hundreds_at_one_distance_list_the_first_few_in_byte_order(redis_client: redis.Redis) -> None:
    """Hundreds of lone representatives at one distance with a few groups among them: the few listed are the first
    IDs in byte order (first_sorted's heap, past a few dozen, and the merge with the groups)."""
    rng = random.Random(23)
    fps = list({flip(QUERY, 2, rng) for _ in range(400)})[:300]
    ids = _ids(rng, 340)
    pairs = list(zip(ids, fps, strict=False)) + [(ids[300 + k], fps[k % 7]) for k in range(40)]
    index = FingerprintIndex(redis_client, "h", bands=4, max_distance=7, max_candidates=0)
    index.open()
    index.bulk_load(pairs)
    oracle = Oracle(7)
    oracle.fps.update(pairs)
    expected = oracle.matches(QUERY)
    assert len(expected) == 340
    for cap in (3, 7, 50, 0):
        found = index.search(QUERY, max_matches=cap)
        assert found.match_count == 340
        assert found.matches == (expected[:cap] if cap else expected), f"cap {cap}"
