"""The benchmark behind `incident-worker bench` (worker/commands/bench.py), on a real Redis, through the real
worker pipeline.

What it measures, in one run, so that ratios compare like with like on a noisy machine:

* fingerprinting: the straightforward 64-steps-per-token loop against `fingerprint`, warm and on unique tokens;
* full ingest: events/s of one worker process indexing a backlog into an empty index, default layout against the
  classic 8 bands;
* for each index size N: pre-load N incidents (bulk, no matching), then on the events that follow measure sustained
  events/s with one and with two worker processes, p50/p99 end-to-end latency (XADD to acknowledgement) at a steady
  half of the measured maximum, candidates verified per event, Redis CPU per event (INFO commandstats and the
  server's own CPU clock), and Redis memory per indexed incident; for the default layout, the classic 8 bands and
  the layout `recommend_bands` picks for N, beside an in-process baseline (the straightforward fingerprint loop and
  a Python dict of band sets) on the same events.

Workers are separate processes running `StreamWorker`, the code of `incident-worker run`; they report what they
measured through a queue.
"""

from __future__ import annotations

import csv
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from .. import library
from ..bands import DEFAULT_BANDS, BandLayout, copies_bands, recommend_bands
from ..fingerprint import fingerprint, fingerprint_reference
from ..index import FingerprintIndex
from ..keys import IndexKeys
from ..library import FN_TRIM_CHANGES
from ..limits import DEFAULT_SNAPSHOT_MAX_CANDIDATES
from ..metrics import Metrics
from ..readpath import SNAPSHOT_SEND
from ..replies import text as as_text
from ..snapshot import MemoryIndex
from .benchio import backlog_done, fcall_usec, packed_xadds, publish, run_header, send_xadds, server_cpu, stream_fields
from .benchpage import main, markdown, page_blocks, update_page
from .workload import Workload

__all__ = ["markdown", "page_blocks", "run_benchmark", "update_page"]

CLASSIC_BANDS = 8

LARGEST_ALL_LAYOUTS = 1_000_000
"""Above this N the benchmark measures one layout unless --layouts names others: the one `stats` advises where the
workers search their own copies, with its snapshot read path (`bands.copies_bands` with the copy's default budget:
the default's 4 bands at ten million, whose copy searches stay within SNAPSHOT_MAX_CANDIDATES; the classic layout
verifies about 4% of the index an event on the primary: hours at ten million), and skips the in-process
baseline."""

CHANGE_LOG_DAYS = 30
"""The pre-load's N incidents are taken as this many days of them (the issue's premise: 30 days at a few events a
second, about ten million), so that the change log trimmed to CHANGES_KEEP's default day holds N / 30 changes."""

TRIM_ENTRIES = 100_000
"""Entries one call of the library's trim removes at most, when the benchmark trims the pre-load's change log."""

PRELOAD_CHUNK = 200_000
"""Incidents a pre-load writes in one pipelined batch (worker/bulkload.py): fewer, larger posting-set commands."""


# -- the worker processes -------------------------------------------------------------------------------------


class _Recorder:
    """Stands in for a histogram: keeps every observation (and when the first and last one came)."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.first = 0.0
        self.last = 0.0

    def observe(self, value: float) -> None:
        now = time.time()
        if not self.values:
            self.first = now
        self.last = now
        self.values.append(value)


def _worker_process(url: str, options: dict[str, Any], stop: Any, results: Any) -> None:
    """One benchmark worker: StreamWorker with recording metrics, until `stop` is set."""
    from ..connection import connect
    from ..logs import configure_logging
    from ..settings import Settings
    from ..stream import StreamWorker

    configure_logging("json", "error")
    settings = Settings(redis_url=url, **options)
    metrics = Metrics()
    latency, candidates = _Recorder(), _Recorder()
    metrics.end_to_end_seconds = latency  # type: ignore[assignment]
    metrics.candidates = candidates  # type: ignore[assignment]
    worker = StreamWorker(connect(settings), settings, metrics=metrics)
    if settings.read_path != "primary":
        # a worker that may make a copy compiles its loops as it starts (copyarrays.compile_soon): its heartbeat,
        # which the clock waits for, comes once they are ready, so the figures are of a started worker's events
        from ..copyarrays import wait_compiled

        wait_compiled()

    def stop_when_told() -> None:
        stop.wait()
        worker.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    worker.run()
    snapshot = worker.processor.snapshot
    copy = snapshot.index if snapshot is not None else None
    results.put(
        {
            "copy_incidents": len(copy) if copy is not None else 0,
            "copy_bytes": copy.nbytes() if copy is not None else 0,
            "copy_load_s": round(snapshot.follower.load_seconds, 2) if snapshot is not None else 0.0,
            "consumer": settings.consumer,
            "count": len(latency.values),
            "first": latency.first,
            "last": latency.last,
            "latency": latency.values,
            "candidates": candidates.values,
            "max_rss_kb": _peak_rss_kb(),
        }
    )


def _peak_rss_kb() -> int:
    """This process's own peak resident memory in KiB. Linux's ru_maxrss keeps the high-water mark of the process
    that forked it (across exec too), so a spawned worker would report the benchmark's peak: VmHWM belongs to this
    process's own address space."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@dataclass
class _Run:
    """Worker processes consuming the events stream of one namespace."""

    url: str
    namespace: str
    bands: int
    count: int
    batch_size: int = 100
    read_path: str = "primary"
    settings: dict[str, Any] | None = None
    """Settings of the workers other than the benchmark's own (say, max_candidates)."""

    def __post_init__(self) -> None:
        context = mp.get_context("spawn")
        self.stop = context.Event()
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=_worker_process,
                args=(
                    self.url,
                    {
                        "namespace": self.namespace,
                        "bands": self.bands,
                        "consumer": f"bench-{k}",
                        "batch_size": self.batch_size,
                        "block_ms": 50,
                        "claim_idle_ms": 600_000,
                        "summary_interval_s": 3600,
                        "alerts_maxlen": 10_000,
                        "socket_timeout_s": 120,
                        "read_path": self.read_path,
                        **(self.settings or {}),
                    },
                    self.stop,
                    self.results,
                ),
                daemon=True,
            )
            for k in range(self.count)
        ]
        for process in self.processes:
            process.start()

    def finish(self) -> list[dict[str, Any]]:
        self.stop.set()
        reports = [self.results.get(timeout=300) for _ in self.processes]
        for process in self.processes:
            process.join(timeout=30)
        return reports


# -- helpers --------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Events:
    """The benchmark's incidents: synthetic (a seeded Zipf workload) or real log lines turned into bags."""

    def __init__(self, seed: int, real_data: Path | None) -> None:
        self.real: list[dict[str, int]] | None = None
        self.next_id = 1
        if real_data is not None:
            from ..text import features_from_text

            bags = []
            for path in sorted(real_data.glob("*.csv")):
                with path.open(newline="", encoding="utf-8", errors="replace") as handle:
                    for row in csv.DictReader(handle):
                        try:
                            bags.append(features_from_text(row.get("Content") or ""))
                        except ValueError:
                            continue
            if not bags:
                raise SystemExit(f"no log lines with a Content column under {real_data}")
            self.real = bags
        self.workload = Workload(seed=seed)

    def preload(self, count: int) -> tuple[list[str], list[int]]:
        """The next `count` incidents as IDs and fingerprints: synthetic ones made in numpy (`Workload.fingerprints`,
        about a million a second, where bags as dicts would take minutes and gigabytes at ten million). Two lists,
        not a list of pairs: ten million tuples would be objects the garbage collector walks (a second's pause of
        the benchmark's publisher, measured as a latency tail)."""
        if self.real is None:
            ids, fps = self.workload.fingerprints(count)
            return ids, fps.tolist()
        items = self.take(count)
        return [incident_id for incident_id, _ in items], [fingerprint(bag) for _, bag in items]

    def take(self, count: int) -> list[tuple[str, dict[str, int]]]:
        if self.real is None:
            return self.workload.take(count)
        out = []
        for _ in range(count):
            bag = self.real[(self.next_id - 1) % len(self.real)]
            out.append((str(self.next_id), bag))
            self.next_id += 1
        return out


# -- measurements ---------------------------------------------------------------------------------------------


@dataclass
class Bench:
    client: redis.Redis
    url: str
    events: _Events
    measure: int
    cap_s: float
    latency_s: float
    log: Any

    def fresh(self, namespace: str) -> None:
        self.client.flushall()
        self.client.function_flush()
        library.load(self.client)  # as the deployment's administrator step would (the benchmark's server is its own)

    def throughput(
        self,
        namespace: str,
        bands: int,
        items: list[tuple[str, dict[str, int]]],
        workers: int,
        cap_s: float | None = None,
        read_path: str = "primary",
    ) -> dict[str, Any]:
        """Events/s of `workers` processes on a backlog of `items`, capped at cap_s; candidates and server time."""
        keys = IndexKeys(namespace)
        run = _Run(self.url, namespace, bands, workers, read_path=read_path)
        startup = self._wait_for_workers(keys, workers)
        # the producer's work (the entries, and their XADDs written for the wire) done before the clock starts, not
        # charged to the workers; sending them and Redis's appends are in it
        xadds = packed_xadds(self.client, keys.events_stream, stream_fields(items))
        usec0, cpu0 = fcall_usec(self.client), server_cpu(self.client)
        started = time.time()
        send_xadds(self.client, xadds)
        deadline = time.monotonic() + (self.cap_s if cap_s is None else cap_s)
        while time.monotonic() < deadline and not backlog_done(self.client, keys.events_stream, "incident-workers"):
            time.sleep(0.02)
        reports = run.finish()
        usec1, cpu1 = fcall_usec(self.client), server_cpu(self.client)
        done = sum(r["count"] for r in reports)
        last = max((r["last"] for r in reports if r["count"]), default=started)
        candidates = [c for r in reports for c in r["candidates"]]
        self.client.delete(keys.events_stream)  # what was not processed within the cap is not measured again
        elapsed = max(last - started, 1e-9)
        return {
            "workers": workers,
            "events": done,
            "offered": len(items),
            "capped": done < len(items),
            "seconds": round(elapsed, 2),
            "events_per_s": round(done / elapsed, 1),
            "candidates_mean": round(statistics.fmean(candidates), 1) if candidates else 0.0,
            "candidates_p99": _percentile(candidates, 0.99),
            "fcall_usec_per_event": round((usec1 - usec0) / max(done, 1), 1),
            "redis_cpu_usec_per_event": round((cpu1 - cpu0) * 1e6 / max(done, 1), 1),
            "startup_s": startup,
            "worker_max_rss_mb": round(max(r.get("max_rss_kb", 0) for r in reports) / 1024, 1),
            **_copy_figures(reports),
        }

    def _wait_for_workers(self, keys: IndexKeys, workers: int) -> float:
        """Seconds until every worker process beats: imported, connected and, on the snapshot path, its copy loaded."""
        started = time.monotonic()
        # the workers' own heartbeat keys (bench-0, bench-1, ...), not a SCAN of the keyspace: on a 1M index that is
        # ~26,000 round trips a poll, which slowed the very start-up being timed (25 s measured against 9 s)
        beats = [keys.heartbeat(f"bench-{k}") for k in range(workers)]
        while time.monotonic() - started < 600 and self.client.exists(*beats) < workers:
            time.sleep(0.05)
        time.sleep(0.2)
        return round(time.monotonic() - started, 2)

    def latency(self, namespace: str, bands: int, rate: float, read_path: str = "primary") -> dict[str, Any]:
        """p50/p99 from XADD to acknowledgement with one worker fed at a steady `rate` events/s."""
        keys = IndexKeys(namespace)
        count = max(200, min(int(rate * self.latency_s), 20_000))
        items = stream_fields(self.events.take(count))
        run = _Run(self.url, namespace, bands, 1, read_path=read_path)
        self._wait_for_workers(keys, 1)
        tick = 0.01
        per_tick = max(rate * tick, 0.01)
        started = time.monotonic()
        sent = 0.0
        while int(sent) < count:
            due = min(count, int((time.monotonic() - started) / tick * per_tick) + 1)
            if due > int(sent):
                publish(self.client, keys.events_stream, items[int(sent) : due])
                sent = float(due)
            time.sleep(tick / 2)
        deadline = time.monotonic() + self.cap_s
        while time.monotonic() < deadline and not backlog_done(self.client, keys.events_stream, "incident-workers"):
            time.sleep(0.02)
        [report] = run.finish()
        self.client.delete(keys.events_stream)
        values = [v * 1000 for v in report["latency"]]
        return {
            "rate": round(rate, 1),
            "events": len(values),
            "p50_ms": round(_percentile(values, 0.50), 2),
            "p99_ms": round(_percentile(values, 0.99), 2),
        }

    def memory_per_incident(self, before: int, count: int) -> float:
        return round((int(self.client.info("memory")["used_memory"]) - before) / max(count, 1), 1)

    def memory_breakdown(self, keys: IndexKeys, count: int, before: int) -> dict[str, Any]:
        """Where Redis's memory an incident goes: `{N}:fp` and the change log (MEMORY USAGE of every field or entry),
        the posting sets and the twin groups (MEMORY USAGE of each, or of an even sample of 100,000 scaled to their
        number), the keyspace's own table (MEMORY STATS: an entry and a bucket a key, which MEMORY USAGE leaves out),
        and the total without the change log (which trimming empties down to the last `changes_keep` of changes: the
        index's own share, the figure that grows with N)."""
        used = int(self.client.info("memory")["used_memory"])
        fp_hash = int(self.client.memory_usage(keys.fingerprints, samples=0) or 0)
        changes = int(self.client.memory_usage(keys.changes, samples=0) or 0)
        kinds: dict[str, list[bytes]] = {"band": [], "twins": []}
        for key in self.client.scan_iter(match=f"{keys.tag}:*", count=10_000):
            kind = key.split(b":", 2)[1].decode()
            if kind in kinds:
                kinds[kind].append(key)
        shares: dict[str, float] = {}
        for kind, names in kinds.items():
            sample = names[:: max(1, len(names) // 100_000)]
            sizes = 0
            for start in range(0, len(sample), 10_000):
                pipe = self.client.pipeline(transaction=False)
                for key in sample[start : start + 10_000]:
                    pipe.memory_usage(key, samples=0)
                sizes += sum(int(size or 0) for size in pipe.execute())
            shares[kind] = sizes / max(len(sample), 1) * len(names) / max(count, 1)
        keyspace = int(self.client.memory_stats().get("db.0", {}).get("overhead.hashtable.main", 0))
        return {
            "fp_hash_per_incident": round(fp_hash / max(count, 1), 1),
            "postings_per_incident": round(shares["band"], 1),
            "posting_sets": len(kinds["band"]),
            "twin_groups_per_incident": round(shares["twins"], 1),
            "twin_groups": len(kinds["twins"]),
            "keyspace_per_incident": round(keyspace / max(count, 1), 1),
            "memory_per_incident_without_change_log": round((used - before - changes) / max(count, 1), 1),
        }

    def trimmed(self, index: FingerprintIndex, count: int, before: int, loaded: int) -> dict[str, Any]:
        """Redis's memory an incident once the upkeep has trimmed the change log to a day (CHANGES_KEEP's default):
        N incidents being about CHANGE_LOG_DAYS days of them (the issue's premise), the log then holds the last
        N / CHANGE_LOG_DAYS changes. The pre-load wrote all N at once, so they are trimmed here to that many, by the
        library's own trim (whole nodes, `changes_trimmed_to` recorded first, as the upkeep does). `loaded`: used_memory
        once the pre-load was written."""
        keys = index.keys
        log_before = int(self.client.memory_usage(keys.changes, samples=0) or 0)
        keep = max(1, count // CHANGE_LOG_DAYS)
        if int(self.client.xlen(keys.changes)) > keep:
            # the ID of the keep-th entry from the end, read in pages of IDs (the entries themselves are small)
            left, last = keep, "+"
            bound: str | None = None
            while left > 0:
                page: list[Any] = list(
                    self.client.xrevrange(keys.changes, last, "-", count=min(left, 50_000) + 1) or []
                )
                page = page[1:] if last != "+" else page
                if not page:
                    break
                page = page[:left]
                left -= len(page)
                last = bound = as_text(page[-1][0])
            if bound is not None:
                while int(index.call(FN_TRIM_CHANGES, [keys.meta, keys.changes], [bound, TRIM_ENTRIES])):
                    pass
        # what the trim gave back, by MEMORY USAGE of the log (used_memory moves with client buffers too, which at
        # small N outweigh it)
        freed = log_before - int(self.client.memory_usage(keys.changes, samples=0) or 0)
        return {
            "change_log_days": CHANGE_LOG_DAYS,
            "change_log_entries_after_trimming": int(self.client.xlen(keys.changes)),
            "memory_per_incident_after_trimming": round((loaded - before - freed) / max(count, 1), 1),
        }

    def change_log_share(self, keys: IndexKeys, count: int) -> dict[str, float]:
        """What the bulk load's entries in `{N}:changes` take of the memory per incident, and per entry.

        The load writes one change-log entry per incident at once; in steady state the log holds only the changes
        of the last `changes_keep` (a day by default), so the index's own share is the figure that grows with N.
        """
        used = int(self.client.memory_usage(keys.changes, samples=0) or 0)
        entries = int(self.client.xlen(keys.changes))
        return {
            "change_log_per_incident": round(used / max(count, 1), 1),
            "change_log_bytes_per_entry": round(used / max(entries, 1), 1),
        }


def _copy_figures(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """On the snapshot path: the first worker's copy, its load (HSCAN and arrays) and its bytes an incident
    (`MemoryIndex.nbytes`: its arrays, and its Python objects estimated)."""
    copies = [r for r in reports if r.get("copy_incidents")]
    if not copies:
        return {}
    first = copies[0]
    return {
        "copy_load_s": first["copy_load_s"],
        "copy_bytes_per_incident": round(first["copy_bytes"] / first["copy_incidents"], 1),
    }


def _fingerprint_speed(events: _Events, bags: int = 2000, repeats: int = 5) -> dict[str, Any]:
    """Microseconds per bag of the straightforward loop and of the fast path; each the best of `repeats` rounds.

    The best round is the one least disturbed by the machine (a shared VM steals time in bursts); the rounds of
    the three measurements are interleaved so that a slow phase does not fall on one of them only.
    """
    sample = [bag for _, bag in events.take(bags)]
    for bag in sample:
        fingerprint(bag)  # warm the token cache, as a running worker has it

    def per_bag(function: Callable[[dict[str, int]], int], bags: list[dict[str, int]]) -> float:
        started = time.perf_counter()
        for bag in bags:
            function(bag)
        return (time.perf_counter() - started) / len(bags)

    reference = warm = cold = float("inf")
    for round_ in range(repeats):
        reference = min(reference, per_bag(fingerprint_reference, sample[:300]))
        warm = min(warm, per_bag(fingerprint, sample))
        unique = [{f"u{round_}.{n}-{token}": w for token, w in bag.items()} for n, bag in enumerate(sample)]
        cold = min(cold, per_bag(fingerprint, unique))
    tokens = statistics.fmean(len(bag) for bag in sample)
    return {
        "tokens_per_bag": round(tokens, 1),
        "reference_us": round(reference * 1e6, 1),
        "fast_repeating_us": round(warm * 1e6, 1),
        "fast_unique_us": round(cold * 1e6, 1),
        "speedup_repeating": round(reference / warm, 1),
        "speedup_unique": round(reference / cold, 1),
    }


class _Baseline:
    """A single-process library: the straightforward fingerprint loop and a dict of band sets (classic 8 bands)."""

    def __init__(self, max_distance: int = 7) -> None:
        self.layout = BandLayout(CLASSIC_BANDS, max_distance)
        self.bands: list[dict[int, set[str]]] = [defaultdict(set) for _ in range(CLASSIC_BANDS)]
        self.fps: dict[str, int] = {}

    def load(self, items: Iterable[tuple[str, int]]) -> None:
        for incident_id, fp in items:
            self.fps[incident_id] = fp
            for band, value in zip(self.bands, self.layout.values(fp), strict=True):
                band[value].add(incident_id)

    def add(self, incident_id: str, bag: dict[str, int]) -> int:
        fp = fingerprint_reference(bag)
        candidates: set[str] = set()
        for band, value in zip(self.bands, self.layout.values(fp), strict=True):
            candidates |= band.get(value, set())
        sorted((d, c) for c in candidates if (d := (self.fps[c] ^ fp).bit_count()) <= self.layout.max_distance)
        self.load([(incident_id, fp)])
        return len(candidates)

    def throughput(self, items: list[tuple[str, dict[str, int]]], cap_s: float) -> dict[str, Any]:
        started = time.perf_counter()
        seen: list[int] = []
        for incident_id, bag in items:
            seen.append(self.add(incident_id, bag))
            if time.perf_counter() - started > cap_s:
                break
        elapsed = time.perf_counter() - started
        return {
            "events": len(seen),
            "offered": len(items),
            "events_per_s": round(len(seen) / elapsed, 1),
            "candidates_mean": round(statistics.fmean(seen), 1) if seen else 0.0,
        }


def _copy_search(
    fps: Iterable[tuple[str, int]], items: list[tuple[str, dict[str, int]]], bands: int = DEFAULT_BANDS
) -> dict[str, Any]:
    """The snapshot path's search alone, in process: the worker's copy of `fps` (`MemoryIndex`, numpy, `bands` bands:
    the layout the snapshot path was measured on, the last if several), searched for
    each of `items` the way a worker searches a send (SNAPSHOT_SEND at a time), nothing indexed. The bare search a
    pipeline is measured against: no Redis, no stream, no fingerprinting (`items` are fingerprinted first)."""
    copy = MemoryIndex(BandLayout(bands, 7))
    started = time.perf_counter()
    copy.load(fps)
    load_s = time.perf_counter() - started
    queries = [(fingerprint(bag), incident_id) for incident_id, bag in items]
    best = float("inf")
    found = 0
    for _ in range(3):
        started = time.perf_counter()
        found = 0
        for start in range(0, len(queries), SNAPSHOT_SEND):
            found += sum(r.match_count for r in copy.search_many(queries[start : start + SNAPSHOT_SEND], limit=116))
        best = min(best, time.perf_counter() - started)
    return {
        "queries": len(queries),
        "queries_per_s": round(len(queries) / max(best, 1e-9), 1),
        "us_per_query": round(best * 1e6 / max(len(queries), 1), 1),
        "matches_mean": round(found / max(len(queries), 1), 2),
        "load_s": round(load_s, 2),
        "bytes_per_incident": round(copy.nbytes() / max(len(copy), 1), 1),
        "bands": bands,
    }


# -- the run --------------------------------------------------------------------------------------------------


def _layouts(size: int, max_distance: int = 7) -> list[tuple[str, int]]:
    recommended = recommend_bands(size, max_distance)
    layouts = [("default", DEFAULT_BANDS), ("classic", CLASSIC_BANDS)]
    if recommended not in (DEFAULT_BANDS, CLASSIC_BANDS):
        layouts.append(("recommended", recommended))
    return layouts


def _measured(size: int, chosen: list[str] | None) -> list[tuple[str, int]]:
    """The layouts measured at `size`: `chosen` (--layouts), else all up to LARGEST_ALL_LAYOUTS and above it the one
    `stats` advises for the snapshot read path (`bands.copies_bands`)."""
    layouts = _layouts(size)
    if chosen is not None:
        return [(name, bands) for name, bands in layouts if name in chosen]
    if size <= LARGEST_ALL_LAYOUTS:
        return layouts
    advised = copies_bands(size, 7, DEFAULT_SNAPSHOT_MAX_CANDIDATES)
    return [next((name, bands) for name, bands in layouts if bands == advised)]


def _with_snapshot(size: int, name: str) -> bool:
    """Whether the snapshot read path is measured on layout `name` at `size`: the default's, and above
    LARGEST_ALL_LAYOUTS the recommended's too (with --layouts naming it)."""
    return name == "default" or (name == "recommended" and size > LARGEST_ALL_LAYOUTS)


def run_benchmark(
    *,
    url: str,
    sizes: list[int],
    ingest: int,
    measure: int,
    cap_s: float,
    ingest_cap_s: float,
    latency_s: float,
    seed: int,
    real_data: Path | None,
    log: Any,
    layouts: list[str] | None = None,
) -> dict[str, Any]:
    client = redis.Redis.from_url(url, socket_timeout=300)
    events = _Events(seed, real_data)
    bench = Bench(client, url, events, measure, cap_s, latency_s, log)
    results = run_header(client)
    results["workload"] = "real log lines" if real_data else f"Zipf vocabulary, seed {seed}"
    log("fingerprinting ...")
    results["fingerprint"] = _fingerprint_speed(events)

    if ingest:
        results["ingest"] = {}
        items = events.take(ingest)
        for name, bands in (("default", DEFAULT_BANDS), ("classic", CLASSIC_BANDS)):
            log(f"full ingest of {ingest:,} events, {name} layout ({bands} bands) ...")
            bench.fresh(name)
            FingerprintIndex(client, "ingest", bands=bands).open()
            results["ingest"][name] = {"bands": bands, **bench.throughput("ingest", bands, items, 1, ingest_cap_s)}
        default, classic = results["ingest"]["default"], results["ingest"]["classic"]
        results["ingest"]["ratio"] = round(default["events_per_s"] / max(classic["events_per_s"], 1e-9), 1)

    results["sizes"] = []
    for size in sizes:
        log(f"N={size:,}: making the pre-load ...")
        started = time.perf_counter()
        ids, fp_list = events.preload(size)
        made = time.perf_counter() - started

        follow = events.take(measure * 5)
        row: dict[str, Any] = {"indexed": size, "layouts": {}}
        snapshot_bands = DEFAULT_BANDS
        for name, bands in _measured(size, layouts):
            layout = BandLayout(bands, 7)
            log(f"N={size:,}: {name} layout, {layout.description} ...")
            bench.fresh("bench")
            before = int(client.info("memory")["used_memory"])
            index = FingerprintIndex(client, "bench", bands=bands)
            started = time.perf_counter()
            index.bulk_load(zip(ids, fp_list, strict=True), chunk=PRELOAD_CHUNK)
            loaded = time.perf_counter() - started
            used = int(client.info("memory")["used_memory"])
            result: dict[str, Any] = {
                "bands": bands,
                "layout": layout.description,
                "probes": layout.probes,
                "preload_made_s": round(made, 1),
                "preload_s": round(loaded, 1),
                "preload_per_s": round(size / max(loaded, 1e-9)),
                "memory_per_incident": bench.memory_per_incident(before, size),
                **bench.change_log_share(IndexKeys("bench"), size),
                **bench.memory_breakdown(IndexKeys("bench"), size, before),
                **bench.trimmed(index, size, before, used),
            }
            one = bench.throughput("bench", bands, follow[:measure], 1)
            two = bench.throughput("bench", bands, follow[measure : 2 * measure], 2)
            result["one_worker"], result["two_workers"] = one, two
            result["latency_half_load"] = bench.latency("bench", bands, one["events_per_s"] / 2)
            if _with_snapshot(size, name):
                log(f"N={size:,}: {name} layout, snapshot read path ...")
                snapshot_bands = bands
                snap_one = bench.throughput("bench", bands, follow[2 * measure : 3 * measure], 1, read_path="snapshot")
                snap_two = bench.throughput("bench", bands, follow[3 * measure : 4 * measure], 2, read_path="snapshot")
                result["snapshot"] = {
                    "one_worker": snap_one,
                    "two_workers": snap_two,
                    "latency_half_load": bench.latency(
                        "bench", bands, snap_one["events_per_s"] / 2, read_path="snapshot"
                    ),
                }
            row["layouts"][name] = result
        if size <= LARGEST_ALL_LAYOUTS:  # a dict of sets an incident: gigabytes and minutes at ten million
            log(f"N={size:,}: in-process baseline ...")
            baseline = _Baseline()
            baseline.load(zip(ids, fp_list, strict=True))
            row["baseline"] = baseline.throughput(follow[:measure], cap_s)
            del baseline
        row["copy_search"] = _copy_search(zip(ids, fp_list, strict=True), follow[:measure], snapshot_bands)
        del ids, fp_list
        results["sizes"].append(row)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    client.close()
    return results


# -- report ---------------------------------------------------------------------------------------------------


if __name__ == "__main__":  # python -m worker.devtools.benchmark: the page renderer (benchpage.py)
    raise SystemExit(main())
