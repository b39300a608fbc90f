"""A key of the namespace that holds another type than the index keeps there (an operator's slip with redis-cli, a
restore into the wrong database, another application's key): every command that meets it says which key, what type
it holds, what it should hold and what to do, and exits 2 as the other data and configuration errors do. None prints
Redis's bare "WRONGTYPE Operation against a key holding the wrong kind of value" or a traceback.

Each key of a small populated namespace is given another type in turn (a string, or a list where the index keeps a
string), and every operator subcommand runs against it in this process, on a real redis-server and on fakeredis's TCP
server: the sweep that found the commands printing the bare error, kept as a test.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from worker import retention
from worker.cli import main
from worker.fingerprint import fingerprint, format_fingerprint
from worker.formats import Alert, DeadLetter, Heartbeat, Match
from worker.index import FingerprintIndex
from worker.keys import IndexKeys

KEYS = IndexKeys("incidents")
DOCK = {"dock": 3, "scanner": 2, "timeout": 1}
ROAD = {"weather": 4, "road": 2}
DOCK_HEX = format_fingerprint(fingerprint(DOCK))
HOUR_MS = 3_600_000

QUERY_DOCK = ("query", "--features", json.dumps(DOCK))
QUERY_TEXT = ("query", "--text", "disk full on db-7")
INSPECT = ("inspect", "INC-1")
INSPECT_ROAD = ("inspect", "INC-5")
STATS = ("stats",)
STATS_JSON = ("stats", "--json")
PUBLISH = ("publish", "{events}")
PUBLISH_TEXT = ("publish", "--text", "{lines}")
ALERTS = ("alerts",)
ALERTS_SINCE = ("alerts", "--since", "0")
ALERTS_GROUP = ("alerts", "--group", "pager")
DEAD = ("dead",)
REPLAY_DRY = ("dead", "replay", "--all", "--dry-run")
REPLAY = ("dead", "replay", "--all")
EXPIRE_DRY = ("expire", "--dry-run")
EXPIRE = ("expire",)
VERIFY = ("verify",)
REPAIR = ("verify", "--repair")
MIGRATE = ("migrate", "--bands", "3")
ABORT = ("migrate", "--abort")
CHECK = ("check",)
CHECK_CONSUMER = ("check", "--consumer", "w1")

COMMANDS = [
    PUBLISH,
    PUBLISH_TEXT,
    QUERY_DOCK,
    QUERY_TEXT,
    INSPECT,
    INSPECT_ROAD,
    STATS,
    STATS_JSON,
    ALERTS,
    ALERTS_SINCE,
    ALERTS_GROUP,
    DEAD,
    REPLAY_DRY,
    REPLAY,
    EXPIRE_DRY,
    EXPIRE,
    VERIFY,
    REPAIR,
    MIGRATE,
    ABORT,
    CHECK,
    CHECK_CONSUMER,
]
"""Every operator subcommand that reads or writes the namespace (run has its own tests: test_snapshot_stream.py)."""

INDEX_READERS = {QUERY_DOCK, QUERY_TEXT, INSPECT, INSPECT_ROAD, STATS, STATS_JSON, EXPIRE_DRY, EXPIRE}
INDEX_READERS |= {VERIFY, REPAIR, MIGRATE}

# (key, the type the index keeps there, the commands that must refuse it)
CASES: list[tuple[str, str, set[tuple[str, ...]]]] = [
    (KEYS.meta, "hash", INDEX_READERS),
    (KEYS.fingerprints, "hash", INDEX_READERS),
    (KEYS.changes, "stream", {STATS, STATS_JSON, VERIFY, REPAIR}),  # verify: the group sizes' change marker
    (KEYS.events_stream, "stream", {PUBLISH, PUBLISH_TEXT, STATS, STATS_JSON, REPLAY_DRY, REPLAY}),
    (KEYS.alerts_stream, "stream", {STATS, STATS_JSON, ALERTS, ALERTS_SINCE, ALERTS_GROUP}),
    (KEYS.dead_stream, "stream", {STATS, STATS_JSON, DEAD, REPLAY_DRY, REPLAY}),
    (KEYS.expiry, "sorted set", {STATS, STATS_JSON, EXPIRE_DRY, EXPIRE, VERIFY, REPAIR}),
    (f"{KEYS.band_prefix(3)}{DOCK_HEX[:4]}", "set", {QUERY_DOCK, INSPECT, VERIFY, REPAIR}),
    (KEYS.twins(DOCK_HEX), "sorted set", {QUERY_DOCK, INSPECT, VERIFY, REPAIR}),
    (KEYS.migration, "hash", {STATS, STATS_JSON, MIGRATE, ABORT}),
    (KEYS.lease("upkeep"), "string", {STATS, STATS_JSON}),
    (KEYS.heartbeat("w1"), "string", set()),  # the worker's next beat (SET) overwrites it
    (KEYS.workers, "sorted set", {STATS, STATS_JSON, CHECK}),
]

BARE = ("WRONGTYPE Operation", "wrong kind of value", "Traceback")


def populate(client: redis.Redis) -> None:
    """A namespace with every key of the contract's table: incidents (two of them twins) under a retention window,
    an event, an alert, a dead letter, the upkeep's lease, and a worker of this host beating."""
    index = FingerprintIndex(client, "incidents", 4, 7)
    index.open()
    retention.set_window(index, 30 * 24 * HOUR_MS)
    index.add("INC-1", DOCK)
    index.add("TWIN-1", DOCK)
    index.add("INC-5", ROAD)
    client.xadd(KEYS.events_stream, {"incident_id": "INC-9", "features": json.dumps({"disk": 3})})
    alert = Alert(
        incident_id="TWIN-1",
        fingerprint=DOCK_HEX,
        matches=[Match(incident_id="INC-1", distance=0)],
        match_count=1,
        max_distance=7,
        source_entry="1-1",
        op="add",
    )
    client.xadd(KEYS.alerts_stream, alert.to_fields())  # type: ignore[arg-type]
    letter = DeadLetter(
        reason="bad_weight",
        detail="a weight is not a whole number",
        source_entry="1-2",
        source_stream=KEYS.events_stream,
        consumer="w1",
    )
    client.xadd(KEYS.dead_stream, letter.to_fields({"incident_id": "INC-9", "features": '{"disk": 2.5}'}))
    client.set(KEYS.lease("upkeep"), "w1", px=HOUR_MS)
    beat = Heartbeat(consumer="w1", at=time.time(), host=socket.gethostname())
    client.set(KEYS.heartbeat("w1"), beat.to_value(), px=HOUR_MS)
    client.zadd(KEYS.workers, {"w1": time.time() * 1000 + HOUR_MS})


def give_another_type(client: redis.Redis, key: str, kind: str) -> str:
    """Replace `key` with a value of another type, as a slip with redis-cli would; the type it now holds."""
    client.delete(key)
    if kind == "string":
        client.rpush(key, "by hand")
        return "list"
    client.set(key, "by hand")
    return "string"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def argv_of(command: tuple[str, ...], tmp_path: Path) -> list[str]:
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"incident_id": "INC-7", "features": ROAD}) + "\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("disk full on db-7\n")
    files = {"{events}": str(events), "{lines}": str(lines)}
    return [files.get(part, part) for part in command]


A_KIND = {"string": "a string", "list": "a list", "hash": "a hash", "set": "a set"}
A_KIND |= {"sorted set": "a sorted set", "stream": "a stream"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("key", "kind", "refusing"), CASES, ids=[case[0] for case in CASES])
def test_every_command_names_a_key_of_another_type_and_what_to_do(
    cli_admin: redis.Redis,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    key: str,
    kind: str,
    refusing: set[tuple[str, ...]],
) -> None:
    assert refusing <= set(COMMANDS)
    wrong: list[str] = []
    for command in COMMANDS:
        cli_admin.flushall()
        populate(cli_admin)
        assert cli_admin.exists(key) or key == KEYS.migration, f"populate() wrote no {key}"  # (no move under way)
        held = give_another_type(cli_admin, key, kind)
        code, out, err = run(argv_of(command, tmp_path), capsys)
        said = out + err
        shown = " ".join(command)
        if any(bare in said for bare in BARE):
            wrong.append(f"{shown}: exit {code}, bare error: {said.strip()[-300:]}")
            continue
        if command not in refusing:
            if code not in (0, 1) or f"{key} holds" in said:
                wrong.append(f"{shown}: exit {code}, not expected to meet {key}: {said.strip()[-300:]}")
            continue
        expected_code = 1 if command[0] == "check" else 2  # check's verdict: unhealthy
        message = f"{key} holds {A_KIND[held]}, not the {kind} the index keeps there"
        if code != expected_code or message not in said or "redis-cli" not in said:
            wrong.append(f"{shown}: exit {code} (expected {expected_code}) and {said.strip()[-400:]!r}")
    assert not wrong, "\n".join(wrong)


def test_the_message_says_what_to_do_for_the_source_of_truth(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """{N}:fp holds every fingerprint: the advice is a backup or sending the events again, never a bare DEL."""
    populate(cli_admin)
    give_another_type(cli_admin, KEYS.fingerprints, "hash")
    code, _, err = run(["stats"], capsys)
    assert code == 2
    assert "source of truth" in err and "backup" in err, err
    assert "DEL" not in err, err


def test_a_dead_letter_is_kept_when_its_replay_cannot_be_written(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """MULTI/EXEC does not roll back: a replay whose XADD meets an events stream of another type deleted the letter
    anyway, and the event was lost. The replay now looks before it writes, and keeps the letter."""
    populate(cli_admin)
    before = cli_admin.xrange(KEYS.dead_stream)
    give_another_type(cli_admin, KEYS.events_stream, "stream")
    code, _, err = run(["dead", "replay", "--all"], capsys)
    assert code == 2, err
    assert cli_admin.xrange(KEYS.dead_stream) == before, "the dead letter was lost"
    assert cli_admin.type(KEYS.events_stream) in (b"string", "string")


def test_a_letter_deleted_by_a_refused_replay_is_written_back(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the stream's type change between the replay's look and its EXEC, the EXEC deletes the letter all the
    same (no roll back): the replay writes it back, whole, and says so."""
    from worker.commands import dead

    populate(cli_admin)
    [(_, letter)] = cli_admin.xrange(KEYS.dead_stream)
    give_another_type(cli_admin, KEYS.events_stream, "stream")
    looked: list[str] = []
    look = dead._writable

    def too_early(client: Any, settings: Any, stream: str) -> None:  # the first look sees the stream it once was
        if not looked:
            looked.append(stream)
            return
        look(client, settings, stream)

    monkeypatch.setattr(dead, "_writable", too_early)
    code, _, err = run(["dead", "replay", "--all"], capsys)
    assert code == 2, err
    assert f"{KEYS.events_stream} holds a string" in err and "dead letters are kept" in err, err
    [(_, kept)] = cli_admin.xrange(KEYS.dead_stream)
    assert kept == letter


def test_an_entry_failed_on_a_posting_set_of_another_type_says_which_in_the_workers_log(cli_admin: redis.Redis) -> None:
    """The start-up check looks at one posting key; an entry whose call meets another of another type failed with
    the bare reply in the log, delivery after delivery, until it was dead-lettered as poison. The log line now names
    the key and what to do."""
    import io

    from worker.logs import configure_logging
    from worker.settings import Settings
    from worker.stream import StreamWorker

    populate(cli_admin)
    road = FingerprintIndex(cli_admin, "incidents", 4, 7).posting_keys(fingerprint(ROAD))[2]
    cli_admin.xadd(KEYS.events_stream, {"incident_id": "INC-6", "features": json.dumps(ROAD)})
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    client = redis.Redis(connection_pool=cli_admin.connection_pool)  # bytes replies, as the worker needs
    worker = StreamWorker(client, Settings(consumer="w1", block_ms=50, claim_interval_ms=100, read_path="primary"))
    worker.setup()
    give_another_type(cli_admin, road, "set")
    worker.read_and_process()
    failed = [json.loads(line) for line in out.getvalue().splitlines() if "entry failed" in line]
    assert failed, out.getvalue()
    assert f"{road} holds a string, not the set the index keeps there" in failed[0]["hint"], failed[0]
    assert "verify --repair" in failed[0]["hint"]


def test_expire_names_a_posting_set_of_another_type_among_those_of_the_incidents_due(
    cli_admin: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(cli_admin)
    index = FingerprintIndex(cli_admin, "incidents", 4, 7)
    index.open()
    retention.set_window(index, 1)  # every incident is due a millisecond later
    time.sleep(0.01)
    posting = index.posting_keys(fingerprint(ROAD))[1]
    give_another_type(cli_admin, posting, "set")
    code, _, err = run(["expire"], capsys)
    assert code == 2, err
    assert f"{posting} holds a string, not the set the index keeps there" in err, err


def test_a_worker_stops_naming_a_registry_of_another_type(cli_admin: redis.Redis) -> None:
    """Each heartbeat enters the worker in {N}:workers: of another type, the worker stops at once (exit 2 from run),
    naming it, rather than beat without being found by `check`."""
    from worker.errors import KeyTypeError
    from worker.settings import Settings
    from worker.stream import StreamWorker

    cli_admin.set(KEYS.workers, "by hand")
    client = redis.Redis(connection_pool=cli_admin.connection_pool)
    worker = StreamWorker(client, Settings(consumer="w1", block_ms=50, read_path="primary"))
    with pytest.raises(KeyTypeError, match=r"\{incidents\}:workers holds a string, not the sorted set"):
        worker.run(until_idle=True)


@pytest.mark.parametrize("replaced", [KEYS.alerts_stream, KEYS.changes])
@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_a_key_replaced_while_workers_run_refuses_their_calls_whole_and_they_go_on_in_order_once_repaired(
    cli_admin: redis.Redis, read_path: str, replaced: str
) -> None:
    """The start's check cannot see a key replaced later. A call that met the alerts stream replaced by a string kept
    what it wrote before its XADD (an incident indexed, its alert lost, its retry a repeat) and the worker went on to
    the next entries (the delete of the same incident applied first, then the add again). Each stream call now checks
    before its first write (fitness.lua): refused whole, the worker names the key and waits for the repair, its
    entries pending, and then applies them in stream order. ({N}:changes replaced made a worker on its copy exit 2:
    the copy's read of it met the other type first.)"""
    import io
    import threading

    from worker.logs import configure_logging
    from worker.settings import Settings
    from worker.stream import StreamWorker

    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    client = redis.Redis(connection_pool=cli_admin.connection_pool)
    settings = Settings(
        consumer="w1", block_ms=50, claim_interval_ms=100, read_path=read_path, reconnect_max_backoff_s=0.1
    )
    worker = StreamWorker(client, settings)
    cli_admin.xadd(KEYS.events_stream, {"incident_id": "INC-1", "features": json.dumps(DOCK)})
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    saved = replaced + "-kept-aside"
    try:
        deadline = time.monotonic() + 20
        while cli_admin.hget(KEYS.fingerprints, "INC-1") is None:
            assert time.monotonic() < deadline, out.getvalue()[-2000:]
            time.sleep(0.02)
        if cli_admin.exists(replaced):
            cli_admin.rename(replaced, saved)
        cli_admin.set(replaced, "by hand")
        cli_admin.xadd(KEYS.events_stream, {"incident_id": "INC-2", "features": json.dumps(DOCK)})
        cli_admin.xadd(KEYS.events_stream, {"incident_id": "INC-2", "op": "delete"})
        while "a call could not finish" not in out.getvalue():
            assert time.monotonic() < deadline, out.getvalue()[-2000:]
            time.sleep(0.02)
        time.sleep(0.3)  # a few more rounds of waiting: still nothing written, nothing acknowledged
        assert thread.is_alive()
        assert cli_admin.hget(KEYS.fingerprints, "INC-2") is None
        assert cli_admin.xlen(saved if replaced == KEYS.changes else KEYS.changes) == 1
        assert cli_admin.xpending(KEYS.events_stream, "incident-workers")["pending"] == 2
        waiting = [json.loads(line) for line in out.getvalue().splitlines() if "a call could not finish" in line]
        assert f"{replaced} holds a string, not the stream the index keeps there" in waiting[0]["problem"]
        cli_admin.delete(replaced)
        if cli_admin.exists(saved):
            cli_admin.rename(saved, replaced)
        while cli_admin.xpending(KEYS.events_stream, "incident-workers")["pending"] or not cli_admin.exists(
            KEYS.alerts_stream
        ):
            assert time.monotonic() < deadline + 20, out.getvalue()[-2000:]
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(timeout=20)
    assert not thread.is_alive()
    # in stream order: INC-2 added (its alert names its twin INC-1), then deleted
    changes = [next(iter(fields.items())) for _, fields in cli_admin.xrange(KEYS.changes)]
    assert changes == [(b"add", b"INC-1"), (b"add", b"INC-2"), (b"delete", b"INC-2")]
    assert cli_admin.hkeys(KEYS.fingerprints) == [b"INC-1"]
    [(_, alert)] = [entry for entry in cli_admin.xrange(KEYS.alerts_stream) if entry[1][b"incident_id"] == b"INC-2"]
    assert json.loads(alert[b"matches"]) == [{"incident_id": "INC-1", "distance": 0}], alert
