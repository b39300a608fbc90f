"""The storm benchmark behind `incident-worker bench --storm N`: N copies of one bag against N distinct bags.

One worker process (the code of `incident-worker run`, default settings: 4 bands, r = 7, alerts capped at 100
matches) ingests each backlog into an empty index, on the same real Redis, one after the other, so the ratio compares
like with like. For each it reports events/s, the candidates verified per event, and Redis memory per incident:

* the index (what the twin groups bound): MEMORY USAGE (every element sampled) of `{N}:fp`, of every posting set
  and of every twin group, divided by N;
* the alerts, apart: a storm's alerts each list 100 matches, so they cost far more than its index; the benchmark
  trims the stream to `ALERTS_MAXLEN` entries as a deployment does (it keeps the last 10,000 here), and reports
  the bytes of one alert and how many alerts there were.
"""

from __future__ import annotations

from typing import Any

import redis

from ..bands import DEFAULT_BANDS
from ..index import FingerprintIndex
from ..keys import IndexKeys
from .benchio import run_header
from .benchmark import Bench, _Events
from .workload import Workload

__all__ = ["run_storm", "storm_markdown"]

NAMESPACE = "storm"


def _usage(client: redis.Redis, pattern: str) -> tuple[int, int]:
    """Keys matching `pattern` and the sum of their MEMORY USAGE, every element counted (SAMPLES 0)."""
    keys = list(client.scan_iter(match=pattern, count=10_000))
    total = 0
    for start in range(0, len(keys), 5000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 5000]:
            pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", 0)
        total += sum(int(size or 0) for size in pipe.execute())
    return len(keys), total


def _index_memory(client: redis.Redis, count: int) -> dict[str, Any]:
    keys = IndexKeys(NAMESPACE)
    _, fp_bytes = _usage(client, keys.fingerprints)
    posting_keys, posting_bytes = _usage(client, keys.band_prefix(0)[: -len("0:")] + "*")
    groups, group_bytes = _usage(client, keys.twin_prefix + "*")
    alerts = int(client.xlen(keys.alerts_stream))
    _, alert_bytes = _usage(client, keys.alerts_stream)
    index_bytes = fp_bytes + posting_bytes + group_bytes
    return {
        "incidents": int(client.hlen(keys.fingerprints)),
        "posting_keys": posting_keys,
        "twin_groups": groups,
        "fp_bytes_per_incident": round(fp_bytes / max(count, 1), 1),
        "postings_bytes_per_incident": round(posting_bytes / max(count, 1), 1),
        "groups_bytes_per_incident": round(group_bytes / max(count, 1), 1),
        "index_bytes_per_incident": round(index_bytes / max(count, 1), 1),
        "alerts_kept": alerts,
        "bytes_per_alert": round(alert_bytes / max(alerts, 1), 1),
    }


def run_storm(*, url: str, copies: int, cap_s: float, seed: int, log: Any) -> dict[str, Any]:
    """Ingest `copies` distinct bags, then `copies` copies of one bag, each into an empty index; compare."""
    client = redis.Redis.from_url(url, socket_timeout=300)
    bench = Bench(client, url, _Events(seed, None), copies, cap_s, 0.0, log)
    workload = Workload(seed=seed, near_duplicates=0.0)
    distinct = workload.take(copies)
    bag = distinct[0][1]
    storm = [(f"storm-{k}", bag) for k in range(copies)]
    results = run_header(client)
    results["copies"] = copies
    for name, items in (("distinct", distinct), ("storm", storm)):
        log(f"{name}: {copies:,} events into an empty index ...")
        bench.fresh(NAMESPACE)
        FingerprintIndex(client, NAMESPACE, bands=DEFAULT_BANDS).open()
        row = bench.throughput(NAMESPACE, DEFAULT_BANDS, items, 1, cap_s)
        row.update(_index_memory(client, row["events"]))
        results[name] = row
    distinct_row, storm_row = results["distinct"], results["storm"]
    results["throughput_ratio"] = round(storm_row["events_per_s"] / max(distinct_row["events_per_s"], 1e-9), 2)
    results["memory_ratio"] = round(
        storm_row["index_bytes_per_incident"] / max(distinct_row["index_bytes_per_incident"], 1e-9), 2
    )
    return results


def storm_markdown(results: dict[str, Any]) -> str:
    """The storm comparison as a Markdown table, for BENCHMARKS.md."""
    out = [
        f"Storm benchmark, {results['date']}: `{results['command']}`; {results['machine']['cpus']} CPUs, "
        f"Redis {results['machine']['redis']}, Python {results['machine']['python']}. One worker process, "
        f"4 bands, r = 7, alerts capped at 100 matches, each backlog into an empty index.",
        "",
        "| backlog | events | events/s | candidates/event (mean, p99) | index B/incident (fp + postings + groups) "
        "| posting keys | twin groups | B/alert (alerts kept) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (("distinct", "distinct bags"), ("storm", "one bag, many IDs")):
        r = results[name]
        capped = " (capped)" if r["capped"] else ""
        out.append(
            f"| {label} | {r['events']:,} of {r['offered']:,}{capped} | {r['events_per_s']:,} | "
            f"{r['candidates_mean']}, {r['candidates_p99']} | {r['index_bytes_per_incident']} "
            f"({r['fp_bytes_per_incident']} + {r['postings_bytes_per_incident']} + {r['groups_bytes_per_incident']}) "
            f"| {r['posting_keys']:,} | {r['twin_groups']:,} | {r['bytes_per_alert']:,} ({r['alerts_kept']:,}) |"
        )
    out.append("")
    out.append(
        f"Storm against distinct: {results['throughput_ratio']}x the events/s (target at least 0.5x), "
        f"{results['memory_ratio']}x the index memory per incident (target at most 1.5x)."
    )
    return "\n".join(out)
