"""The fingerprint, its test vectors, its validation, and the fast path against the definition.

The contract: docs/contract.md#the-fingerprint.
"""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import InvalidFeaturesError
from worker.fingerprint import (
    MAX_WEIGHT,
    distance,
    fingerprint,
    fingerprint_many,
    fingerprint_reference,
    format_fingerprint,
    parse_fingerprint,
    stored_fingerprint,
)

fpmod = importlib.import_module("worker.fingerprint")  # the package re-exports a function of the same name

SPEC_VECTORS = [
    ({"dock": 3, "scanner": 2, "timeout": 1}, "0b61171015620fa1"),
    ({"weather": 4, "road": 2}, "d82ccc6d72fe2dbe"),
    ({"a": 1, "b": 1}, "2542044921827000"),
    ({"disk full": 5, "Ünïcode": 2, "": 1}, "91091bf6b0ecbe2f"),
    ({"x": 1}, "4f586ef96743df4a"),
    ({"tok": 1099511627776}, "6190f7b58567ad5d"),
]


@pytest.mark.parametrize(("bag", "expected"), SPEC_VECTORS)
def test_spec_vectors(bag: dict[str, int], expected: str) -> None:
    assert format_fingerprint(fingerprint(bag)) == expected
    assert format_fingerprint(fingerprint_reference(bag)) == expected


def test_spec_vectors_in_a_batch() -> None:
    assert [format_fingerprint(fp) for fp in fingerprint_many(bag for bag, _ in SPEC_VECTORS)] == [
        expected for _, expected in SPEC_VECTORS
    ]


weights = st.integers(min_value=1, max_value=MAX_WEIGHT)
small_weights = st.integers(min_value=1, max_value=6)
tokens = st.text(max_size=12)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.dictionaries(tokens, small_weights, min_size=1, max_size=40))
def test_fast_path_equals_definition_small_weights(bag: dict[str, int]) -> None:
    assert fingerprint(bag) == fingerprint_reference(bag)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(tokens, weights, min_size=1, max_size=25))
def test_fast_path_equals_definition_any_weights(bag: dict[str, int]) -> None:
    assert fingerprint(bag) == fingerprint_reference(bag)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=6), min_size=2, max_size=8, unique=True), st.integers(1, MAX_WEIGHT))
def test_ties_give_zero_bits(token_list: list[str], weight: int) -> None:
    # An even number of equal weights makes ties likely; pairs of tokens are the classic case (the "a", "b" vector).
    bag = dict.fromkeys(token_list[: len(token_list) // 2 * 2], weight)
    assert fingerprint(bag) == fingerprint_reference(bag)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        tokens, st.sampled_from([1, 2, 63, 64, 127, 128, 2**15 - 1, 2**15, 2**31, MAX_WEIGHT]), min_size=1, max_size=30
    )
)
def test_lane_width_boundaries(bag: dict[str, int]) -> None:
    # total weights just under and over 2**7 and 2**15 switch between the cached 8-bit and 16-bit lanes and wider ones
    assert fingerprint(bag) == fingerprint_reference(bag)


@pytest.mark.parametrize("limit", [2**7, 2**15])
def test_total_weight_around_each_cached_lane_limit(limit: int) -> None:
    rng = random.Random(limit)
    for total in range(limit - 3, limit + 3):
        for parts in (1, 2, 3, 7):
            weights = [total // parts] * (parts - 1)
            weights.append(total - sum(weights))
            bag = {f"t{rng.random()}": w for w in weights}
            assert sum(bag.values()) == total
            assert fingerprint(bag) == fingerprint_reference(bag), (total, parts)


def test_heaviest_bag_of_many_max_weights() -> None:
    bag = {f"t{i}": MAX_WEIGHT - i for i in range(2000)}
    assert fingerprint(bag) == fingerprint_reference(bag)


def test_total_weight_at_the_16_bit_lane_limit() -> None:
    for total in (2**15 - 2, 2**15 - 1, 2**15, 2**15 + 1):
        bag = {"a": total // 2, "b": total - total // 2}
        assert fingerprint(bag) == fingerprint_reference(bag), total


def test_token_cache_bound_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fpmod, "_TOKEN_CACHE_SIZE", 8)
    fpmod._spread8.clear()
    fpmod._spread16.clear()
    bags = [{f"w{(i * 7 + j) % 50}": j + 1 for j in range(10)} for i in range(60)]  # total weight 55: 8-bit lanes
    bags += [{f"w{(i * 7 + j) % 50}": 20 * j + 1 for j in range(10)} for i in range(60)]  # 910: 16-bit lanes
    assert fingerprint_many(bags) == [fingerprint_reference(bag) for bag in bags]
    assert 0 < len(fpmod._spread8) <= 8 and 0 < len(fpmod._spread16) <= 8


class Weird(str):
    pass


def test_str_subclass_is_a_string_token() -> None:
    assert fingerprint({Weird("dock"): 3, "scanner": 2, "timeout": 1}) == int("0b61171015620fa1", 16)


BAD_BAGS = [
    ({}, "empty_bag", "empty"),
    ([("a", 1)], "not_a_mapping", "list"),
    ("dock", "not_a_mapping", "str"),
    (None, "not_a_mapping", "NoneType"),
    ({"a": True}, "bad_weight", "'a'"),
    ({"a": False}, "bad_weight", "bool"),
    ({"a": 2.0}, "bad_weight", "float"),
    ({"a": "2"}, "bad_weight", "'2'"),
    ({"a": 0}, "bad_weight", "out of range"),
    ({"a": -3}, "bad_weight", "-3"),
    ({"a": MAX_WEIGHT + 1}, "bad_weight", str(MAX_WEIGHT + 1)),
    ({"a": None}, "bad_weight", "None"),
    ({"ok": 1, "boom": 1.5}, "bad_weight", "'boom'"),
    ({1: 1}, "bad_token", "int"),
    ({b"a": 1}, "bad_token", "bytes"),
    ({"\ud800": 1}, "bad_token", "surrogate"),
]


@pytest.mark.parametrize(("bag", "reason", "named"), BAD_BAGS)
@pytest.mark.parametrize("function", [fingerprint, fingerprint_reference])
def test_bad_bags_are_refused(function, bag, reason: str, named: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidFeaturesError) as caught:
        function(bag)
    assert caught.value.reason == reason
    assert named in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_bad_bag_after_a_cached_token_is_still_refused() -> None:
    fingerprint({"cached": 1})
    with pytest.raises(InvalidFeaturesError, match="'cached'"):
        fingerprint({"cached": 0})


def test_batch_raises_on_first_bad_bag() -> None:
    with pytest.raises(InvalidFeaturesError):
        fingerprint_many([{"a": 1}, {}])


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_distance_and_hex_round_trip(a: int, b: int) -> None:
    assert parse_fingerprint(format_fingerprint(a)) == a
    assert parse_fingerprint(format_fingerprint(a).encode()) == a
    assert len(format_fingerprint(a)) == 16
    assert distance(a, b) == sum(((a >> i) & 1) != ((b >> i) & 1) for i in range(64))


class _SortedIteration(dict):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(dict.__iter__(self)))


class _ListMapping(Mapping):  # type: ignore[type-arg]
    """A mapping over a list of pairs: keys need not be hashable, and `values` is not consulted by `items`."""

    def __init__(self, pairs: list[tuple[object, object]]) -> None:
        self.pairs = pairs

    def __getitem__(self, key: object) -> object:
        return next(v for k, v in self.pairs if k == key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(k for k, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


def test_other_mappings_are_read_through_their_items_once() -> None:
    bag = {"zeta": 5, "alpha": 1, "mid": 2}
    assert fingerprint(_SortedIteration(bag)) == fingerprint_reference(bag)
    assert fingerprint(_ListMapping(list(bag.items()))) == fingerprint_reference(bag)
    with pytest.raises(InvalidFeaturesError) as caught:
        fingerprint(_ListMapping([("a", 1), (["un", "hashable"], 2)]))
    assert caught.value.reason == "bad_token"
    with pytest.raises(InvalidFeaturesError) as caught:
        fingerprint(_ListMapping([("a", 1), ("b", 0)]))
    assert caught.value.reason == "bad_weight"


def test_importing_the_pure_core_imports_no_redis_client_nor_pydantic() -> None:
    """`import worker.fingerprint` (and bands, keys, text, errors) must stay cheap: no redis, no pydantic."""
    code = (
        "import sys, worker.fingerprint, worker.bands, worker.keys, worker.text, worker.errors\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'pydantic', 'hiredis'))\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "", f"the pure modules imported {done.stdout.strip()}"


@given(st.integers(0, 2**64 - 1))
def test_a_stored_fingerprint_reads_back_in_either_case_as_text_or_bytes(fp: int) -> None:
    hex_fp = format_fingerprint(fp)
    for value in (hex_fp, hex_fp.upper(), hex_fp.encode(), hex_fp.upper().encode()):
        assert stored_fingerprint(value) == fp


@pytest.mark.parametrize(
    "value", ["", "0" * 15, "0" * 17, "0x" + "0" * 14, "00000000_0000000", " " + "0" * 15, "+" + "0" * 15, "zz" * 8]
)
def test_a_value_the_search_does_not_read_is_no_stored_fingerprint(value: str) -> None:
    """What int(value, 16) would read (0x, _, a sign, spaces) is no fingerprint: the index's search never finds it."""
    assert stored_fingerprint(value) is None and stored_fingerprint(value.encode()) is None
