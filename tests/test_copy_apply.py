"""A batch of changes applied to a copy at once (`MemoryIndex.apply`: the loaded rows' look-ups of all of its IDs and
fingerprints in one numpy step each) against the same changes `set` and `delete` one by one, and the oracle: IDs
loaded, gone and set again, repeated within the batch, hashing alike (`id_hash`), fingerprints of loaded rows whose
incidents went, rows made and emptied within the batch, tiers sealed and rebuilt meanwhile (`seal_at`)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import Oracle, clustered
from tests.test_loadedrows import IDS, _check, id_hash  # noqa: F401 (a fixture)
from worker.bands import BandLayout
from worker.snapshot import MemoryIndex


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    loaded=st.lists(st.tuples(st.integers(0, len(IDS) - 1), st.integers(0, 9)), max_size=30),
    batches=st.lists(
        st.lists(
            st.tuples(st.integers(0, len(IDS) + 3), st.one_of(st.none(), st.integers(0, 11))), min_size=1, max_size=20
        ),
        max_size=6,
    ),
)
def test_a_batch_applied_at_once_changes_the_copy_as_one_by_one(
    seed,
    loaded,
    batches,
    id_hash,  # noqa: F811
    seal_at,
) -> None:
    rng = random.Random(seed)
    pool = clustered(rng, 12, 7, centers=3)  # (10 and 11: fingerprints no loaded incident holds)
    ids = [*IDS, "new", "é2", "\udcff", "x" * 40 + "y"]  # (a lone surrogate: no ID the loaded rows can hold)
    layout = BandLayout(4, 7)
    at_once, one_by_one, oracle = MemoryIndex(layout), MemoryIndex(layout), Oracle(7)
    pairs = [(ids[incident], pool[which]) for incident, which in loaded]
    at_once.load(pairs)
    one_by_one.load(pairs)
    oracle.fps.update(pairs)
    for batch in batches:
        changes = [(ids[incident], None if which is None else pool[which]) for incident, which in batch]
        at_once.apply(changes)
        for incident_id, fp in changes:
            if fp is None:
                one_by_one.delete(incident_id)
                oracle.fps.pop(incident_id, None)
            else:
                one_by_one.set(incident_id, fp)
                oracle.fps[incident_id] = fp
        assert dict(at_once.items()) == dict(one_by_one.items())
        assert (at_once.distinct, at_once.empty_rows, at_once.tier_rebuilds) == (
            one_by_one.distinct,
            one_by_one.empty_rows,
            one_by_one.tier_rebuilds,
        )
        assert at_once._gone.tolist() == one_by_one._gone.tolist()
        assert at_once._over == one_by_one._over and at_once._members == one_by_one._members
        probes = rng.random()  # the same searches on both (which may build tiers anew: alike)
        _check(at_once, oracle, pool, random.Random(probes))
        _check(one_by_one, oracle, pool, random.Random(probes))
