"""Reproducible synthetic incident workloads, for the benchmark and the end-to-end tests.

Bags draw 8 to 30 tokens from a Zipf-distributed vocabulary (a few tokens are in most incidents, as "error" or a
service name are in real incident text, which makes band buckets uneven), with weights 1 to 5. About a fifth of the
incidents are near duplicates: small edits (a weight changed, a token added or dropped) of an earlier bag.

`Workload.fingerprints` makes a benchmark's pre-load (millions of incidents) in numpy: the fingerprints of bags of the
same distribution, computed exactly as `fingerprint` would (a test holds them against it), without a dict per bag;
the incidents that follow (`next`, `take`) may be near duplicates of its last bags, as they would of `take`'s.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from ..fingerprint import token_hash

__all__ = ["Workload"]


@dataclass
class Workload:
    """An endless, seeded stream of (incident_id, bag); IDs are decimal integers from `first_id` on."""

    seed: int = 1
    vocabulary: int = 20_000
    zipf_s: float = 0.9  # gives the classic 8-band layout 4.1% of the index as candidates, as the prototype saw
    min_tokens: int = 8
    max_tokens: int = 30
    max_weight: int = 5
    near_duplicates: float = 0.2
    first_id: int = 1
    memory: int = 5_000  # earlier bags a near duplicate may copy

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._tokens = [f"t{k}" for k in range(self.vocabulary)]
        self._cumulative = list(accumulate(1.0 / (k + 1) ** self.zipf_s for k in range(self.vocabulary)))
        self._recent: list[dict[str, int]] = []
        self._next_id = self.first_id

    def _fresh(self) -> dict[str, int]:
        rng = self._rng
        count = rng.randint(self.min_tokens, self.max_tokens)
        bag: dict[str, int] = {}
        while len(bag) < count:
            for token in rng.choices(self._tokens, cum_weights=self._cumulative, k=count - len(bag)):
                bag[token] = rng.randint(1, self.max_weight)
        return bag

    def _edit(self, original: dict[str, int]) -> dict[str, int]:
        rng = self._rng
        bag = dict(original)
        for _ in range(rng.randint(1, 2)):
            action = rng.random()
            token = rng.choice(list(bag))
            if action < 0.5:
                bag[token] = rng.randint(1, self.max_weight)
            elif action < 0.75 and len(bag) > 1:
                del bag[token]
            else:
                extra = rng.choices(self._tokens, cum_weights=self._cumulative, k=1)[0]
                bag[extra] = rng.randint(1, self.max_weight)
        return bag

    def next(self) -> tuple[str, dict[str, int]]:
        """The next incident."""
        if self._recent and self._rng.random() < self.near_duplicates:
            bag = self._edit(self._rng.choice(self._recent))
        else:
            bag = self._fresh()
        if len(self._recent) < self.memory:
            self._recent.append(bag)
        else:
            self._recent[self._rng.randrange(self.memory)] = bag
        incident_id = str(self._next_id)
        self._next_id += 1
        return incident_id, bag

    def fingerprints(self, count: int, *, chunk: int = 200_000) -> tuple[list[str], np.ndarray]:
        """The next `count` incidents as IDs and fingerprints (uint64), for a pre-load: about a million a second.

        The bags follow this workload's distribution, generated in numpy from its seed: 8 to 30 distinct tokens from
        the Zipf vocabulary, weights 1 to 5, and a share
        `near_duplicates` of 1 or 2 edits (a weight changed, a token dropped or added) of a fresh bag among the
        `memory` before it. Each fingerprint is exactly `fingerprint` of its bag (the same token hashes, 64 counters
        per bag in 8-bit lanes). The last `memory` bags become the ones `next` may copy from.
        """
        rng = np.random.default_rng(self._rng.getrandbits(64))
        lanes = self._token_bits()
        cumulative = np.array(self._cumulative)
        # the Zipf draw by table: token of each of 2**22 equal slices of the cumulative weights (exact to 2**-22)
        table = np.minimum(
            np.searchsorted(cumulative, (np.arange(1 << 22) + 0.5) * (cumulative[-1] / (1 << 22)), side="right"),
            self.vocabulary - 1,
        ).astype(np.int32)
        width = self.max_tokens + 2  # two spare slots for added tokens
        fps = np.empty(count, dtype=np.uint64)
        window_tokens = np.zeros((0, width), dtype=np.int32)
        window_weights = np.zeros((0, width), dtype=np.int64)
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            tokens, weights = self._fresh_arrays(rng, table, n, width)
            # near duplicates: copies of a fresh bag among the `memory` before them (this chunk's or the last's)
            history_tokens = np.concatenate([window_tokens, tokens])
            history_weights = np.concatenate([window_weights, weights])
            near = np.flatnonzero(rng.random(n) < self.near_duplicates) if start + n > 1 else np.zeros(0, np.int64)
            near = near[near + start > 0]
            here = near + len(window_tokens)  # positions in the history
            reach = np.minimum(here, self.memory)
            source = here - rng.integers(1, reach + 1)
            is_near = np.zeros(len(history_tokens), dtype=bool)
            is_near[here] = True
            # a source that is itself a near duplicate is replaced by the fresh bag just before it (fresh bags are
            # 80% of all: a short walk back)
            while True:
                bad = is_near[source]
                if not bad.any():
                    break
                source[bad] -= 1
                source[source < 0] = 0
            tokens[near] = history_tokens[source]
            weights[near] = history_weights[source]
            self._edit_arrays(rng, table, tokens, weights, near)
            fps[start : start + n] = _simhash(lanes, tokens, weights)
            keep = max(0, self.memory)
            window_tokens = np.concatenate([window_tokens, tokens])[-keep:]
            window_weights = np.concatenate([window_weights, weights])[-keep:]
        if count:
            self._recent = [
                _bag(self._tokens, t, w) for t, w in zip(window_tokens.tolist(), window_weights.tolist(), strict=True)
            ][-self.memory :]
        ids = [str(self._next_id + k) for k in range(count)]
        self._next_id += count
        return ids, fps

    def _token_bits(self) -> np.ndarray:
        """Each token's hash spread into 8 uint64 words of eight 8-bit lanes, lane b holding bit b of the hash."""
        hashes = np.array([token_hash(token) for token in self._tokens], dtype=np.uint64)
        bits = ((hashes[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
        return bits.view(np.uint64)  # (vocabulary, 8): byte lanes in memory order are bits 0..63

    def _fresh_arrays(
        self, rng: np.random.Generator, table: np.ndarray, n: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each bag: the first `count` distinct tokens of a row of draws (as `_fresh` draws until it has `count`
        distinct ones), each with its own weight; the slots after them empty."""
        counts = rng.integers(self.min_tokens, self.max_tokens + 1, size=n)
        draws = table[rng.integers(0, len(table), size=(n, 2 * width))]
        # the first occurrence of each token in its row: sort each row, mark where a value starts, map back
        order = np.argsort(draws, axis=1, kind="stable")
        ordered = np.take_along_axis(draws, order, axis=1)
        starts = np.ones_like(ordered, dtype=bool)
        starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
        first = np.zeros_like(starts)
        np.put_along_axis(first, order, starts, axis=1)
        rank = np.cumsum(first, axis=1) - 1
        keep = first & (rank < counts[:, None])
        rows, columns = np.nonzero(keep)
        tokens = np.zeros((n, width), dtype=draws.dtype)
        weights = np.zeros((n, width), dtype=np.int64)
        tokens[rows, rank[rows, columns]] = draws[rows, columns]
        weights[rows, rank[rows, columns]] = rng.integers(1, self.max_weight + 1, size=len(rows))
        return tokens, weights

    def _edit_arrays(
        self, rng: np.random.Generator, table: np.ndarray, tokens: np.ndarray, weights: np.ndarray, near: np.ndarray
    ) -> None:
        """One or two edits of each bag of `near`, as `_edit`: a held token's weight changed (half), the token
        dropped (a quarter) or a token drawn and given a weight."""
        for edit in range(2):
            rows = near if edit == 0 else near[rng.random(len(near)) < 0.5]
            if not len(rows):
                continue
            held = weights[rows] > 0
            # a random held slot of each row: the k-th held one, k uniform below the row's count
            k = (rng.random(len(rows)) * held.sum(axis=1)).astype(np.int64)
            slot = np.argmax(np.cumsum(held, axis=1) > k[:, None], axis=1)
            action = rng.random(len(rows))
            change = action < 0.5
            weights[rows[change], slot[change]] = rng.integers(1, self.max_weight + 1, size=int(change.sum()))
            drop = (action >= 0.5) & (action < 0.75) & (held.sum(axis=1) > 1)
            weights[rows[drop], slot[drop]] = 0
            add = np.flatnonzero(action >= 0.75)
            extra = table[rng.integers(0, len(table), size=len(add))]
            # a token the bag holds already gets the new weight (as a dict's key would); another takes a spare slot
            held_at = (tokens[rows[add]] == extra[:, None]) & (weights[rows[add]] > 0)
            slot = np.where(held_at.any(axis=1), np.argmax(held_at, axis=1), self.max_tokens + edit)
            tokens[rows[add], slot] = extra
            weights[rows[add], slot] = rng.integers(1, self.max_weight + 1, size=len(add))

    def take(self, count: int) -> list[tuple[str, dict[str, int]]]:
        """The next `count` incidents."""
        return [self.next() for _ in range(count)]

    def __iter__(self) -> Iterator[tuple[str, dict[str, int]]]:
        while True:
            yield self.next()


def _simhash(lanes: np.ndarray, tokens: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """SimHash-64 of each bag (row): bit b set when the weight of its tokens with hash bit b exceeds half its total.

    `lanes` holds each token's hash bits in 8-bit lanes (8 uint64 words): a slot's weight is at most 5, so 16 slots
    add up to at most 80 in a lane, without a carry; the halves of the slots are then added in 16 bits."""
    counters = np.zeros((len(tokens), 64), dtype=np.int16)
    for half in range(0, tokens.shape[1], 16):
        sums = np.zeros((len(tokens), 8), dtype=np.uint64)
        for slot in range(half, min(half + 16, tokens.shape[1])):
            sums += lanes[tokens[:, slot]] * weights[:, slot, None].astype(np.uint64)
        counters += sums.view(np.uint8)  # (n, 64): the weight of these slots' tokens whose hash bit b is set
    total = weights.sum(axis=1)
    bits = (2 * counters.astype(np.int64) > total[:, None]).astype(np.uint8)
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").reshape(-1).astype(np.uint64)


def _bag(vocabulary: list[str], tokens: list[int], weights: list[int]) -> dict[str, int]:
    bag: dict[str, int] = {}
    for token, weight in zip(tokens, weights, strict=True):
        if weight:
            name = vocabulary[token]
            bag[name] = bag.get(name, 0) + weight
    return bag
