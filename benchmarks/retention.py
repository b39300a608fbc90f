"""What retention costs and does, on a real redis-server started here.

* memory: N incidents of the benchmark's seeded workload indexed through the apply step, once with retention off and
  once on; the bookkeeping `{N}:expiry` measured with MEMORY USAGE (exact: SAMPLES 0) and as the difference in
  used_memory (the change log left out);
* expiry: those N incidents made due, then expired in passes of `EXPIRE_BATCH`: incidents per second and the server's
  time per incident (INFO commandstats of the expire function);
* flat: an ingest several windows long at a steady rate, expiry passes between batches as a worker runs them: the
  index size and its memory sampled once a window, which stay flat once the first window has passed.

Usage: python benchmarks/retention.py [--size N] [--flat-seconds S --window-ms W --rate R]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker import library, retention  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402

PIPELINE = 500


def _index_all(index: FingerprintIndex, items: list[tuple[str, int]]) -> None:
    for start in range(0, len(items), PIPELINE):
        index.execute([index.apply_command("add", i, fp) for i, fp in items[start : start + PIPELINE]])


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def memory(client: Any, size: int) -> dict[str, float]:
    items = [(i, fingerprint(bag)) for i, bag in Workload(seed=1).take(size)]
    found: dict[str, float] = {}
    for on in (False, True):
        client.flushall()
        index = FingerprintIndex(client)
        index.open()
        if on:
            retention.set_window(index, 30 * 86_400_000)
        base = _used(client)
        _index_all(index, items)
        changes = int(client.memory_usage(index.keys.changes, samples=0) or 0)
        per = (_used(client) - base - changes) / size
        found["index_on" if on else "index_off"] = round(per, 1)
        if on:
            found["expiry_memory_usage"] = round(int(client.memory_usage(index.keys.expiry, samples=0)) / size, 1)
    found["expiry_used_memory"] = round(found["index_on"] - found["index_off"], 1)
    return found


def expiry(client: Any, size: int) -> dict[str, float]:
    index = FingerprintIndex(client)
    retention.set_window(index, 1)  # everything indexed is due a millisecond later
    time.sleep(0.01)
    client.config_resetstat()
    started = time.perf_counter()
    result = retention.expire_due(index)
    seconds = time.perf_counter() - started
    stats = client.info("commandstats")
    call = stats.get("cmdstat_fcall", {"usec": 0, "calls": 0})  # only the expire function ran since the reset
    assert result.expired == size, result
    return {
        "expired": result.expired,
        "incidents_per_s": round(size / seconds),
        "server_us_per_incident": round(call["usec"] / size, 2),
        "calls": call["calls"],
    }


def flat(client: Any, seconds: float, window_ms: int, rate: int) -> list[dict[str, float]]:
    client.flushall()
    index = FingerprintIndex(client, "flat")
    index.open()
    retention.set_window(index, window_ms)
    workload = Workload(seed=2)
    samples = []
    started = time.monotonic()
    next_sample = started
    sent = 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate) - sent
        if due > 0:
            batch = [(i, fingerprint(bag)) for i, bag in workload.take(min(due, PIPELINE))]
            _index_all(index, batch)
            sent += len(batch)
        retention.expire_due(index, budget_s=0.05)
        if time.monotonic() >= next_sample:
            next_sample += window_ms / 1000
            count = len(index)
            fp = int(client.memory_usage(index.keys.fingerprints, samples=0) or 0)
            exp = int(client.memory_usage(index.keys.expiry, samples=0) or 0)
            changes = int(client.memory_usage(index.keys.changes, samples=0) or 0)
            samples.append(
                {
                    "t_s": round(time.monotonic() - started, 1),
                    "sent": sent,
                    "indexed": count,
                    "fp_and_expiry_bytes": fp + exp,
                    "used_memory_but_change_log": _used(client) - changes,  # the workers trim the log apart
                }
            )
        else:
            time.sleep(0.005)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--flat-seconds", type=float, default=0)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = server.client()
            library.load(client)
            print(f"memory at N={args.size:,}, bytes per incident:", memory(client, args.size))
            print(f"expiring N={args.size:,} in passes of {retention.EXPIRE_BATCH}:", expiry(client, args.size))
            if args.flat_seconds:
                print(f"ingest of {args.flat_seconds:.0f} s at {args.rate}/s, window {args.window_ms} ms:")
                for sample in flat(client, args.flat_seconds, args.window_ms, args.rate):
                    print("  ", sample)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
