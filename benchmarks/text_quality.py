"""How well `worker.text` groups real log lines, judged by their templates, beside Drain3 and a whitespace split.

Each Loghub ``*_structured.csv`` labels every line with the template it came from (``EventId``). A line's template
is the yardstick: two lines "group" when their fingerprints are within distance r (Drain3: when it puts them in one
cluster). Over every pair of lines of a system (about two million for 2,000 lines):

* precision: of the pairs that group, the share whose two lines share a template;
* recall: of the pairs that share a template, the share that group;
* pure alerts: the lines streamed in file order, each compared with every line before it, as the worker does: of
  the lines that alert (at least one earlier line within r; Drain3: joining a cluster that already has lines), the
  share whose matches all share the new line's template;
* grouping accuracy (GA; Zhu et al., "Tools and Benchmarks for Automated Log Parsing", 2019, and Loghub-2.0): the
  share of lines whose group is exactly the lines of their template. The groups are the worker's, the lines
  streamed in file order: a line joins the group of its closest earlier line within r (ties: the earliest line, as
  the worker orders matches by distance, then ID), else it opens a group; groups never merge. Drain3's groups are
  its clusters. A split template (in two groups) and a mixed group (two templates) both cost every line they hold.

Tokenizers: ``whitespace`` (lowercase, split on whitespace, count: nothing masked), ``text`` (`features_from_text`,
the product's), and Drain3 (PyPI ``drain3``, an optional benchmark dependency: ``pip install -e '.[bench]'``) with
its default configuration and with the masking of IPv4 addresses and numbers that its documentation suggests.
Templates are a rough yardstick, not a ground truth: a template may hold free text, and two templates may differ by
one word.

``--leave-one-out`` shows whether the choice of rules generalises: for each system, it chooses among the levers of
`text_levers.TextRules` (the shipped rules, each a switch, in the module beside this one: weighting, the weight of
plain words, one placeholder, paths, variable tails, the word after ``user``, the word after a ``key=``: 192
combinations) the one with the best mean of precision, recall, pure alerts and GA at the default distance on the
seven other systems, and measures it on the held-out one: the estimate for systems nobody tuned on. ``--levers``
prints each lever alone against the product's rules (and the pairs of `LEVER_PAIRS` together), then judges each by
leave-one-system-out on its own: for each held-out system, the product's rules or the lever, whichever the seven
others score better.

Usage: python benchmarks/text_quality.py [LOGHUB_DIR] [--distances 3,5,7,9] [--leave-one-out] [--levers] [--json F]
(LOGHUB_DIR defaults to ../shared/data/loghub beside the repository, then /work/shared/data/loghub.)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import logging
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from text_levers import DEFAULT_RULES, TextRules, tokenizer  # noqa: E402 (after the sys.path lines)

from worker.fingerprint import fingerprint  # noqa: E402
from worker.text import TOKENIZER_VERSION, features_from_text  # noqa: E402

LOGHUB_PLACES = [REPO_ROOT.parent / "shared" / "data" / "loghub", Path("/work/shared/data/loghub")]
DEFAULT_DISTANCE = 7
SPEED_LINE = "Failed password for invalid user admin from 187.141.143.180 port 55517"  # 70 characters

# Drain3's README: "following masking instructions in drain3.ini will mask IP addresses and integers"
DRAIN3_MASKING = [
    (r"((?<=[^A-Za-z0-9])|^)(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})((?=[^A-Za-z0-9])|$)", "IP"),
    (r"((?<=[^A-Za-z0-9])|^)([\-\+]?\d+)((?=[^A-Za-z0-9])|$)", "NUM"),
]

Tokenizer = Callable[[str], dict[str, int]]
Lines = list[tuple[str, str]]
Scores = dict[int, tuple[float, float, float]]  # distance -> (precision, recall, pure alerts)
Figures = tuple[float, ...]  # precision, recall, pure alerts, grouping accuracy (at one distance)


def whitespace_split(text: str) -> dict[str, int]:
    """The baseline: lowercase, split on whitespace, count; nothing masked."""
    bag = Counter(text.lower().split())
    if not bag:
        raise ValueError("no token")
    return dict(bag)


def load(path: Path) -> Lines:
    """(content, template ID) of every line of a Loghub structured CSV."""
    with path.open(newline="", encoding="utf-8") as handle:
        return [(row["Content"], row["EventId"]) for row in csv.DictReader(handle)]


def fingerprints_of(lines: Lines, tokenize: Tokenizer) -> list[int | None]:
    """The fingerprint of every line, None when it yields no token."""
    fps: list[int | None] = []
    for content, _ in lines:
        try:
            fps.append(fingerprint(tokenize(content)))
        except ValueError:
            fps.append(None)
    return fps


def _same_template_pairs(templates: Sequence[str]) -> int:
    return sum(n * (n - 1) // 2 for n in Counter(templates).values())


def fingerprint_scores(fps: Sequence[int | None], templates: Sequence[str], distances: Sequence[int]) -> Scores:
    """Precision, recall and pure alerts of grouping by fingerprint distance, at each distance.

    Lines with one fingerprint are counted together, so the work grows with the distinct fingerprints squared.
    A line without a fingerprint groups with nothing.
    """
    farthest = max(distances)
    groups: dict[int, Counter[str]] = defaultdict(Counter)
    for fp, template in zip(fps, templates, strict=True):
        if fp is not None:
            groups[fp][template] += 1
    keys = list(groups)
    counts = [groups[key] for key in keys]
    sizes = [sum(c.values()) for c in counts]
    grouped = Counter({0: sum(n * (n - 1) // 2 for n in sizes)})
    agreeing = Counter({0: sum(v * (v - 1) // 2 for c in counts for v in c.values())})
    for i, (a, count_a, size_a) in enumerate(zip(keys, counts, sizes, strict=True)):
        for j in range(i + 1, len(keys)):
            d = (a ^ keys[j]).bit_count()
            if d <= farthest:
                count_b = counts[j]
                grouped[d] += size_a * sizes[j]
                agreeing[d] += sum(v * count_b[t] for t, v in count_a.items() if t in count_b)
    total_same = _same_template_pairs(templates)

    alerts: Counter[int] = Counter()
    pure: Counter[int] = Counter()
    seen: dict[int, Counter[str]] = {}
    for fp, template in zip(fps, templates, strict=True):
        if fp is None:
            continue
        nearest = nearest_other = farthest + 1
        for other, others in seen.items():
            d = (fp ^ other).bit_count()
            if d < nearest:
                nearest = d
            if d < nearest_other and (len(others) > 1 or template not in others):
                nearest_other = d
        for r in distances:
            if nearest <= r:
                alerts[r] += 1
                pure[r] += nearest_other > r
        seen.setdefault(fp, Counter())[template] += 1

    scores: Scores = {}
    for r in distances:
        pairs = sum(v for d, v in grouped.items() if d <= r)
        same = sum(v for d, v in agreeing.items() if d <= r)
        scores[r] = (
            same / pairs if pairs else 1.0,
            same / total_same if total_same else 1.0,
            pure[r] / alerts[r] if alerts[r] else 1.0,
        )
    return scores


def cluster_scores(clusters: Sequence[int], templates: Sequence[str]) -> tuple[float, float, float]:
    """Precision, recall and pure alerts of grouping by cluster (a line alerts when it joins a non-empty cluster)."""
    members: dict[int, Counter[str]] = defaultdict(Counter)
    alerts = pure = 0
    for cluster, template in zip(clusters, templates, strict=True):
        before = members[cluster]
        if before:
            alerts += 1
            pure += len(before) == 1 and template in before
        before[template] += 1
    pairs = sum(sum(c.values()) * (sum(c.values()) - 1) // 2 for c in members.values())
    same = sum(v * (v - 1) // 2 for c in members.values() for v in c.values())
    total_same = _same_template_pairs(templates)
    return (same / pairs if pairs else 1.0, same / total_same if total_same else 1.0, pure / alerts if alerts else 1.0)


NO_MATCH = (65, -1)
"""The closest earlier line of a line that has none (or no fingerprint): farther than any distance."""


def closest_earlier(fps: Sequence[int | None]) -> list[tuple[int, int]]:
    """Every line's closest earlier line, as (distance, index): the smallest distance, then the earliest line (the
    worker sorts matches by distance, then ID; here a line's ID is its index). `NO_MATCH` for the first line and for
    a line without a fingerprint (never indexed, so no later line matches it either).

    Lines that share a fingerprint are compared once, through the first of them: the earliest at its distance.
    """
    first: dict[int, int] = {}  # fingerprint -> its first line, in the order of first lines
    found: list[tuple[int, int]] = []
    for index, fp in enumerate(fps):
        if fp is None:
            found.append(NO_MATCH)
            continue
        twin = first.get(fp)
        if twin is not None:
            found.append((0, twin))
            continue
        nearest, earliest = NO_MATCH
        for other, line in first.items():  # earliest first: a tie keeps the earlier line
            d = (fp ^ other).bit_count()
            if d < nearest:
                nearest, earliest = d, line
        found.append((nearest, earliest))
        first[fp] = index
    return found


def closest_match_groups(closest: Sequence[tuple[int, int]], r: int) -> list[int]:
    """The group of every line at distance r under the worker's group rule, the lines streamed in file order: a line
    joins the group of its closest earlier line (`closest_earlier`) when it is within r, else opens a group. A group
    is named by the index of the line that opened it; groups never merge."""
    groups: list[int] = []
    for index, (d, earlier) in enumerate(closest):
        groups.append(groups[earlier] if d <= r else index)
    return groups


def grouping_accuracy(groups: Sequence[Hashable], templates: Sequence[str]) -> float:
    """Grouping accuracy (GA; Zhu et al. 2019, Loghub-2.0): the share of lines whose group holds exactly the lines
    of their template. A group is right when all its lines share a template and no line of that template is
    elsewhere; every line of a right group counts, every other line does not."""
    if not templates:
        return 1.0
    group_size = Counter(groups)
    template_size = Counter(templates)
    together = Counter(zip(groups, templates, strict=True))
    right = sum(n for (group, template), n in together.items() if n == group_size[group] == template_size[template])
    return right / len(templates)


def grouping_scores(fps: Sequence[int | None], templates: Sequence[str], distances: Sequence[int]) -> dict[int, float]:
    """Grouping accuracy of the worker's groups (`closest_match_groups`) at each distance."""
    closest = closest_earlier(fps)
    return {r: grouping_accuracy(closest_match_groups(closest, r), templates) for r in distances}


def drain3_clusters(lines: Lines, masked: bool) -> list[int]:
    """Drain3's cluster of every line, fed in file order (default configuration, or with the README's masking)."""
    from drain3 import TemplateMiner
    from drain3.masking import MaskingInstruction
    from drain3.template_miner_config import TemplateMinerConfig

    config = TemplateMinerConfig()  # built in code: no drain3.ini is read
    if masked:
        config.masking_instructions = [MaskingInstruction(pattern, name) for pattern, name in DRAIN3_MASKING]
    miner = TemplateMiner(config=config)
    return [miner.add_log_message(content)["cluster_id"] for content, _ in lines]


def have_drain3() -> bool:
    try:
        import drain3  # noqa: F401
    except ImportError:
        return False
    return True


def micros_per_call(function: Tokenizer, text: str, calls: int = 2000, rounds: int = 7) -> float:
    """The best of `rounds` timings of `calls` calls, in microseconds per call (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            function(text)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / calls


BY_DISTANCE = ("whitespace", "text")
"""The methods that group by fingerprint distance (Drain3's clusters have no distance)."""

GRID_LEVERS = ("weights", "word_weight", "one_placeholder", "paths", "variable_tail", "user_value", "key_value")
"""The levers leave-one-out chooses among; the others (`head`, `hosts`, `key_words`, `units`) are measured alone."""


def stream_speed(lines: Sequence[str]) -> tuple[float, float]:
    """Microseconds per line and per 70 characters to tokenize `lines` once each (best of 3 passes)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for line in lines:
            with contextlib.suppress(ValueError):
                features_from_text(line)
        best = min(best, time.perf_counter() - started)
    characters = sum(len(line) for line in lines)
    return 1e6 * best / len(lines), 1e6 * best * 70 / characters


def lever_grid() -> list[TextRules]:
    """Every combination of the levers of `TextRules` that leave-one-out chooses among (`GRID_LEVERS`)."""
    grid = []
    for weights, word_weight, one, paths, tail, user, key_value in itertools.product(
        ("binary", "count"), (1, 2, 3), *[(False, True)] * 5
    ):
        grid.append(
            dataclasses.replace(
                DEFAULT_RULES,
                weights=weights,  # type: ignore[arg-type]
                word_weight=word_weight,
                one_placeholder=one,
                paths=paths,
                variable_tail=tail,
                user_value=user,
                key_value=key_value,
            )
        )
    return grid


def describe(rules: TextRules) -> str:
    """The levers of `rules` that differ from the product's, or "product" when none does."""
    changed = [
        f"{field.name}={getattr(rules, field.name)}"
        for field in dataclasses.fields(rules)
        if getattr(rules, field.name) != getattr(DEFAULT_RULES, field.name)
    ]
    return ", ".join(changed) or "product"


def measure(lines: Lines, tokenize: Tokenizer, distances: Sequence[int]) -> dict[int, Figures]:
    """Precision, recall, pure alerts and grouping accuracy of `tokenize` on one system, at each distance."""
    fps = fingerprints_of(lines, tokenize)
    templates = [t for _, t in lines]
    pairs = fingerprint_scores(fps, templates, distances)
    groups = grouping_scores(fps, templates, distances)
    return {r: (*pairs[r], groups[r]) for r in distances}


def mean_score(scores: dict[int, Figures], r: int) -> float:
    """The mean of the figures at distance r: what leave-one-out and the levers' judgement maximise."""
    return sum(scores[r]) / len(scores[r])


def average(rows: Sequence[Figures]) -> Figures:
    return tuple(sum(row[k] for row in rows) / len(rows) for k in range(len(rows[0])))


def leave_one_out(data: dict[str, Lines], r: int, progress: bool) -> dict[str, Any]:
    """For each system: the lever combination chosen on the other seven, and its scores on the held-out one.

    Chosen three ways: among every combination, among those with one placeholder, and among those with named ones
    (the same choice, with that lever held), so that the placeholder question is settled on held-out figures too.

    Combinations the seven others score exactly alike (a lever that changes no line of theirs, such as the word
    after ``user`` with OpenSSH held out) are tied: the held-out figures are the mean over the tied ones, what a
    choice by lot would give on average, rather than whichever the grid lists first.
    """
    grid = lever_grid()
    per_rules: list[dict[str, dict[int, Figures]]] = []
    for number, rules in enumerate(grid, 1):
        tokenize = tokenizer(rules)
        per_rules.append({system: measure(lines, tokenize, [r]) for system, lines in data.items()})
        if progress:
            print(f"  leave-one-out: {number}/{len(grid)} lever combinations measured", file=sys.stderr, end="\r")
    if progress:
        print(file=sys.stderr)
    choices = {
        "any": range(len(grid)),
        "one": [i for i, rules in enumerate(grid) if rules.one_placeholder],
        "named": [i for i, rules in enumerate(grid) if not rules.one_placeholder],
    }
    rows: dict[str, dict[str, Any]] = {}
    for held_out in data:
        others = [system for system in data if system != held_out]
        rows[held_out] = {}
        for way, candidates in choices.items():
            if not candidates:  # a grid without named (or one) placeholders
                continue
            score = {i: sum(mean_score(per_rules[i][system], r) for system in others) for i in candidates}
            best = max(score.values())
            tied = [i for i in candidates if score[i] == best]
            rows[held_out][way] = {
                "chosen": describe(grid[tied[0]]),
                "tied": len(tied),
                "held_out": average([per_rules[i][held_out][r] for i in tied]),
            }
    overall = max(range(len(grid)), key=lambda i: sum(mean_score(per_rules[i][s], r) for s in data))
    product = grid.index(DEFAULT_RULES)
    return {
        "distance": r,
        "rows": rows,
        "chosen_on_all": describe(grid[overall]),
        "product_in_sample": {s: per_rules[product][s][r] for s in data},
        "combinations": len(grid),
    }


LEVER_PAIRS = (("user_key", "accounts"),)
"""Levers also measured together (both on), where each alone answers only half of a question."""


def lever_variants() -> dict[str, TextRules]:
    """The product's rules, and the product's rules with one lever changed (or a pair of `LEVER_PAIRS`), by name."""
    variants = {"product": DEFAULT_RULES}
    for field in dataclasses.fields(TextRules):
        value = getattr(DEFAULT_RULES, field.name)
        if field.name == "weights":
            variants["weights=count"] = dataclasses.replace(DEFAULT_RULES, weights="count")
        elif field.name == "head":
            variants["head=2"] = dataclasses.replace(DEFAULT_RULES, head=2)
        elif isinstance(value, bool):
            variants[f"{field.name}={not value}"] = dataclasses.replace(DEFAULT_RULES, **{field.name: not value})
        else:
            for other in (1, 2, 3):
                if other != value:
                    variants[f"{field.name}={other}"] = dataclasses.replace(DEFAULT_RULES, **{field.name: other})
    for pair in LEVER_PAIRS:
        changed = {name: not getattr(DEFAULT_RULES, name) for name in pair}
        variants[", ".join(f"{name}={value}" for name, value in changed.items())] = dataclasses.replace(
            DEFAULT_RULES, **changed
        )
    return variants


def levers_alone(data: dict[str, Lines], distances: Sequence[int]) -> dict[str, Any]:
    """The product's rules with one lever changed at a time: the mean scores over the systems at each distance
    (``tables``), and each variant's scores per system at the default distance (``per_system``)."""
    tables: dict[int, dict[str, Figures]] = {r: {} for r in distances}
    per_system: dict[str, dict[str, Figures]] = {}
    for name, rules in lever_variants().items():
        tokenize = tokenizer(rules)
        scores = {system: measure(lines, tokenize, distances) for system, lines in data.items()}
        for r in distances:
            tables[r][name] = average([s[r] for s in scores.values()])
        per_system[name] = {system: s[DEFAULT_DISTANCE] for system, s in scores.items()}
    return {"tables": tables, "per_system": per_system}


def levers_held_out(per_system: dict[str, dict[str, Figures]]) -> dict[str, Any]:
    """Each lever judged by leave-one-system-out: for each held-out system, the product's rules or the lever,
    whichever has the better mean of its figures (P, R, A and GA) over the seven others, scored on the held-out one.

    A lever that only one system wants is taken when that system is among the seven and left when it is held out, so
    the held-out average rises above the product's only when the lever helps systems it was not chosen on.
    """
    product = per_system["product"]
    systems = list(product)
    result: dict[str, Any] = {}
    for name, scores in per_system.items():
        if name == "product":
            continue
        held: dict[str, Figures] = {}
        taken = 0
        for system in systems:
            others = [s for s in systems if s != system]
            gain = sum(sum(scores[s]) - sum(product[s]) for s in others)
            take = gain > 0
            taken += take
            held[system] = (scores if take else product)[system]
        result[name] = {
            "taken": taken,
            "held_out": held,
            "average": average(list(held.values())),
            "in_sample": average(list(scores.values())),
        }
    result["product"] = {"average": average(list(product.values()))}
    return result


def lost_and_merged(lines: Lines, tokenize: Tokenizer, r: int, top: int) -> dict[str, list[dict[str, Any]]]:
    """Where grouping at distance r goes wrong on one system, to read rather than to score.

    ``lost``: the templates with the most same-template pairs farther apart than r, each with its farthest pair;
    ``merged``: the template pairs with the most lines within r of each other, each with one such pair.
    """
    fps = fingerprints_of(lines, tokenize)
    by_template: dict[str, list[int]] = defaultdict(list)
    for index, (_, template) in enumerate(lines):
        by_template[template].append(index)
    lost = []
    for template, members in by_template.items():
        count: Counter[int | None] = Counter(fps[i] for i in members)
        keys = list(count)
        missed, farthest = 0, (-1, 0, 0)
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                d = 65 if a is None or b is None else (a ^ b).bit_count()
                if d > r:
                    missed += count[a] * count[b]
                    if d > farthest[0]:
                        farthest = (d, fps.index(a), fps.index(b))
        if missed:
            n = len(members)
            d, i, j = farthest
            lost.append(
                {
                    "template": template,
                    "lost": missed,
                    "pairs": n * (n - 1) // 2,
                    "distance": d,
                    "lines": [lines[i][0], lines[j][0]],
                }
            )
    lost.sort(key=lambda row: -row["lost"])
    groups: dict[int, list[int]] = defaultdict(list)
    for index, fp in enumerate(fps):
        if fp is not None:
            groups[fp].append(index)
    merged: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], tuple[int, int, int]] = {}
    keys = list(groups)
    for i, a in enumerate(keys):
        for b in keys[i:]:
            d = (a ^ b).bit_count()
            if d > r:
                continue
            for x in groups[a]:
                for y in groups[b]:
                    if a == b and y <= x:
                        continue
                    ta, tb = lines[x][1], lines[y][1]
                    if ta != tb:
                        pair = (min(ta, tb), max(ta, tb))
                        merged[pair] += 1
                        example.setdefault(pair, (d, x, y))
    merged_rows = [
        {
            "templates": list(pair),
            "pairs": n,
            "distance": example[pair][0],
            "lines": [lines[example[pair][1]][0], lines[example[pair][2]][0]],
        }
        for pair, n in merged.most_common(top)
    ]
    return {"lost": lost[:top], "merged": merged_rows}


def print_lost_and_merged(report: dict[str, dict[str, list[dict[str, Any]]]], r: int) -> None:
    def short(line: str) -> str:
        return line if len(line) <= 100 else line[:97] + "..."

    print(f"where the product's rules go wrong at r={r} (same-template pairs lost, different templates merged):")
    for system, found in report.items():
        print(f"  {system}")
        for row in found["lost"]:
            share = row["lost"] / row["pairs"]
            lost = f"{row['lost']} of {row['pairs']} pairs ({share:.0%})"
            print(f"    lost {lost} of {row['template']}, up to d={row['distance']}")
            for line in row["lines"]:
                print(f"      {short(line)!r}")
        for row in found["merged"]:
            print(f"    merged {row['pairs']} pairs of {' and '.join(row['templates'])} (d={row['distance']})")
            for line in row["lines"]:
                print(f"      {short(line)!r}")


def _pct(value: float) -> str:
    return f"{100 * value:5.1f}"


def _pct2(value: float) -> str:
    return f"{100 * value:6.2f}"


def print_leave_one_out(loo: dict[str, Any]) -> None:
    r, tried = loo["distance"], loo["combinations"]
    print(f"leave-one-out at r={r}: levers chosen on the other systems ({tried} combinations), scored on the eighth")
    ways = {"any": "any levers", "one": "one placeholder", "named": "named placeholders"}
    print(f"{'held out':<10} " + "  ".join(f"{title:^27}" for title in ways.values()) + "  chosen (any levers)")
    print(f"{'':<10} " + "  ".join(f"{'P':>6} {'R':>6} {'A':>6} {'GA':>6}" for _ in ways))
    rows = loo["rows"]
    for system, row in rows.items():
        cells = "  ".join(" ".join(_pct2(x) for x in row[way]["held_out"]) for way in ways)
        tied = f" (and {row['any']['tied'] - 1} tied)" if row["any"]["tied"] > 1 else ""
        print(f"{system:<10} {cells}  {row['any']['chosen']}{tied}")
    for label, combine in (("average", lambda v: sum(v) / len(v)), ("lowest", min)):
        cells = "  ".join(
            " ".join(_pct2(combine([row[way]["held_out"][k] for row in rows.values()])) for k in range(4))
            for way in ways
        )
        print(f"{label:<10} {cells}")
    for way in ("one", "named"):
        chosen = Counter(row[way]["chosen"] for row in rows.values())
        print(f"chosen with {ways[way]}: " + "; ".join(f"{name} ({n} of {len(rows)})" for name, n in chosen.items()))
    print(f"chosen on all systems: {loo['chosen_on_all']}")


def print_quality(results: dict[str, dict[str, Any]], distances: Sequence[int]) -> None:
    methods = list(next(iter(results.values())))
    columns = "  ".join(f"{'r=' + str(r):^17}" for r in distances)
    print(f"{'system':<10} {'method':<14} {columns}")
    print(f"{'':<10} {'':<14} " + "  ".join(f"{'P':>5} {'R':>5} {'A':>5}" for _ in distances))
    rows = [*results, "average", "lowest"]
    for system in rows:
        for method in methods:
            cells = []
            for r in distances:
                values = [results[s][method][r] for s in results]
                if system == "average":
                    triple = tuple(sum(v[k] for v in values) / len(values) for k in range(3))
                elif system == "lowest":
                    triple = tuple(min(v[k] for v in values) for k in range(3))
                else:
                    triple = results[system][method][r]
                cells.append(" ".join(_pct(x) for x in triple))
            print(f"{system:<10} {method:<14} " + "  ".join(cells))


def print_grouping(grouping: dict[str, dict[str, dict[int, float]]], distances: Sequence[int]) -> None:
    """GA in % per system and method: at each distance for fingerprints, once for Drain3 (its clusters have none)."""
    columns = [
        (method, r)
        for method in next(iter(grouping.values()))
        for r in (distances if method in BY_DISTANCE else distances[:1])
    ]
    titles = [f"{method} r={r}" if method in BY_DISTANCE else method for method, r in columns]
    widths = [max(len(title), 5) for title in titles]
    print(f"{'system':<10} " + " ".join(f"{title:>{w}}" for title, w in zip(titles, widths, strict=True)))
    rows = {system: [values[method][r] for method, r in columns] for system, values in grouping.items()}
    rows["average"] = [sum(column) / len(column) for column in zip(*rows.values(), strict=True)]
    rows["lowest"] = [min(column) for column in zip(*[rows[s] for s in grouping], strict=True)]
    for system, row in rows.items():
        print(f"{system:<10} " + " ".join(f"{100 * x:>{w}.1f}" for x, w in zip(row, widths, strict=True)))


def find_loghub(given: Path | None) -> Path | None:
    for place in [given] if given else LOGHUB_PLACES:
        if place is not None and any(place.glob("*_structured.csv")):
            return place
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loghub", nargs="?", type=Path, help="directory of *_structured.csv")
    parser.add_argument("--distances", default="3,5,7,9", help="distances r to judge at (default 3,5,7,9)")
    parser.add_argument("--leave-one-out", action="store_true", help="choose the levers on 7 systems, test on the 8th")
    parser.add_argument("--levers", action="store_true", help="each lever alone against the product's rules")
    parser.add_argument("--lost", type=int, metavar="N", help="the N worst templates and template pairs per system")
    parser.add_argument("--no-drain3", action="store_true", help="leave Drain3 out even when it is installed")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    logging.getLogger("drain3").setLevel(logging.ERROR)  # Drain3 logs every new cluster

    loghub = find_loghub(args.loghub)
    if loghub is None:
        print("no *_structured.csv found; pass the Loghub directory as the first argument", file=sys.stderr)
        return 2
    distances = sorted({int(r) for r in args.distances.split(",")} | {DEFAULT_DISTANCE})
    data = {path.name.split("_")[0]: load(path) for path in sorted(loghub.glob("*_structured.csv"))}
    drain = have_drain3() and not args.no_drain3
    if not drain and not args.no_drain3:
        print("drain3 is not installed (pip install -e '.[bench]'): its rows are left out", file=sys.stderr)

    results: dict[str, dict[str, Any]] = {}
    grouping: dict[str, dict[str, dict[int, float]]] = {}
    for system, lines in data.items():
        templates = [t for _, t in lines]
        row: dict[str, Any] = {}
        grouped: dict[str, dict[int, float]] = {}
        for name, tokenize in (("whitespace", whitespace_split), ("text", features_from_text)):
            fps = fingerprints_of(lines, tokenize)
            row[name] = fingerprint_scores(fps, templates, distances)
            grouped[name] = grouping_scores(fps, templates, distances)
        if drain:
            for name, masked in (("drain3", False), ("drain3+masks", True)):
                clusters = drain3_clusters(lines, masked)
                row[name] = dict.fromkeys(distances, cluster_scores(clusters, templates))  # a cluster has no distance
                grouped[name] = dict.fromkeys(distances, grouping_accuracy(clusters, templates))
        results[system] = row
        grouping[system] = grouped

    print(f"Tokenizer version {TOKENIZER_VERSION}; Loghub samples in {loghub}")
    print("P: precision, R: recall (pairs), A: pure alerts, in %; Drain3 has no distance (same figures in each column)")
    print()
    print_quality(results, distances)
    print()
    print("GA: grouping accuracy in %, the share of lines whose group is exactly the lines of their template; the")
    print("worker's groups (a line joins the group of its closest earlier line within r, ties to the earliest line,")
    print("else opens one); Drain3's groups are its clusters")
    print()
    print_grouping(grouping, distances)
    one_line = micros_per_call(features_from_text, SPEED_LINE)
    baseline = micros_per_call(whitespace_split, SPEED_LINE)
    every_line = [content for lines in data.values() for content, _ in lines]
    per_line, per_70 = stream_speed(every_line)
    print()
    print(f"speed: {one_line:.1f} us for a {len(SPEED_LINE)}-character line ({baseline:.1f} us, whitespace split);")
    print(
        f"       {per_line:.1f} us a line over the {len(every_line):,} sample lines ({per_70:.1f} us per 70 characters)"
    )
    output: dict[str, Any] = {
        "tokenizer_version": TOKENIZER_VERSION,
        "quality": {
            s: {m: {str(r): v for r, v in row.items()} for m, row in rows.items()} for s, rows in results.items()
        },
        "grouping_accuracy": {
            s: {m: {str(r): v for r, v in row.items()} for m, row in rows.items()} for s, rows in grouping.items()
        },
        "speed_us_70_chars": one_line,
        "speed_us_whitespace": baseline,
        "speed_us_sample_line": per_line,
        "speed_us_per_70_sample_chars": per_70,
    }
    if args.lost:
        report = {
            system: lost_and_merged(lines, features_from_text, DEFAULT_DISTANCE, args.lost)
            for system, lines in data.items()
        }
        print()
        print_lost_and_merged(report, DEFAULT_DISTANCE)
        output["lost_and_merged"] = report
    if args.levers:
        measured = levers_alone(data, distances)
        tables = measured["tables"]
        print()
        print("each lever alone, mean over the systems, P R A GA in % at each distance:")
        print(f"  {'rules':<34} " + "  ".join(f"{'r=' + str(r):^27}" for r in distances))
        for name in tables[DEFAULT_DISTANCE]:
            print(f"  {name:<34} " + "  ".join(" ".join(_pct2(x) for x in tables[r][name]) for r in distances))
        held_out = levers_held_out(measured["per_system"])
        print()
        print(f"each lever by leave-one-system-out at r={DEFAULT_DISTANCE}: taken when it beats the product's rules")
        print("on the seven others (mean of P, R, A, GA); P R A GA in %, averaged over the eight held-out systems:")
        product_average = " ".join(_pct2(x) for x in held_out["product"]["average"])
        print(f"  {'product':<34} {product_average}")
        for name, row in held_out.items():
            if name != "product":
                cells = " ".join(_pct2(x) for x in row["average"])
                print(f"  {name:<34} {cells}  taken for {row['taken']} of {len(row['held_out'])}")
        output["levers"] = tables[DEFAULT_DISTANCE]
        output["levers_by_distance"] = {str(r): table for r, table in tables.items()}
        output["levers_per_system"] = measured["per_system"]
        output["levers_held_out"] = held_out
    if args.leave_one_out:
        loo = leave_one_out(data, DEFAULT_DISTANCE, progress=sys.stderr.isatty())
        print()
        print_leave_one_out(loo)
        output["leave_one_out"] = loo
    if args.json:
        args.json.write_text(json.dumps(output, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
