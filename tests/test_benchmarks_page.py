"""BENCHMARKS.md opens with today's figures for today's code, from one run of one command.

Its tables of `incident-worker bench` are rendered from results files (`<!-- bench-results: FILE -->`): each must be
exactly `markdown` of its file, and the first (today's run) must have been measured on the code of today in
everything that decides where the time goes (the Functions library's hash, the tokenizer's version, the layout and
read-path defaults). A change to any of those fails here until the benchmark runs again; a later table of a long run
may be older, when the page says so before it:

    .venv/bin/incident-worker bench --json > benchmarks/results-NEW.json
    .venv/bin/python -m worker.devtools.benchmark benchmarks/results-NEW.json
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from worker.devtools.benchio import code_version
from worker.devtools.benchmark import markdown, page_blocks, update_page

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "BENCHMARKS.md"
TEXT = PAGE.read_text(encoding="utf-8")
RERUN = (
    "run the benchmark again (`incident-worker bench --json > benchmarks/results-NEW.json`, the table's own command) "
    "and render the page from it (`python -m worker.devtools.benchmark benchmarks/results-NEW.json`)"
)


def test_the_page_is_a_page_of_figures_not_a_notebook() -> None:
    assert len(TEXT.splitlines()) <= 300, "BENCHMARKS.md holds today's figures; notes go to benchmarks/journal/"
    dated = re.findall(r"^#+ .*\d{4}-\d{2}-\d{2}.*$", TEXT, re.MULTILINE)
    assert not dated, f"dated headings belong in benchmarks/journal/: {dated}"


def test_the_page_opens_with_a_table_of_the_benchmark() -> None:
    blocks = page_blocks(TEXT)
    assert blocks, "BENCHMARKS.md has no <!-- bench-results: FILE --> table"
    first_section = TEXT.split("\n## ", 2)[1]
    assert "<!-- bench-results: " in first_section, "the first section of BENCHMARKS.md is today's run"


def test_each_table_is_its_results_file_rendered() -> None:
    for name, body in page_blocks(TEXT):
        results = json.loads((ROOT / name).read_text(encoding="utf-8"))
        assert body == markdown(results), (
            f"BENCHMARKS.md's table of {name} is not that run as rendered: `python -m worker.devtools.benchmark`"
        )


OLDER = "measured on an earlier commit"
"""What the page says before a table (other than today's run) whose run is older than the code."""


def _stale_fields(name: str) -> list[str]:
    """What `name`'s run measured differently from today's code (empty: today's code)."""
    today = code_version()
    results = json.loads((ROOT / name).read_text(encoding="utf-8"))
    code = results.get("code")
    assert code is not None, f"{name} does not record the code it measured: {RERUN}"
    assert not code["uncommitted_changes"], f"{name} measured code that was never committed: {RERUN}"
    decisive = ("library", "tokenizer_version", "default_bands", "max_distance", "snapshot_send")
    return [
        f"{field} {code[field]!r}, today's code has {today[field]!r} (its commit {str(code['commit'])[:12]})"
        for field in decisive
        if code[field] != today[field]
    ]


def test_the_top_table_measured_today_s_code() -> None:
    """The page opens with today's figures: the run of its first table measured the code of today."""
    [(name, _), *_] = page_blocks(TEXT)
    stale = _stale_fields(name)
    assert not stale, f"{name}, the top table, measured {'; '.join(stale)}: {RERUN}"


def test_a_later_table_of_older_code_says_so() -> None:
    """A table further down (a long run, such as a million incidents) may be older than the code, but the page says
    so before it, and each table names the commit it ran on."""
    for name, body in page_blocks(TEXT)[1:]:
        assert "Code: commit " in body, f"{name}'s table does not name the commit it ran on"
        if _stale_fields(name):
            before = TEXT.split(f"<!-- bench-results: {name} -->", 1)[0].rsplit("\n## ", 1)[-1]
            assert OLDER in before, (
                f"{name} is older than today's code ({'; '.join(_stale_fields(name))}): run it again, or say before "
                f"its table that it was {OLDER!r}"
            )


def test_a_new_run_replaces_the_table_of_its_command(tmp_path: Path) -> None:
    [(name, _), *_] = page_blocks(TEXT)
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / name, tmp_path / name)
    results = json.loads((ROOT / name).read_text(encoding="utf-8"))
    results["date"] = "2030-01-01T00:00:00+00:00"
    (tmp_path / "benchmarks" / "results-new.json").write_text(json.dumps(results), encoding="utf-8")
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# Benchmarks\n\n<!-- bench-results: {name} -->\nold\n<!-- end bench-results -->\n", "utf-8")
    updated = update_page(page, [tmp_path / "benchmarks" / "results-new.json"])
    assert page_blocks(updated) == [("benchmarks/results-new.json", markdown(results))]
    assert "Run 2030-01-01T00:00:00+00:00" in updated
