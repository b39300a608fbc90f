"""What one event of a near-duplicate storm (or a crafted flood) costs the primary's Redis, for two versions of the
Lua side by side on one real redis-server.

`incident-worker bench --near-storm` measures the whole pipeline with a worker; this runs the primary's apply call
(library mode: no stream, no alert; the 100 closest listed, as the worker lists them) and its read-only search
(`matches`) straight from Python, so that the cost of the Lua's search can be compared between versions on a
shared, loaded machine: every version given (`--lua DIR`, a worker/lua directory of any checkout; each is loaded as
its own library, named after a hash of its source) gets a namespace of its own, and the versions take turns every
BLOCK events, so a change of the machine's load falls on all of them alike.

For each backlog: the first EDGE events applied one by one into empty indexes; the middle bulk-loaded; the last EDGE
searched (`matches`), then applied one by one. Reported per version and phase, per event: the server's CPU us
(used_cpu_user + sys over its blocks), FCALL us (INFO commandstats, the wall time inside the calls), candidates
verified and matches counted (the replies), and the growth of the last EDGE's apply over the first's.

Usage: python benchmarks/storm_search.py --lua /work/main/worker/lua --lua worker/lua [--count 12000]
[--flood 20000] [--budget 3000] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

import redis  # noqa: E402 (after the sys.path line)

from worker import library  # noqa: E402
from worker.devtools.near_storm import flood_bags, near_storm_bags  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402

EDGE = 2000
BLOCK = 50
CAP = 100


def load_version(client: redis.Redis, lua_dir: Path) -> str:
    """Load the library assembled from `lua_dir` under a name of its own; returns that name."""
    source = library.assemble(lambda name: (lua_dir / f"{name}.lua").read_text(encoding="utf-8"))
    name = f"incident_index_{hashlib.sha1(source.encode()).hexdigest()[:10]}"
    client.function_load(source.replace("incident_index_v2", name), replace=True)
    return name


class Version:
    """One version of the library, its index and what its calls cost so far."""

    def __init__(self, client: redis.Redis, label: str, name: str, namespace: str, budget: int) -> None:
        self.client, self.label, self.name = client, label, name
        self.index = FingerprintIndex(client, namespace, max_candidates=budget)
        with self.active():
            self.index.open()
        self.totals: dict[str, dict[str, float]] = {}

    def active(self) -> Any:
        version = self

        class _Active:
            def __enter__(self) -> None:
                library.FN_APPLY = f"{version.name}_apply"
                library.FN_MATCHES = f"{version.name}_matches"
                library.FN_ENSURE_META = f"{version.name}_ensure_meta"

            def __exit__(self, *_: Any) -> None:
                return None

        return _Active()

    def add(self, incident_id: str, fp: int) -> tuple[int, int]:
        result = self.index._retrying("add", incident_id, fp, CAP)  # the ApplyResult: its candidates too
        return result.candidates, result.match_count

    def search(self, _: str, fp: int) -> tuple[int, int]:
        result = self.index.search(fp, max_matches=CAP)
        return result.candidates, result.match_count


def _server(client: redis.Redis) -> tuple[float, float]:
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    usec = sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in ("fcall", "fcall_ro"))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), usec


def take_turns(
    client: redis.Redis,
    versions: list[Version],
    phase: str,
    call: Callable[[Version], Callable[..., Any]],
    items: list[tuple[str, int]],
) -> None:
    """Run `items` through every version, BLOCK events at a time each in turn, adding up what each block cost."""
    for version in versions:
        version.totals[phase] = {"events": 0, "cpu_us": 0.0, "fcall_us": 0.0, "candidates": 0, "matches": 0}
    for start in range(0, len(items), BLOCK):
        block = items[start : start + BLOCK]
        for version in versions:
            run = call(version)
            with version.active():
                cpu0, usec0 = _server(client)
                for incident_id, fp in block:
                    c, m = run(incident_id, fp)
                    version.totals[phase]["candidates"] += c
                    version.totals[phase]["matches"] += m
                cpu1, usec1 = _server(client)
            t = version.totals[phase]
            t["events"] += len(block)
            t["cpu_us"] += (cpu1 - cpu0) * 1e6
            t["fcall_us"] += usec1 - usec0


def backlog(
    client: redis.Redis, names: list[tuple[str, str]], label: str, items: list[tuple[str, int]], budget: int
) -> dict[str, Any]:
    client.flushall()
    versions = [Version(client, lab, name, f"{label}{k}", budget) for k, (lab, name) in enumerate(names)]
    first, middle, last = items[:EDGE], items[EDGE:-EDGE], items[-EDGE:]
    take_turns(client, versions, "first_add", lambda v: v.add, first)
    for version in versions:
        with version.active():
            version.index.bulk_load(middle)
    take_turns(client, versions, "last_search", lambda v: v.search, last)
    take_turns(client, versions, "last_add", lambda v: v.add, last)
    out: dict[str, Any] = {}
    for version in versions:
        rows = {}
        for phase, t in version.totals.items():
            n = max(t["events"], 1)
            rows[phase] = {k: round(v / n, 1) for k, v in t.items() if k != "events"}
        rows["cpu_growth"] = round(rows["last_add"]["cpu_us"] / max(rows["first_add"]["cpu_us"], 1e-9), 2)
        rows["fcall_growth"] = round(rows["last_add"]["fcall_us"] / max(rows["first_add"]["fcall_us"], 1e-9), 2)
        out[version.label] = rows
    return out


def twin_bucket(
    client: redis.Redis, names: list[tuple[str, str]], groups: int, twins: int, budget: int, queries: int = 200
) -> dict[str, Any]:
    """`groups` fingerprints at distance 2 of one query, each held by 1 + `twins` incidents (bulk-loaded), and the
    query's search (`matches`, the closest 100) `queries` times: the listing's cost when the cap is reached inside
    one distance full of twin groups."""
    client.flushall()
    rng = random.Random(23)
    query = rng.getrandbits(64)
    fps: set[int] = set()
    while len(fps) < groups:
        a, b = rng.sample(range(64), 2)
        fps.add(query ^ (1 << a) ^ (1 << b))
    items = [(f"t{k}-{j}", fp) for k, fp in enumerate(sorted(fps)) for j in range(1 + twins)]
    versions = [Version(client, lab, name, f"bucket{k}", budget) for k, (lab, name) in enumerate(names)]
    for version in versions:
        with version.active():
            version.index.bulk_load(items)
    take_turns(client, versions, "search", lambda v: v.search, [("q", query)] * queries)
    return {
        v.label: {k: round(x / max(v.totals["search"]["events"], 1), 1) for k, x in v.totals["search"].items()}
        for v in versions
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lua", type=Path, action="append", help="a worker/lua directory (repeat to compare)")
    parser.add_argument("--count", type=int, default=12000, help="near-storm events (0 = none)")
    parser.add_argument("--flood", type=int, default=20000, help="crafted flood events (0 = none)")
    parser.add_argument("--budget", type=int, default=3000, help="the per-event budget (max_candidates)")
    parser.add_argument(
        "--bucket",
        default="",
        metavar="G,T",
        help="also G fingerprints at distance 2 of one query, each with T twins, and that query's search (the cap "
        "reached among twin groups at one distance)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    dirs = args.lua or [REPO_ROOT / "worker" / "lua"]
    backlogs = {}
    if args.count:
        backlogs["near_storm"] = [(f"near-{k}", fingerprint(b)) for k, b in enumerate(near_storm_bags(args.count))]
    if args.flood:
        backlogs["flood"] = [(f"flood-{k}", fingerprint(b)) for k, b in enumerate(flood_bags(args.flood))]
    results: dict[str, Any] = {"lua": [str(d) for d in dirs], "budget": args.budget}
    with tempfile.TemporaryDirectory(prefix="storm-search-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            with redis.Redis(port=server.port, socket_timeout=600) as client:
                names = [(f"{k}:{d}", load_version(client, d)) for k, d in enumerate(dirs)]
                for label, items in backlogs.items():
                    results[label] = backlog(client, names, label, items, args.budget)
                if args.bucket:
                    groups, twins = (int(x) for x in args.bucket.split(","))
                    results["twin_bucket"] = twin_bucket(client, names, groups, twins, args.budget)
        finally:
            server.stop()
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    if args.bucket:
        print(f"\ntwin bucket {args.bucket}: per search, server CPU us / FCALL us (candidates, matches)")
        for version, r in results["twin_bucket"].items():
            print(f"  {version}: {r['cpu_us']:.0f} / {r['fcall_us']:.0f} ({r['candidates']:.0f}, {r['matches']:.0f})")
    for label in backlogs:
        print(f"\n{label} (budget {args.budget:,}): per event, server CPU us / FCALL us (candidates, matches)")
        for version, rows in results[label].items():
            cells = [
                f"{phase} {r['cpu_us']:.0f} / {r['fcall_us']:.0f} ({r['candidates']:.0f}, {r['matches']:.0f})"
                for phase, r in rows.items()
                if isinstance(r, dict)
            ]
            print(
                f"  {version}: "
                + "; ".join(cells)
                + f"; growth CPU {rows['cpu_growth']}x, FCALL {rows['fcall_growth']}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
