"""Prometheus metrics of one worker, in a registry of its own (so tests can run several workers in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_CANDIDATE_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


class Metrics:
    """Everything `/metrics` shows: outcomes, alerts, dead letters, latencies, candidates, lag, index size."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter("incident_worker_events", "Stream entries handled, by outcome", ["outcome"], registry=r)
        self.alerts = Counter("incident_worker_alerts", "Alerts published", registry=r)
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
        self.group_lag = Gauge(
            "incident_worker_group_lag", "Entries of the events stream not yet delivered to the group", registry=r
        )
        self.group_pending = Gauge(
            "incident_worker_group_pending", "Entries delivered to the group and not yet acknowledged", registry=r
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

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve /metrics on `addr`:`port` from a daemon thread (loopback unless told otherwise)."""
        start_http_server(port, addr=addr, registry=self.registry)
