"""docs/contract.md is the contract users read: its key and field tables must match what the code writes.

A key builder, a stream field, a meta field or a dead-letter reason added without a row in the contract fails here,
and so does a row the code no longer has. The other pages are held too: every link between them arrives, and the
module map of docs/architecture.md lists exactly the modules of worker/.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from pathlib import Path

import fakeredis
import pytest

from worker.fingerprint import fingerprint
from worker.formats import DEAD_LETTER_FIELDS, REASONS, Alert, Heartbeat, IncidentEvent
from worker.index import FingerprintIndex
from worker.keys import IndexKeys
from worker.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_PATH = ROOT / "docs" / "contract.md"
CONTRACT = CONTRACT_PATH.read_text(encoding="utf-8")


def table(name: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the table after `<!-- name -->`."""
    marker = f"<!-- {name} -->"
    assert marker in CONTRACT, f"docs/contract.md has no {marker} table"
    lines = CONTRACT.split(marker, 1)[1].strip().splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def first_column(name: str) -> set[str]:
    """The backquoted names in the first column of a table."""
    return {re.fullmatch(r"`([^`]+)`", row[0]).group(1) for row in table(name)}  # type: ignore[union-attr]


def _code_keys() -> dict[str, str]:
    """Every key name IndexKeys builds for namespace N (placeholders for arguments) -> its docstring."""
    keys = IndexKeys("N")
    built: dict[str, str] = {}
    for name, member in inspect.getmembers(type(keys)):
        if name.startswith("_") or name in {"tag", "namespace", "owns", "postings_prefix", "postings_pattern"}:
            continue  # (the last two build what a generation's posting keys start with, and a SCAN pattern of them)
        if isinstance(member, property | functools.cached_property):  # the constant names are made once
            value = getattr(keys, name)
        elif inspect.isfunction(member):
            parameters = list(inspect.signature(member).parameters.values())[1:]
            placeholders = {"int": 0, "str": "x"}
            if any(str(p.annotation) not in placeholders for p in parameters):
                continue  # builds something other than a key name (band_keys takes a layout)
            value = member(keys, *(placeholders[str(p.annotation)] for p in parameters))
        else:
            continue
        if isinstance(value, str) and value.startswith("{N}:"):
            built[value] = inspect.getdoc(member) or ""
    built[keys.band_prefix(0, 1)] = "Set: a migrated index's postings, under their layout's generation"
    return built


def _matches(key: str, documented: str) -> bool:
    """Whether a built key (or key prefix, ending in ':') has the documented shape; `<...>` stands for any part."""
    built_parts, doc_parts = key.split(":"), documented.split(":")
    return len(built_parts) == len(doc_parts) and all(
        d.startswith("<") or b == d or (b == "" and i == len(built_parts) - 1)
        for i, (b, d) in enumerate(zip(built_parts, doc_parts, strict=True))
    )


def test_every_key_the_code_builds_is_documented_and_every_documented_key_is_built() -> None:
    documented = {row[0].strip("`"): row[1] for row in table("keys-table")}
    built = _code_keys()
    assert len(built) >= 7, built
    for key, doc in built.items():
        rows = [d for d in documented if _matches(key, d)]
        assert rows, f"{key} is built by worker/keys.py but has no row in docs/contract.md's key table"
        kind = re.match(r"(Hash|Set|Stream|String[^:]*|Sorted set|List):", doc)
        if kind:
            assert documented[rows[0]].lower().startswith(kind.group(1).lower()), (key, documented[rows[0]])
    for d in documented:
        assert any(_matches(key, d) for key in built), (
            f"docs/contract.md documents {d}, which worker/keys.py no longer builds"
        )


def test_meta_fields_are_documented() -> None:
    written = set(FingerprintIndex(fakeredis.FakeRedis(), namespace="docs").meta_fields())
    assert first_column("meta-fields") == written | set(FingerprintIndex.LATER_META_FIELDS)


def test_heartbeat_fields_are_documented() -> None:
    beat = Heartbeat(
        consumer="c", at=1.0, started=1.0, processed=1, cut=1, host="h", read_path="snapshot", snapshot_position="1-0"
    )
    written = set(json.loads(beat.to_value()))
    assert first_column("heartbeat-fields") == written


def test_event_alert_and_dead_letter_fields_are_documented() -> None:
    assert first_column("event-fields") == set(IncidentEvent.model_fields)
    assert first_column("alert-fields") == set(Alert.model_fields)
    alert = Alert(
        incident_id="90",
        fingerprint="0b61171015620fa1",
        matches=[{"incident_id": "47", "distance": 0}],  # type: ignore[list-item]
        match_count=1,
        max_distance=7,
        source_entry="1-0",
        op="add",
        text="Disk full on db-7",  # a text incident's alert, with ALERT_TEXT_CHARS set
        incomplete=True,  # a search cut at the per-event budget
        group_id="47",
        group_size=2,
        opens_group=True,  # (an opener's alert has no matches; every field shown at once)
        event_fields={"service": "db"},  # with ALERT_EVENT_FIELDS=service: copied under its own name
    )
    assert set(alert.to_fields()) == first_column("alert-fields") - {"event_fields"} | {"service"}
    assert Alert.from_fields(alert.to_fields()) == alert
    assert first_column("dead-letter-fields") == set(DEAD_LETTER_FIELDS)


def test_every_dead_letter_reason_is_documented() -> None:
    assert first_column("reasons") == set(REASONS)


@pytest.mark.parametrize("row", table("test-vectors"), ids=lambda row: row[1])
def test_documented_test_vectors_are_what_the_code_computes(row: list[str]) -> None:
    bag = json.loads(row[0].strip("`"))
    assert format(fingerprint(bag), "016x") == row[1].strip("`")


def test_settings_the_contract_names_exist() -> None:
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", CONTRACT)) - {"MAX_PROBES", "REASONS"}
    assert named, "the contract names no setting"
    assert {n.lower() for n in named} <= set(Settings.model_fields), named


def _anchors(path: Path = CONTRACT_PATH) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def _pages() -> list[Path]:
    """Every Markdown page people read in a clone: the README, BENCHMARKS.md, docs/, deploy/ and the journal."""
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    return pages + sorted((ROOT / "deploy").rglob("*.md")) + sorted((ROOT / "benchmarks").rglob("*.md"))


def test_links_into_the_contract_point_at_its_sections() -> None:
    anchors = _anchors()
    sources = [*_pages(), *sorted((ROOT / "worker").rglob("*.py"))]
    sources += sorted((ROOT / "worker").rglob("*.lua"))
    links = 0
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for anchor in re.findall(r"contract\.md#([a-z0-9\-]+)", text):
            links += 1
            assert anchor in anchors, f"{path.relative_to(ROOT)} links to docs/contract.md#{anchor}, not a section"
    assert links, "nothing links to docs/contract.md"


def test_every_link_between_the_pages_arrives() -> None:
    """Pages moved out of the README keep their links: every relative link names a file of the repository, and an
    anchor into a Markdown page names one of its headings."""
    checked = 0
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            where = f"{page.relative_to(ROOT)} links to {target}"
            assert path.exists(), f"{where}: no such file"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{where}: {path.name} has no such heading"
            checked += 1
    assert checked > 50, checked


MODULE_MAP = ROOT / "docs" / "architecture.md"


def test_the_module_map_lists_every_module() -> None:
    """docs/architecture.md's module map names every module of worker/ (Python and Lua), found on disk, and nothing
    else: a module added, split or renamed needs its line there."""
    text = MODULE_MAP.read_text(encoding="utf-8")
    marker = "<!-- module-map -->"
    assert marker in text, "docs/architecture.md has no <!-- module-map --> table"
    rows = text.split(marker, 1)[1].strip().splitlines()[2:]
    listed: list[str] = []
    for row in rows:
        if not row.startswith("|"):
            break
        found = re.fullmatch(r"\| `([^`]+)` \| (.+) \|", row)
        assert found and found.group(2).strip(), f"a module map row is not | `path` | what it owns |: {row}"
        listed.append(found.group(1))
    assert len(listed) == len(set(listed)), "a module is listed twice"
    on_disk = {
        path.relative_to(ROOT).as_posix()
        for pattern in ("*.py", "*.lua")
        for path in (ROOT / "worker").rglob(pattern)
        if "__pycache__" not in path.parts
    }
    missing, gone = sorted(on_disk - set(listed)), sorted(set(listed) - on_disk)
    assert not missing, f"modules not in docs/architecture.md's module map (add a line each): {missing}"
    assert not gone, f"docs/architecture.md's module map lists modules that do not exist: {gone}"


def test_the_docs_and_the_code_cite_the_contract_not_spec_sections() -> None:
    """A clone has docs/contract.md, not the customer's SPEC.md: citations point at the contract's sections."""
    sources = [*_pages(), *sorted((ROOT / "worker").rglob("*.py"))]
    sources += sorted((ROOT / "worker").rglob("*.lua"))
    for path in sources:
        text = path.read_text(encoding="utf-8")
        found = re.search(r"SPEC(?:\.md)?,? (?:sections?|§) ?\d", text)
        assert found is None, f"{path.relative_to(ROOT)} cites {found.group(0)!r}; link a contract section instead"
