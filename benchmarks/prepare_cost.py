"""The worker's CPU for preparing an event (issue 25): `IncidentEvent.from_fields` on entries of the benchmark's
workload as the stream gives them (bytes), and its parts, in process time an event, best of `--repeat`.

Usage: python benchmarks/prepare_cost.py [--code DIR] [--events M] [--repeat R]
(`--code` imports `worker` from that checkout: run it for two checkouts alternately and compare.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    from worker.devtools.workload import Workload
    from worker.fingerprint import fingerprint
    from worker.formats import EventLimits, IncidentEvent

    entries = []
    for incident_id, bag in Workload(seed=args.seed).take(args.events):
        fields = IncidentEvent(incident_id=incident_id, features=bag).to_fields()
        entries.append({name.encode(): value.encode() for name, value in fields.items()})
    bags = [json.loads(entry[b"features"]) for entry in entries]
    limits = EventLimits()

    def from_fields() -> None:
        for entry in entries:
            IncidentEvent.from_fields(entry, limits)

    def fingerprints() -> None:
        for bag in bags:
            fingerprint(bag)

    def parse_json() -> None:
        for entry in entries:
            json.loads(entry[b"features"].decode())

    for name, run in [("from_fields", from_fields), ("fingerprint", fingerprints), ("json.loads", parse_json)]:
        run()  # warm the token cache
        best = min(timeit.Timer(run, timer=time.process_time).repeat(number=1, repeat=args.repeat))
        print(f"{name}: {best / len(entries) * 1e6:.1f} us an event")


if __name__ == "__main__":
    main()
