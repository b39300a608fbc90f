"""`incident-worker bench`: the benchmark (worker/devtools/benchmark.py) on a real redis-server it starts itself."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import redis

from ._shared import EXIT_OK, UsageError

LAYOUT_NAMES = ("default", "classic", "recommended")

__all__ = ["configure"]


def _sizes(value: str) -> list[int]:
    try:
        return [int(size) for size in value.split(",") if size]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of whole numbers") from None


def _counts(value: str) -> list[int]:
    counts = _sizes(value)
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give numbers of workers, comma-separated, such as 1,2,4")
    return counts


def _layouts(value: str) -> list[str]:
    names = [name for name in value.split(",") if name]
    unknown = sorted(set(names) - set(LAYOUT_NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: give one or more of {', '.join(LAYOUT_NAMES)}, comma-separated")
    return names


def _read_paths(value: str) -> list[str]:
    names = [name for name in value.split(",") if name]
    if not names or set(names) - {"primary", "snapshot", "auto"}:
        raise argparse.ArgumentTypeError(f"{value!r}: give one or more of primary, snapshot, auto, comma-separated")
    return names


def _rounds(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of rounds, 1 or more")
    return int(value)


def _bench(args: argparse.Namespace) -> int:
    from ..devtools.benchmark import markdown, run_benchmark
    from ..devtools.redis_server import RedisServer, redis_server_available

    sizes = sorted(set(args.sizes + ([1_000_000] if args.large else [])))

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    server = None
    url = args.redis_url
    with tempfile.TemporaryDirectory(prefix="incident-bench-") as directory:
        if url is None:
            if not redis_server_available():
                raise UsageError("redis-server is not on PATH: install Redis 7, or pass --redis-url")
            server = RedisServer(Path(directory))
            server.start()
            url = server.url
            log(f"redis-server {server.port} started for the benchmark")
        else:
            with redis.Redis.from_url(url) as probe:
                if probe.dbsize() and not args.force:
                    raise UsageError("the Redis at --redis-url is not empty; the benchmark flushes it: add --force")
        try:
            if args.verify:
                from ..devtools.verify_bench import run_verify_bench, verify_markdown

                found = run_verify_bench(url=url, incidents=args.verify, seed=args.seed, log=log)
                print(json.dumps(found, indent=2) if args.json else verify_markdown(found))
                return EXIT_OK
            if args.near_storm:
                from ..devtools.near_storm import near_storm_markdown, run_near_storm

                found = run_near_storm(
                    url=url,
                    count=args.near_storm,
                    flood=args.flood,
                    cap_s=args.ingest_cap,
                    seed=args.seed,
                    log=log,
                    budget=args.max_candidates,
                    flood_preload=args.flood_preload,
                    read_paths=args.read_paths,
                    rounds=args.rounds,
                )
                print(json.dumps(found, indent=2) if args.json else near_storm_markdown(found))
                return EXIT_OK
            if args.storm:
                from ..devtools.storm import run_storm, storm_markdown

                storm = run_storm(url=url, copies=args.storm, cap_s=args.ingest_cap, seed=args.seed, log=log)
                print(json.dumps(storm, indent=2) if args.json else storm_markdown(storm))
                return EXIT_OK
            results = run_benchmark(
                url=url,
                sizes=sizes,
                ingest=args.ingest,
                measure=args.events,
                cap_s=args.cap,
                ingest_cap_s=args.ingest_cap,
                latency_s=args.latency_seconds,
                seed=args.seed,
                real_data=args.real_data,
                log=log,
                layouts=args.layouts,
            )
            if args.fleet:
                from ..devtools.fleet import run_fleet

                results["fleet"] = run_fleet(
                    size=args.fleet_size,
                    events=args.fleet_events,
                    workers=args.fleet,
                    seed=args.seed,
                    repeat=args.fleet_repeat,
                    by_command=True,
                    log=log,
                )
                results["machine"]["load_average_at_end"] = results["fleet"]["load_average_at_end"]
        finally:
            if server is not None:
                server.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return EXIT_OK
    print(markdown(results))
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Benchmark the real pipeline (worker processes, Redis Functions) on a real redis-server it starts on a free "
        "port (or --redis-url). Prints Markdown tables for BENCHMARKS.md; --json for the numbers."
    )
    parser.epilog = (
        "Examples: incident-worker bench; incident-worker bench --large (adds N = 1,000,000); "
        "incident-worker bench --sizes 10000 --ingest 0 --json; incident-worker bench --sizes 10000000 --ingest 0 "
        "(ten million incidents, the default layout); incident-worker bench --storm 100000 (a storm of "
        "exact duplicates against distinct incidents); incident-worker bench --near-storm 12000 --flood 50000 (near "
        "duplicates and a crafted flood, the per-event budget); incident-worker bench --sizes 1000000 --ingest 0 "
        "--fleet 1,2,4 (adds the fleet: the primary's CPU an event with 1, 2 and 4 snapshot workers, copies read "
        "from the primary and from a replica, by part, projected to 8, 16 and 32 workers). Exit codes: 0 measured, "
        "2 bad usage (no redis-server on PATH, a non-empty Redis without --force)."
    )
    parser.add_argument("--redis-url", help="use this Redis instead of starting one (it must be empty, or --force)")
    parser.add_argument("--force", action="store_true", help="with --redis-url: allow a non-empty database (FLUSHED)")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=[10_000, 100_000],
        help="index sizes N, comma-separated (default 10000,100000; '' for none); 1000000 and 10000000 are offered "
        "too (10000000: about 6 minutes on an idle machine; the bench near 3 GB, Redis near 2 GB; BENCHMARKS.md)",
    )
    parser.add_argument(
        "--layouts",
        type=_layouts,
        default=None,
        help="layouts measured at each size, comma-separated, of default (with the snapshot read path beside it), "
        "classic and recommended (default: all three up to N = 1,000,000, where the classic layout alone takes most "
        "of an hour; above it the default layout alone, and no in-process baseline)",
    )
    parser.add_argument("--large", action="store_true", help="add N = 1,000,000 (takes a few minutes more)")
    parser.add_argument("--ingest", type=int, default=100_000, help="events of the full-ingest test (0 = skip)")
    parser.add_argument("--events", type=int, default=5000, help="events per throughput measurement")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds a single measurement may take at most")
    parser.add_argument(
        "--ingest-cap",
        type=float,
        default=600.0,
        help="seconds the full ingest may take (the classic layout needs four to five minutes for 100,000 here)",
    )
    parser.add_argument("--latency-seconds", type=float, default=8.0, help="length of the half-load latency run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic workload")
    parser.add_argument("--real-data", type=Path, help="a directory of Loghub *_structured.csv files to use instead")
    parser.add_argument(
        "--storm",
        type=int,
        default=0,
        metavar="N",
        help="instead: N copies of one bag against N distinct bags (events/s, index memory per incident)",
    )
    parser.add_argument(
        "--near-storm",
        type=int,
        default=0,
        metavar="N",
        help="instead: N near duplicates (one bag plus one token of its own each) against N distinct bags, and a "
        "crafted flood (--flood), on both read paths: events/s and Redis time per event over the first and last "
        "2,000 events",
    )
    parser.add_argument(
        "--flood",
        type=int,
        default=20_000,
        metavar="M",
        help="with --near-storm: M crafted bags sharing one band value (0 = none; default 20000)",
    )
    parser.add_argument(
        "--flood-preload",
        type=int,
        default=0,
        metavar="P",
        help="with --near-storm: also P flood incidents pre-loaded (bulk load), then 2,000 flood events timed "
        "(0 = none)",
    )
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=None,
        metavar="B",
        help="with --near-storm: the workers' per-event budget, on both read paths (default: each path's own "
        "setting's default)",
    )
    parser.add_argument(
        "--read-paths",
        type=_read_paths,
        default="primary,snapshot",
        metavar="PATHS",
        help="with --near-storm: the read paths measured, comma-separated, of primary, snapshot and auto (the "
        "default setting: the primary until a storm or SNAPSHOT_MIN_INCIDENTS moves the search to the copy; default "
        "primary,snapshot)",
    )
    parser.add_argument(
        "--rounds",
        type=_rounds,
        default=3,
        metavar="R",
        help="with --near-storm: the distinct and near storm backlogs R times on each path, alternating; the path's "
        "figures are the round of the median ratio (default 3)",
    )
    parser.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="N",
        help="instead: time `verify` on an index of N incidents, clean, paced, and `--repair` with 1%% damaged",
    )
    parser.add_argument(
        "--fleet",
        type=_counts,
        default=None,
        metavar="K,K,...",
        help="also measure the fleet: the primary's CPU an event with these numbers of snapshot-path worker "
        "processes (say 1,2,4), their copies read from the primary and then from a replica, on a primary and a "
        "replica of its own (redis-server on PATH, whatever --redis-url says); its parts (SLOWLOG of every command), "
        "and its projection to 8, 16 and 32 workers with the primary's one-core ceiling (benchmarks/fleet.py alone)",
    )
    parser.add_argument(
        "--fleet-size", type=int, default=100_000, metavar="N", help="with --fleet: incidents pre-loaded (100000)"
    )
    parser.add_argument("--fleet-events", type=int, default=6000, metavar="M", help="with --fleet: events a run (6000)")
    parser.add_argument(
        "--fleet-repeat", type=int, default=1, metavar="R", help="with --fleet: rounds of every run, medians shown (1)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(handler=_bench)
