"""Band widths, probe values, the pigeonhole guarantee, and refused layouts.

The contract: docs/contract.md#bands-and-the-recall-guarantee.
"""

from __future__ import annotations

import random
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.bands import MAX_PROBES, BandLayout, probe_count, probe_radii
from worker.errors import LayoutError
from worker.keys import IndexKeys

ALLOWED_FOR_7 = [m for m in range(1, 65) if probe_count(m, 7) <= MAX_PROBES]


@pytest.mark.parametrize("bands", range(1, 65))
def test_widths_cover_64_bits_and_differ_by_at_most_one(bands: int) -> None:
    layout = BandLayout(bands, 0)
    assert sum(layout.widths) == 64
    assert max(layout.widths) - min(layout.widths) <= 1
    assert list(layout.widths) == sorted(layout.widths, reverse=True)  # the wider bands come first
    assert layout.offsets[0] == 0
    for b in range(1, bands):
        assert layout.offsets[b] == layout.offsets[b - 1] + layout.widths[b - 1]


@pytest.mark.parametrize("bands", [1, 2, 4, 8, 16, 32, 64])
def test_classic_layout_when_bands_divide_64(bands: int) -> None:
    layout = BandLayout(bands, 0)
    width = 64 // bands
    rng = random.Random(bands)
    for _ in range(50):
        fp = rng.getrandbits(64)
        assert layout.values(fp) == [(fp >> (b * width)) & ((1 << width) - 1) for b in range(bands)]


def test_three_bands_are_22_21_21_bits_probed_at_2_2_1() -> None:
    layout = BandLayout(3, 7)
    assert layout.widths == (22, 21, 21)
    assert max(layout.radii) == 7 // 3  # the contract's p = r // m
    assert layout.radii == (2, 2, 1)  # 7 = 2 * 3 + 1: the first two bands at 2, the last at 1
    assert layout.probes == 254 + 232 + 22
    assert [len(masks) for masks in layout.probe_masks] == [254, 232, 22]


def test_four_bands_probe_17_values_each() -> None:
    layout = BandLayout(4, 7)
    assert max(layout.radii) == 1
    assert layout.radii == (1, 1, 1, 1)
    assert layout.probes == 68
    assert [len(masks) for masks in layout.probe_masks] == [17] * 4


def test_classic_layout_probes_every_band_exactly_at_distance_7() -> None:
    assert BandLayout(8, 7).radii == (0,) * 8
    assert BandLayout(8, 7).probes == 8
    assert BandLayout(8, 3).radii == (0, 0, 0, 0, -1, -1, -1, -1)  # 4 exact bands: one of any 4 must agree
    assert BandLayout(8, 3).probed_bands == 4


@pytest.mark.parametrize("bands", range(1, 65))
def test_radii_are_the_tightest_complete_probing(bands: int) -> None:
    """Recall needs, for every split of <= r differing bits over the bands, one band within its radius.

    The worst split puts radius + 1 bits in every band, which is r + 1 in total: just out of reach. Any smaller
    radius on any band would let a split of r bits through, so no probing with fewer values per band is complete.
    """
    for max_distance in range(0, 65):
        radii = probe_radii(bands, max_distance)
        assert sum(p + 1 for p in radii) == max_distance + 1
        assert list(radii) == sorted(radii, reverse=True)  # the probed bands are a prefix, the widest first
        assert max(radii) == max_distance // bands  # never wider than r // m
        assert min(radii) >= max_distance // bands - 1


@pytest.mark.parametrize("bands", range(1, 7))
def test_every_split_of_differing_bits_within_r_meets_a_probed_band(bands: int) -> None:
    """Brute force over every distribution of the differing bits across the bands (widths allowing)."""
    layout_widths = BandLayout(bands, 0).widths
    for max_distance in range(0, 13):
        radii = probe_radii(bands, max_distance)
        for split in product(range(max_distance + 1), repeat=bands):
            if sum(split) <= max_distance and all(d <= w for d, w in zip(split, layout_widths, strict=True)):
                assert any(d <= p for d, p in zip(split, radii, strict=True)), (bands, max_distance, split)


@pytest.mark.parametrize(
    ("bands", "max_distance"), [(8, 7), (4, 7), (3, 7), (5, 9), (16, 20), (2, 3), (7, 6), (8, 3), (5, 7)]
)
def test_probe_values_are_exactly_the_values_within_each_bands_radius(bands: int, max_distance: int) -> None:
    layout = BandLayout(bands, max_distance)
    rng = random.Random(bands * 100 + max_distance)
    fp = rng.getrandbits(64)
    probed = layout.probe_values(fp)
    assert sum(len(p) for p in probed) == layout.probes
    for b, (value, probes) in enumerate(zip(layout.values(fp), probed, strict=True)):
        width, radius = layout.widths[b], layout.radii[b]
        if radius < 0:
            assert probes == []
            continue
        assert probes[0] == value
        assert len(probes) == len(set(probes))
        if width <= 16:  # brute force over the whole band
            expected = {v for v in range(1 << width) if (v ^ value).bit_count() <= radius}
            assert set(probes) == expected
        else:
            assert all((v ^ value).bit_count() <= radius and v < 1 << width for v in probes)


@settings(max_examples=500)
@given(
    st.integers(1, 64),
    st.integers(0, 64),
    st.integers(0, 2**64 - 1),
    st.data(),
)
def test_pigeonhole_every_pair_within_r_shares_a_probe(
    bands: int, max_distance: int, a: int, data: st.DataObject
) -> None:
    if probe_count(bands, max_distance) > MAX_PROBES:
        return
    layout = BandLayout(bands, max_distance)
    flips = data.draw(st.sets(st.integers(0, 63), max_size=max_distance))
    b = a
    for bit in flips:
        b ^= 1 << bit
    assert any(value_b in probes for value_b, probes in zip(layout.values(b), layout.probe_values(a), strict=True)), (
        "a fingerprint within r was not probed: recall would be incomplete"
    )


def test_unreasonable_layouts_are_refused_with_a_way_out() -> None:
    with pytest.raises(LayoutError) as caught:
        BandLayout(2, 7)
    message = str(caught.value)
    assert "bands=2" in message and "10,978" in message
    assert "3 (508 probes)" in message  # the smallest count of bands that works


@pytest.mark.parametrize(
    ("bands", "max_distance", "fragment"),
    [
        (0, 7, "bands=0"),
        (65, 7, "bands=65"),
        (4, -1, "max_distance=-1"),
        (4, 65, "max_distance=65"),
        ("4", 7, "bands='4'"),
        (4, 7.0, "max_distance=7.0"),
        (True, 7, "bands=True"),
    ],
)
def test_out_of_range_layouts_are_refused(bands: object, max_distance: object, fragment: str) -> None:
    with pytest.raises(LayoutError, match=fragment.replace("(", r"\(")):
        BandLayout(bands, max_distance)  # type: ignore[arg-type]


def test_every_layout_for_distance_7_from_3_bands_up_is_usable() -> None:
    assert list(range(3, 65)) == ALLOWED_FOR_7


def test_key_names_follow_spec_section_3() -> None:
    keys = IndexKeys("incidents")
    assert keys.fingerprints == "{incidents}:fp"
    assert keys.meta == "{incidents}:meta"
    assert keys.events_stream == "{incidents}:events"
    assert keys.alerts_stream == "{incidents}:alerts"
    assert keys.dead_stream == "{incidents}:dead"
    assert keys.band_keys(BandLayout(8, 7))[3].key(0xA7) == "{incidents}:band:3:a7"
    assert keys.band_keys(BandLayout(4, 7))[0].key(0x5) == "{incidents}:band:0:0005"
    assert keys.band_keys(BandLayout(3, 7))[1].key(0x5) == "{incidents}:band:1:000005"
    assert keys.band_keys(BandLayout(1, 0))[0].key(0x5) == "{incidents}:band:0:0000000000000005"
    layout = BandLayout(3, 7)
    assert layout.hex_digits == (6, 6, 6)  # ceil(22 / 4), ceil(21 / 4)
    assert BandLayout(8, 7).hex_digits == (2,) * 8
    assert BandLayout(5, 7).hex_digits == (4, 4, 4, 4, 3)


@pytest.mark.parametrize("namespace", ["", "a{b", "a}b", "has space", "tab\t"])
def test_bad_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        IndexKeys(namespace)


def test_band_advice_keeps_the_default_until_three_bands_save_real_time() -> None:
    from worker.bands import query_cost_us, recommend_bands

    assert [recommend_bands(n) for n in (0, 3, 10_000, 100_000)] == [4, 4, 4, 4]
    assert recommend_bands(1_000_000) == 3  # measured: faster than the default at 1M (benchmarks/journal/pipeline.md)
    # the cost model: more incidents cost more; at 1M three bands' 508 probes are cheaper than 4 bands' candidates
    assert query_cost_us(4, 7, 10_000) < query_cost_us(4, 7, 100_000) < query_cost_us(4, 7, 1_000_000)
    assert query_cost_us(3, 7, 1_000_000) < query_cost_us(4, 7, 1_000_000) < query_cost_us(8, 7, 1_000_000)


def test_band_advice_on_the_snapshot_path_keeps_the_default(no_worker_env: None) -> None:
    """The cost model is the primary path's; on copies the primary's time does not depend on the layout and the
    default's 16-bit bands search fastest, so 3 bands are not advised there, and an index on them is advised back."""
    from worker.commands.stats import _on_copies, recommendation
    from worker.formats import Heartbeat
    from worker.settings import Settings

    assert recommendation(1_000_000, 4, 7)[0] == 3
    best, advice = recommendation(1_000_000, 4, 7, on_copies=True)
    assert best == 4 and "snapshot read path" in advice and "the layout in use" in advice
    best, advice = recommendation(1_000_000, 3, 7, on_copies=True)
    assert best == 4 and "incident-worker migrate --bands 4" in advice
    # the copies' searches have their own budget (SNAPSHOT_MAX_CANDIDATES, 60,000): 4 bands stay within half of it
    # to about 29M incidents on uniform fingerprints, then 3 bands are advised there too; with the primary's 3,000
    # 4 bands would have been crowded from about 1.5M
    assert recommendation(10_000_000, 4, 7, on_copies=True)[0] == 4
    assert recommendation(10_000_000, 4, 7, on_copies=True, budget=3000)[0] == 3
    best, advice = recommendation(40_000_000, 4, 7, on_copies=True)
    assert best == 3 and "past the per-event budget of 60,000" in advice and "raise" not in advice

    auto = Settings(read_path="auto", snapshot_min_incidents=100_000)
    assert not _on_copies(auto, 99_999, []) and _on_copies(auto, 100_000, [])
    assert _on_copies(Settings(read_path="snapshot"), 0, [])
    assert not _on_copies(Settings(read_path="primary"), 10**6, [])
    # what live workers say goes before what these settings would choose
    assert _on_copies(Settings(read_path="primary"), 0, [Heartbeat(consumer="a", read_path="snapshot")])
    assert not _on_copies(auto, 10**6, [Heartbeat(consumer="a", read_path="primary"), Heartbeat(consumer="b")])
