"""/metrics told once a batch (worker/metrics.py `observe_each`, worker/outcomes.py `flush`): the same series, values
and sums as an observation an event."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from worker.metrics import observe_each

BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


values = st.one_of(
    st.sampled_from([0, 1, 5, 10, 50_000, 50_001, 0.5, 1e-9, math.inf, -1, -math.inf]),
    st.integers(0, 100_000),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(st.lists(values, max_size=40), max_size=5))
def test_a_batch_observed_at_once_shows_what_one_observation_a_value_shows(batches: list[list[float]]) -> None:
    one, each = CollectorRegistry(), CollectorRegistry()
    by_value = Histogram("h", "x", buckets=BUCKETS, registry=one)
    at_once = Histogram("h", "x", buckets=BUCKETS, registry=each)
    for batch in batches:
        for value in batch:
            by_value.observe(value)
        observe_each(at_once, batch)
    assert exposition(each) == exposition(one)


def test_anything_but_a_plain_histogram_is_told_each_value() -> None:
    seen: list[Any] = []

    class Recorder:
        def observe(self, value: float) -> None:
            seen.append(value)

    observe_each(Recorder(), [3, 1.5, 3])
    assert seen == [3, 1.5, 3]
    registry = CollectorRegistry()
    labelled = Histogram("l", "x", ["kind"], buckets=BUCKETS, registry=registry)
    observe_each(labelled.labels("a"), [7, 70])  # a labelled child is a Histogram of its own
    assert 'l_bucket{kind="a",le="10.0"} 1.0' in exposition(registry)
