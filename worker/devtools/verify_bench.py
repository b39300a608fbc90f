"""The integrity-check benchmark behind `incident-worker bench --verify N`: how long `verify` takes on an index of N
incidents, what it costs the primary, and how long `verify --repair` takes with damage to repair.

The index is the benchmark's synthetic workload (worker/devtools/workload.py: Zipf bags, a fifth near duplicates,
default layout), bulk-loaded. Measured on it, one after the other: a check of the clean index unpaced; the same at
`--max-rate` 10,000 items a second; then 1% of the incidents are damaged as a hand edit could (half lose one posting,
half get a stray posting ID) and `verify --repair` runs, then a check confirms the index clean.
"""

from __future__ import annotations

import os
import platform
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis

from ..fingerprint import fingerprint
from ..index import FingerprintIndex
from ..integrity import Verifier, VerifyReport
from ..replies import text
from .workload import Workload

__all__ = ["run_verify_bench", "verify_markdown"]

NAMESPACE = "verify"
PACED_RATE = 10_000


def _calls(client: redis.Redis) -> tuple[float, int, float, int]:
    """Microseconds and calls Redis spent in FCALL_RO and FCALL so far."""
    stats = client.info("commandstats")
    ro, rw = stats.get("cmdstat_fcall_ro", {}), stats.get("cmdstat_fcall", {})
    return float(ro.get("usec", 0)), int(ro.get("calls", 0)), float(rw.get("usec", 0)), int(rw.get("calls", 0))


def _timed(client: redis.Redis, verifier: Verifier) -> tuple[VerifyReport, dict[str, Any]]:
    before = _calls(client)
    started = time.perf_counter()
    report = verifier.run()
    seconds = time.perf_counter() - started
    after = _calls(client)
    ro_usec, ro_calls = after[0] - before[0], after[1] - before[1]
    rw_usec, rw_calls = after[2] - before[2], after[3] - before[3]
    items = report.scanned["items"]
    return report, {
        "seconds": round(seconds, 2),
        "items": items,
        "items_per_s": round(items / seconds) if seconds else None,
        "check_calls": ro_calls,
        "check_usec_per_call": round(ro_usec / ro_calls) if ro_calls else None,
        "repair_calls": rw_calls,
        "repair_usec_per_call": round(rw_usec / rw_calls) if rw_calls else None,
        "redis_function_s": round((ro_usec + rw_usec) / 1e6, 2),
        "findings": report.counts,
        "repaired": sum(1 for f in report.findings if f.repaired),
        "dropped": report.dropped,
    }


def run_verify_bench(*, url: str, incidents: int, seed: int = 1, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build an index of `incidents`, then time verify on it clean, paced, and with 1% damage under --repair."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    index = FingerprintIndex(client, NAMESPACE)
    log(f"loading {incidents:,} incidents")
    workload = Workload(seed=seed)
    index.bulk_load((incident_id, fingerprint(bag)) for incident_id, bag in workload.take(incidents))

    results: dict[str, Any] = {
        "incidents": incidents,
        "layout": index.layout.description,
        "batch": 500,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "redis": client.info("server")["redis_version"],
    }
    log("verify, unpaced")
    report, results["check"] = _timed(client, Verifier(client, NAMESPACE))
    results["posting_keys"] = report.scanned["posting_keys"]
    log(f"verify --max-rate {PACED_RATE}")
    _, results["check_paced"] = _timed(client, Verifier(client, NAMESPACE, max_rate=PACED_RATE))

    rng = random.Random(seed)
    damaged = rng.sample(sorted(text(k) for k in client.hkeys(index.keys.fingerprints)), incidents // 100)
    pipe = client.pipeline(transaction=False)
    for n, incident_id in enumerate(damaged):
        fp = int(client.hget(index.keys.fingerprints, incident_id) or b"0", 16)
        key = index.posting_keys(fp)[n % 4]
        if n % 2:
            pipe.srem(key, incident_id)
        else:
            pipe.sadd(index.posting_keys(rng.getrandbits(64))[n % 4], f"stray-{n}")
    pipe.execute()
    log(f"verify --repair after damaging {len(damaged):,} incidents")
    _, results["repair"] = _timed(client, Verifier(client, NAMESPACE, repair=True))
    after, results["check_after_repair"] = _timed(client, Verifier(client, NAMESPACE))
    results["clean_after_repair"] = after.clean
    client.close()
    return results


def verify_markdown(results: dict[str, Any]) -> str:
    """The results as the table BENCHMARKS.md shows."""
    rows = [
        ("verify (clean index, unpaced)", results["check"]),
        (f"verify --max-rate {PACED_RATE:,}", results["check_paced"]),
        ("verify --repair (1% damaged)", results["repair"]),
        ("verify after the repair", results["check_after_repair"]),
    ]
    lines = [
        f"{results['incidents']:,} incidents, {results['posting_keys']:,} posting sets, {results['layout']}; "
        f"{results['machine']}, Redis {results['redis']}, {results['when']}",
        "",
        "| run | time | items/s | Redis time in verify's calls | check calls (us each) | repair calls (us each) | "
        "findings |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows:
        found = ", ".join(f"{kind} {count:,}" for kind, count in row["findings"].items()) or "none"
        lines.append(
            f"| {name} | {row['seconds']} s | {row['items_per_s']:,} | {row['redis_function_s']} s | "
            f"{row['check_calls']:,} ({row['check_usec_per_call']}) | {row['repair_calls']:,} "
            f"({row['repair_usec_per_call']}) | {found} |"
        )
    return "\n".join(lines)
