"""SimHash-64 fingerprints of weighted feature bags (docs/contract.md#the-fingerprint).

The definition keeps 64 signed counters: for each token and each bit b of its BLAKE2b-64 hash, add the token's
weight when the bit is 1 and subtract it when it is 0; bit b of the fingerprint is set when counter b is > 0.
`fingerprint_reference` is that definition, line by line. `fingerprint` computes the same bits faster:

* Counter b equals ``2 * S_b - W``, where ``W`` is the bag's total weight and ``S_b`` the weight of the tokens whose
  hash has bit b set. So the fingerprint needs only the 64 sums ``S_b``.
* A token's hash is "spread" into one Python integer of 64 lanes, L bits each, lane b holding bit b of the hash.
  Then ``S = sum(weight * spread)`` adds all 64 lanes of all tokens in a handful of big-integer operations in C,
  and no lane can carry into the next while ``W < 2 ** (L - 1)``.
* Adding ``2 ** (L - 1) - W - 1`` to every lane of ``2 * S`` makes a lane's top bit the answer to ``2 * S_b > W``;
  the 64 top bits are gathered with one shift, one mask and a bytes translation.
* The spread integers of recent tokens are cached (incident vocabularies repeat heavily) in two forms, and the
  bag's total weight chooses: lanes of 8 bits below 128 (most incident bags; half the big-integer work of 16),
  lanes of 16 bits below 32,768. Heavier bags, up to weights of 2 ** 53 - 1 each, take wider lanes computed on the
  spot: slower, still exact. The lookups and products run inside `map`, in C.

Every input is validated first: a bad bag raises `InvalidFeaturesError` (a `ValueError`) naming the token and value.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from operator import mul
from typing import Any

from .errors import InvalidFeaturesError

__all__ = [
    "MAX_WEIGHT",
    "distance",
    "fingerprint",
    "fingerprint_many",
    "fingerprint_reference",
    "format_fingerprint",
    "parse_fingerprint",
    "stored_fingerprint",
    "token_hash",
]

MAX_WEIGHT = 2**53 - 1
"""The largest weight a token may carry: the largest integer a JSON number holds exactly in every language."""

_TOKEN_CACHE_SIZE = 65_536
"""Spread integers kept per lane width (about 100 and 170 bytes): a working vocabulary fits; a cache empties when
full."""

_BLAKE2B_8 = hashlib.blake2b(digest_size=8)
"""Copying a prepared hash object and updating it is 20 to 35% cheaper than building a new one per token."""

_LANE_BITS = 16
_LANE_LIMIT = 1 << (_LANE_BITS - 1)  # bags whose total weight is below this use the cached 16-bit lanes
_LANE8_LIMIT = 1 << 7  # ... and below this the cached 8-bit lanes


def _lanes_constants(lane_bits: int) -> tuple[int, int, list[int]]:
    """The all-lanes-one integer, lane width in bytes, and the spread of each byte value for `lane_bits`."""
    ones = sum(1 << (lane_bits * b) for b in range(64))
    per_byte = [sum(((x >> i) & 1) << (lane_bits * i) for i in range(8)) for x in range(256)]
    return ones, lane_bits // 8, per_byte


_ONES16 = _lanes_constants(_LANE_BITS)[0]
_ONES8 = _lanes_constants(8)[0]
_wide_constants: dict[int, tuple[int, int, list[int]]] = {}
_INT_ONLY = {int}
_BIAS8 = [(127 - weight) * _ONES8 for weight in range(_LANE8_LIMIT)]
"""`_gather`'s bias for 8-bit lanes, by total weight: lane b of 2 * S + bias has its top bit set iff 2 * S_b > W."""
_BITS_TO_ASCII = bytes.maketrans(b"\x00\x01", b"01")


def _show(value: Any, limit: int = 60) -> str:
    """A repr short enough for a log line or an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _token_bytes(token: Any) -> bytes:
    if not isinstance(token, str):
        raise InvalidFeaturesError(
            "bad_token",
            f"token {_show(token)} is of type {type(token).__name__}; tokens must be strings",
        )
    try:
        return token.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFeaturesError(
            "bad_token",
            f"token {_show(token)} is not valid Unicode (it holds a lone surrogate) and has no UTF-8 form",
        ) from None


def _bad_weight(token: Any, weight: Any) -> InvalidFeaturesError:
    if type(weight) is int:
        problem = "is out of range"
    elif isinstance(weight, bool):
        problem = "is a bool, not an integer"
    else:
        problem = f"is of type {type(weight).__name__}, not an integer"
    return InvalidFeaturesError(
        "bad_weight",
        f"weight {_show(weight)} of token {_show(token)} {problem}; weights must be integers "
        f"from 1 to 2**53 - 1 ({MAX_WEIGHT})",
    )


def _check_bag(features: Any) -> None:
    if not isinstance(features, Mapping):
        raise InvalidFeaturesError(
            "not_a_mapping",
            f"features must be a mapping of token -> weight, got {type(features).__name__}",
        )
    if not features:
        raise InvalidFeaturesError("empty_bag", "features is empty; a bag needs at least one token")


def token_hash(token: str) -> int:
    """BLAKE2b with an 8-byte digest of the token's UTF-8 bytes, read as a little-endian unsigned integer."""
    hasher = _BLAKE2B_8.copy()
    hasher.update(_token_bytes(token))
    return int.from_bytes(hasher.digest(), "little")


def fingerprint_reference(features: Mapping[str, int]) -> int:
    """The definition exactly as written: 64 counters, one step per token and bit. Slow; the oracle for tests."""
    _check_bag(features)
    counters = [0] * 64
    for token, weight in features.items():
        token_bytes = _token_bytes(token)
        if type(weight) is not int or not 1 <= weight <= MAX_WEIGHT:
            raise _bad_weight(token, weight)
        digest = int.from_bytes(hashlib.blake2b(token_bytes, digest_size=8).digest(), "little")
        for bit in range(64):
            if (digest >> bit) & 1:
                counters[bit] += weight
            else:
                counters[bit] -= weight
    result = 0
    for bit in range(64):
        if counters[bit] > 0:
            result |= 1 << bit
    return result


class _SpreadCache(dict[str, int]):
    """token -> its spread integer of 64 lanes of `lane_bits`; a miss hashes the token (and validates it).

    A dict whose `__missing__` fills it, so that a bag's lookups run inside `map` in C, with no Python loop.
    """

    def __init__(self, lane_bits: int) -> None:
        super().__init__()
        self.step = 8 * lane_bits
        self.table = _lanes_constants(lane_bits)[2]

    def __missing__(self, token: str) -> int:
        hasher = _BLAKE2B_8.copy()
        hasher.update(_token_bytes(token))
        table, step = self.table, self.step
        d0, d1, d2, d3, d4, d5, d6, d7 = hasher.digest()
        spread = (
            table[d0]
            | table[d1] << step
            | table[d2] << 2 * step
            | table[d3] << 3 * step
            | table[d4] << 4 * step
            | table[d5] << 5 * step
            | table[d6] << 6 * step
            | table[d7] << 7 * step
        )
        if len(self) >= _TOKEN_CACHE_SIZE:
            self.clear()
        self[token] = spread
        return spread


_spread8 = _SpreadCache(8)
_spread16 = _SpreadCache(_LANE_BITS)


def _gather(total: int, weight: int, lane_bits: int, ones: int, lane_bytes: int) -> int:
    """The fingerprint from the 64 lane sums in `total`: bit b is set when 2 * S_b > weight."""
    biased = 2 * total + ((1 << (lane_bits - 1)) - weight - 1) * ones
    tops = ((biased >> (lane_bits - 1)) & ones).to_bytes(8 * lane_bits, "little")[::lane_bytes]
    return int(tops.translate(_BITS_TO_ASCII)[::-1], 2)


def _fingerprint_wide(features: Mapping[str, int], weight: int) -> int:
    """Bags too heavy for 16-bit lanes: lanes as wide as the total weight needs, spreads computed on the spot."""
    lane_bits = -(-(weight.bit_length() + 1) // 8) * 8
    constants = _wide_constants.get(lane_bits)
    if constants is None:
        constants = _wide_constants[lane_bits] = _lanes_constants(lane_bits)
    ones, lane_bytes, per_byte = constants
    step = 8 * lane_bits
    total = 0
    for token, token_weight in features.items():
        digest = token_hash(token).to_bytes(8, "little")
        spread = 0
        for position, value in enumerate(digest):
            spread |= per_byte[value] << (step * position)
        total += token_weight * spread
    return _gather(total, weight, lane_bits, ones, lane_bytes)


def fingerprint(features: Mapping[str, int]) -> int:
    """The SimHash-64 fingerprint of a feature bag, as docs/contract.md#the-fingerprint defines it.

    Raises `InvalidFeaturesError` (a `ValueError`) for anything that is not a bag.
    """
    if type(features) is not dict:
        features = _as_dict(features)  # one consistent view of any other mapping
    elif not features:
        _check_bag(features)
    weights = features.values()
    if {*map(type, weights)} != _INT_ONLY or min(weights) < 1:
        _raise_bad_weight(features)
    weight = sum(weights)  # no weight is over the limit when their sum is not (all are positive)
    if weight < _LANE8_LIMIT:
        tops = ((sum(map(mul, weights, map(_spread8.__getitem__, features))) << 1) + _BIAS8[weight]) >> 7
        return int((tops & _ONES8).to_bytes(64, "little").translate(_BITS_TO_ASCII)[::-1], 2)
    if weight > MAX_WEIGHT and max(weights) > MAX_WEIGHT:
        _raise_bad_weight(features)
    if weight < _LANE_LIMIT:
        return _gather(sum(map(mul, weights, map(_spread16.__getitem__, features))), weight, _LANE_BITS, _ONES16, 2)
    return _fingerprint_wide(features, weight)


def _as_dict(features: Any) -> dict[Any, Any]:
    """A plain dict of any other mapping (its items, once), or `InvalidFeaturesError`."""
    _check_bag(features)
    try:
        copy = dict(features.items())
    except TypeError as error:  # an unhashable token
        raise InvalidFeaturesError("bad_token", f"a token of the bag cannot be used: {error}") from None
    _check_bag(copy)
    return copy


def _raise_bad_weight(features: dict[Any, Any]) -> None:
    """Raise for the first token (in the bag's order) whose weight, or else whose token, is invalid."""
    for token, token_weight in features.items():
        if type(token_weight) is not int or not 0 < token_weight <= MAX_WEIGHT:
            raise _bad_weight(token, token_weight)
        _token_bytes(token)
    raise InvalidFeaturesError("bad_weight", "a weight of the bag is out of range")  # pragma: no cover


def fingerprint_many(bags: Iterable[Mapping[str, int]]) -> list[int]:
    """Fingerprints of many bags, sharing one token cache; raises on the first bad bag."""
    return [fingerprint(bag) for bag in bags]


def format_fingerprint(value: int) -> str:
    """16 lowercase hex digits, most significant first: the form stored in Redis and shown to people."""
    return f"{value:016x}"


def parse_fingerprint(text: str | bytes) -> int:
    """The inverse of `format_fingerprint`."""
    if isinstance(text, bytes):
        text = text.decode("ascii")
    if len(text) != 16:
        raise ValueError(f"a fingerprint is 16 hex digits, got {text!r}")
    return int(text, 16)


_STORED_TEXT = re.compile(r"[0-9a-fA-F]{16}", re.ASCII)
_STORED_BYTES = re.compile(rb"[0-9a-fA-F]{16}")


def stored_fingerprint(value: str | bytes) -> int | None:
    """The fingerprint the index's search reads in a value of `{N}:fp` or the change log: 16 hex digits, uppercase
    too. None for anything else (a value mangled by hand, which the search never finds and verify reports); unlike
    `parse_fingerprint` (and `int`), it takes no ``0x``, ``_``, sign or space."""
    pattern = _STORED_BYTES if isinstance(value, bytes) else _STORED_TEXT
    return int(value, 16) if pattern.fullmatch(value) else None  # type: ignore[arg-type]


def distance(a: int, b: int) -> int:
    """Hamming distance between two fingerprints: the popcount of their XOR."""
    return (a ^ b).bit_count()
