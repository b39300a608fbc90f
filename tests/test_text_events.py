"""Text events: an event may carry `text` instead of `features`; the worker tokenizes it, records the tokenizer
version in the index meta, refuses an index made by another version, and can copy a bounded prefix into alerts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.conftest import fast_settings
from tests.streams import alerts, dead_letters, pending_count, publish
from worker.errors import LayoutMismatchError, TokenizerMismatchError
from worker.fingerprint import fingerprint
from worker.formats import REASONS, Alert, IncidentEvent, event_error
from worker.index import FingerprintIndex
from worker.settings import Settings
from worker.stream import StreamWorker
from worker.text import TOKENIZER_VERSION, features_from_text

META = "{incidents}:meta"
DISK_1 = "Disk full on db-07 (10.0.3.17): writes failing since 03:14 UTC"
DISK_2 = "disk full on DB-12 (10.0.9.201): writes failing since 22:40 UTC"
CERT = "TLS certificate for api.example.com expires in 7 days"


pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a redis_client that decodes replies


def run_worker(redis_client: Any, **overrides: Any) -> StreamWorker:
    worker = StreamWorker(redis_client, fast_settings(**overrides))
    worker.run(until_idle=True)
    return worker


# --- the event format ---


def test_a_text_event_is_fingerprinted_by_the_products_tokenizer() -> None:
    event = IncidentEvent.from_fields({"incident_id": "1", "text": DISK_1})
    assert event.text == DISK_1 and event.features is None
    assert event.fingerprint == fingerprint(features_from_text(DISK_1))
    assert IncidentEvent.from_fields(event.to_fields()) == event


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"incident_id": "1", "text": DISK_1, "features": '{"a": 1}'}, "features_and_text"),
        ({"incident_id": "1", "text": DISK_1, "features": '{"a": 1}', "op": "delete"}, "features_and_text"),
        ({"incident_id": "1"}, "missing_field"),
        ({"incident_id": "1", "op": "upsert"}, "missing_field"),
        ({"incident_id": "1", "text": " -- !!"}, "empty_bag"),
        ({"incident_id": "1", "text": ""}, "empty_bag"),
        ({"features": '{"a": 1}'}, "missing_field"),
    ],
)
def test_events_without_exactly_one_of_features_and_text_are_refused(fields: dict[str, str], reason: str) -> None:
    with pytest.raises(ValidationError) as caught:
        IncidentEvent.from_fields(fields)
    got, detail = event_error(caught.value)
    assert got == reason and got in REASONS
    assert detail


def test_a_delete_needs_neither_features_nor_text() -> None:
    assert IncidentEvent.from_fields({"incident_id": "1", "op": "delete"}).fingerprint is None


def test_a_text_too_large_for_the_limits_is_refused() -> None:
    from worker.formats import EventLimits

    with pytest.raises(ValidationError) as caught:
        text = " ".join(a + b for a in "abcdefgh" for b in "xyz")  # 24 distinct words
        IncidentEvent.from_fields({"incident_id": "1", "text": text}, EventLimits(max_tokens=10))
    assert event_error(caught.value)[0] == "too_many_tokens"


def _alert_fields(incident_id: str, matches: list[tuple[str, int]], match_count: int) -> dict[str, str]:
    """An alert's stream fields, as the worker writes them."""
    listed = ",".join(f'{{"incident_id":"{i}","distance":{d}}}' for i, d in matches)
    return {
        "incident_id": incident_id,
        "fingerprint": "0" * 16,
        "matches": f"[{listed}]",
        "match_count": str(match_count),
        "max_distance": "7",
        "source_entry": "1-0",
        "op": "add",
    }


def test_an_alert_reads_back_with_and_without_text() -> None:
    fields = _alert_fields("2", [("1", 0)], 1)
    assert Alert.from_fields(fields).text is None
    alert = Alert.from_fields({**fields, "text": "Disk full"})
    assert alert.text == "Disk full" and alert.to_fields() == {**fields, "text": "Disk full"}


# --- end to end, on a real Redis and on fakeredis ---


def test_text_events_alert_like_bags_and_record_the_tokenizer(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "1", "text": DISK_1},
            {"incident_id": "2", "text": CERT},
            {"incident_id": "3", "text": DISK_2},
            {"incident_id": "4", "features": {"dock": 3}},
        ],
    )
    worker = run_worker(redis_client)
    assert worker.stats.alerts == 1
    [alert] = alerts(redis_client)
    assert alert.incident_id == "3" and [m.incident_id for m in alert.matches] == ["1"]
    assert alert.text is None  # not asked for
    assert alert.fingerprint == fingerprint(features_from_text(DISK_2))
    assert redis_client.hget(META, "tokenizer") == str(TOKENIZER_VERSION).encode()
    assert pending_count(redis_client) == 0 and dead_letters(redis_client) == []


def test_a_bag_only_index_records_no_tokenizer(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "4", "features": {"dock": 3}}])
    run_worker(redis_client)
    assert redis_client.hget(META, "tokenizer") is None


def test_alerts_carry_a_bounded_prefix_of_the_text_when_asked(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "1", "text": DISK_1}, {"incident_id": "3", "text": DISK_2}])
    run_worker(redis_client, alert_text_chars=12)
    [alert] = alerts(redis_client)
    assert alert.text == DISK_2[:12]


def test_alert_text_chars_is_bounded() -> None:
    with pytest.raises(ValidationError):
        Settings(alert_text_chars=100_000)


def test_text_events_with_both_or_neither_are_dead_letters(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "1", "text": DISK_1, "features": {"a": 1}},
            {"incident_id": "2"},
            {"incident_id": "3", "text": "..."},
        ],
    )
    run_worker(redis_client)
    letters = dead_letters(redis_client)
    assert [(d.original["incident_id"], d.reason) for d in letters] == [
        ("1", "features_and_text"),
        ("2", "missing_field"),
        ("3", "empty_bag"),
    ]
    assert letters[0].original["text"] == DISK_1  # the original fields are kept
    assert pending_count(redis_client) == 0 and alerts(redis_client) == []


def test_a_worker_refuses_an_index_made_by_another_tokenizer(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "1", "text": DISK_1}])
    run_worker(redis_client)
    previous = str(TOKENIZER_VERSION - 1)  # an index of the version before: an upgrade that changed the tokenizer
    redis_client.hset(META, "tokenizer", previous)
    with pytest.raises(TokenizerMismatchError, match=f"tokenizer version {previous}") as caught:
        StreamWorker(redis_client, Settings(consumer="w2")).setup()
    assert isinstance(caught.value, LayoutMismatchError)  # handled like a layout mismatch: exit code 2
    message = str(caught.value)
    assert f"this worker's is version {TOKENIZER_VERSION}" in message and "new namespace" in message


def test_a_text_event_meeting_another_tokenizer_stops_the_worker_and_stays_pending(redis_client: redis.Redis) -> None:
    worker = StreamWorker(redis_client, Settings(consumer="w1", block_ms=50, claim_interval_ms=100))
    worker.setup()  # opened before another version wrote the meta
    redis_client.hset(META, "tokenizer", "1")
    publish(redis_client, [{"incident_id": "1", "text": DISK_1}])
    with pytest.raises(TokenizerMismatchError, match="version 1"):
        worker.read_and_process()
    assert pending_count(redis_client) == 1 and redis_client.hlen("{incidents}:fp") == 0


def test_bags_alone_need_no_tokenizer_so_the_library_opens_such_an_index(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "1", "text": DISK_1}])
    run_worker(redis_client)
    redis_client.hset(META, "tokenizer", "1")
    index = FingerprintIndex(redis_client)
    assert index.matches(features_from_text(DISK_1)) == [("1", 0)]


def test_query_of_a_text_refuses_an_index_made_by_another_tokenizer(redis_client: redis.Redis) -> None:
    from worker.commands.query import run_query
    from worker.errors import UsageError

    publish(redis_client, [{"incident_id": "1", "text": DISK_1}])
    run_worker(redis_client)
    bag = features_from_text(DISK_2)
    assert [m["incident_id"] for m in run_query(redis_client, Settings(), bag, None, text=True).matches] == ["1"]
    redis_client.hset(META, "tokenizer", "1")
    with pytest.raises(UsageError, match="tokenizer version 1"):
        run_query(redis_client, Settings(), bag, None, text=True)
    assert run_query(redis_client, Settings(), bag, None).matches  # a bag is a bag: no tokenizer involved


def test_the_alerts_command_shows_the_text_of_a_text_incident() -> None:
    from worker.commands.alerts import alert_line

    fields = _alert_fields("3", [("1", 2)], 1)
    assert "text:" not in alert_line("1-0", Alert.from_fields(fields))
    assert "text: 'Disk full on db-12'" in alert_line(
        "1-0", Alert.from_fields({**fields, "text": "Disk full on db-12"})
    )


def test_the_alerts_command_says_an_incomplete_alert_counts_at_least_its_matches() -> None:
    from worker.commands.alerts import alert_line

    fields = _alert_fields("9", [("1", 2), ("2", 3)], 3000)
    exact = alert_line("1-0", Alert.from_fields(fields))
    assert ": 3,000 matches within 7: 1 (distance 2), 2 (distance 3) and 2,998 more" in exact
    assert "at least" not in exact and "incomplete" not in exact
    cut = alert_line("1-0", Alert.from_fields({**fields, "incomplete": "1"}))
    assert ": at least 3,000 matches within 7: 1 (distance 2), 2 (distance 3) and at least 2,998 more" in cut
    assert cut.endswith("(incomplete: the search stopped at the per-event budget)")


@pytest.mark.timeout(60)
def test_a_text_of_a_megabyte_of_slashes_is_dead_lettered_and_the_worker_goes_on(redis_client: redis.Redis) -> None:
    """Once, such a text held each worker that took it for hours (the tokenizer was quadratic in its slashes)."""
    publish(
        redis_client,
        [
            {"incident_id": "slashes", "text": "/" * 1_000_000},
            {"incident_id": "1", "text": DISK_1},
            {"incident_id": "3", "text": DISK_2 + " " + "/-" * 400_000},
        ],
    )
    run_worker(redis_client)
    assert [(d.original["incident_id"], d.reason) for d in dead_letters(redis_client)] == [("slashes", "empty_bag")]
    assert [a.incident_id for a in alerts(redis_client)] == ["3"]
    assert pending_count(redis_client) == 0


HOSTILE_TEXT = (
    "Disk full on db-07\x1b[2J\x1b]0;owned\x07 \u202eright-to-left\r\nwrites\x00 failing\x9b31m since 03:14 UTC"
)


def _printable(line: str) -> bool:
    """Nothing a terminal acts on: no control character (C0, DEL, C1) and no invisible format character (bidi)."""
    return all(char.isprintable() for char in line)


def test_texts_and_ids_print_with_their_control_characters_escaped(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator reads alerts and dead letters in a terminal: a producer's text or ID must not drive it (clear the
    screen, set the title, reorder a line, forge one)."""
    from worker.commands._format import shown
    from worker.commands.alerts import alert_line
    from worker.commands.dead import print_letter
    from worker.commands.demo import alert_lines

    odd_id = "\x1b[31mred\u202e\n"
    publish(
        redis_client,
        [
            {"incident_id": "1", "text": DISK_1},
            {"incident_id": odd_id, "text": HOSTILE_TEXT},
            {"incident_id": "\x1b[2J", "text": "\x1b[;\x07 \r\n--"},  # no word: a dead letter
        ],
    )
    run_worker(redis_client, alert_text_chars=200)
    [alert] = alerts(redis_client)
    assert alert.incident_id == odd_id and alert.text == HOSTILE_TEXT  # stored as sent
    line = alert_line("1-0", alert)
    assert _printable(line) and shown(odd_id) in line and "\\x1b" in line
    for demo_line in alert_lines(alert, lambda incident_id: HOSTILE_TEXT if incident_id == odd_id else DISK_1):
        assert _printable(demo_line), demo_line
    [(entry_id, _)] = redis_client.xrange("{incidents}:dead")
    [letter] = dead_letters(redis_client)
    capsys.readouterr()  # the worker's log
    print_letter(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, letter)
    printed = capsys.readouterr().out
    assert printed.count("\n") == 4 and all(_printable(line) for line in printed.splitlines())
    assert shown("plain text, é, 漢字, e\u0301") == "plain text, é, 漢字, e\u0301"  # printable text stays as it is


def test_the_worker_s_console_log_escapes_control_characters(redis_client: redis.Redis) -> None:
    """The console log is for a terminal: an incident ID or text in a line must not drive it either."""
    import io

    from worker.logs import configure_logging

    out = io.StringIO()
    configure_logging("console", "debug", stream=out)
    publish(
        redis_client,
        [
            {"incident_id": "1", "text": DISK_1},
            {"incident_id": "\x1b[31mred\u202e", "text": HOSTILE_TEXT},
            {"incident_id": "\x1b]0;owned\x07", "text": "\x1b[;\x07"},  # no word: a dead letter
        ],
    )
    run_worker(redis_client)
    logged = out.getvalue()
    assert "dead letter" in logged and "alert" in logged
    assert all(line.isprintable() for line in logged.splitlines()), logged


@settings(max_examples=200, deadline=None)
@given(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40),
    st.sampled_from(["text", "features", "incident_id"]),
    st.integers(20, 120),
)
def test_an_entry_is_validated_alike_as_text_and_as_the_bytes_the_worker_reads(
    value: str, name: str, limit: int
) -> None:
    """`publish` validates str fields and the worker the same entry's bytes: MAX_ENTRY_BYTES is in bytes for both
    (a line of multi-byte characters once passed publish and then met the worker as too_large)."""
    from worker.formats import EventLimits

    fields = {"incident_id": "1", "text": "disk full"}
    fields[name] = value if name != "features" else json.dumps({value: 1}, ensure_ascii=False)
    if name == "features":
        del fields["text"]
    limits = EventLimits(max_entry_bytes=limit)

    def outcome(raw: dict[Any, Any]) -> tuple[str, int | None]:
        try:
            return "ok", IncidentEvent.from_fields(raw, limits).fingerprint
        except ValidationError as error:
            return event_error(error)[0], None

    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    assert outcome(fields) == outcome(as_bytes)


def test_publish_refuses_a_text_line_the_worker_would_find_too_large() -> None:
    from worker.commands.publish import _parse_line
    from worker.errors import InvalidLineError
    from worker.formats import EventLimits

    line = " ".join(["\u00e9t\u00e9"] * 200_000)  # 0.8 million characters, 1.4 MB
    limits = EventLimits()
    assert len(line) < limits.max_entry_bytes < len(line.encode())
    with pytest.raises(InvalidLineError) as caught:
        _parse_line(line, 1, text_mode=True, id_prefix="app:", limits=limits)
    assert caught.value.reason == "too_large"


def test_only_an_indexed_text_incident_records_the_tokenizer(redis_client: redis.Redis) -> None:
    """A text event that indexes nothing (a delete carrying a text, an add refused as a duplicate ID) leaves an index
    of bags without `tokenizer`: else a worker of another version would refuse an index that holds no text incident."""
    publish(
        redis_client,
        [
            {"incident_id": "1", "features": {"disk": 3}},
            {"incident_id": "1", "op": "delete", "text": DISK_1},
            {"incident_id": "2", "features": {"disk": 3}},
            {"incident_id": "2", "text": DISK_1},  # duplicate_id: not indexed
            {"incident_id": "3", "op": "delete", "text": CERT},  # an unknown ID: nothing changes
        ],
    )
    run_worker(redis_client)
    assert [d.reason for d in dead_letters(redis_client)] == ["duplicate_id"]
    assert redis_client.hkeys("{incidents}:fp") in ([b"2"], ["2"])
    assert redis_client.hget(META, "tokenizer") is None


LINES = [DISK_1, DISK_2, CERT, "Failed password for root from 10.0.0.1 port 22 ssh2"]
PAYLOADS = [("text", line) for line in LINES] + [
    ("features", features_from_text(DISK_1)),  # the bag of a text: the same fingerprint
    ("features", {"dock": 3, "scanner": 2}),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]), st.sampled_from(["add", "upsert", "delete"]), st.sampled_from(PAYLOADS)
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from(["primary", "snapshot"]),
)
def test_text_and_bag_events_of_one_incident_follow_the_repeat_rules(
    redis_client: redis.Redis, events: list[tuple[str, str, tuple[str, Any]]], read_path: str
) -> None:
    """Text and bag events mixed on a few IDs: alerts, dead letters and the index as the brute-force oracle has them
    (a text and a bag of one fingerprint are one incident repeated, never a duplicate ID); a text incident's alert
    carries the start of its own text, a bag's none."""
    from tests.oracle import Oracle

    redis_client.flushall()
    oracle = Oracle(7)
    expected_alerts, expected_dead = [], []
    published = []
    for incident_id, op, (kind, payload) in events:
        fp = fingerprint(features_from_text(payload) if kind == "text" else payload)
        if op == "delete":
            oracle.delete(incident_id)
            published.append({"incident_id": incident_id, "op": "delete"})
            continue
        found = oracle.add(incident_id, fp) if op == "add" else oracle.upsert(incident_id, fp)
        if found == "duplicate":
            expected_dead.append(incident_id)
        elif found:
            text = payload[:10] if kind == "text" else None
            expected_alerts.append((incident_id, op, [(m, d) for m, d in found], text))
        published.append({"incident_id": incident_id, "op": op, kind: payload})
    publish(redis_client, published)
    run_worker(redis_client, alert_text_chars=10, read_path=read_path)
    got = [
        (a.incident_id, a.op, [(m.incident_id, m.distance) for m in a.matches], a.text) for a in alerts(redis_client)
    ]
    assert got == expected_alerts
    assert [(d.original["incident_id"], d.reason) for d in dead_letters(redis_client)] == [
        (i, "duplicate_id") for i in expected_dead
    ]
    stored = {k if isinstance(k, str) else k.decode(): v for k, v in redis_client.hgetall("{incidents}:fp").items()}
    assert {k: int(v, 16) for k, v in stored.items()} == oracle.fps
    assert pending_count(redis_client) == 0


def test_run_on_an_index_of_another_tokenizer_exits_2_and_says_why(server: Any) -> None:
    import subprocess

    from tests.streams import clean_env, worker_command

    client = server.client()
    FingerprintIndex(client).add("bag", {"disk": 3})  # an index, of text incidents made by version 3
    client.hset(META, "tokenizer", "3")
    publish(client, [{"incident_id": "1", "text": DISK_1}])
    done = subprocess.run(
        [*worker_command(), "run", "--until-idle"],
        env=clean_env(redis_url=server.url, log_format="json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    [refusal] = [json.loads(line) for line in (done.stdout + done.stderr).splitlines() if '"level": "error"' in line]
    assert "tokenizer" in refusal["event"] and "layout" not in refusal["event"]
    assert "tokenizer version 3" in refusal["error"] and f"version {TOKENIZER_VERSION}" in refusal["error"]
    assert "new namespace" in refusal["error"]
    assert client.hget(META, "tokenizer") == b"3" and client.hkeys("{incidents}:fp") == [b"bag"]


@pytest.mark.parametrize("text_mode", [False, True])
def test_publish_names_a_line_with_both_features_and_text_as_the_worker_would(text_mode: bool) -> None:
    from worker.commands.publish import _parse_line
    from worker.errors import InvalidLineError
    from worker.formats import EventLimits

    line = json.dumps({"incident_id": "1", "text": DISK_1, "features": {"disk": 3}})
    with pytest.raises(InvalidLineError) as caught:
        _parse_line(line, 1, text_mode=text_mode, id_prefix="app:", limits=EventLimits())
    assert caught.value.reason == "features_and_text"
    assert "one of them" in caught.value.detail or "not both" in caught.value.detail


def test_query_of_a_text_that_is_not_utf8_says_so() -> None:
    """A shell hands undecodable bytes of an argument (or of standard input) over as surrogate escapes."""
    import argparse

    from worker.commands.query import _bag_of
    from worker.errors import UsageError

    with pytest.raises(UsageError) as caught:
        _bag_of(argparse.Namespace(text=b"disk \xff full".decode("utf-8", "surrogateescape"), features=None))
    message = str(caught.value)
    assert "not valid UTF-8" in message and "nothing to fingerprint" not in message and "errors=" not in message
    with pytest.raises(UsageError, match="nothing to fingerprint"):
        _bag_of(argparse.Namespace(text="-- !!", features=None))


@pytest.mark.parametrize("text_mode", [False, True])
def test_publish_reports_an_incident_id_without_a_utf8_form_instead_of_crashing(
    server: Any, tmp_path: Any, text_mode: bool
) -> None:
    """A JSON line can spell a lone surrogate (\\ud800), which no stream field can hold: publish crashed with a
    UnicodeEncodeError traceback while sending its chunk."""
    import subprocess

    from tests.streams import clean_env, worker_command

    source = tmp_path / "lines.jsonl"
    source.write_text(
        '{"incident_id": "\\ud800x", "text": "disk full"}\n{"incident_id": "ok", "text": "disk full on db-7"}\n'
    )
    done = subprocess.run(
        [*worker_command(), "publish", *(["--text"] if text_mode else []), "--json", str(source)],
        env=clean_env(redis_url=server.url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["published"], summary["skipped"]) == (1, 1)
    assert summary["errors"][0]["reason"] == "bad_incident_id" and "UTF-8" in summary["errors"][0]["detail"]
    assert [f[b"incident_id"] for _, f in server.client().xrange("{incidents}:events")] == [b"ok"]
