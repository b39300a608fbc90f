"""What a change in a claim's window costs the primary: apply_batch's time an event against the changes it validates.

Starts a redis-server of its own, loads the Functions library of the checkout given (`--code`, default this one),
bulk-loads N incidents of the benchmark's seeded Zipf workload, and for each window K, batch after batch: brings a
copy (a `ChangeFollower`) to the end of the change log, adds K incidents after it (library-mode apply calls), then
sends 16 new incidents as apply_batch calls whose claims were searched on that copy, so that each call validates the
K changes (and its batch's earlier calls). Prints the apply_batch call's time an event (INFO commandstats) by K; the
slope is the cost of one change in the window, an event. Run it on two checkouts to compare.

Usage: python benchmarks/validation_cost.py [--code DIR] [--size N] [--windows 0,100,400,1600] [--batches B]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent)
parser.add_argument("--size", type=int, default=20_000)
parser.add_argument("--windows", default="0,100,400,1600")
parser.add_argument("--batches", type=int, default=20)
args = parser.parse_args()
sys.path.insert(0, str(args.code.resolve()))  # the checkout measured (its Python and its Lua)

import redis  # noqa: E402

from worker.devtools.redis_server import scratch_server  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402
from worker.library import SnapshotClaim, apply_batch  # noqa: E402
from worker.readpath import ChangeFollower  # noqa: E402


def main() -> None:
    with scratch_server() as server:
        client = redis.Redis.from_url(server.url)
        workload = Workload(seed=7)
        index = FingerprintIndex(client, "bench", bands=4)
        index.open()
        index.bulk_load([(i, fingerprint(bag)) for i, bag in workload.take(args.size)])
        print(f"{args.code}: N = {args.size:,}, batches of 16, {args.batches} batches a window")
        follower = ChangeFollower(client, index.keys, index.layout)
        follower.load()
        for window in (int(k) for k in args.windows.split(",")):
            usec, events = 0.0, 0
            for _ in range(args.batches):
                follower.catch_up()  # the copy at the end of the log, then `window` changes after it
                for incident_id, bag in workload.take(window):
                    index.execute([index.apply_command("add", incident_id, fingerprint(bag))])
                copy = follower.index
                items = [(i, fingerprint(bag)) for i, bag in workload.take(16)]
                results = copy.search_many([(fp, i) for i, fp in items], limit=116)
                commands = [
                    index.apply_command(
                        "add",
                        i,
                        fp,
                        snapshot=SnapshotClaim(
                            copy.position, r.match_count, r.matches, len(r.matches) == r.match_count
                        ),
                    )
                    for (i, fp), r in zip(items, results, strict=True)
                ]
                before = float(client.info("commandstats")["cmdstat_fcall"]["usec"])
                [reply] = index.execute([apply_batch(commands)])
                usec += float(client.info("commandstats")["cmdstat_fcall"]["usec"]) - before
                statuses = {r[0].decode() if isinstance(r[0], bytes) else r[0] for r in reply}
                assert statuses == {"indexed"}, statuses
                events += 16
            print(f"  window {window:5}: {usec / events:8.1f} us an event")


if __name__ == "__main__":
    main()
