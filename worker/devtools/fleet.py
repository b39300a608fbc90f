"""`incident-worker bench --fleet 1,2,4` (and `benchmarks/fleet.py`): the primary's CPU an event with 1, 2 and 4
snapshot-path workers, their copies fed from the primary or from a replica, what it is made of, and its projection to
8, 16 and 32 workers with the primary's one-core ceiling (issue 25, "the fleet").

Starts a primary and a replica of it (REPLICAOF), each a redis-server of its own (whatever Redis the rest of the
bench uses); bulk-loads N incidents of the benchmark's seeded Zipf workload; then, for each worker count and each
source of the copies (interleaved, so the index's growth and the machine's noise fall on both alike), starts that
many worker processes (`StreamWorker`, the code of `incident-worker run`, on the snapshot path, with
`snapshot_replica_url` for the replica; one send at a time, `SNAPSHOT_SENDS_ALONE=1`, as a worker with peers sends,
so that a single worker's row is of the same schedule as the others'), waits until every copy is loaded, publishes M
events (all at once: a backlog, the primary's ceiling; or at a steady rate) and times them until the group is idle.
Measured on the primary from INFO, for the events only (the copies' loads come before): its CPU (used_cpu_sys +
used_cpu_user) an event, FCALL's time an event, the replica's CPU an event, the changes validated an event; with
`by_command`, the primary's time by part of the workers (SLOWLOG of every command: FCALL by function, the copies'
reads, heartbeats, upkeep).
Then fits primary CPU an event = fixed + per worker x workers to each source (least squares over the measured
counts) and projects 8, 16 and 32 workers, with the primary's ceiling (one core: 1e6 / us an event).

With `tail_followers` K, it measures the change log's tail alone instead: one worker whose copy reads the replica,
with no other copy and then with K processes that only follow the primary's log (load, then catch up every 5 ms).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from .. import library
from ..bands import DEFAULT_BANDS
from ..fingerprint import fingerprint
from ..index import FingerprintIndex
from ..keys import IndexKeys
from .benchio import backlog_done, fcall_usec, packed_xadds, publish, send_xadds, server_cpu, stream_fields
from .benchmark import _Recorder
from .benchpage import CHANGE_US, PROJECTED, fleet_markdown
from .redis_server import RedisServer
from .workload import Workload

__all__ = ["fleet_markdown", "projection", "run_fleet"]

NAMESPACE = "bench"


def _worker(url: str, replica_url: str | None, consumer: str, stop: Any, results: Any) -> None:
    """One worker process on the snapshot path, its copy read from `replica_url` when given, until `stop`."""
    from ..connection import connect, connect_replica
    from ..logs import configure_logging
    from ..metrics import Metrics
    from ..settings import Settings
    from ..stream import StreamWorker

    configure_logging("json", "error")
    settings = Settings(
        redis_url=url,
        snapshot_replica_url=replica_url,
        namespace=NAMESPACE,
        consumer=consumer,
        read_path="snapshot",
        batch_size=100,
        block_ms=50,
        claim_idle_ms=600_000,
        summary_interval_s=3600,
        alerts_maxlen=10_000,
        socket_timeout_s=120,
        # one send at a time, as every worker with peers sends: the fit and its projection are of the fleet's
        # schedule (a lone worker writes its sends ahead, and the windows that adds are its own row of the bench)
        snapshot_sends_alone=1,
    )
    metrics = Metrics()
    candidates = _Recorder()
    metrics.candidates = candidates  # type: ignore[assignment]
    worker = StreamWorker(connect(settings), settings, metrics=metrics, replica=connect_replica(settings))

    def stop_when_told() -> None:
        stop.wait()
        worker.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    worker.run()
    described = worker.snapshot.describe() if worker.snapshot is not None else {}
    results.put({"consumer": consumer, "candidates": candidates.values, "snapshot": described})


def _follower(url: str, stop: Any, every_s: float) -> None:
    """A copy that follows the primary's change log (a worker's tail, without its searches or calls): loads once,
    then catches up every `every_s`, as a worker does before each send of SNAPSHOT_SEND events."""
    from ..bands import BandLayout
    from ..readpath import ChangeFollower

    client = redis.Redis.from_url(url, socket_timeout=120)
    follower = ChangeFollower(client, IndexKeys(NAMESPACE), BandLayout(DEFAULT_BANDS, 7))
    follower.load()
    client.set(f"{{{NAMESPACE}}}:fleet-follower:{os.getpid()}", 1)
    while not stop.is_set():
        follower.catch_up()
        time.sleep(every_s)


def tail_cost(primary: RedisServer, replica: RedisServer, followers: int, items: list[Any]) -> dict[str, Any]:
    """One worker whose copy reads the replica, plus `followers` processes tailing the primary's change log: the
    primary's CPU an event, whose growth with `followers` is the tail's own cost, apart from the validation."""
    client = primary.client(socket_timeout=300)
    context = mp.get_context("spawn")
    stop = context.Event()
    processes = [
        context.Process(target=_follower, args=(primary.url, stop, 0.005), daemon=True) for _ in range(followers)
    ]
    for process in processes:
        process.start()
    while len(list(client.scan_iter(f"{{{NAMESPACE}}}:fleet-follower:*"))) < followers:
        time.sleep(0.05)
    try:
        row = run_once(primary, replica, 1, items)
    finally:
        stop.set()
        for process in processes:
            process.join(timeout=30)
        for key in client.scan_iter(f"{{{NAMESPACE}}}:fleet-follower:*"):
            client.delete(key)
        client.close()
    return {"followers": followers, **row}


def _publish_at(client: redis.Redis, stream: str, events: list[dict[str, str]], rate: float) -> None:
    """Publish `events` at `rate` a second, a slice every 10 ms (a steady load instead of a backlog)."""
    began = time.perf_counter()
    sent = 0
    while sent < len(events):
        due = min(len(events), int((time.perf_counter() - began) * rate) + 1)
        if due > sent:
            publish(client, stream, events[sent:due])
            sent = due
        time.sleep(0.01)


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """calls and usec of every command the server ran (those the functions run counted under their own names too)."""
    return {
        name.removeprefix("cmdstat_"): (int(row.get("calls", 0)), float(row.get("usec", 0)))
        for name, row in client.info("commandstats").items()
    }


def _top_level(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """calls and usec of the commands the workers sent (SLOWLOG, logging every command: those the functions run are
    not in it), FCALL by function; and, as `benchmark`, those of this script (publishing the events, polling)."""
    parts: dict[str, tuple[int, float]] = {}
    for entry in client.slowlog_get(-1):
        words = bytes(entry["command"]).split(b" ", 2)
        name = words[0].decode().lower()
        if name in ("fcall", "fcall_ro") and len(words) > 1:
            name = f"{name} {words[1].decode()}"
        if bytes(entry.get("client_address") or b"") == b"?:0":
            continue  # run by a function: counted in its FCALL
        if not bytes(entry.get("client_name") or b"").startswith(b"incident-worker"):
            name = "benchmark"
        calls, usec = parts.get(name, (0, 0.0))
        parts[name] = (calls + 1, usec + float(entry["duration"]))
    return parts


def run_once(
    primary: RedisServer,
    replica: RedisServer | None,
    workers: int,
    items: list[Any],
    *,
    by_command: bool = False,
    rate: float = 0.0,
) -> dict[str, Any]:
    client = primary.client(socket_timeout=300)
    replica_client = replica.client(socket_timeout=300) if replica is not None else None
    keys = IndexKeys(NAMESPACE)
    context = mp.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    cpu_before_start = server_cpu(client)
    processes = [
        context.Process(
            target=_worker,
            args=(primary.url, replica.url if replica else None, f"fleet-{k}", stop, results),
            daemon=True,
        )
        for k in range(workers)
    ]
    for process in processes:
        process.start()
    beats = [keys.heartbeat(f"fleet-{k}") for k in range(workers)]
    started = time.monotonic()
    while client.exists(*beats) < workers and time.monotonic() - started < 300:
        time.sleep(0.05)
    time.sleep(0.3)
    startup_cpu = server_cpu(client) - cpu_before_start
    if by_command:
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 1_000_000)
        client.slowlog_reset()
    stats0 = _commandstats(client)
    fcall0, cpu0 = fcall_usec(client), server_cpu(client)
    rcpu0 = server_cpu(replica_client) if replica_client is not None else 0.0
    fields = stream_fields(items)
    written = None if rate else packed_xadds(client, keys.events_stream, fields)  # (the producer's work: unclocked)
    began = time.perf_counter()
    if written is None:
        _publish_at(client, keys.events_stream, fields, rate)
    else:
        send_xadds(client, written)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not backlog_done(client, keys.events_stream, "incident-workers"):
        time.sleep(0.02)
    elapsed = time.perf_counter() - began
    fcall1, cpu1 = fcall_usec(client), server_cpu(client)
    stats1 = _commandstats(client)
    top: dict[str, tuple[int, float]] = {}
    if by_command:
        client.config_set("slowlog-log-slower-than", -1)
        top = _top_level(client)
        client.slowlog_reset()
    rcpu1 = server_cpu(replica_client) if replica_client is not None else 0.0
    stop.set()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    client.delete(keys.events_stream)
    done = len(items)
    candidates = [c for r in reports for c in r["candidates"]]
    cpu_us = (cpu1 - cpu0) * 1e6 / done
    fcall_us = (fcall1 - fcall0) / done
    row = {
        "source": "replica" if replica is not None else "primary",
        "workers": workers,
        "events": done,
        "events_per_s": round(done / elapsed),
        "primary_cpu_us_per_event": round(cpu_us, 1),
        "primary_fcall_us_per_event": round(fcall_us, 1),
        "primary_rest_us_per_event": round(cpu_us - fcall_us, 1),
        "replica_cpu_us_per_event": round((rcpu1 - rcpu0) * 1e6 / done, 1) if replica is not None else None,
        "changes_validated_per_event": round(statistics.fmean(candidates), 1) if candidates else 0.0,
        "primary_cpu_s_while_copies_loaded": round(startup_cpu, 2),
        "top_level": {
            name: [round(calls / done, 4), round(usec / done, 2)] for name, (calls, usec) in sorted(top.items())
        },
        "commands": {  # every command, those the functions ran included (INFO commandstats)
            name: [
                round((calls - stats0.get(name, (0, 0))[0]) / done, 4),
                round((usec - stats0.get(name, (0, 0))[1]) / done, 2),
            ]
            for name, (calls, usec) in sorted(stats1.items())
            if calls > stats0.get(name, (0, 0))[0]
        },
        "replica_left": sum(int(r["snapshot"].get("snapshot_replica_lost", 0)) for r in reports),
        "fallbacks": sum(int(r["snapshot"].get("snapshot_fallbacks", 0)) for r in reports),
    }
    client.close()
    if replica_client is not None:
        replica_client.close()
    return row


def fit(rows: list[dict[str, Any]], name: str) -> tuple[float, float]:
    """The least-squares line `name` = intercept + slope x workers over `rows`: (intercept, slope)."""
    xs = [float(r["workers"]) for r in rows]
    ys = [float(r[name]) for r in rows]
    if len(set(xs)) < 2:
        return ys[0], 0.0
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def _medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per source and worker count, the median of each figure over the rounds (a shared machine is noisy)."""
    rows = []
    for key in dict.fromkeys((r["source"], r["workers"]) for r in runs):
        same = [r for r in runs if (r["source"], r["workers"]) == key]
        row = dict(same[0])
        for name, value in row.items():
            if isinstance(value, (int, float)) and name != "workers":
                row[name] = round(statistics.median(r[name] for r in same), 1)
            elif isinstance(value, dict):  # per command: [calls, usec] an event, each the median over the rounds
                row[name] = {
                    command: [
                        round(statistics.median(r[name].get(command, [0, 0])[k] for r in same), 4 - 2 * k)
                        for k in (0, 1)
                    ]
                    for command in sorted({c for r in same for c in r[name]})
                }
        rows.append(row)
    return rows


def _replicate(primary: RedisServer, replica: RedisServer) -> None:
    """Make `replica` a replica of `primary` and wait until it holds what the primary holds."""
    with primary.client() as client, replica.client() as r:
        r.replicaof("127.0.0.1", primary.port)
        while True:
            info = r.info("replication")
            offset = int(client.info("replication")["master_repl_offset"])
            if info.get("master_link_status") == "up" and int(info.get("slave_repl_offset", -1)) >= offset:
                return
            time.sleep(0.1)


def run_fleet(
    *,
    size: int,
    events: int,
    workers: list[int],
    seed: int = 7,
    repeat: int = 1,
    by_command: bool = False,
    rate: float = 0.0,
    tail_followers: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The fleet measure (see the module's docstring) on a primary and a replica of its own; the figures."""
    workload = Workload(seed=seed)
    runs: list[dict[str, Any]] = []
    tails: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="incident-fleet-") as directory:
        (Path(directory) / "p").mkdir()
        (Path(directory) / "r").mkdir()
        primary = RedisServer(Path(directory) / "p")
        replica = RedisServer(Path(directory) / "r", load_functions=False)
        primary.start()
        replica.start()
        try:
            client = primary.client(socket_timeout=300)
            library.load(client)
            index = FingerprintIndex(client, NAMESPACE, bands=DEFAULT_BANDS)
            index.open()
            started = time.perf_counter()
            index.bulk_load([(i, fingerprint(bag)) for i, bag in workload.take(size)])
            log(f"fleet: loaded {size:,} incidents in {time.perf_counter() - started:.0f} s")
            client.close()
            _replicate(primary, replica)
            for round_ in range(repeat if tail_followers else 0):
                for followers in (0, tail_followers):
                    row = tail_cost(primary, replica, followers, workload.take(events))
                    tails.append(row)
                    log("fleet: " + json.dumps({"round": round_ + 1, **row}))
            for round_ in range(0 if tail_followers else repeat):
                for count in workers:
                    for source in (None, replica):
                        items = workload.take(events)
                        row = run_once(primary, source, count, items, by_command=by_command, rate=rate)
                        runs.append(row)
                        log(
                            f"fleet: round {round_ + 1}, {count} worker(s), copies read the {row['source']}: "
                            f"primary CPU {row['primary_cpu_us_per_event']} us an event"
                        )
        finally:
            replica.stop()
            primary.stop()
    rows = _medians(runs)
    return {
        "size": size,
        "events": events,
        "seed": seed,
        "repeat": repeat,
        "rate": rate,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
        "projection": projection(rows),
        "runs": [{k: v for k, v in run.items() if k != "commands"} for run in runs],  # (in rows, as medians)
        "tails": tails,
        "tail_followers": tail_followers,
    }


def projection(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per source of the copies: primary CPU an event = fixed + per_worker x workers (least squares), the changes
    validated an event likewise (the validation's share of the growth), and the cost and ceiling at 8, 16, 32."""
    fits: dict[str, Any] = {}
    for source in ("primary", "replica"):
        same = [r for r in rows if r["source"] == source]
        if not same:
            continue
        fixed, per_worker = fit(same, "primary_cpu_us_per_event")
        window0, window_per_worker = fit(same, "changes_validated_per_event")
        per_worker = max(per_worker, 0.0)  # a slope within the noise below zero: flat
        fits[source] = {
            "fixed_us": round(fixed, 1),
            "per_worker_us": round(per_worker, 2),
            "changes_validated": round(window0, 1),
            "changes_validated_per_worker": round(window_per_worker, 1),
            "window_per_worker_us": round(window_per_worker * CHANGE_US, 2),
            "projected": {
                str(k): {
                    "us": round(fixed + per_worker * k, 1),
                    "ceiling": round(1e6 / max(fixed + per_worker * k, 1e-9)),
                }
                for k in PROJECTED
            },
        }
    return fits
