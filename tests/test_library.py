"""The Functions library as worker/library.py assembles it from worker/lua/, and the names and arguments the Python
side calls it with: each written once, and held equal here to what the Lua files say."""

from __future__ import annotations

import re
import typing
from importlib import resources
from pathlib import Path

import pytest
import redis
from redis.exceptions import ResponseError

from tests.test_deploy import ACL_TEMPLATE
from worker import library
from worker.index import FingerprintIndex
from worker.library import ApplyArgs, ApplyKeys

LUA = Path(library.__file__).parent / "lua"


def _lua(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


def _library_constants() -> dict[str, str]:
    return {name: value for name, value in vars(library).items() if name.startswith("FN_")}


# -- assembling ----------------------------------------------------------------------------------------------------


def test_each_file_is_placed_once_where_it_is_first_included() -> None:
    files = {
        "root": '#!lua name=x\n--- @include "b"\n--- @include "a"\nroot\n',
        "a": '--- @include "c"\na\n',
        "b": '--- @include "c"\n--- @include "a"\nb\n',
        "c": "c\n",
    }
    assert library.assemble(files.__getitem__, "root") == "#!lua name=x\nc\na\nb\nroot\n"


def test_an_include_cycle_is_refused_with_the_chain() -> None:
    files = {"root": '--- @include "a"\n', "a": '--- @include "b"\n', "b": '--- @include "a"\n'}
    with pytest.raises(ValueError, match=re.escape("a.lua includes itself through root -> a -> b")):
        library.assemble(files.__getitem__, "root")


def test_the_library_is_every_file_under_worker_lua_and_starts_with_its_name() -> None:
    """No file under worker/lua/ is left out of the library (nor shipped without being loaded)."""
    placed: list[str] = []

    def read(name: str) -> str:
        placed.append(name)
        return _lua(name)

    source = library.assemble(read)
    assert source.startswith("#!lua name=incident_index_v2\n")
    assert sorted(placed) == sorted(path.stem for path in LUA.glob("*.lua"))
    assert len(placed) == len(set(placed)), "a file placed twice"
    assert "@include" not in source.replace("`--- @include", "")
    assert library.LIBRARY_SOURCE.startswith(f"#!lua name={library.LIBRARY_NAME}\n")


def test_the_packaged_files_are_the_ones_the_library_is_assembled_from() -> None:
    packaged = resources.files("worker").joinpath("lua")
    assert library.assemble(lambda name: packaged.joinpath(f"{name}.lua").read_text(encoding="utf-8")) == (
        library.assemble(_lua)
    )


@pytest.mark.parametrize("path", sorted(LUA.glob("*.lua")), ids=lambda path: path.name)
def test_each_lua_file_says_what_it_holds_and_stays_readable(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if path.stem != "index":
        assert text.startswith(f"-- {path.name}: "), f"{path.name} opens without a header saying what it holds"
    assert text.count("\n") <= 400, f"{path.name} has grown past 400 lines: split it by concern"


# -- function names ------------------------------------------------------------------------------------------------


def test_every_registered_function_has_its_python_name_and_every_python_name_a_function() -> None:
    registered = set(library.FUNCTIONS.values())
    assert len(library.FUNCTIONS) == len(re.findall(r"^register\(", library.LIBRARY_SOURCE, re.MULTILINE))
    assert set(_library_constants().values()) == registered
    for name, value in _library_constants().items():
        assert value == f"{library.LIBRARY_NAME}_{name.removeprefix('FN_').lower()}"
    assert "redis.register_function" not in library.LIBRARY_SOURCE.replace(
        "redis.register_function{function_name = LIBRARY", ""
    ), "a function registered without `register`: library.py would not know its name"


def test_every_function_the_python_side_names_is_loaded_and_callable(redis_client: redis.Redis) -> None:
    """FUNCTION LIST holds exactly the functions library.py names, and an FCALL of each reaches it (its answer to
    no keys and no arguments may be an error of its own, never "function not found")."""
    [entry] = redis_client.function_list(library=library.LIBRARY_NAME)
    fields = dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
    listed = set()
    for function in fields.get(b"functions", fields.get("functions")):
        described = dict(zip(function[::2], function[1::2], strict=True)) if isinstance(function, list) else function
        name = described.get(b"name", described.get("name"))
        listed.add(name.decode() if isinstance(name, bytes) else name)
    assert listed == set(library.FUNCTIONS.values())
    key = "{lib}:meta"
    for name in library.FUNCTIONS.values():
        try:
            redis_client.fcall(name, 1, key)
        except ResponseError as error:
            assert not library.is_missing_function(error), name


# -- the apply call's keys and arguments ---------------------------------------------------------------------------


def _header(block: str) -> list[tuple[int | None, str, bool]]:
    """The entries of the KEYS or ARGV block of apply.lua's header: (number or None, name, is a list)."""
    text = _lua("apply")
    start = text.index(f"\n-- {block}, in this order")
    entries = []
    for line in text[start + 1 :].splitlines()[1:]:
        if not line.startswith("--   "):  # entries, and the lines that go on describing one
            if entries:
                break
            continue
        found = re.match(r"--   (?:\[(\d+)\] )?([a-z_]+)(\.\.\.)? ", line)
        if found:
            entries.append((int(found.group(1)) if found.group(1) else None, found.group(2), bool(found.group(3))))
    return entries


@pytest.mark.parametrize(("block", "definition"), [("KEYS", ApplyKeys), ("ARGV", ApplyArgs)])
def test_the_apply_calls_keys_and_arguments_are_the_ones_the_lua_header_names_in_its_order(
    block: str, definition: type
) -> None:
    entries = _header(block)
    assert [name for _, name, _ in entries] == list(definition._fields)
    numbered = [number for number, _, is_list in entries if not is_list]
    assert numbered == list(range(1, len(numbered) + 1)), "the header's single values are numbered 1, 2, ... in order"
    first_list = next(k for k, (_, _, is_list) in enumerate(entries) if is_list)
    assert all(is_list for _, _, is_list in entries[first_list:]), "the lists come after every single value"
    hints = typing.get_type_hints(definition)
    assert [typing.get_origin(hints[name]) is list for name in definition._fields] == [
        is_list for _, _, is_list in entries
    ]
    if block == "ARGV":
        assert re.search(rf"^local ARGS = {len(numbered)}  ", _lua("apply"), re.MULTILINE), (
            "apply.lua's ARGS counts the arguments before `listed`"
        )


def test_the_apply_command_carries_each_field_where_its_definition_puts_it(redis_client: redis.Redis) -> None:
    index = FingerprintIndex(redis_client, "lib", bands=4, max_distance=7)
    index.open()
    index.add_fingerprint("old", 0x1)
    stream = library.StreamTarget("ev", "al", "dead", "g", alerts_maxlen=50)
    claim = library.SnapshotClaim("5-1", 2, [("a", 1), ("b", 3)], False)
    command = index.apply_command(
        "upsert",
        "old",
        0x2,
        expected=0x1,
        stream=stream,
        entry_id="9-0",
        max_matches=7,
        snapshot=claim,
        max_candidates=300,
    )
    assert command[:2] == ("FCALL", library.FN_APPLY)
    n_keys = command[2]
    keys, args = command[3 : 3 + n_keys], command[3 + n_keys :]
    named = dict(zip(ApplyArgs._fields, args, strict=False))
    assert named["op"] == "upsert" and named["incident_id"] == "old" and named["expected"] == "0000000000000001"
    assert (named["group"], named["entry_id"], named["alerts_maxlen"]) == ("g", "9-0", 50)
    assert (named["limits"], named["snapshot"], named["migration"]) == ("7 300", "5-1 2 0", "")
    assert list(args[len(ApplyArgs._fields) - 1 :]) == ["a", 1, "b", 3]
    first = dict(zip(ApplyKeys._fields[:8], keys, strict=False))
    assert first["events"] == "ev" and first["alerts"] == "al" and first["meta"] == index.keys.meta
    assert keys[8 : 8 + named["n_new"]] == tuple(index.posting_keys(0x2))
    assert keys[8 + named["n_new"] : 8 + named["n_new"] + named["n_old"]] == tuple(index.posting_keys(0x1))


# -- the alert's matches JSON ----------------------------------------------------------------------------------------


def _matches_json_oracle(flat: list[tuple[bytes, str]]) -> bytes:
    """The alert's `matches` as alert_json.lua writes it: each ID's bytes as they are but `"`, `\\` and control
    bytes escaped, its distance as Lua writes its number (%.14g); the longest head whose bytes, counted as the cap
    has always counted them (each ID and its quotes, its distance and 27), fit in 8,192 (at least one)."""
    escapes = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
    pieces, size = [], 2
    for k, (raw, d) in enumerate(flat):
        escaped = b"".join(escapes.get(c) or (b"\\u%04x" % c if c < 32 or c == 127 else bytes([c])) for c in raw)
        number = b"%.14g" % float(d)
        size += len(escaped) + 2 + len(number) + 27
        if size > 8192 and k > 0:
            break
        pieces.append(b'{"incident_id":"' + escaped + b'","distance":' + number + b"}")
    return b"[" + b",".join(pieces) + b"]"


@pytest.mark.parametrize("seed", range(6))
def test_the_alerts_matches_json_is_each_match_escaped_and_capped_in_bytes(redis_client, seed: int) -> None:
    """matches_json_within (distances written from pieces made in advance, IDs checked in one anchored match)
    against a Python oracle: IDs needing every kind of escape or none, distances of 0 to 64 and a fraction (as a
    hand-edited fingerprint may give), given as numbers and, every other one, as the digits a claim sent (as
    merge_claim passes a claim's own head on), written otherwise too ("07", "-0", "7.0"); lists short and long, cut
    at the byte cap; on Redis and on fakeredis."""
    import random

    rng = random.Random(seed)
    alphabet = ["a", "Z", "0", "-", '"', "\\", "\x00", "\x01", "\x1f", "\x7f", "é", "\n", "\t", " ", "\U0001f600"]
    script = (
        _lua("alert_json")
        + "\nlocal flat = {}\nfor i = 1, #ARGV, 2 do\n"
        + "  flat[i] = ARGV[i]; flat[i + 1] = i % 4 == 1 and tonumber(ARGV[i + 1]) or ARGV[i + 1]\nend\n"
        + "return matches_json_within(flat)\n"
    )
    for _ in range(25):
        flat = []
        rate = rng.choice([0.0, 0.001, 0.2])  # (IDs all plain, one needing escapes among many, many)
        # (distances each with its piece made in advance, as a claim's are, or now and then one without)
        written_otherwise = rng.choice([[], ["2.25", "07", "-0", "7.0"]])
        for _ in range(rng.choice([0, 1, 2, 5, 100, 400])):
            raw = "".join(rng.choice(alphabet) if rng.random() < rate else "x" for _ in range(rng.choice([1, 6, 300])))
            digits = rng.choice(["0", "1", "7", "9", "10", "64", *written_otherwise])
            flat.append((raw.encode(), digits))
        args = [part for raw, d in flat for part in (raw, d)]
        reply = redis_client.eval(script, 0, *args)
        written = reply if isinstance(reply, bytes) else reply.encode("utf-8", "surrogateescape")
        assert written == _matches_json_oracle(flat)
    # plain lists of one ID length about the byte cap: whole, or cut after the last match that fits
    for count in range(seed * 10 + 180, seed * 10 + 300, 7):
        flat = [(f"i{k:05d}".encode(), str(k % 65)) for k in range(count)]
        reply = redis_client.eval(script, 0, *[part for pair in flat for part in pair])
        written = reply if isinstance(reply, bytes) else reply.encode()
        assert written == _matches_json_oracle(flat)


def test_the_fitness_check_covers_every_command_the_apply_step_sends() -> None:
    """A command a stream call sends that the check before its first write does not ask about (SRANDMEMBER, which
    a flooded posting set is sampled with; SCARD and SISMEMBER, sent after the first write) was refused midway, or
    not granted at all: good events became poison, or an index was left half-written."""
    files = ["base", "meta", "listing", "search", "window", "snapshot", "claim_json", "apply_context", "groups"]
    files += ["alert_json", "apply"]
    sent = set()
    for name in files:
        sent |= set(re.findall(r"redis\.p?call\('([A-Z]+)'", _lua(name)))
    fitness = _lua("fitness")
    checks = fitness[fitness.index("local ACL_CHECKS") : fitness.index("local TYPE_PROBES")]
    checked = set(re.findall(r"\{'([A-Z]+)'", checks))
    assert sent, "no command found: has the Lua's way of calling Redis changed?"
    assert sent - {"XLEN", "HLEN"} <= checked, sorted(sent - checked)
    granted = {line.strip()[1:].upper() for line in ACL_TEMPLATE.read_text().splitlines() if line.strip()[:1] == "+"}
    assert checked <= granted, sorted(checked - granted)
