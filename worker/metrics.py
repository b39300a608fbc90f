"""Prometheus metrics of one worker, in a registry of its own (so tests can run several workers in one process)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["Metrics", "observe_each"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_CANDIDATE_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


class Metrics:
    """Everything `/metrics` shows: outcomes, alerts, dead letters, latencies, candidates, lag, index size, and the
    upkeep's and the read path's state that deploy/prometheus/alerts.yml watches."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter("incident_worker_events", "Stream entries handled, by outcome", ["outcome"], registry=r)
        self.alerts = Counter("incident_worker_alerts", "Alerts published", registry=r)
        self.groups_opened = Counter(
            "incident_worker_groups_opened", "Incidents indexed without a match: each opened a group", registry=r
        )
        self.groups_joined = Counter(
            "incident_worker_groups_joined",
            "Incidents indexed with a match: each joined its closest's group",
            registry=r,
        )
        self.dead_letters = Counter(
            "incident_worker_dead_letters", "Entries dead-lettered, by reason", ["reason"], registry=r
        )
        self.batch_seconds = Histogram(
            "incident_worker_batch_seconds", "Time to process one batch", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.end_to_end_seconds = Histogram(
            "incident_worker_end_to_end_seconds",
            "From the entry's XADD (its ID's time) to its acknowledgement",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.candidates = Histogram(
            "incident_worker_candidates", "Candidates verified per event", buckets=_CANDIDATE_BUCKETS, registry=r
        )
        self.budget_exceeded = Counter(
            "incident_worker_budget_exceeded",
            "Events whose search stopped at the per-event budget (MAX_CANDIDATES): their alerts say incomplete",
            registry=r,
        )
        self.group_lag = Gauge(
            "incident_worker_group_lag", "Entries of the events stream not yet delivered to the group", registry=r
        )
        self.group_pending = Gauge(
            "incident_worker_group_pending", "Entries delivered to the group and not yet acknowledged", registry=r
        )
        self.inbox_entries = Gauge(
            "incident_worker_inbox_entries",
            "Entries producers appended to the inbox ({N}:inbox) that no worker has moved into the events stream yet",
            registry=r,
        )
        self.index_size = Gauge("incident_worker_index_incidents", "Incidents in the index", registry=r)
        self.reconnects = Counter("incident_worker_reconnects", "Times the worker lost Redis and retried", registry=r)
        self.expired = Counter(
            "incident_worker_expired",
            "Incidents this worker took out of the index because their retention window had passed",
            registry=r,
        )
        self.claimed = Counter(
            "incident_worker_claimed", "Entries taken over from silent consumers (XAUTOCLAIM)", registry=r
        )
        # The upkeep's view, for the alert rules of deploy/prometheus: who holds its lease, the memory of the streams
        # it keeps within budgets (measured by the lease holder only), and whether retention is on.
        self.upkeep_lease_held = Gauge(
            "incident_worker_upkeep_lease_held", "1 while this worker holds the upkeep lease, else 0", registry=r
        )
        self.stream_memory = Gauge(
            "incident_worker_stream_memory_bytes",
            "Redis memory of a stream with a memory budget, as the upkeep last measured it (before trimming)",
            ["stream"],
            registry=r,
        )
        self.stream_memory_budget = Gauge(
            "incident_worker_stream_memory_budget_bytes",
            "The stream's memory budget (ALERTS_MAX_MEMORY, DEAD_MAX_MEMORY; 0: none)",
            ["stream"],
            registry=r,
        )
        self.retention_seconds = Gauge(
            "incident_worker_retention_seconds",
            "The namespace's retention window as of this worker's start (0: retention is off)",
            registry=r,
        )
        self.snapshot_fallbacks = _CallbackCounter(
            "incident_worker_snapshot_fallbacks",
            "Events the snapshot's claim could not be validated for, so searched in full on the primary",
        )
        r.register(self.snapshot_fallbacks)
        self.snapshot_replica_lost = _CallbackCounter(
            "incident_worker_snapshot_replica_lost",
            "Times the worker's copy left its replica (failed, behind, or no longer the primary's) for the primary",
        )
        r.register(self.snapshot_replica_lost)
        self.group_merges = _CallbackCounter(
            "incident_worker_group_merges",
            "Group merges the index has had (incident-worker groups merge; {N}:meta's group_merges, read each summary)",
        )
        r.register(self.group_merges)

    def follow_snapshot_fallbacks(self, read: Callable[[], int]) -> None:
        """Report `read()` (the worker's count, kept where the read path counts it) as the fallbacks counter."""
        self.snapshot_fallbacks.read = read

    def follow_snapshot_replica_lost(self, read: Callable[[], int]) -> None:
        """Report `read()` (the read path's count) as the counter of replicas left for the primary."""
        self.snapshot_replica_lost.read = read

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve /metrics on `addr`:`port` from a daemon thread (loopback unless told otherwise)."""
        start_http_server(port, addr=addr, registry=self.registry)


class _CallbackCounter(Collector):
    """A counter whose value is read at scrape time from where it is already counted (0 until told where)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.read: Callable[[], int] = lambda: 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.read())


def observe_each(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(value)` for each of `values`, in order, as of one batch of events.

    For a prometheus `Histogram` without labels, the same buckets and the same sum (added in the same order) are set
    once a bucket instead of under two locks a value: two observations an event, 5 us each, had been about a twentieth
    of a snapshot worker's CPU. Anything else (a histogram of another make, the benchmark's recorders) is told each
    value in turn."""
    if not values:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if (
        type(histogram) is not Histogram
        or histogram._labelnames
        or bounds is None
        or buckets is None
        or total is None
        or len(bounds) != len(buckets)
    ):
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    summed = total.get()
    for value in values:
        summed += value
        at = bisect_left(bounds, value)  # the first bound >= value: the bucket `observe` counts it in
        if at < len(counts) and value == value:  # (NaN: in no bucket, as `observe` leaves it)
            counts[at] += 1
    total.set(summed)
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
