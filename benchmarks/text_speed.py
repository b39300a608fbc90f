"""`features_from_text` against other versions of worker/text.py, in one process, rounds interleaved.

The machine is shared and its speed drifts by the minute, so versions timed in separate runs are not comparable;
here every round times each version once, and the best CPU time (``time.process_time``) of each is kept. Two
figures per version: the 70-character line of `text_quality.SPEED_LINE` (500 calls a round), and a pass over every
line of the Loghub samples (one call a line, so no line is repeated within a pass).

Usage: python benchmarks/text_speed.py [--rounds N] [OTHER_TEXT_PY ...]
e.g.   git show c696e91:worker/text.py > /tmp/text_v2.py
       git show main:worker/text.py > /tmp/text_main.py
       python benchmarks/text_speed.py /tmp/text_v2.py /tmp/text_main.py
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import text_quality

from worker.text import features_from_text

Tokenizer = Callable[[str], object]


def load_version(path: Path, name: str) -> Tokenizer:
    """`features_from_text` of another copy of worker/text.py, loaded as a module of its own inside the `worker`
    package, so that its relative imports (`from .errors import ...`) find today's package."""
    name = f"worker.{name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.features_from_text


def cpu_micros(function: Tokenizer, texts: Sequence[str]) -> float:
    """CPU microseconds per text of one call on each of `texts` (texts without a word are skipped quietly)."""
    started = time.process_time()
    for text in texts:
        with contextlib.suppress(ValueError):
            function(text)
    return 1e6 * (time.process_time() - started) / len(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("others", nargs="*", type=Path, help="other versions of worker/text.py to time beside it")
    parser.add_argument("--rounds", type=int, default=15, help="rounds (default 15)")
    args = parser.parse_args(argv)
    loghub = text_quality.find_loghub(None)
    if loghub is None:
        print("no Loghub samples found", file=sys.stderr)
        return 2
    lines = [content for path in sorted(loghub.glob("*_structured.csv")) for content, _ in text_quality.load(path)]
    versions: dict[str, Tokenizer] = {"this tree": features_from_text}
    for number, path in enumerate(args.others):
        versions[str(path)] = load_version(path, f"text_version_{number}")
    versions["whitespace split"] = text_quality.whitespace_split
    one_line = [text_quality.SPEED_LINE] * 500
    best_line = dict.fromkeys(versions, float("inf"))
    best_pass = dict.fromkeys(versions, float("inf"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for _ in range(args.rounds):
        for name, function in versions.items():
            best_line[name] = min(best_line[name], cpu_micros(function, one_line))
        for name, function in versions.items():
            best_pass[name] = min(best_pass[name], cpu_micros(function, lines))
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    mine_line, mine_pass = best_line["this tree"], best_pass["this tree"]
    print(f"{'version':<32} {'70-char line':>14} {'sample line':>14}   this tree's time, as a share of it")
    for name in versions:
        print(
            f"{name:<32} {best_line[name]:>11.2f} us {best_pass[name]:>11.2f} us   "
            f"{mine_line / best_line[name]:.2f} and {mine_pass / best_pass[name]:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
