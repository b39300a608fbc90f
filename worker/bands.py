"""Band layouts: how 64-bit fingerprints are cut into bands and which band values a query probes.

The contract: docs/contract.md#bands-and-the-recall-guarantee, and the proof that follows it there.

Pure arithmetic, no Redis. Probing each of the m bands at radius p = r // m would do: since m * (p + 1) > r,
two fingerprints within r agree within p on at least one band (pigeonhole), so probing every value within p of
each of the query's band values finds every fingerprint within r.

The same argument allows less (Norouzi, Punjani and Fleet 2012, Proposition 2). Write r = p * m + a with
0 <= a < m. If the first a + 1 bands each differed by more than p and the other m - a - 1 bands each by more than
p - 1, the distance would be at least (a + 1)(p + 1) + (m - a - 1) p = r + 1. So two fingerprints within r agree
within p on one of the first a + 1 bands or within p - 1 on one of the others: probing the first a + 1 bands at
radius p and the rest at p - 1 (not at all when p = 0) keeps recall complete, with fewer probes and candidates.
The first bands are the widest, whose extra probes at radius p add the fewest candidates.
Under the default, 4 bands and r = 7, this is p = 1 on every band; 3 bands probe at 2, 2 and 1 instead of 2, 2, 2
(508 probes instead of 718 and about 40% fewer candidates). The posting sets are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from math import comb

from .errors import LayoutError

__all__ = ["DEFAULT_BANDS", "DEFAULT_MAX_DISTANCE", "MAX_PROBES", "BandLayout", "probe_count"]

DEFAULT_MAX_DISTANCE = 7
"""The contract's default: every indexed incident within Hamming distance 7 is a near duplicate."""

DEFAULT_BANDS = 4
"""4 bands of 16 bits probed at radius 1 verify ~20x fewer candidates than the classic 8 exact bands (BENCHMARKS.md)."""

MAX_PROBES = 4096
"""Probe keys per query: each is a key the client builds and sends and the server looks up (~40 bytes, ~1 us)."""


def _widths(bands: int) -> tuple[int, ...]:
    base, extra = divmod(64, bands)
    return tuple(base + 1 if b < extra else base for b in range(bands))


def probe_radii(bands: int, max_distance: int) -> tuple[int, ...]:
    """Per band, the radius a query probes it at: r // m for the first r % m + 1 bands, one less for the rest.

    -1 means the band is not probed at all (its postings are still written). See the module's docstring.
    """
    radius, extra = divmod(max_distance, bands)
    return tuple(radius if b <= extra else radius - 1 for b in range(bands))


def _ball(width: int, radius: int) -> int:
    """Values within `radius` of one `width`-bit value (0 for radius -1)."""
    return sum(comb(width, i) for i in range(radius + 1))


def probe_count(bands: int, max_distance: int) -> int:
    """How many band values one query probes under this layout (before any validation)."""
    return sum(_ball(w, p) for w, p in zip(_widths(bands), probe_radii(bands, max_distance), strict=True))


def _show_radii(radii: tuple[int, ...]) -> str:
    if len(set(radii)) == 1:
        return f"probe radius {radii[0]}"
    return "probe radii " + ",".join(str(p) if p >= 0 else "-" for p in radii)


def _usable(max_distance: int, max_probes: int) -> list[int]:
    return [m for m in range(1, 65) if probe_count(m, max_distance) <= max_probes]


def _masks(width: int, radius: int) -> tuple[int, ...]:
    """Every `width`-bit XOR mask of popcount <= radius, the zero mask first."""
    masks = [0]
    for ones in range(1, radius + 1):
        for positions in combinations(range(width), ones):
            masks.append(sum(1 << p for p in positions))
    return tuple(masks)


@dataclass(frozen=True)
class BandLayout:
    """m contiguous bands over the 64 fingerprint bits, band 0 at the least significant end."""

    bands: int
    max_distance: int
    widths: tuple[int, ...] = field(init=False, repr=False)
    offsets: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        validate(self.bands, self.max_distance)
        widths = _widths(self.bands)
        offsets = tuple(sum(widths[:b]) for b in range(self.bands))
        object.__setattr__(self, "widths", widths)
        object.__setattr__(self, "offsets", offsets)

    @cached_property
    def radii(self) -> tuple[int, ...]:
        """Per band, the radius it is probed at (-1: not probed); see the module's docstring."""
        return probe_radii(self.bands, self.max_distance)

    @cached_property
    def probe_masks(self) -> tuple[tuple[int, ...], ...]:
        """Per band, the XOR masks that turn the query's band value into each probed value (zero mask first)."""
        return self.masks()

    @property
    def probed_bands(self) -> int:
        """How many bands a query at the full distance probes: always a prefix, band 0 first."""
        return sum(1 for p in self.radii if p >= 0)

    @property
    def probes(self) -> int:
        """Band values probed per query."""
        return probe_count(self.bands, self.max_distance)

    @cached_property
    def hex_digits(self) -> tuple[int, ...]:
        """Digits of each band's value in key names: ceil(width / 4)."""
        return tuple(-(-width // 4) for width in self.widths)

    @property
    def description(self) -> str:
        """One line for logs and `stats`: '4 bands of 16 bits, max distance 7, probe radius 1, 68 probes per query'.

        Bands probed at different radii are listed one by one: 'probe radii 2,2,1'; '-' is a band not probed.
        """
        widths = sorted(set(self.widths), reverse=True)
        shown = "/".join(str(w) for w in widths)
        return (
            f"{self.bands} band{'s' if self.bands > 1 else ''} of {shown} bits, "
            f"max distance {self.max_distance}, {_show_radii(self.radii)}, {self.probes} probes per query"
        )

    def values(self, fp: int) -> list[int]:
        """The fingerprint's value in each band."""
        return [(fp >> offset) & ((1 << width) - 1) for offset, width in zip(self.offsets, self.widths, strict=True)]

    def masks(self, max_distance: int | None = None) -> tuple[tuple[int, ...], ...]:
        """Per band, the XOR masks a query within `max_distance` (default and at most: the layout's) probes.

        Zero mask first; an empty tuple for a band that query does not probe.
        """
        if max_distance is None or max_distance >= self.max_distance:
            cached: tuple[tuple[int, ...], ...] | None = self.__dict__.get("probe_masks")
            if cached is not None:
                return cached
            max_distance = self.max_distance
        radii = probe_radii(self.bands, max(0, max_distance))
        return tuple(_masks(width, p) if p >= 0 else () for width, p in zip(self.widths, radii, strict=True))

    def probe_values(self, fp: int, max_distance: int | None = None) -> list[list[int]]:
        """Per band, every value a query within `max_distance` (default: the layout's) probes, its own first."""
        values = self.values(fp)
        return [[value ^ mask for mask in masks] for value, masks in zip(values, self.masks(max_distance), strict=True)]


def validate(bands: int, max_distance: int, max_probes: int = MAX_PROBES) -> None:
    """Raise `LayoutError` with a way out when bands is not 1 to 64 or the layout probes too many values."""
    if type(bands) is not int or not 1 <= bands <= 64:
        raise LayoutError(f"bands={bands!r} is not a whole number from 1 to 64; the default is {DEFAULT_BANDS}")
    if type(max_distance) is not int or not 0 <= max_distance <= 64:
        raise LayoutError(
            f"max_distance={max_distance!r} is not a whole number from 0 to 64; the default is {DEFAULT_MAX_DISTANCE}"
        )
    count = probe_count(bands, max_distance)
    if count > max_probes:
        usable = _usable(max_distance, max_probes)
        best = ", ".join(f"{m} ({probe_count(m, max_distance)} probes)" for m in usable[:4])
        raise LayoutError(
            f"bands={bands} with max_distance={max_distance} probes its bands at "
            f"{_show_radii(probe_radii(bands, max_distance)).removeprefix('probe ')}: "
            f"{count:,} probe keys per query, over the limit of {max_probes:,}. "
            f"Use more bands: {best} or more"
        )


# Server cost of one query, in microseconds of Redis time, as taken apart by benchmarks/profile_call.py on a
# 1M-incident index (BENCHMARKS.md, "Where the time goes"): a probe key costs its passing into the call and a key
# lookup (~1 us once the keyspace outgrows the caches), a candidate its set-union entry, its fingerprint's hash
# read, the conversions between Lua and Redis and the comparison (~2 us). Smaller indexes cost less of both.
_US_PER_PROBE = 1.2
_US_PER_CANDIDATE = 2.0


def expected_candidates(bands: int, max_distance: int, indexed: int) -> float:
    """Candidates one query verifies among `indexed` uniformly random fingerprints (real data clusters: ~1-2x more)."""
    radii = probe_radii(bands, max_distance)
    share = sum(_ball(w, p) / 2**w for w, p in zip(_widths(bands), radii, strict=True))
    return indexed * min(1.0, share)


def query_cost_us(bands: int, max_distance: int, indexed: int) -> float:
    """Expected Redis time of one query, in microseconds, by the measured costs above (uniform fingerprints)."""
    probes = probe_count(bands, max_distance)
    return probes * _US_PER_PROBE + expected_candidates(bands, max_distance, indexed) * _US_PER_CANDIDATE


def recommend_bands(indexed: int, max_distance: int = DEFAULT_MAX_DISTANCE) -> int:
    """The band count to use at this index size (m): the default unless another saves real time.

    Fewer, wider bands mean fewer candidates but more probes and more, smaller posting sets (more memory per
    incident); `incident-worker bench` measures both sides. A change of layout is a migration (`incident-worker
    migrate`: a pass over the index, both layouts' postings held meanwhile), so another count is recommended only
    when it saves at least a quarter of the default's time and 100 us a query.
    """
    usable = [m for m in range(1, 65) if probe_count(m, max_distance) <= MAX_PROBES]
    best = min(usable, key=lambda m: query_cost_us(m, max_distance, indexed))
    if DEFAULT_BANDS not in usable:
        return best
    default = query_cost_us(DEFAULT_BANDS, max_distance, indexed)
    saving = default - query_cost_us(best, max_distance, indexed)
    return best if saving >= max(100.0, default / 4) else DEFAULT_BANDS


def copies_crowded(indexed: int, max_distance: int, budget: int) -> bool:
    """Whether the default layout's searches would meet the `budget` of candidates where the workers search their
    own copies (the snapshot read path): when they meet more than half of it on uniform fingerprints (real data
    clusters: up to 2x more). Then fewer, wider bands are advised there too (`copies_bands`)."""
    return bool(budget) and 2 * expected_candidates(DEFAULT_BANDS, max_distance, indexed) > budget


def copies_bands(indexed: int, max_distance: int, budget: int) -> int:
    """The band count advised where the workers search their own copies, with a copy's `budget`: the default (the
    primary only validates, at a cost the layout does not change; the copies search 16-bit bands fastest, and they
    cost Redis the least memory: 3 bands take about twice its memory an incident) until its searches would be
    crowded (`copies_crowded`), then `recommend_bands`'."""
    if probe_count(DEFAULT_BANDS, max_distance) <= MAX_PROBES and not copies_crowded(indexed, max_distance, budget):
        return DEFAULT_BANDS
    return recommend_bands(indexed, max_distance)
