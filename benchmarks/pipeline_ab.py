"""One worker on the snapshot path, two checkouts of the code alternately, on one pre-loaded index (issue 25, 1M).

Starts a redis-server of its own, bulk-loads N incidents of the benchmark's seeded Zipf workload (namespace
"bench", 4 bands), then for each round and each checkout given (`--code DIR`, in turn): publishes M events, starts
one worker process whose `worker` package is imported from that checkout (`StreamWorker`, the code of
`incident-worker run`, `READ_PATH=snapshot`, the benchmark's settings), lets it load its copy, and times it from its
first read until the group is idle: events/s, and the primary's CPU and FCALL time an event. Each checkout loads its
own Functions library (their names carry their hash), so both run against the same index. With `--profile FILE`
the worker of the last checkout given runs under cProfile in the last round, its stats written to FILE and its
read-ahead thread's to FILE.ahead (cProfile slows it: its rate is not comparable); a FILE ending in .txt samples both
threads with py-spy instead (`pip install py-spy` into the venv; raw collapsed stacks; `AB_GIL=1`: only the samples
of the thread holding the GIL, i.e. the worker's Python CPU). `AB_PHASES=1` adds the main
thread's wall time an event per phase (refresh, search, build, execute, settle) to each round's line; a checkout
given as DIR@SECONDS runs with sys.setswitchinterval(SECONDS); `AB_GC=1` adds the cyclic garbage collector's time an
event (t_gc).

Usage: python benchmarks/pipeline_ab.py --code /work/main --code . [--size N] [--events M] [--rounds R]
           [--seed S] [--profile FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

import redis  # noqa: E402

from worker.devtools.redis_server import scratch_server  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.formats import IncidentEvent  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402
from worker.keys import IndexKeys  # noqa: E402

# The worker process: imports `worker` from the checkout given as argv[1]; prints one JSON line.
WORKER = r"""
import cProfile, json, sys, time
sys.path.insert(0, sys.argv[1])
from worker.connection import connect
from worker.logs import configure_logging
from worker.settings import Settings
from worker.stream import StreamWorker
configure_logging("json", "error")
settings = Settings(redis_url=sys.argv[2], namespace="bench", bands=4, consumer="ab", batch_size=100, block_ms=50,
                    claim_idle_ms=600_000, summary_interval_s=3600, alerts_maxlen=10_000, socket_timeout_s=120,
                    read_path="snapshot")
import os, threading
TIMES = {}
if os.environ.get("AB_PHASES"):  # where the main thread's time goes, phase by phase (wall time, summed)
    from worker import processing, readpath, index as index_module
    def timed(owner, name, label):
        inner = getattr(owner, name)
        def wrapper(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return inner(*args, **kwargs)
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                TIMES[label] = TIMES.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)
    timed(readpath.SnapshotReader, "refresh", "refresh")
    timed(readpath.SnapshotReader, "claims", "search")
    timed(processing.Processor, "_command", "build")
    timed(index_module.FingerprintIndex, "execute", "execute")
    timed(processing.Processor, "_settle_replies", "settle")
    timed(processing.Processor, "prepare", "prepare (main thread)")
    timed(processing.Processor, "_read", "read (main thread)")
    timed(processing.Processor, "read_and_process", "all")
    if os.environ.get("AB_PHASES") == "2":  # the refresh's parts, and the sends' writes and reply waits
        from worker import snapshot as snapshot_module, transport as transport_module
        timed(readpath.ChangeFollower, "_read_log", "refresh: log read")
        timed(snapshot_module.MemoryIndex, "apply", "refresh: apply")
        timed(processing.Processor, "_snapshot_adds", "pack")
        timed(processing.Processor, "_send_ahead", "sends ahead")
        timed(transport_module.ConnectionTransport, "receive", "reply wait")
if os.environ.get("AB_GC"):  # the cyclic collector's own time (wall, summed over its passes), as t_gc
    import gc
    gc_started = []
    def gc_clock(phase, info):
        if phase == "start":
            gc_started.append(time.perf_counter())
        elif gc_started:
            TIMES["gc"] = TIMES.get("gc", 0.0) + time.perf_counter() - gc_started.pop()
    gc.callbacks.append(gc_clock)
if os.environ.get("AB_SWITCH"):
    sys.setswitchinterval(float(os.environ["AB_SWITCH"]))
worker = StreamWorker(connect(settings), settings)
worker.setup()  # loads the copy: not timed
TIMES.clear()  # (the load ran through refresh: its seconds are no phase of the events)
assert worker.snapshot is not None
print("ready", flush=True)
sys.stdin.readline()
profile = cProfile.Profile() if sys.argv[3] else None
if profile:  # the read-ahead thread too, in a profile of its own (merged)
    from worker import processing
    ahead_profile = cProfile.Profile()
    inner_read_ahead = processing.Processor._read_ahead
    def read_ahead(self):
        ahead_profile.enable()
        try:
            return inner_read_ahead(self)
        finally:
            ahead_profile.disable()
    processing.Processor._read_ahead = read_ahead
started, cpu = time.perf_counter(), time.process_time()
if profile:
    profile.enable()
worker.run(until_idle=True)
if profile:
    profile.disable()
    profile.dump_stats(sys.argv[3])
    ahead_profile.dump_stats(sys.argv[3] + ".ahead")
print(json.dumps({"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                  "fallbacks": worker.snapshot.fallbacks, **{"t_" + k: v for k, v in TIMES.items()}}), flush=True)
"""


def primary_stats(client: redis.Redis) -> tuple[float, float, int]:
    cpu = client.info("cpu")
    fcall = client.info("commandstats").get("cmdstat_fcall", {})
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), float(fcall.get("usec", 0)), 0


def run_one(url: str, code: Path, client: redis.Redis, events: int, profile: str) -> dict[str, float]:
    env = dict(os.environ)
    if "@" in str(code):  # DIR@SECONDS: that checkout with sys.setswitchinterval(SECONDS) (an experiment)
        path, _, env["AB_SWITCH"] = str(code).partition("@")
        code = Path(path)
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(code), url, "" if profile.endswith(".txt") else profile],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": str(code)},
    )
    assert process.stdout is not None and process.stdin is not None
    ready = process.stdout.readline().strip()
    if ready != "ready":
        raise SystemExit(f"the worker of {code} did not start: {ready!r}")
    spy = None
    if profile.endswith(".txt"):  # py-spy, every thread, sampled from outside (cProfile sees one thread only)
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "-p",
                str(process.pid),
                "-f",
                "raw",
                "-r",
                "400",
                "-o",
                profile,
                "--nonblocking",
                *(["--gil"] if os.environ.get("AB_GIL") else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        profile = ""
    cpu0, usec0, _ = primary_stats(client)
    process.stdin.write("go\n")
    process.stdin.flush()
    report = json.loads(process.stdout.readline())
    process.wait(timeout=60)
    if spy is not None:
        spy.wait(timeout=60)
    cpu1, usec1, _ = primary_stats(client)
    return {
        "events_per_s": events / report["seconds"],
        "worker_cpu_us": report["cpu"] * 1e6 / events,
        "primary_cpu_us": (cpu1 - cpu0) * 1e6 / events,
        "fcall_us": (usec1 - usec0) / events,
        "fallbacks": report["fallbacks"],
        **{k: v * 1e6 / events for k, v in report.items() if k.startswith("t_")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", type=Path, required=True, help="a checkout (repeat: A, B, ...)")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", default="", help="cProfile the last checkout's worker in the last round")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with scratch_server() as server:
        client = redis.Redis.from_url(server.url)
        workload = Workload(seed=args.seed)
        index = FingerprintIndex(client, "bench", bands=4)
        index.open()
        started = time.perf_counter()
        ids, fps = workload.fingerprints(args.size)  # numpy: the bench's own pre-load, minutes faster at 10M
        index.bulk_load(zip(ids, fps.tolist(), strict=True))
        del ids, fps
        print(f"pre-loaded {args.size:,} in {time.perf_counter() - started:.1f} s", flush=True)
        for code in {str(code).partition("@")[0] for code in args.code}:  # each checkout's own library
            loader = "import sys, redis; sys.path.insert(0, sys.argv[1]); from worker import library; "
            loader += "library.load(redis.Redis.from_url(sys.argv[2]))"
            subprocess.run([sys.executable, "-c", loader, code, server.url], check=True)
        rates: dict[str, list[dict[str, float]]] = {str(code): [] for code in args.code}
        for round_ in range(args.rounds):
            for k, code in enumerate(args.code):
                pipe = client.pipeline(transaction=False)
                for incident_id, bag in workload.take(args.events):
                    fields = IncidentEvent(incident_id=incident_id, features=bag).to_fields()
                    pipe.xadd(IndexKeys("bench").events_stream, fields)  # type: ignore[arg-type]
                pipe.execute()
                last = round_ == args.rounds - 1 and k == len(args.code) - 1
                result = run_one(server.url, code, client, args.events, args.profile if last else "")
                rates[str(code)].append(result)
                print(
                    f"round {round_ + 1} {code}: " + json.dumps({k: round(v, 1) for k, v in result.items()}),
                    flush=True,
                )
        print(f"load average at the end: {os.getloadavg()}")
        for code, results in rates.items():
            keep = results[:-1] if args.profile and code == str(args.code[-1]) and len(results) > 1 else results
            print(
                f"{code}: median events/s {statistics.median(r['events_per_s'] for r in keep):,.0f}, "
                f"worker CPU {statistics.median(r['worker_cpu_us'] for r in keep):.1f} us/event, "
                f"primary CPU {statistics.median(r['primary_cpu_us'] for r in keep):.1f} us/event"
            )


if __name__ == "__main__":
    main()
