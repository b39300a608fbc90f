"""How well `worker.text` turns real log lines into fingerprints: the Loghub samples, judged by their templates.

Each Loghub ``*_structured.csv`` labels every line with the template it came from (``EventId``). Lines of one
template are "the same kind of message"; a good tokenizer puts their fingerprints within the alert distance of each
other and keeps lines of different templates apart. For each system this samples pairs of lines and prints:

* ``same<=r``: the fraction of same-template pairs within distance r (higher is better);
* ``same<=r new text``: the same, counting only pairs whose texts differ (identical lines are trivially at 0);
* ``diff<=r``: the fraction of different-template pairs within distance r (lower is better).

Three tokenizers are compared: whitespace split (lowercase, no masking), `features_from_text`, and
`features_from_text` with bigrams. Templates are a rough yardstick, not a ground truth: a template may hold free
text (user names, host names), and two templates may differ by one word.

Usage: python benchmarks/text_quality.py [LOGHUB_DIR] [--pairs N] [--distance R] [--seed S]
(LOGHUB_DIR defaults to ../shared/data/loghub, relative to the repository root.)
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from worker.fingerprint import distance, fingerprint  # noqa: E402 (after the sys.path line)
from worker.text import features_from_text  # noqa: E402

DEFAULT_LOGHUB = REPO_ROOT.parent / "shared" / "data" / "loghub"

Tokenizer = Callable[[str], dict[str, int]]


def whitespace_split(text: str) -> dict[str, int]:
    """The baseline: lowercase, split on whitespace, count; nothing masked."""
    bag = Counter(text.lower().split())
    if not bag:
        raise ValueError("no token")
    return dict(bag)


TOKENIZERS: dict[str, Tokenizer] = {
    "whitespace": whitespace_split,
    "text": features_from_text,
    "text+bigrams": lambda text: features_from_text(text, bigrams=True),
}


def load(path: Path) -> list[tuple[str, str]]:
    """(content, template ID) of every line of a Loghub structured CSV."""
    with path.open(newline="", encoding="utf-8") as handle:
        return [(row["Content"], row["EventId"]) for row in csv.DictReader(handle)]


def sample_pairs(
    lines: list[tuple[str, str]], pairs: int, rng: random.Random
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """Index pairs: same template, same template with different text, different templates.

    A same-template pair picks a line at random, then another line of its template, so large templates do not
    swamp the sample more than their share of lines.
    """
    by_template: dict[str, list[int]] = defaultdict(list)
    for index, (_, template) in enumerate(lines):
        by_template[template].append(index)
    paired = [index for index, (_, template) in enumerate(lines) if len(by_template[template]) > 1]
    same: list[tuple[int, int]] = []
    new_text: list[tuple[int, int]] = []
    diff: list[tuple[int, int]] = []
    for _ in range(pairs):
        if paired:
            first = rng.choice(paired)
            second = rng.choice(by_template[lines[first][1]])
            while second == first:
                second = rng.choice(by_template[lines[first][1]])
            same.append((first, second))
        for _attempt in range(20):  # templates whose lines are all identical yield no pair with new text
            first = rng.choice(paired) if paired else 0
            second = rng.choice(by_template[lines[first][1]])
            if lines[first][0] != lines[second][0]:
                new_text.append((first, second))
                break
        if len(by_template) > 1:
            first = rng.randrange(len(lines))
            second = rng.randrange(len(lines))
            while lines[second][1] == lines[first][1]:
                second = rng.randrange(len(lines))
            diff.append((first, second))
    return same, new_text, diff


def within(fingerprints: list[int | None], pairs: list[tuple[int, int]], radius: int) -> str:
    """The fraction of pairs (both lines tokenized) within `radius`, as a percentage."""
    judged = 0
    hits = 0
    for a, b in pairs:
        first, second = fingerprints[a], fingerprints[b]
        if first is not None and second is not None:
            judged += 1
            hits += distance(first, second) <= radius
    return f"{100 * hits / judged:.1f}%" if judged else "-"


def fingerprints_of(lines: list[tuple[str, str]], tokenizer: Tokenizer) -> tuple[list[int | None], float]:
    """The fingerprint of every line (None when it yields no token) and the tokenizer's microseconds per line."""
    started = time.perf_counter()
    bags: list[dict[str, int] | None] = []
    for content, _ in lines:
        try:
            bags.append(tokenizer(content))
        except ValueError:
            bags.append(None)
    elapsed = time.perf_counter() - started
    return [None if bag is None else fingerprint(bag) for bag in bags], 1e6 * elapsed / len(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loghub", nargs="?", type=Path, default=DEFAULT_LOGHUB, help="directory of *_structured.csv")
    parser.add_argument("--pairs", type=int, default=5000, help="pairs sampled per kind and system (default 5000)")
    parser.add_argument("--distance", type=int, default=7, help="the alert distance r (default 7)")
    parser.add_argument("--seed", type=int, default=20240601, help="random seed, for a reproducible table")
    args = parser.parse_args(argv)

    files = sorted(args.loghub.glob("*_structured.csv"))
    if not files:
        print(f"no *_structured.csv in {args.loghub}; pass the Loghub directory as the first argument", file=sys.stderr)
        return 2
    r = args.distance
    header = f"{'system':<10} {'tokenizer':<13} {'templates':>9} {f'same<={r}':>9} {f'same<={r} new text':>18} "
    header += f"{f'diff<={r}':>9} {'no token':>8} {'us/line':>7}"
    print(header)
    print("-" * len(header))
    for path in files:
        system = path.name.split("_")[0]
        lines = load(path)
        same, new_text, diff = sample_pairs(lines, args.pairs, random.Random(f"{args.seed}:{system}"))
        templates = len({template for _, template in lines})
        for name, tokenizer in TOKENIZERS.items():
            fingerprints, micros = fingerprints_of(lines, tokenizer)
            empty = sum(1 for fp in fingerprints if fp is None)
            print(
                f"{system:<10} {name:<13} {templates:>9} {within(fingerprints, same, r):>9} "
                f"{within(fingerprints, new_text, r):>18} {within(fingerprints, diff, r):>9} {empty:>8} {micros:>7.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
