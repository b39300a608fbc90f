"""`incident-worker bench` through the real entry point: a small run on a redis-server of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_redis_server
from tests.streams import clean_env, worker_command
from worker.bands import BandLayout
from worker.fingerprint import fingerprint


@pytest.mark.slow
def test_small_benchmark_measures_every_layout_and_the_baseline() -> None:
    require_redis_server()
    args = ["bench", "--sizes", "3000", "--ingest", "300", "--events", "150", "--cap", "20", "--ingest-cap", "30"]
    args += ["--latency-seconds", "1"]
    done = subprocess.run(
        [*worker_command(), *args, "--json"], env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    fp = results["fingerprint"]
    assert fp["reference_us"] > fp["fast_repeating_us"] > 0 and fp["speedup_repeating"] > 1
    for name in ("default", "classic"):
        ingest = results["ingest"][name]
        assert ingest["events"] == 300 and ingest["events_per_s"] > 0 and not ingest["capped"]
    [row] = results["sizes"]
    assert row["indexed"] == 3000 and set(row["layouts"]) == {"default", "classic"}
    for layout in row["layouts"].values():
        assert layout["memory_per_incident"] > 72  # at least the fingerprint hash's share
        assert layout["one_worker"]["events"] == 150 and layout["two_workers"]["events"] == 150
        assert layout["one_worker"]["fcall_usec_per_event"] > 0 and layout["one_worker"]["redis_cpu_usec_per_event"] > 0
        assert 0 < layout["latency_half_load"]["p50_ms"] <= layout["latency_half_load"]["p99_ms"]
    assert row["baseline"]["events"] == 150
    # the snapshot copy's search alone, on the same events; and the bulk load's change log apart from the index
    assert row["copy_search"]["queries"] == 150 and row["copy_search"]["queries_per_s"] > 0
    for layout in row["layouts"].values():
        assert 0 < layout["change_log_per_incident"] < layout["memory_per_incident"]
        assert layout["change_log_bytes_per_entry"] >= 16  # at least the fingerprint it carries
        # the change log trimmed to a day's changes (N / 30: whole nodes of entries, so at least that many stay)
        assert 400 // 30 <= layout["change_log_entries_after_trimming"] < 400
        assert layout["memory_per_incident_after_trimming"] < layout["memory_per_incident"]
        assert (
            layout["posting_sets"] > 0 and layout["postings_per_incident"] > 0 and layout["keyspace_per_incident"] > 0
        )
    # the classic 8 exact bands verify more candidates than 4 bands probed at radius 1, on the same events
    assert (
        row["layouts"]["classic"]["one_worker"]["candidates_mean"]
        > row["layouts"]["default"]["one_worker"]["candidates_mean"]
    )


def test_benchmark_refuses_a_non_empty_redis(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as client:
        client.set("someone-else", "1")
    done = subprocess.run(
        [*worker_command(), "bench", "--redis-url", server.url, "--sizes", "", "--ingest", "0"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not empty" in done.stderr and "--force" in done.stderr


@pytest.mark.slow
def test_call_profile_unions_exactly_the_probed_postings(server) -> None:  # type: ignore[no-untyped-def]
    """benchmarks/profile_call.py: its candidates are those a brute force over the band values finds."""
    import random
    import sys

    from tests.oracle import clustered

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import profile_call

    rng = random.Random(5)
    fps = clustered(rng, 600, 7, centers=20)
    preload = [(str(i), fp) for i, fp in enumerate(fps)]
    queries = clustered(rng, 30, 7, centers=20)
    with server.client() as client:
        for bands in (3, 4):
            result = profile_call.profile_layout(client, bands, preload, queries)
            layout = BandLayout(bands, 7)
            expected = [
                sum(
                    any(
                        value in probes for value, probes in zip(layout.values(fp), layout.probe_values(q), strict=True)
                    )
                    for fp in fps
                )
                for q in queries
            ]
            assert result["candidates_mean"] == round(sum(expected) / len(expected), 1)
            assert result["probe_keys"] == layout.probes
            assert set(result["steps"]) == set(profile_call.STEPS)
            assert result["steps"]["add"]["sadd"] > 0 and result["steps"]["sunion+hmget"]["hmget"] > 0
            assert f"{layout.probes} probe keys" in profile_call.report(result)


@pytest.mark.slow
def test_storm_benchmark_compares_a_storm_with_distinct_incidents() -> None:
    """`bench --storm N`: the storm verifies one candidate an event, keeps one posting per band and one twin group,
    and its alerts list 100 matches while the index stays small."""
    require_redis_server()
    done = subprocess.run(
        [*worker_command(), "bench", "--storm", "300", "--ingest-cap", "60", "--json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    storm, distinct = results["storm"], results["distinct"]
    assert storm["events"] == distinct["events"] == 300 and storm["incidents"] == distinct["incidents"] == 300
    assert storm["candidates_p99"] == 1 and storm["posting_keys"] == 4 and storm["twin_groups"] == 1
    assert distinct["twin_groups"] == 0 and distinct["posting_keys"] > 300
    assert storm["alerts_kept"] == 299 and storm["bytes_per_alert"] > 100 * 20  # 100 matches listed in each
    assert storm["index_bytes_per_incident"] < distinct["index_bytes_per_incident"]
    assert results["throughput_ratio"] > 0 and results["memory_ratio"] == round(
        storm["index_bytes_per_incident"] / distinct["index_bytes_per_incident"], 2
    )


def test_a_spawned_worker_reports_its_own_peak_memory_not_its_parents() -> None:
    """ru_maxrss of a spawned process keeps its parent's high-water mark on Linux; the benchmark's workers must not
    report the benchmark's memory as theirs."""
    import multiprocessing as mp
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM is Linux's")
    ballast = bytearray(300 * 1024 * 1024)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touch every page: the parent's peak is now over 300 MB
    context = mp.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_report_peak, args=(results,))
    child.start()
    peak_kb = results.get(timeout=60)
    child.join(timeout=60)
    del ballast
    assert peak_kb < 200 * 1024, f"a fresh interpreter reported {peak_kb} KiB: its parent's peak"


def _report_peak(results: Any) -> None:
    from worker.devtools.benchmark import _peak_rss_kb

    results.put(_peak_rss_kb())


def test_the_crafted_flood_shares_one_band_value_and_the_near_storm_many_distinct_fingerprints() -> None:
    from worker.bands import DEFAULT_BANDS, BandLayout
    from worker.devtools.near_storm import flood_bags, near_storm_bags

    layout = BandLayout(DEFAULT_BANDS, 7)
    mask = ((1 << layout.widths[0]) - 1) << layout.offsets[0]
    flood = [fingerprint(bag) for bag in flood_bags(500)]
    assert len({fp & mask for fp in flood}) == 1 and len(set(flood)) > 450
    storm = [fingerprint(bag) for bag in near_storm_bags(2000)]
    assert len(set(storm)) > 1000
    near = sum((storm[0] ^ fp).bit_count() <= 7 for fp in storm[1:])
    assert near > 500, "the storm's fingerprints are not near one another"


@pytest.mark.slow
def test_near_storm_benchmark_cuts_the_flood_at_the_budget_on_both_read_paths() -> None:
    require_redis_server()
    done = subprocess.run(
        # a flood past the copy's 2,048 rows compared one by one, so that its tiers are searched (and cut) too
        # and a flood pre-loaded (bulk_load), whose 2,000 events then meet 3,000 incidents sharing their band value
        [
            *worker_command(),
            "bench",
            "--near-storm",
            "300",
            "--flood",
            "2400",
            "--flood-preload",
            "3000",
            "--max-candidates",
            "50",
            "--rounds",
            "2",
            "--json",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert results["max_candidates"] == 50
    for read_path in ("primary", "snapshot"):
        rows = results[read_path]
        assert rows["distinct"]["events"] == rows["near_storm"]["events"] == 300
        assert rows["flood"]["events"] == 2400 and rows["flood"]["incomplete_alerts_kept"] > 0
        assert rows["distinct"]["incomplete_alerts_kept"] == 0
        assert rows["throughput_ratio"] > 0
        # two rounds, each a distinct and a storm backlog; the path's rows are those of the lower ratio (the median
        # of two, as of an even count, is the lower one)
        assert len(rows["rounds"]) == 2
        assert rows["throughput_ratio"] == min(r["throughput_ratio"] for r in rows["rounds"])
        assert rows["near_storm"]["events_per_s"] in [r["near_storm_events_per_s"] for r in rows["rounds"]]
        preloaded = rows["flood_preloaded"]
        assert preloaded["preloaded"] == 3000 and preloaded["events"] == 2000
        assert preloaded["incomplete_alerts_kept"] > 0
    assert results["primary"]["flood"]["candidates_max"] <= 50
    assert results["primary"]["flood_preloaded"]["candidates_max"] <= 50
    assert results["flood_preload"] == 3000


def _run_figures(rate: float) -> dict[str, Any]:
    return {
        "events_per_s": rate,
        "capped": False,
        "candidates_mean": 1.0,
        "candidates_p99": 2,
        "fcall_usec_per_event": 10.0,
        "redis_cpu_usec_per_event": 20.0,
        "startup_s": 1.0,
        "worker_max_rss_mb": 100.0,
    }


def test_above_a_million_the_benchmark_measures_the_layout_stats_advises_with_its_snapshot_path() -> None:
    """Above a million the benchmark measures the layout `stats` advises for the snapshot read path (4 bands at ten
    million, whose copy searches stay within the copy's own budget; 3 bands past about 29M), with that path;
    --layouts default,recommended measures both, each with its snapshot read path."""
    from worker.commands.stats import recommendation
    from worker.devtools.benchmark import _measured, _with_snapshot
    from worker.devtools.benchpage import markdown

    [(name, bands)] = _measured(10_000_000, None)
    assert name == "default" and bands == recommendation(10_000_000, 4, 7, on_copies=True)[0] == 4
    assert _with_snapshot(10_000_000, name)
    [(name, bands)] = _measured(40_000_000, None)
    assert name == "recommended" and bands == recommendation(40_000_000, 4, 7, on_copies=True)[0] == 3
    assert _with_snapshot(40_000_000, name)
    both = _measured(10_000_000, ["default", "recommended"])
    assert [n for n, _ in both] == ["default", "recommended"] and all(_with_snapshot(10_000_000, n) for n, _ in both)
    # up to a million: every layout, the snapshot path on the default's alone, as before
    assert [n for n, _ in _measured(1_000_000, None)] == ["default", "classic", "recommended"]
    assert _with_snapshot(1_000_000, "default") and not _with_snapshot(1_000_000, "recommended")

    layout = {
        "bands": 3,
        "probes": 508,
        "memory_per_incident": 150.0,
        "one_worker": _run_figures(100.0),
        "two_workers": _run_figures(150.0),
        "latency_half_load": {"p50_ms": 5.0, "p99_ms": 40.0},
    }
    layout["snapshot"] = {
        "one_worker": _run_figures(4000.0),
        "two_workers": _run_figures(5000.0),
        "latency_half_load": {"p50_ms": 4.0, "p99_ms": 30.0},
    }
    results = {
        "date": "today",
        "command": "incident-worker bench --sizes 10000000",
        "code": {
            "commit": "x",
            "uncommitted_changes": False,
            "library": "l",
            "tokenizer_version": 1,
            "default_bands": 4,
        },
        "machine": {"cpus": 2, "platform": "p", "python": "3", "redis": "7", "load_average": [1, 1, 1]},
        "workload": "w",
        "fingerprint": {
            "tokens_per_bag": 1,
            "reference_us": 2,
            "fast_repeating_us": 1,
            "speedup_repeating": 2,
            "fast_unique_us": 1,
            "speedup_unique": 2,
        },
        "sizes": [
            {
                "indexed": 10_000_000,
                "layouts": {"recommended": layout},
                "copy_search": {"queries_per_s": 9000.0, "us_per_query": 111.0, "bands": 3},
            }
        ],
    }
    page = markdown(results)
    assert "| recommended, snapshot read path" in page and "(the snapshot copy, 3 bands" in page
    assert "snapshot / recommended 40.00x" in page


def test_near_storm_benchmark_measures_only_the_read_paths_asked() -> None:
    require_redis_server()
    command = [*worker_command(), "bench", "--near-storm", "60", "--flood", "0", "--rounds", "1", "--json"]
    done = subprocess.run(
        [*command, "--read-paths", "primary"], env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert results["read_paths"] == ["primary"] and "snapshot" not in results
    assert results["primary"]["near_storm"]["events"] == 60
    refused = subprocess.run(
        [*command, "--read-paths", "replica"], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "give one or more of primary, snapshot, auto" in refused.stderr
    refused = subprocess.run([*command, "--rounds", "0"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give a whole number of rounds, 1 or more" in refused.stderr


@pytest.mark.slow
def test_the_fleet_measure_reads_copies_from_the_primary_then_a_replica_and_projects_the_fleet() -> None:
    """`bench --fleet 1,2`: each count of snapshot workers with its copies read from the primary and from a replica;
    the copies on the replica leave the primary's change log alone; the parts and the projection are printed."""
    require_redis_server()
    args = ["bench", "--sizes", "", "--ingest", "0", "--fleet", "1,2", "--fleet-size", "2000", "--fleet-events", "400"]
    done = subprocess.run(
        [*worker_command(), *args, "--json"], env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fleet = json.loads(done.stdout)["fleet"]
    rows = {(r["source"], r["workers"]): r for r in fleet["rows"]}
    assert set(rows) == {("primary", 1), ("replica", 1), ("primary", 2), ("replica", 2)}
    for row in rows.values():
        assert row["events"] == 400 and row["primary_cpu_us_per_event"] > 0 and row["fallbacks"] == 0
        assert row["top_level"]["benchmark"][0] >= 1  # its own XADD an event, told apart from the workers'
        assert any(name.endswith("apply_batch") for name in row["top_level"])
    # the copies' change-log reads go to the replica: none on the primary but the lag check's XREVRANGE
    assert "xrange" in rows["primary", 2]["top_level"]
    if rows["replica", 2]["replica_left"] == 0:  # (a replica a loaded machine left behind is left for the primary)
        assert "xrange" not in rows["replica", 2]["top_level"]
    assert rows["replica", 1]["replica_cpu_us_per_event"] > 0
    for source in ("primary", "replica"):
        projected = fleet["projection"][source]["projected"]
        assert set(projected) == {"8", "16", "32"} and all(p["ceiling"] > 0 for p in projected.values())
    from worker.devtools.fleet import fleet_markdown

    text = fleet_markdown(fleet)
    assert "| apply_batch |" in text and "32 workers" in text and "ceiling" in text
