"""A brute-force model of the index: a dict of fingerprints and a linear scan. The truth the tests compare to."""

from __future__ import annotations

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
