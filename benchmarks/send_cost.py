"""The snapshot worker's CPU for a send's parts, in-process (issue 25): building and packing the apply_batch call,
settling its replies, the copy's claims and following its changes; process time an event, best of `--repeat`.

* ``build+pack``: each add's `apply_command`, `apply_batch`, hiredis's `pack_command` (the general path);
* ``snapshot_adds``: `FingerprintIndex.snapshot_adds` (the same bytes, written at once), when the checkout has it;
* ``settle``: `parse_apply` and `Outcomes.record` of typical replies, the batch's `flush`;
* ``claims``, ``set``: `SnapshotReader.claims` of sends of 16 on a copy of `--size` workload incidents, then `set`
  of each (what following the change log does with the send's own adds).

Usage: python benchmarks/send_cost.py [--code DIR] [--size N] [--repeat R]
(`--code` imports `worker` from that checkout: run it for two checkouts alternately and compare.)
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import timeit
from pathlib import Path
from typing import Any


def best(run: Any, events: int, repeat: int) -> float:
    return min(timeit.Timer(run, timer=time.process_time).repeat(number=1, repeat=repeat)) / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    import redis
    from hiredis import pack_command

    from worker import index as index_module
    from worker.bands import BandLayout
    from worker.devtools.workload import Workload
    from worker.fingerprint import fingerprint
    from worker.formats import IncidentEvent
    from worker.keys import IndexKeys
    from worker.library import SnapshotClaim, StreamTarget, apply_batch, parse_apply
    from worker.logs import configure_logging, get_logger
    from worker.metrics import Metrics
    from worker.outcomes import Outcomes
    from worker.readpath import ChangeFollower, SnapshotReader

    workload = Workload(seed=7)
    loaded = [(incident_id, fingerprint(bag)) for incident_id, bag in workload.take(args.size)]
    events = [
        (incident_id, fingerprint(bag), f"1733000{n:06d}-0") for n, (incident_id, bag) in enumerate(workload.take(1600))
    ]
    claim = SnapshotClaim("1733000000000-5", 2, [("inc-1", 3), ("inc-22", 5)], True, holder=None)
    index = index_module.FingerprintIndex(redis.Redis(), "bench", bands=4)  # never connects
    target = StreamTarget("{bench}:events", "{bench}:alerts", "{bench}:dead", "workers", 10_000, 10_000)

    def build_and_pack() -> None:
        for start in range(0, len(events), 16):
            calls = [
                index.apply_command(
                    "add",
                    i,
                    fp,
                    expected="*",
                    stream=target,
                    entry_id=e,
                    max_matches=100,
                    max_candidates=0,
                    snapshot=claim,
                )
                for i, fp, e in events[start : start + 16]
            ]
            pack_command(apply_batch(calls))

    print(f"build+pack: {best(build_and_pack, len(events), args.repeat):.1f} us an event")
    if hasattr(index_module, "SnapshotAdd"):
        adds = [index_module.SnapshotAdd(i, fp, e, claim, "", "", None) for i, fp, e in events]

        def written() -> None:
            for start in range(0, len(adds), 16):
                index.snapshot_adds(adds[start : start + 16], stream=target, max_matches=100, max_candidates=0)

        print(f"snapshot_adds: {best(written, len(events), args.repeat):.1f} us an event")

    configure_logging("json", "error")
    outcomes = Outcomes(Metrics(), get_logger(consumer="bench"))
    event = IncidentEvent.from_fields({b"incident_id": b"inc-1", b"features": b'{"a": 2, "b": 3}'})
    replies = [
        [b"indexed", b"2", b"7", b"1733000000000-3", b"inc-5", b"3", b"inc-5", b"2", b"inc-9", b"4"],
        [b"indexed", b"0", b"9", b"", b"inc-1", b"1"],
    ] * 800

    def settle() -> None:
        for start in range(0, len(replies), 16):
            for reply in replies[start : start + 16]:
                result = parse_apply(reply)
                outcomes.record(result.status, "1733000000000-1", event=event, result=result)
            outcomes.flush()

    print(f"settle: {best(settle, len(replies), args.repeat):.1f} us an event")

    queries = [(incident_id, fp) for incident_id, fp, _ in events]
    claims_s, set_s = [], []
    for _ in range(3):
        follower = ChangeFollower(None, IndexKeys("bench"), BandLayout(4, 7))
        follower.index.load(loaded)
        follower.loaded = True
        reader = SnapshotReader.__new__(SnapshotReader)
        reader.follower = follower
        gc.collect()
        gc.freeze()
        spent = [0.0, 0.0]
        for start in range(0, len(queries), 16):
            send = queries[start : start + 16]
            began = time.process_time()
            reader.claims(send, 100, 0)
            searched = time.process_time()
            for incident_id, fp in send:
                follower.index.set(incident_id, fp)
            spent[0] += searched - began
            spent[1] += time.process_time() - searched
        gc.unfreeze()
        claims_s.append(spent[0])
        set_s.append(spent[1])
    print(f"claims: {min(claims_s) / len(queries) * 1e6:.1f} us an event, set: {min(set_s) / len(queries) * 1e6:.1f}")


if __name__ == "__main__":
    main()
