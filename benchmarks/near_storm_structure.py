"""The near storm's structure, and what a cluster scheme would read per event (issue 23, step 2; no Redis).

    .venv/bin/python benchmarks/near_storm_structure.py [--count 12000] [--cap 100] [--json out.json]

The storm is `incident-worker bench --near-storm`'s (worker/devtools/near_storm.py: one alert reworded N times, the
same 16 tokens plus one of its own each). Everything here is brute force over the fingerprints, as tests/oracle.py
is; the candidates of a search are found as the default layout finds them (4 bands of 16 bits probed at radius 1:
an indexed fingerprint is a candidate when some band of it is within 1 bit of the query's).

Reported:

* distinct fingerprints among the N, and the pairwise distance distribution over the distinct ones;
* today's structure (one representative per distinct fingerprint, exact twins in twin groups): candidates verified
  per event, over the first and the last 2,000 events;
* for a cluster radius delta in {1, 2, 3}: the cluster scheme of issue 23 simulated in arrival order. A cluster is a
  label with a fixed centre (its first member's fingerprint); a new fingerprint joins the cluster of its closest
  centre within delta, else starts its own. Postings hold the label under every member's band values, so the
  labels a query reads are those with a member among today's candidates. For a label at centre distance d:
  d <= r - delta counts the whole cluster unopened, d > r + delta none, otherwise its members are opened. The list of
  the `cap` closest matches (max_matches, default 100) is then completed by branch and bound: clusters opened in
  order of max(0, d - delta) until the cap-th best found is closer than the next bound (ties by ID force opening).
  Per event: labels read (each one fingerprint read and compared) and members opened (each one read and compared).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.bands import DEFAULT_BANDS, DEFAULT_MAX_DISTANCE, BandLayout
from worker.devtools.near_storm import near_storm_bags
from worker.fingerprint import fingerprint

EDGE = 2000


def popcount(values: np.ndarray) -> np.ndarray:
    return np.bitwise_count(values).astype(np.int16)


def band_values(fps: np.ndarray, layout: BandLayout) -> np.ndarray:
    """(len(fps), bands) array of each fingerprint's band values."""
    out = np.empty((len(fps), layout.bands), dtype=np.uint64)
    for b, (offset, width) in enumerate(zip(layout.offsets, layout.widths, strict=True)):
        out[:, b] = (fps >> np.uint64(offset)) & np.uint64((1 << width) - 1)
    return out


def candidates_mask(query_bands: np.ndarray, bands: np.ndarray, radii: tuple[int, ...]) -> np.ndarray:
    """Which rows of `bands` the query's probes reach (some band within its probe radius)."""
    hit = np.zeros(len(bands), dtype=bool)
    for b, radius in enumerate(radii):
        if radius < 0:
            continue
        hit |= popcount(bands[:, b] ^ query_bands[b]) <= radius
    return hit


def summarise(per_event: list[int]) -> dict[str, float]:
    a = np.asarray(per_event, dtype=float)
    return {
        "mean": round(float(a.mean()), 1),
        "first_2000": round(float(a[:EDGE].mean()), 1),
        "last_2000": round(float(a[-EDGE:].mean()), 1),
        "max": int(a.max()),
    }


def today(events: np.ndarray, layout: BandLayout) -> dict[str, Any]:
    """Candidates verified per event by today's structure: one representative per distinct fingerprint."""
    distinct: dict[int, int] = {}
    order = np.zeros(len(events), dtype=np.uint64)
    per_event = []
    radii = layout.radii
    bands_of = band_values(events, layout)
    for i, fp in enumerate(events.tolist()):
        n = len(distinct)
        if n:
            per_event.append(int(candidates_mask(bands_of[i], band_values(order[:n], layout), radii).sum()))
        else:
            per_event.append(0)
        if fp not in distinct:
            distinct[fp] = n
            order[n] = fp
    return {"candidates": summarise(per_event)}


def clusters(
    events: np.ndarray, layout: BandLayout, delta: int, r: int, cap: int, check: bool = False
) -> dict[str, Any]:
    """The cluster scheme simulated in arrival order (see the module's docstring).

    `check`: also compare, for every event, the count (whole clusters counted unopened plus the opened members
    within r) and the `cap` closest distances found by branch and bound with a linear scan of every member."""
    radii = layout.radii
    n_events = len(events)
    members = np.zeros(n_events, dtype=np.uint64)  # distinct fingerprints in arrival order
    member_bands = np.zeros((n_events, layout.bands), dtype=np.uint64)
    weight = np.zeros(n_events, dtype=np.int64)  # incidents holding each distinct fingerprint (twins)
    cluster_of = np.zeros(n_events, dtype=np.int64)
    centres: list[int] = []
    index_of: dict[int, int] = {}
    n = 0
    labels_read, opened, opened_for_count, whole = [], [], [], []
    query_bands = band_values(events, layout)
    centre_arr = np.zeros(n_events, dtype=np.uint64)
    for i, fp in enumerate(events.tolist()):
        x = np.uint64(fp)
        if n:
            hit = candidates_mask(query_bands[i], member_bands[:n], radii)
            labels = np.unique(cluster_of[:n][hit])
        else:
            labels = np.zeros(0, dtype=np.int64)
        labels_read.append(len(labels))
        open_count = 0
        count_open = 0
        whole_count = 0
        if len(labels):
            d_centre = popcount(centre_arr[labels] ^ x)
            in_play = d_centre <= r + delta
            play_labels, play_d = labels[in_play], d_centre[in_play]
            # members of each label in play, with their true distances
            sel = np.isin(cluster_of[:n], play_labels)
            m_idx = np.nonzero(sel)[0]
            m_d = popcount(members[m_idx] ^ x)
            m_label = cluster_of[m_idx]
            opened_labels: set[int] = set()
            for lab, d in zip(play_labels.tolist(), play_d.tolist(), strict=True):
                if d > r - delta:
                    opened_labels.add(lab)
                else:
                    whole_count += 1
            count_open = int(np.isin(m_label, list(opened_labels)).sum()) if opened_labels else 0
            # branch and bound for the cap closest: open in order of the lower bound until the cap-th best is closer
            # than the next bound (a tie may hide a smaller ID)
            bounds = sorted(zip(np.maximum(play_d - delta, 0).tolist(), play_labels.tolist(), strict=True))
            by_label = np.argsort(m_label, kind="stable")
            sorted_labels = m_label[by_label]
            found: list[int] = []
            for bound, lab in bounds:
                if len(found) >= cap and found[cap - 1] < bound:
                    break
                opened_labels.add(lab)
                lo, hi = np.searchsorted(sorted_labels, [lab, lab + 1])
                rows = by_label[lo:hi]
                ds = np.repeat(m_d[rows], weight[m_idx[rows]])
                found = sorted(found + [int(d) for d in ds if d <= r])[: max(cap, 1)]
            open_count = int(np.isin(m_label, list(opened_labels)).sum()) if opened_labels else 0
            if check:
                whole_labels = play_labels[play_d <= r - delta]
                in_whole = np.isin(m_label, whole_labels)
                counted = int(weight[m_idx[in_whole]].sum()) + int(weight[m_idx[~in_whole & (m_d <= r)]].sum())
                every = popcount(members[:n] ^ x)
                assert counted == int(weight[:n][every <= r].sum()), (i, counted)
                closest = sorted(np.repeat(every[every <= r], weight[:n][every <= r]).tolist())[:cap]
                assert found[:cap] == closest, i
        elif check:
            assert not (popcount(members[:n] ^ x) <= r).any(), i
        opened.append(open_count)
        opened_for_count.append(count_open)
        whole.append(whole_count)
        if fp in index_of:
            weight[index_of[fp]] += 1
            continue
        # join the cluster of the closest centre within delta, else start one
        best = -1
        if centres:
            d_all = popcount(centre_arr[: len(centres)] ^ x)
            k = int(np.argmin(d_all))
            if int(d_all[k]) <= delta:
                best = k
        if best < 0:
            best = len(centres)
            centres.append(fp)
            centre_arr[best] = x
        members[n] = x
        member_bands[n] = query_bands[i]
        weight[n] = 1
        cluster_of[n] = best
        index_of[fp] = n
        n += 1
    sizes = np.bincount(cluster_of[:n])
    return {
        "delta": delta,
        "clusters": len(centres),
        "singletons": int((sizes == 1).sum()),
        "largest": int(sizes.max()),
        "labels_read": summarise(labels_read),
        "members_opened_for_count": summarise(opened_for_count),
        "members_opened_with_closest": summarise(opened),
        "labels_counted_whole": summarise(whole),
        "work": summarise([a + b for a, b in zip(labels_read, opened, strict=True)]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=12_000)
    parser.add_argument("--cap", type=int, default=100, help="max_matches: the closest matches each alert lists")
    parser.add_argument("--deltas", default="1,2,3")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    r = DEFAULT_MAX_DISTANCE
    layout = BandLayout(DEFAULT_BANDS, r)
    events = np.array([fingerprint(bag) for bag in near_storm_bags(args.count)], dtype=np.uint64)
    distinct = np.unique(events)
    pair_d = np.zeros(65, dtype=np.int64)
    for i in range(len(distinct) - 1):
        pair_d += np.bincount(popcount(distinct[i + 1 :] ^ distinct[i]), minlength=65)
    pairs = int(pair_d.sum())
    out: dict[str, Any] = {
        "events": args.count,
        "distinct": len(distinct),
        "pairs": pairs,
        "pair_distance": {str(d): int(c) for d, c in enumerate(pair_d) if c},
        "pairs_within_r": round(float(pair_d[: r + 1].sum()) / pairs, 3),
        "today": today(events, layout),
    }
    print(json.dumps({k: v for k, v in out.items()}, indent=1), flush=True)
    out["clusters"] = []
    for delta in [int(d) for d in args.deltas.split(",")]:
        found = clusters(events, layout, delta, r, args.cap)
        print(json.dumps(found), flush=True)
        out["clusters"].append(found)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
