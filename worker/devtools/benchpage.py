"""BENCHMARKS.md from the benchmark's results files: `markdown` renders one run (worker/devtools/benchmark.py's
`run_benchmark`) as the page's tables, and `update_page` renders every `<!-- bench-results: FILE -->` block of the
page again, a new run replacing the table of the run with the same command (`python -m worker.devtools.benchmark
NEW.json`; tests/test_benchmarks_page.py holds the page to its files and its top table to today's code). The
fleet's figures (`bench --fleet`, worker/devtools/fleet.py) are rendered here too, by `fleet_markdown`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from ..readpath import SNAPSHOT_SEND

__all__ = [
    "CHANGE_US",
    "PAGE_BLOCK",
    "PROJECTED",
    "decompose",
    "fleet_markdown",
    "main",
    "markdown",
    "page_blocks",
    "update_page",
]

PROJECTED = (8, 16, 32)

CHANGE_US = 0.12
"""The primary's time a change of a call's validation window costs an event (reading it once per apply_batch of 16,
filing it, and the calls' checks): 0.18 us measured alone by benchmarks/validation_cost.py on a quieter machine
(journal: "The validation reads only what can change an answer"), times 0.65 for the windows filed by the send's own
queries (journal: "The fleet by part"). What the projection's per-worker part owes to the widening windows."""


def _bytes(layout: dict[str, Any]) -> str:
    """Redis bytes per incident, and the bulk load's change-log share of it when measured."""
    total = layout["memory_per_incident"]
    log = layout.get("change_log_per_incident")
    if log is None:
        return f"{total}"
    trimmed = layout.get("memory_per_incident_after_trimming")
    after = f"; {trimmed} with the log trimmed to a day" if trimmed is not None else ""
    return f"{total} ({round(total - log, 1)} index + {log} change log{after})"


def markdown(results: dict[str, Any]) -> str:
    """The results as the Markdown tables of BENCHMARKS.md."""
    out = []
    machine = results["machine"]
    out.append(f"Run {results['date']}: `{results['command'].strip()}`")
    code = results.get("code")
    if code is not None:
        changes = ", with changes not committed" if code["uncommitted_changes"] else ""
        out.append(
            f"Code: commit {(code['commit'] or 'unknown')[:12]}{changes}; Functions library {code['library']}, "
            f"tokenizer version {code['tokenizer_version']}, {code['default_bands']} bands by default."
        )
    out.append(
        f"Machine: {machine['cpus']} CPUs, {machine['platform']}, Python {machine['python']}, "
        f"Redis {machine['redis']}. Workload: {results['workload']}."
    )
    if "load_average" in machine:
        out.append(
            f"Load average (1, 5, 15 min) at the start: {machine['load_average']}, at the end: "
            f"{machine.get('load_average_at_end', '-')}."
        )
    fp = results["fingerprint"]
    out.append("")
    out.append("| fingerprint per bag | straightforward loop | fast, repeating vocabulary | fast, unique tokens |")
    out.append("|---|---|---|---|")
    out.append(
        f"| {fp['tokens_per_bag']} tokens | {fp['reference_us']} us | {fp['fast_repeating_us']} us "
        f"({fp['speedup_repeating']}x) | {fp['fast_unique_us']} us ({fp['speedup_unique']}x) |"
    )
    if "ingest" in results:
        ingest = results["ingest"]
        out.append("")
        out.append(
            "| full ingest, one worker | events | events/s | candidates/event (mean, p99) "
            "| Redis us/event (in the call, CPU) |"
        )
        out.append("|---|---|---|---|---|")
        for name in ("default", "classic"):
            r = ingest[name]
            capped = " (capped)" if r["capped"] else ""
            out.append(
                f"| {name}, {r['bands']} bands | {r['events']:,} of {r['offered']:,}{capped} | {r['events_per_s']:,} "
                f"| {r['candidates_mean']}, {r['candidates_p99']} | {r['fcall_usec_per_event']}, "
                f"{r['redis_cpu_usec_per_event']} |"
            )
        out.append(f"\nDefault layout / classic 8 bands, events/s: **{ingest['ratio']}x**.")
    for row in results["sizes"]:
        out.append("")
        out.append(f"**N = {row['indexed']:,} indexed**")
        out.append("")
        out.append(
            "| layout | events/s, 1 worker | 2 workers | p50 / p99 ms at half load | candidates/event "
            "(mean, p99) | Redis us/event (in the call, CPU) | bytes/incident |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for name, r in row["layouts"].items():
            one, two, lat = r["one_worker"], r["two_workers"], r["latency_half_load"]
            capped, capped_two = ("*" if run["capped"] else "" for run in (one, two))
            out.append(
                f"| {name}: {r['bands']} bands, {r['probes']} probes | {one['events_per_s']:,}{capped} | "
                f"{two['events_per_s']:,}{capped_two} | {lat['p50_ms']} / {lat['p99_ms']} | {one['candidates_mean']}, "
                f"{one['candidates_p99']} | {one['fcall_usec_per_event']}, {one['redis_cpu_usec_per_event']} | "
                f"{_bytes(r)} |"
            )
        # the snapshot read path, on the default layout (and above a million incidents on the advised one instead)
        snapped_layouts = [name for name, r in row["layouts"].items() if "snapshot" in r]
        snap_name = snapped_layouts[-1] if snapped_layouts else "default"
        for name in snapped_layouts:
            snap = row["layouts"][name]["snapshot"]
            one, two, lat = snap["one_worker"], snap["two_workers"], snap["latency_half_load"]
            capped, capped_two = ("*" if run["capped"] else "" for run in (one, two))
            copy_size = (
                f", copy {one['copy_bytes_per_incident']} B/incident" if "copy_bytes_per_incident" in one else ""
            )
            out.append(
                f"| {name}, snapshot read path (copy loaded in {one['startup_s']} s, worker RSS "
                f"{one['worker_max_rss_mb']} MB{copy_size}) | {one['events_per_s']:,}{capped} | "
                f"{two['events_per_s']:,}{capped_two} | {lat['p50_ms']} / {lat['p99_ms']} | "
                f"{one['candidates_mean']} changes validated | "
                f"{one['fcall_usec_per_event']}, {one['redis_cpu_usec_per_event']} | same |"
            )
        base = row.get("baseline")  # not measured above a million incidents
        base_capped = ""
        if base is not None:
            offered = base.get("offered", base["events"])
            base_capped = "*" if base["events"] < offered else ""
            out.append(
                f"| in-process baseline (reference loop, dict of 8 band sets) | {base['events_per_s']:,}{base_capped} "
                "| - | - | "
                f"{base['candidates_mean']}, - | - | - |"
            )
        snap = row["layouts"].get(snap_name, {}).get("snapshot")
        copy = row.get("copy_search")
        if copy is not None:
            bands = f", {copy['bands']} bands" if copy.get("bands", 4) != 4 else ""
            out.append(
                f"| in-process search alone (the snapshot copy{bands}, {SNAPSHOT_SEND} queries at a time) | "
                f"{copy['queries_per_s']:,} queries/s ({copy['us_per_query']} us a query) | - | - | - | - | - |"
            )
        ratios = []
        default_row = row["layouts"].get("default")
        default = default_row["one_worker"]["events_per_s"] if default_row else float("nan")
        classic = row["layouts"].get("classic")
        if default_row and classic:
            ratios.append(f"default / classic {default / max(classic['one_worker']['events_per_s'], 1e-9):.1f}x")
        if default_row and base is not None:
            ratios.append(f"default / baseline {default / max(base['events_per_s'], 1e-9):.1f}x")
        recommended = row["layouts"].get("recommended")
        if recommended is not None and default_row:
            rate = recommended["one_worker"]["events_per_s"]
            ratios.append(f"recommended ({recommended['bands']} bands) / default {rate / max(default, 1e-9):.1f}x")
        if default_row:
            two = default_row["two_workers"]["events_per_s"]
            ratios.append(f"two workers / one {two / max(default, 1e-9):.2f}x")
        snap_row = row["layouts"].get(snap_name)
        if snap is not None and snap_row:
            primary_rate = snap_row["one_worker"]["events_per_s"]
            ratios.append(f"snapshot / {snap_name} {snap['one_worker']['events_per_s'] / max(primary_rate, 1e-9):.2f}x")
            snap_rate = max(snap["one_worker"]["events_per_s"], 1e-9)
            ratios.append(f"snapshot two workers / one {snap['two_workers']['events_per_s'] / snap_rate:.2f}x")
            if copy is not None:
                best = max(snap["one_worker"]["events_per_s"], snap["two_workers"]["events_per_s"])
                ratios.append(
                    "in-process search / snapshot pipeline (best of 1 and 2 workers) "
                    f"{copy['queries_per_s'] / best:.2f}x"
                )
            for label, key in (("in the call", "fcall_usec_per_event"), ("CPU", "redis_cpu_usec_per_event")):
                primary, snapped = snap_row["one_worker"][key], snap["one_worker"][key]
                ratios.append(f"Redis {label} per event snapshot / {snap_name} {snapped / max(primary, 1e-9):.2f}x")
        capped_any = base_capped or any(
            layout[run]["capped"] for layout in row["layouts"].values() for run in ("one_worker", "two_workers")
        )
        footnote = " (* capped at the time limit.)" if capped_any else ""
        out.append(f"\nRatios: {', '.join(ratios)}.{footnote}")
    if "fleet" in results:  # bench --fleet
        out += ["", fleet_markdown(results["fleet"])]
    return "\n".join(out)


# -- BENCHMARKS.md --------------------------------------------------------------------------------------------

PAGE_BLOCK = re.compile(r"<!-- bench-results: (?P<path>\S+) -->\n(?P<body>.*?)<!-- end bench-results -->", re.DOTALL)
"""A table of BENCHMARKS.md rendered from a results file: the marker names the file, the body is `markdown` of it."""


def page_blocks(page: str) -> list[tuple[str, str]]:
    """(results file, rendered body) of every block of the page that a results file renders."""
    return [(match["path"], match["body"].rstrip("\n")) for match in PAGE_BLOCK.finditer(page)]


def update_page(page_path: Path, results_paths: list[Path]) -> str:
    """The page with each block rendered again from its results file; a results file given replaces the block whose
    run had the same command (a new run of `incident-worker bench --json` replaces the old run's table)."""
    root = page_path.parent
    page = page_path.read_text(encoding="utf-8")
    replacing = {}
    for path in results_paths:
        command = json.loads(path.read_text(encoding="utf-8"))["command"].strip()
        replacing[command] = path.resolve().relative_to(root.resolve()).as_posix()
    used = set()

    def render(match: re.Match[str]) -> str:
        name = match["path"]
        old = json.loads((root / name).read_text(encoding="utf-8"))
        command = old["command"].strip()
        if command in replacing:
            name = replacing[command]
            used.add(command)
        results = json.loads((root / name).read_text(encoding="utf-8"))
        return f"<!-- bench-results: {name} -->\n{markdown(results)}\n<!-- end bench-results -->"

    updated = PAGE_BLOCK.sub(render, page)
    if unused := set(replacing) - used:
        commands = [json.loads((root / p).read_text(encoding="utf-8"))["command"] for p, _ in page_blocks(page)]
        raise SystemExit(
            f"no table of {page_path} is from the command {sorted(unused)}; its tables are from {commands}"
        )
    return updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.devtools.benchmark",
        description="Render BENCHMARKS.md's tables of the benchmark again from their results files "
        "(tests/test_benchmarks_page.py holds the page to them, and them to today's code).",
        epilog="After `incident-worker bench --json > benchmarks/results-NEW.json`: "
        "python -m worker.devtools.benchmark benchmarks/results-NEW.json (replaces the table of the run with the same "
        "command).",
    )
    parser.add_argument("results", nargs="*", type=Path, help="new results files, each replacing its command's table")
    parser.add_argument("--page", type=Path, default=Path("BENCHMARKS.md"), help="the page (default BENCHMARKS.md)")
    args = parser.parse_args(argv)
    args.page.write_text(update_page(args.page, args.results), encoding="utf-8")
    return 0


# -- the fleet (worker/devtools/fleet.py) -------------------------------------------------------------------


PARTS = {
    "apply_batch": ("apply_batch", "apply"),
    "read_new": ("read_new", "read_pending", "claim"),
    "inbox": ("intake",),
    "upkeep": ("lease", "trim_events", "trim_changes", "expiry_backfill", "expire", "set_retention", "memory", "time"),
    "heartbeat": ("set", "zadd", "zremrangebyscore", "pexpire"),
    "copies: log, floor, lag": ("xrange", "xrevrange", "hget", "hscan"),
    "recovery, summary": ("xpending", "xinfo", "xautoclaim", "xclaim", "hlen", "zcard", "zrange"),
}
"""The decomposition's rows: the commands the workers send (FCALL by function), grouped by the part of the worker
that sends them."""


def decompose(row: dict[str, Any]) -> dict[str, list[float]]:
    """The primary's time an event by part of the workers (calls an event, us an event), the benchmark's own
    commands, and what the commands do not account for: the event loop, the sockets, feeding the replica (CPU less
    the commands' time; below zero when the OS took the CPU from Redis mid-command, which the commands' time counts)."""
    parts: dict[str, list[float]] = {}
    for name, (calls, usec) in row["top_level"].items():
        command = re.sub(r"^fcall(_ro)? \w+?_[0-9a-f]{10}_", "", name)  # FCALL by its function's short name
        part = "benchmark: publishing, polling" if name == "benchmark" else "other"
        part = next((p for p, names in PARTS.items() if command in names), part)
        sums = parts.setdefault(part, [0.0, 0.0])
        sums[0] += calls
        sums[1] += usec
    inside = sum(usec for _, usec in parts.values())
    parts["outside commands (CPU less the above)"] = [0.0, row["primary_cpu_us_per_event"] - inside]
    return parts


def fleet_markdown(results: dict[str, Any]) -> str:
    """The fleet's figures as Markdown: the runs, the primary's time by part (when measured), the projection."""
    out: list[str] = []
    rows = results["rows"]
    load = results.get("load_average_at_end")
    how = f"at {results['rate']:,.0f} events/s" if results.get("rate") else "all at once (a backlog)"
    out.append(
        f"**The fleet**: N = {results['size']:,}, {results['events']:,} events a run published {how}, seed "
        f"{results['seed']}, medians of {results['repeat']} round(s)"
        + (f"; load average at the end {load}" if load else "")
    )
    tails = results.get("tails") or []
    if tails:
        k = results["tail_followers"]
        without = statistics.median(r["primary_cpu_us_per_event"] for r in tails if r["followers"] == 0)
        with_ = statistics.median(r["primary_cpu_us_per_event"] for r in tails if r["followers"] == k)
        out.append("")
        out.append(
            f"Tail alone: one worker on the replica, primary CPU {without:.1f} us/event; with {k} copies tailing the "
            f"primary {with_:.1f}: {(with_ - without) / k:.2f} us/event a copy"
        )
    if not rows:
        return "\n".join(out)
    out.append("")
    out.append(
        "| copies read | workers | events/s | primary CPU us/event | of which FCALL | rest | replica CPU us/event "
        "| changes validated/event |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        replica_cpu = "-" if r["replica_cpu_us_per_event"] is None else r["replica_cpu_us_per_event"]
        out.append(
            f"| {r['source']} | {r['workers']} | {r['events_per_s']:,.0f} | {r['primary_cpu_us_per_event']} "
            f"| {r['primary_fcall_us_per_event']} | {r['primary_rest_us_per_event']} | {replica_cpu} "
            f"| {r['changes_validated_per_event']} |"
        )
    if any(r["top_level"] for r in rows):
        out += _parts_markdown(rows)
    out.append("")
    out.append(
        "| copies read | fixed us/event | per worker us/event | changes validated/event: fixed + per worker "
        f"| of which the windows (x {CHANGE_US} us) | " + " | ".join(f"{k} workers" for k in PROJECTED) + " |"
    )
    out.append("|---|---|---|---|---|" + "---|" * len(PROJECTED))
    for source, f in results["projection"].items():
        cells = [
            f"{f['projected'][str(k)]['us']:.0f} us, ceiling {f['projected'][str(k)]['ceiling']:,}/s" for k in PROJECTED
        ]
        out.append(
            f"| {source} | {f['fixed_us']} | {f['per_worker_us']} | {f['changes_validated']} + "
            f"{f['changes_validated_per_worker']} | {f['window_per_worker_us']} us a worker | "
            + " | ".join(cells)
            + " |"
        )
    out.append("")
    out.append("(ceiling: one core of the primary, 1e6 / us an event)")
    return "\n".join(out)


def _parts_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The primary's time an event by part (see decompose), us an event and, in brackets, calls an event."""
    columns = [(r, decompose(r)) for r in rows]
    names = list(dict.fromkeys(name for _, parts in columns for name in parts))
    names.sort(key=lambda name: (name.startswith("benchmark"), name.startswith("outside")))  # theirs last
    out = [
        "",
        "The primary's time an event by part, us (calls an event): the commands' time from SLOWLOG, which counts a "
        "command's wall time, the OS's pauses of Redis included; the last row is CPU less the commands' time",
        "",
        "| part | " + " | ".join(f"{r['source']}, {r['workers']}" for r, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name in names:
        cells = []
        for _, parts in columns:
            calls, usec = parts.get(name, [0.0, 0.0])
            cells.append(f"{usec:.1f}" + (f" ({calls:.3f})" if calls else ""))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("| primary CPU | " + " | ".join(f"{r['primary_cpu_us_per_event']:.1f}" for r, _ in columns) + " |")
    out.append(
        "| changes validated | " + " | ".join(f"{r['changes_validated_per_event']:.1f}" for r, _ in columns) + " |"
    )
    return out
