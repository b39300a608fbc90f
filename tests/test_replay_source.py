"""Where `dead replay` sends a dead letter: the events stream the operator's settings name, and only a letter that came
from it, unless the operator says otherwise. A letter's own `source_stream` field never chooses the key written.

The cases: a namespace whose workers read two streams (letters of the other one are kept and the message says how to
send them back there), a worker whose stream setting changed (`--any-source` moves the letters of the old stream to
the new one), and letters whose source_stream is missing, outside the namespace, a key of the index, or garbage with
terminal control characters (kept, never written to, never echoed raw). In this process, on a real redis-server and
on fakeredis's TCP server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from worker.cli import main
from worker.formats import DeadLetter

EVENTS = "{incidents}:events"
OTHER = "{incidents}:events-b"
OLD = "{incidents}:old-events"
DEAD = "{incidents}:dead"
ORIGINAL = {"incident_id": "INC-9", "features": json.dumps({"disk": 3})}


def letter(client: redis.Redis, source: str | None, incident_id: str = "INC-9") -> str:
    """A dead letter as a worker writes it, of an event of `source` (None: the field left out)."""
    fields: dict[Any, Any] = DeadLetter(
        reason="bad_weight",
        detail="a weight is not a whole number",
        source_entry="1-1",
        source_stream=source or "",
        consumer="w1",
    ).to_fields({**ORIGINAL, "incident_id": incident_id})
    if source is None:
        del fields["source_stream"]
    return client.xadd(DEAD, fields).decode()  # type: ignore[union-attr]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def queued(client: redis.Redis, stream: str) -> list[str]:
    return [fields[b"incident_id"].decode() for _, fields in client.xrange(stream)]


def test_a_letter_goes_back_to_the_configured_stream_it_came_from(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    letter(cli_admin, EVENTS)
    code, out, err = run(["dead", "replay", "--all"], capsys)
    assert code == 0, err
    assert queued(cli_admin, EVENTS) == ["INC-9"] and cli_admin.xlen(DEAD) == 0
    assert f"to {EVENTS}" in out


def test_letters_of_another_stream_of_the_namespace_are_kept_and_sent_back_there_when_asked(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sets of workers in one namespace, one dead-letter stream: a replay run with one set's settings replays
    that set's letters, and keeps the other's, saying how to send them back to the stream they came from."""
    letter(cli_admin, EVENTS, "INC-A")
    theirs = letter(cli_admin, OTHER, "INC-B")
    code, out, err = run(["dead", "replay", "--all"], capsys)
    assert code == 1, "a letter kept makes the replay fail"
    assert queued(cli_admin, EVENTS) == ["INC-A"], "only the letter of the configured stream"
    assert not cli_admin.exists(OTHER)
    assert [entry_id.decode() for entry_id, _ in cli_admin.xrange(DEAD)] == [theirs]
    assert f"{theirs}: came from {OTHER}, not {EVENTS}" in err, err
    assert f"--events-stream '{OTHER}'" in err and "--any-source" in err, err

    code, out, err = run(["dead", "replay", "--all", "--events-stream", OTHER], capsys)
    assert code == 0, err
    assert f"replayed 1 dead letter to {OTHER}" in out, out
    assert queued(cli_admin, OTHER) == ["INC-B"] and queued(cli_admin, EVENTS) == ["INC-A"]
    assert cli_admin.xlen(DEAD) == 0


def test_after_the_stream_setting_changed_any_source_moves_the_old_streams_letters_to_the_new_one(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    letter(cli_admin, OLD)
    code, _, err = run(["dead", "replay", "--all", "--dry-run"], capsys)
    assert code == 1 and f"came from {OLD}, not {EVENTS}" in err, err
    code, out, err = run(["dead", "replay", "--all", "--any-source", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["events_stream"] == EVENTS
    assert [(item["source_stream"], item["incident_id"]) for item in report["replayed"]] == [(OLD, "INC-9")]
    assert queued(cli_admin, EVENTS) == ["INC-9"] and not cli_admin.exists(OLD)


MANGLED = [
    pytest.param("{other}:events", id="another namespace"),
    pytest.param("{incidents}:fp", id="a key of the index"),
    pytest.param("{incidents}:alerts", id="the alerts stream"),
    pytest.param("\x1b[2J{incidents}:events\x07", id="terminal control characters"),
    pytest.param("", id="empty"),
    pytest.param(None, id="missing"),
]


@pytest.mark.parametrize("source", MANGLED)
def test_a_letters_source_stream_never_chooses_the_key_written(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str], source: str | None
) -> None:
    cli_admin.hset("{incidents}:fp", "INC-1", "0b61171015620fa1")
    cli_admin.xadd("{incidents}:alerts", {"incident_id": "INC-1"})
    before = {key: cli_admin.dump(key) for key in cli_admin.keys("*") if key != DEAD.encode()}
    dead_id = letter(cli_admin, source)
    code, out, err = run(["dead", "replay", "--all"], capsys)
    assert code == 1, out + err
    assert {key: cli_admin.dump(key) for key in cli_admin.keys("*") if key != DEAD.encode()} == before
    assert [entry_id.decode() for entry_id, _ in cli_admin.xrange(DEAD)] == [dead_id], "the letter is kept"
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert f"{dead_id}: " in err and "--any-source" in err, err
    assert "--events-stream" not in err, "no advice to write where a mangled field points"

    code, out, err = run(["dead", "replay", dead_id, "--any-source"], capsys)
    assert code == 0, err
    assert queued(cli_admin, EVENTS) == ["INC-9"]
    assert {key: cli_admin.dump(key) for key in cli_admin.keys("*") if key not in (DEAD.encode(), EVENTS.encode())} == (
        before
    )


def test_dead_lists_a_mangled_source_stream_escaped(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    letter(cli_admin, "\x1b]0;owned\x07{incidents}:events")
    code, out, _ = run(["dead"], capsys)
    assert code == 0
    assert "\x1b" not in out and "\\x1b]0;owned\\x07" in out, out


@pytest.mark.parametrize(
    "stream",
    ["{incidents}:migration", "{incidents}:expiry", "{incidents}:twins:0b61171015620fa1", "{incidents}:lease:upkeep"],
)
def test_the_stream_a_replay_writes_is_never_a_key_the_index_keeps(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str], stream: str
) -> None:
    """--events-stream goes through the settings' checks: a name the index uses for something else is bad usage,
    before anything is read or written (XADD would create a stream where a move to another layout keeps its state)."""
    letter(cli_admin, stream)
    code, out, err = run(["dead", "replay", "--all", "--events-stream", stream], capsys)
    assert code == 2, out + err
    assert "is a key the index itself uses" in err, err
    assert not cli_admin.exists(stream) and cli_admin.xlen(DEAD) == 1
