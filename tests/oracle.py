"""A brute-force model of the index: a dict of fingerprints and a linear scan. The truth the tests compare to."""

from __future__ import annotations

import json
import random


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


class Oracle:
    def __init__(self, max_distance: int) -> None:
        self.max_distance = max_distance
        self.fps: dict[str, int] = {}

    def matches(self, fp: int, limit: int | None = None, exclude: str | None = None) -> list[tuple[str, int]]:
        limit = self.max_distance if limit is None else limit
        found = [(i, hamming(fp, other)) for i, other in self.fps.items() if i != exclude]
        return sorted([(i, d) for i, d in found if d <= limit], key=lambda m: (m[1], m[0]))

    def add(self, incident_id: str, fp: int) -> list[tuple[str, int]] | str:
        if incident_id in self.fps:
            return [] if self.fps[incident_id] == fp else "duplicate"
        matches = self.matches(fp)
        self.fps[incident_id] = fp
        return matches

    def upsert(self, incident_id: str, fp: int) -> list[tuple[str, int]]:
        if self.fps.get(incident_id) == fp:
            return []
        matches = self.matches(fp, exclude=incident_id)
        self.fps[incident_id] = fp
        return matches

    def delete(self, incident_id: str) -> bool:
        return self.fps.pop(incident_id, None) is not None


def flip(fp: int, bits: int, rng: random.Random) -> int:
    """`fp` with `bits` distinct random bits flipped: a fingerprint at exactly that distance."""
    for bit in rng.sample(range(64), bits):
        fp ^= 1 << bit
    return fp


def clustered(rng: random.Random, count: int, max_distance: int, centers: int = 4) -> list[int]:
    """Fingerprints around a few centers, at distances spread around max_distance from each other."""
    middles = [rng.getrandbits(64) for _ in range(centers)]
    return [flip(rng.choice(middles), rng.randint(0, max_distance // 2 + 2), rng) for _ in range(count)]


def assert_postings_match(
    client: object,
    namespace: str,
    bands: int,
    fps: dict[str, int] | None = None,
    *,
    generation: int = 0,
    also: tuple[int, int] | None = None,
) -> None:
    """The namespace's posting sets and twin groups are exactly what its (stored or given) fingerprints call for.

    Each distinct fingerprint has one representative, the same incident in every posting set of it, and nothing
    else is in the posting sets; a fingerprint held by two or more incidents has a twin group, a sorted set of all of
    them with score 0; no other twin group exists.
    """
    from worker.fingerprint import format_fingerprint
    from worker.index import FingerprintIndex

    def text(value: object) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    index = FingerprintIndex(client, namespace, bands=bands, max_distance=0, generation=generation)  # type: ignore[arg-type]
    # `also`: (bands, generation) of a second layout that must hold the same postings (a migration's target)
    layouts = [index] + ([FingerprintIndex(client, namespace, also[0], 0, also[1])] if also else [])  # type: ignore[arg-type]
    if fps is None:
        fps = {text(k): int(text(v), 16) for k, v in client.hgetall(index.keys.fingerprints).items()}  # type: ignore[attr-defined]
    holders: dict[int, set[str]] = {}
    for incident_id, fp in fps.items():
        holders.setdefault(fp, set()).add(incident_id)
    found = {
        text(key): {text(m) for m in client.smembers(key)}  # type: ignore[attr-defined]
        for key in client.scan_iter(match=index.keys.band_prefix(0)[: -len("0:")] + "*", count=1000)  # type: ignore[attr-defined]
    }
    expected: dict[str, set[str]] = {}
    for fp, group in holders.items():
        keys = [key for layout in layouts for key in layout.posting_keys(fp)]
        representatives = set(group)
        for key in keys:
            representatives &= found.get(key, set())
        assert len(representatives) == 1, (
            f"fingerprint {fp:016x} of {sorted(group)} has {len(representatives)} representatives in its postings"
        )
        for key in keys:
            expected.setdefault(key, set()).update(representatives)
    assert found == expected, "posting sets disagree with the fingerprints (a leftover or a missing posting)"
    groups = {
        text(key): {text(m): s for m, s in client.zrange(key, 0, -1, withscores=True)}  # type: ignore[attr-defined]
        for key in client.scan_iter(match=index.keys.twin_prefix + "*", count=1000)  # type: ignore[attr-defined]
    }
    expected_groups = {
        index.keys.twins(format_fingerprint(fp)): dict.fromkeys(group, 0.0)
        for fp, group in holders.items()
        if len(group) > 1
    }
    assert groups == expected_groups, "twin groups disagree with the fingerprints"


class GroupOracle(Oracle):
    """The index with groups, by brute force: each incident's label kept for every incident (the index stores only
    those that differ from the incident's own ID), each group's size counted.

    An incident with matches joins the group of its closest match (smallest distance, then the smaller ID in byte
    order: `matches`'s first); without, it opens a group labelled with its ID, or, when that ID labels a live group
    or a merged one already, `<ID>#<n>` with n from a counter (the first n free of labels and IDs, of at most
    LABEL_TRIES tried; past them the next n, with zeros before it to make the label longer than any ID).
    """

    LABEL_TRIES = 8

    def __init__(self, max_distance: int) -> None:
        super().__init__(max_distance)
        self.raw: dict[str, str] = {}
        self.merged: dict[str, str] = {}
        self.seq = 0

    def group(self, incident_id: str) -> str:
        raw = self.raw[incident_id]
        return self.merged.get(raw, raw)

    def size(self, label: str) -> int:
        return sum(1 for i in self.fps if self.group(i) == label)

    def groups(self) -> dict[str, tuple[str, int]]:
        return {i: (self.group(i), self.size(self.group(i))) for i in self.fps}

    def _live(self, label: str) -> bool:
        return any(self.group(i) == label for i in self.fps)

    def _decide(self, incident_id: str, matches: list[tuple[str, int]]) -> None:
        if matches:
            self.raw[incident_id] = self.group(matches[0][0])
            return
        label = incident_id
        if self._live(label) or label in self.merged:
            for _ in range(self.LABEL_TRIES):
                self.seq += 1
                label = f"{incident_id}#{self.seq}"
                if not self._live(label) and label not in self.merged and label not in self.fps:
                    break
            else:  # a number padded past any incident ID's length (256 characters): free without looking
                self.seq += 1
                label = f"{incident_id}#{str(self.seq).zfill(256 - len(incident_id))}"
        self.raw[incident_id] = label

    def add(self, incident_id: str, fp: int) -> list[tuple[str, int]] | str:
        if incident_id in self.fps:
            return super().add(incident_id, fp)
        matches = self.matches(fp)
        self._decide(incident_id, matches)
        self.fps[incident_id] = fp
        return matches

    def upsert(self, incident_id: str, fp: int) -> list[tuple[str, int]]:
        if self.fps.get(incident_id) == fp:
            return []
        self.fps.pop(incident_id, None)
        self.raw.pop(incident_id, None)
        matches = self.matches(fp)
        self._decide(incident_id, matches)
        self.fps[incident_id] = fp
        return matches

    def delete(self, incident_id: str) -> bool:
        self.raw.pop(incident_id, None)
        return super().delete(incident_id)

    def merge(self, into: str, other: str) -> bool:
        """Fold group `other` into `into` (labels); False when either names no live group."""
        a, b = self.merged.get(into, into), self.merged.get(other, other)
        if not self._live(a) or not self._live(b):
            return False
        if a != b:
            for label, target in list(self.merged.items()):
                if target == b:
                    self.merged[label] = a
            self.merged[b] = a
        return True

    def stored(self) -> tuple[dict[str, str], dict[str, int]]:
        """What the index keeps: {N}:group (labels other than the incident's own ID) and {N}:groupsize (every group
        but an opener alone under its own label)."""
        entries = {i: raw for i, raw in self.raw.items() if raw != i}
        sizes: dict[str, int] = {}
        for label in {self.group(i) for i in self.fps}:
            members = [i for i in self.fps if self.group(i) == label]
            if not (len(members) == 1 and members[0] == label and self.raw[label] == label):
                sizes[label] = len(members)
        return entries, sizes


def claim_arguments(pairs: list[tuple[str, int]], as_json: bool = False, shown: int = 0) -> str:
    """A claim's listing as its arguments are written (protocol bytes, as text): two a match (ID, distance), as
    `snapshotadds._listing` writes them, or (`as_json`) one, the listing as its alert's JSON with where each match
    starts, as worker/lua/claim_json.lua reads it: '<n>/<m>:<offsets, 5 hex digits each, n + 1>[<entries joined
    by ','>', the ',' after the m-th (the alert's last: the `shown`th, or the last, then a ']' after it) a ']'.
    Written here from the format, independently of the compiled loop that writes them in the worker."""
    if not as_json:
        return "".join(f"${len(i)}\r\n{i}\r\n${len(str(d))}\r\n{d}\r\n" for i, d in pairs)
    entries = [json.dumps({"incident_id": i, "distance": d}, separators=(",", ":")) for i, d in pairs]
    starts = [sum(len(e) + 1 for e in entries[:k]) for k in range(len(entries) + 1)]
    m = len(entries) if not 0 < shown < len(entries) else shown
    array = "[" + ",".join(entries[:m]) + "]" + "".join("," * bool(k) + e for k, e in enumerate(entries[m:]))
    payload = f"{len(pairs)}/{m}:" + "".join(f"{at:05x}" for at in starts) + array
    return f"${len(payload)}\r\n{payload}\r\n"
