"""benchmarks/text_quality.py: its pair and alert figures against a brute force over every pair of lines."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import text_quality

from worker.text import TOKENIZER_VERSION


def _brute_force(groups: list[int | None], templates: list[str], near: object) -> tuple[float, float, float]:
    """Precision, recall, pure alerts; `near(i, j)` says whether lines i and j group."""
    grouped = agreeing = same_template = alerts = pure = 0
    for j in range(len(templates)):
        matches = [i for i in range(j) if near(i, j)]  # type: ignore[operator]
        for i in range(j):
            same_template += templates[i] == templates[j]
        grouped += len(matches)
        agreeing += sum(templates[i] == templates[j] for i in matches)
        if matches:
            alerts += 1
            pure += all(templates[i] == templates[j] for i in matches)
    return (
        agreeing / grouped if grouped else 1.0,
        agreeing / same_template if same_template else 1.0,
        pure / alerts if alerts else 1.0,
    )


lines = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 3, 2**63, 2**64 - 1])),
        st.sampled_from("abc"),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(lines, st.lists(st.integers(0, 64), min_size=1, max_size=3, unique=True))
def test_fingerprint_scores_count_every_pair(rows: list[tuple[int | None, str]], distances: list[int]) -> None:
    fps = [fp for fp, _ in rows]
    templates = [t for _, t in rows]
    scores = text_quality.fingerprint_scores(fps, templates, distances)
    for r in distances:

        def near(i: int, j: int, r: int = r) -> bool:
            a, b = fps[i], fps[j]
            return a is not None and b is not None and (a ^ b).bit_count() <= r

        assert scores[r] == pytest.approx(_brute_force(fps, templates, near))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from("abc")), min_size=1, max_size=40))
def test_cluster_scores_count_every_pair(rows: list[tuple[int, str]]) -> None:
    clusters = [c for c, _ in rows]
    templates = [t for _, t in rows]
    expected = _brute_force(clusters, templates, lambda i, j: clusters[i] == clusters[j])  # type: ignore[arg-type]
    assert text_quality.cluster_scores(clusters, templates) == pytest.approx(expected)


def test_grouping_accuracy_on_a_hand_checked_example() -> None:
    """Six lines, templates A A A B B C. Groups g1 = {0, 1}, g2 = {2}, g3 = {3, 4}, g4 = {5}: A is split (its three
    lines are wrong), B and C are grouped exactly (three lines right)."""
    templates = ["A", "A", "A", "B", "B", "C"]
    assert text_quality.grouping_accuracy(["g1", "g1", "g2", "g3", "g3", "g4"], templates) == 3 / 6
    # a mixed group: C's line joins B's group, so B and C are wrong, and A, now whole, is right
    assert text_quality.grouping_accuracy([1, 1, 1, 3, 3, 3], templates) == 3 / 6
    assert text_quality.grouping_accuracy([0, 0, 0, 1, 1, 2], templates) == 1.0
    assert text_quality.grouping_accuracy([0, 1, 2, 3, 4, 5], templates) == 1 / 6  # only C, alone, is right
    assert text_quality.grouping_accuracy([], []) == 1.0


def _ga_brute_force(groups: Sequence[object], templates: list[str]) -> float:
    """GA as defined: line i is right when the lines grouped with it are exactly those sharing its template."""
    n = len(templates)
    right = sum(
        {j for j in range(n) if groups[j] == groups[i]} == {j for j in range(n) if templates[j] == templates[i]}
        for i in range(n)
    )
    return right / n if n else 1.0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abcd")), max_size=30))
def test_grouping_accuracy_is_its_definition_on_random_labelings(rows: list[tuple[int, str]]) -> None:
    groups = [g for g, _ in rows]
    templates = [t for _, t in rows]
    assert text_quality.grouping_accuracy(groups, templates) == pytest.approx(_ga_brute_force(groups, templates))


def _groups_brute_force(fps: list[int | None], r: int) -> list[int]:
    """The group rule read literally: a line (with a fingerprint) joins the group of the earlier line with a
    fingerprint at the smallest distance within r, the earliest of those at that distance; else it opens a group."""
    groups: list[int] = []
    for j, fp in enumerate(fps):
        matches = [
            ((fp ^ other).bit_count(), i)
            for i, other in enumerate(fps[:j])
            if fp is not None and other is not None and (fp ^ other).bit_count() <= r
        ]
        groups.append(groups[min(matches)[1]] if matches else j)
    return groups


@settings(max_examples=300, deadline=None)
@given(lines, st.lists(st.integers(0, 64), min_size=1, max_size=3, unique=True))
def test_grouping_follows_the_closest_earlier_match(rows: list[tuple[int | None, str]], distances: list[int]) -> None:
    fps = [fp for fp, _ in rows]
    templates = [t for _, t in rows]
    closest = text_quality.closest_earlier(fps)
    scores = text_quality.grouping_scores(fps, templates, distances)
    for r in distances:
        expected = _groups_brute_force(fps, r)
        assert text_quality.closest_match_groups(closest, r) == expected
        assert scores[r] == pytest.approx(_ga_brute_force(expected, templates))


def test_a_tie_joins_the_group_of_the_earliest_line() -> None:
    """Line 2 is at distance 1 from lines 0 and 1, which opened groups of their own: it joins line 0's."""
    fps: list[int | None] = [0b01, 0b10, 0b11]
    assert text_quality.closest_match_groups(text_quality.closest_earlier(fps), 1) == [0, 1, 0]
    assert text_quality.closest_match_groups(text_quality.closest_earlier(fps), 0) == [0, 1, 2]
    # a line without a fingerprint opens a group nobody joins
    assert text_quality.closest_match_groups(text_quality.closest_earlier([None, 0, None, 0]), 64) == [0, 1, 2, 1]


def test_every_lever_combination_is_distinct_and_named() -> None:
    grid = text_quality.lever_grid()
    assert len(grid) == len(set(grid)) == 192
    assert text_quality.describe(text_quality.DEFAULT_RULES) == "product"
    assert text_quality.DEFAULT_RULES in grid


def test_quality_benchmark_runs_on_a_small_sample(tmp_path: Path) -> None:
    sample = tmp_path / "Tiny_2k.log_structured.csv"
    rows = ["LineId,Content,EventId"]
    for n in range(30):
        rows.append(f"{n},Failed password for root from 10.0.0.{n} port {4000 + n} ssh2,E1")
        rows.append(f"{n + 30},Disk full on db-{n}: writes failing since 03:{n:02d} UTC,E2")
    sample.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out.json"
    arguments = [str(tmp_path), "--distances", "3,7", "--no-drain3", "--levers", "--lost", "2", "--json", str(out)]
    assert text_quality.main(arguments) == 0
    import json

    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["quality"]["Tiny"]["text"]["7"] == [1.0, 1.0, 1.0]
    assert figures["grouping_accuracy"]["Tiny"]["text"] == {"3": 1.0, "7": 1.0}
    assert figures["quality"]["Tiny"]["whitespace"]["7"][1] < 1.0  # nothing masked: the numbers keep lines apart
    assert figures["grouping_accuracy"]["Tiny"]["whitespace"]["7"] < 1.0
    assert set(figures["levers_by_distance"]) == {"3", "7"}
    assert figures["levers_by_distance"]["7"]["product"] == [1.0, 1.0, 1.0, 1.0]  # P, R, A and GA
    assert figures["lost_and_merged"]["Tiny"] == {"lost": [], "merged": []}


LOGHUB = text_quality.find_loghub(None)
BOUNDED = 500  # the first lines of each sample: about 2 s for all eight, where the whole samples take a minute


@pytest.mark.skipif(LOGHUB is None, reason="the Loghub samples are not on this machine")
def test_quality_on_the_first_lines_of_each_loghub_sample() -> None:
    """The product's rules at the default distance keep their figures on a bounded sample (BENCHMARKS.md: all)."""
    assert LOGHUB is not None
    scores = {}
    for path in sorted(LOGHUB.glob("*_structured.csv")):
        lines = text_quality.load(path)[:BOUNDED]
        fps = text_quality.fingerprints_of(lines, text_quality.features_from_text)
        scores[path.name] = text_quality.fingerprint_scores(fps, [t for _, t in lines], [7])[7]
    assert len(scores) == 8
    precision, recall, pure = (sum(s[k] for s in scores.values()) / len(scores) for k in range(3))
    assert precision >= 0.99 and recall >= 0.99 and pure >= 0.97, (precision, recall, pure)
    assert min(s[1] for s in scores.values()) >= 0.95, scores
    if text_quality.have_drain3():  # side by side with Drain3 (pip install -e '.[bench]')
        drain = [
            text_quality.cluster_scores(text_quality.drain3_clusters(lines, False), [t for _, t in lines])
            for lines in (text_quality.load(path)[:BOUNDED] for path in sorted(LOGHUB.glob("*_structured.csv")))
        ]
        assert precision >= sum(d[0] for d in drain) / len(drain)
        assert pure >= sum(d[2] for d in drain) / len(drain)


PUBLISHED = Path(__file__).resolve().parent.parent / "benchmarks" / f"text-quality-v{TOKENIZER_VERSION}.json"


@pytest.mark.skipif(LOGHUB is None, reason="the Loghub samples are not on this machine")
def test_the_published_figures_are_this_tokenizer_s_and_at_least_drain3_s() -> None:
    """The whole samples at the default distance: the product's figures are those BENCHMARKS.md publishes (the JSON
    of this tokenizer version, which a change to the rules must write again), and its mean precision and recall
    are at least Drain3's (measured by the same run), the issue's in-sample target."""
    assert LOGHUB is not None
    published = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    assert published["tokenizer_version"] == TOKENIZER_VERSION
    quality = published["quality"]
    measured = {}
    for path in sorted(LOGHUB.glob("*_structured.csv")):
        system = path.name.split("_")[0]
        lines = text_quality.load(path)
        fps = text_quality.fingerprints_of(lines, text_quality.features_from_text)
        measured[system] = text_quality.fingerprint_scores(fps, [t for _, t in lines], [7])[7]
        assert measured[system] == pytest.approx(quality[system]["text"]["7"], abs=1e-12), system
    assert len(measured) == 8

    def mean(method: str, k: int) -> float:
        return sum(quality[system][method]["7"][k] for system in measured) / len(measured)

    for k in (0, 1):  # precision, recall
        assert mean("text", k) >= mean("drain3", k) and mean("text", k) >= mean("drain3+masks", k)
    assert mean("text", 2) >= 0.97  # pure alerts


@pytest.mark.skipif(LOGHUB is None, reason="the Loghub samples are not on this machine")
def test_the_published_grouping_accuracy_is_this_tokenizer_s() -> None:
    """The GA BENCHMARKS.md publishes, at r = 5, 7 and 9 on the whole samples, is what this code measures, and at
    the default distance it is above Drain3's (measured by the same run)."""
    assert LOGHUB is not None
    published = json.loads(PUBLISHED.read_text(encoding="utf-8"))["grouping_accuracy"]
    for path in sorted(LOGHUB.glob("*_structured.csv")):
        system = path.name.split("_")[0]
        lines = text_quality.load(path)
        fps = text_quality.fingerprints_of(lines, text_quality.features_from_text)
        measured = text_quality.grouping_scores(fps, [t for _, t in lines], [5, 7, 9])
        for r in (5, 7, 9):
            assert measured[r] == pytest.approx(published[system]["text"][str(r)], abs=1e-12), (system, r)

    def mean(method: str) -> float:
        return sum(published[system][method]["7"] for system in published) / len(published)

    assert mean("text") >= max(mean("drain3"), mean("drain3+masks"))


def test_lost_and_merged_names_the_templates_and_a_pair_of_lines() -> None:
    lines = [
        ("authentication failure; logname= uid=0 tty=ssh ruser= rhost=10.0.0.1 user=alice", "A"),
        ("authentication failure; logname= uid=0 tty=ssh ruser= rhost=10.0.0.2 user=bob", "A"),  # farther than 7
        ("disk full on /var/a", "B"),
        ("disk full on /var/b", "C"),  # the same bag as B's line: merged at distance 0
    ]
    found = text_quality.lost_and_merged(lines, text_quality.features_from_text, 7, 3)
    assert [(row["template"], row["lost"], row["pairs"]) for row in found["lost"]] == [("A", 1, 1)]
    assert found["lost"][0]["distance"] > 7 and found["lost"][0]["lines"] == [lines[0][0], lines[1][0]]
    assert [(row["templates"], row["pairs"], row["distance"]) for row in found["merged"]] == [(["B", "C"], 1, 0)]


def test_a_lever_is_judged_on_the_systems_it_was_not_chosen_on() -> None:
    """A lever that helps one system and hurts another is taken only where the hurt one is held out."""
    product = {"a": (1.0, 0.7, 1.0), "b": (1.0, 1.0, 1.0), "c": (1.0, 1.0, 1.0)}
    lever = {"a": (1.0, 1.0, 1.0), "b": (1.0, 1.0, 1.0), "c": (0.5, 1.0, 1.0)}
    helps = {"a": (1.0, 1.0, 1.0), "b": (1.0, 1.0, 1.0), "c": (1.0, 1.0, 1.0)}
    judged = text_quality.levers_held_out({"product": product, "lever": lever, "helps": helps})
    assert judged["lever"]["taken"] == 1  # with c held out, a's gain decides
    assert judged["lever"]["held_out"] == {"a": product["a"], "b": product["b"], "c": lever["c"]}
    assert judged["lever"]["average"] == pytest.approx((2.5 / 3, 2.7 / 3, 1.0))
    assert judged["lever"]["in_sample"] == pytest.approx((2.5 / 3, 1.0, 1.0))
    assert judged["helps"]["taken"] == 2  # not with a held out: no other system gains
    assert judged["helps"]["average"] == pytest.approx((1.0, 2.7 / 3, 1.0))
    assert judged["product"]["average"] == pytest.approx((1.0, 2.7 / 3, 1.0))


def test_the_levers_table_measures_every_lever_and_the_pairs() -> None:
    names = set(text_quality.lever_variants())
    assert {"product", "user_key=True", "accounts=True", "user_key=True, accounts=True", "head=2"} <= names


@pytest.mark.skipif(LOGHUB is None, reason="the Loghub samples are not on this machine")
def test_the_speed_comparison_loads_another_version_and_prints_both(capsys: pytest.CaptureFixture[str]) -> None:
    import text_speed

    other = Path(__file__).resolve().parent.parent / "worker" / "text.py"  # this tree's, loaded as another module
    assert text_speed.load_version(other, "text_version_test")("Disk full") == {"disk": 3, "full": 3}
    assert text_speed.main([str(other), "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "this tree" in printed and str(other) in printed and "whitespace split" in printed


def test_leave_one_out_averages_the_combinations_the_other_systems_cannot_tell_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``ssh`` held out, the word after ``user`` changes no line of ``disk``: both combinations tie there, and
    the held-out figures are their mean, not whichever the grid lists first."""
    without_user = dataclasses.replace(text_quality.DEFAULT_RULES, user_value=False)
    monkeypatch.setattr(text_quality, "lever_grid", lambda: [without_user, text_quality.DEFAULT_RULES])
    names = ["alice", "bob", "carol", "dave", "erin", "frank"]
    data = {
        "ssh": [(f"Invalid user {name} from 10.0.0.{n} port 22 on host alpha", "E1") for n, name in enumerate(names)]
        + [(f"Accepted password for {name} from 10.0.1.{n} port 22", "E2") for n, name in enumerate(names)],
        "disk": [(f"Disk full on db-{n}: writes failing since 03:{n:02d} UTC", "E1") for n in range(6)]
        + [(f"Certificate for api-{n} expires in {n} days", "E2") for n in range(6)],
    }
    loo = text_quality.leave_one_out(data, 7, progress=False)
    ssh = loo["rows"]["ssh"]["any"]
    assert ssh["tied"] == 2
    expected = text_quality.average(
        [
            text_quality.measure(data["ssh"], text_quality.tokenizer(rules), [7])[7]
            for rules in (without_user, text_quality.DEFAULT_RULES)
        ]
    )
    assert ssh["held_out"] == pytest.approx(expected)
