"""The README is the front door, and docs/ the rooms behind it: the configuration table, commands, metric names and the
tokenizer's version they show must match the code, and the README stays short enough to read before the first
command."""

from __future__ import annotations

import re
from pathlib import Path

from worker.cli import build_parser
from worker.metrics import Metrics
from worker.settings import ENV_PREFIX, Settings, settings_table
from worker.text import TOKENIZER_VERSION, WORD_WEIGHT

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
TEXT = (ROOT / "docs" / "text.md").read_text(encoding="utf-8")
DOCS = README + "".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md")))


def _between(start: str, end: str, page: str = README) -> str:
    return page.split(start, 1)[1].split(end, 1)[0]


def test_the_readme_stays_a_front_door() -> None:
    """Clone to first alert, then links out: operations and guarantees live in docs/, not in a second copy here."""
    assert len(README.splitlines()) <= 300
    assert "make demo" in README and "make test" in README


def test_configuration_table_matches_the_settings() -> None:
    table = _between("<!-- settings-table", "<!-- end settings-table -->", CONFIGURATION).split("\n", 1)[1].strip()
    assert table == settings_table(), "regenerate the table with worker.settings.settings_table()"
    documented = set(re.findall(rf"`{ENV_PREFIX}([A-Z_]+)`", table))
    assert documented == {name.upper() for name in Settings.model_fields}


def test_quick_start_is_two_make_commands() -> None:
    quick = _between("## Quick start", "\n## ")
    first_block = quick.split("```", 2)[1]
    assert [line.split()[0:2] for line in first_block.strip().splitlines()] == [["make", "demo"], ["make", "test"]]


def test_every_subcommand_the_readme_names_exists() -> None:
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    named = set(re.findall(r"`incident-worker ([\w-]+)", README))
    assert named <= set(subcommands), named - set(subcommands)
    assert set(subcommands) <= named, f"not in the README's commands: {set(subcommands) - named}"


def test_every_metric_the_readme_names_exists() -> None:
    exported = {sample.name for family in Metrics().registry.collect() for sample in family.samples}
    exported |= {family.name for family in Metrics().registry.collect()}
    named = set(re.findall(r"`(incident_worker_\w+)`", DOCS))
    assert named and named <= exported, named - exported


def test_the_docs_name_this_tokenizer_s_version_and_weights() -> None:
    """The text page's version and the Python page's weights once lagged the code by a version or two."""
    assert re.findall(r"`worker\.text\.TOKENIZER_VERSION`,\s*(\d+)\)", TEXT) == [str(TOKENIZER_VERSION)]
    assert f"Version {TOKENIZER_VERSION} (this release)" in TEXT
    assert set(re.findall(r"plain words weighing (\w+)", DOCS)) <= {str(WORD_WEIGHT), "three"}
    assert "plain words weighing" in DOCS
