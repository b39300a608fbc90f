"""The primary's CPU an event with 1, 2 and 4 snapshot workers, their copies fed from the primary or from a replica,
what it is made of, and its projection to 8, 16 and 32 workers (issue 25, "the fleet"): worker/devtools/fleet.py,
which `incident-worker bench --fleet 1,2,4` runs too.

Usage: python benchmarks/fleet.py [--size N] [--events M] [--workers 1,2,4] [--repeat R] [--by-command] [--rate E]
                                  [--json FILE]
       python benchmarks/fleet.py --tail-followers K [--size N] [--events M] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker.devtools.fleet import fleet_markdown, run_fleet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every run; the tables show medians")
    parser.add_argument(
        "--tail-followers",
        type=int,
        default=0,
        help="instead: measure the tail alone, one worker on the replica with 0 and then this many copies tailing "
        "the primary's change log",
    )
    parser.add_argument(
        "--by-command",
        action="store_true",
        help="also take the primary's time apart by what the workers sent (SLOWLOG of every command while the events "
        "run: it costs the primary a few us an event, the same in every run)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="publish the events at this rate a second (a steady load below the ceiling) instead of all at once",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    results = run_fleet(
        size=args.size,
        events=args.events,
        workers=[int(k) for k in args.workers.split(",")],
        seed=args.seed,
        repeat=args.repeat,
        by_command=args.by_command,
        rate=args.rate,
        tail_followers=args.tail_followers,
        log=lambda message: print(message, flush=True),
    )
    print()
    print(fleet_markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
