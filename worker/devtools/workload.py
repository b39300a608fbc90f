"""Reproducible synthetic incident workloads, for the benchmark and the end-to-end tests.

Bags draw 8 to 30 tokens from a Zipf-distributed vocabulary (a few tokens are in most incidents, as "error" or a
service name are in real incident text, which makes band buckets uneven), with weights 1 to 5. About a fifth of the
incidents are near duplicates: small edits (a weight changed, a token added or dropped) of an earlier bag.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

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

    def take(self, count: int) -> list[tuple[str, dict[str, int]]]:
        """The next `count` incidents."""
        return [self.next() for _ in range(count)]

    def __iter__(self) -> Iterator[tuple[str, dict[str, int]]]:
        while True:
            yield self.next()
