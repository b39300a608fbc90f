"""The stream worker in-process, on a real redis-server and on fakeredis: formats, dead letters, repeats, claims."""

from __future__ import annotations

import json
import time
from typing import Any

import fakeredis
import pytest
import redis

from tests.conftest import fast_settings
from tests.oracle import assert_postings_match
from tests.streams import (
    ALERTS,
    DEAD,
    EVENTS,
    FP,
    GROUP,
    alerts,
    assert_pairs_reported_once,
    dead_letters,
    fingerprints,
    pending_count,
    publish,
)
from worker.devtools.workload import Workload
from worker.errors import LayoutMismatchError
from worker.fingerprint import fingerprint, format_fingerprint
from worker.formats import DeadLetter
from worker.index import FingerprintIndex
from worker.processing import _segments
from worker.settings import Settings
from worker.stream import StreamWorker

DOCK = {"dock": 3, "scanner": 2, "timeout": 1}
ROAD = {"weather": 4, "road": 2}


pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a redis_client that decodes replies


def settings(**overrides: Any) -> Settings:
    return fast_settings(**overrides)


def run_worker(redis_client: Any, **overrides: Any) -> StreamWorker:
    worker = StreamWorker(redis_client, settings(**overrides))
    worker.run(until_idle=True)
    return worker


def test_spec_section_4_example(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "47", "features": DOCK},
            {"incident_id": "83", "features": ROAD},
            {"incident_id": "90", "features": DOCK},
        ],
    )
    entries = [entry_id.decode() for entry_id, _ in redis_client.xrange(EVENTS)]
    run_worker(redis_client)
    [alert] = alerts(redis_client)
    assert alert.incident_id == "90"
    assert [(m.incident_id, m.distance) for m in alert.matches] == [("47", 0)]
    assert alert.match_count == 1 and alert.max_distance == 7 and alert.op == "add"
    assert alert.fingerprint == 0x0B61171015620FA1
    assert alert.to_fields()["fingerprint"] == alert.model_dump()["fingerprint"] == "0b61171015620fa1"
    assert alert.source_entry == entries[2]
    assert redis_client.hget(FP, "47") == b"0b61171015620fa1"
    assert pending_count(redis_client) == 0
    index = FingerprintIndex(redis_client)
    assert index.matches(DOCK) == [("47", 0), ("90", 0)]
    assert index.matches(ROAD) == [("83", 0)]


def test_events_appended_before_any_worker_are_processed(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": str(i), "features": {f"w{i}": 1}} for i in range(30)])
    run_worker(redis_client)
    assert redis_client.hlen(FP) == 30


BAD_INPUT = [
    ({"features": json.dumps(DOCK)}, "missing_field"),
    ({"incident_id": "x"}, "missing_field"),
    ({"incident_id": "x", "op": "upsert"}, "missing_field"),
    ({"incident_id": "x", "features": '{"dock": 3,'}, "bad_json"),
    ({"incident_id": "x", "features": "[1, 2]"}, "bad_features"),
    ({"incident_id": "x", "features": "null"}, "missing_field"),
    ({"incident_id": "x", "features": '{"dock": true}'}, "bad_weight"),
    ({"incident_id": "x", "features": '{"dock": 2.0}'}, "bad_weight"),
    ({"incident_id": "x", "features": '{"dock": "2"}'}, "bad_weight"),
    ({"incident_id": "x", "features": '{"dock": 0}'}, "bad_weight"),
    ({"incident_id": "x", "features": '{"dock": 9007199254740992}'}, "bad_weight"),
    ({"incident_id": "x", "features": "{}"}, "empty_bag"),
    ({"incident_id": "x", "features": '{"\\ud800": 1}'}, "bad_token"),
    ({"incident_id": "x", "features": b'{"\xff\xfe": 1}'}, "not_utf8"),
    ({"incident_id": b"\xc3\x28", "features": json.dumps(DOCK)}, "not_utf8"),
    ({"incident_id": "", "features": json.dumps(DOCK)}, "bad_incident_id"),
    ({"incident_id": "x" * 257, "features": json.dumps(DOCK)}, "bad_incident_id"),
    ({"incident_id": "x", "features": json.dumps(DOCK), "op": "purge"}, "bad_op"),
    ({"incident_id": "x", "features": json.dumps({f"t{i}": 1 for i in range(60)})}, "too_many_tokens"),
    ({"incident_id": "x", "features": json.dumps({"t" * 200: 1})}, "token_too_long"),
    ({"incident_id": "x", "features": json.dumps(DOCK), "padding": "p" * 5000}, "too_large"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD_INPUT, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BAD_INPUT)])
def test_bad_input_is_dead_lettered_and_good_entries_around_it_are_processed(
    redis_client: redis.Redis, fields: dict[str, Any], reason: str
) -> None:
    good_before = [{"incident_id": f"g{i}", "features": {f"before{i}": 2, "x": 1}} for i in range(3)]
    good_after = [{"incident_id": f"h{i}", "features": {f"after{i}": 2, "y": 1}} for i in range(3)]
    publish(redis_client, good_before)
    [bad_entry] = publish(redis_client, [fields])
    publish(redis_client, good_after)
    run_worker(redis_client, max_tokens=50, max_token_length=100, max_entry_bytes=4096)
    [letter] = dead_letters(redis_client)
    assert letter.reason == reason
    assert letter.detail and len(letter.detail) > 10
    assert letter.source_entry == bad_entry and letter.source_stream == EVENTS and letter.consumer == "w1"
    # the original fields are kept byte for byte; those of an oversized entry cut to dead_letter_prefix_bytes
    [(_, raw)] = redis_client.xrange(DEAD)
    for name, value in fields.items():
        expected = value if isinstance(value, bytes) else str(value).encode()
        assert raw[name.encode()] == (expected[:1024] if reason == "too_large" else expected)
    indexed = {k.decode() for k in redis_client.hkeys(FP)}
    assert indexed == {e["incident_id"] for e in good_before + good_after}
    assert pending_count(redis_client) == 0


def test_replay_refuses_a_dead_letter_that_kept_only_prefixes_of_its_fields(redis_client: redis.Redis) -> None:
    """A dead letter of an entry over max_entry_bytes keeps only the first bytes of each field: replaying those would
    queue another event (a cut text indexes fine, under a wrong fingerprint). It is skipped, and kept; one whose
    fields all fit the prefix is whole and replays."""
    from worker.commands.dead import replay

    cut = {"incident_id": "cut", "text": "disk full on db-07 " * 100}  # its text is cut to 1,024 bytes
    whole = {"incident_id": "whole", "features": json.dumps(DOCK), "note": "n" * 600}  # every field under 1,024
    [cut_entry, whole_entry] = publish(redis_client, [cut, whole])
    run_worker(redis_client, max_entry_bytes=512)
    letters = {letter.source_entry: entry_id for entry_id, letter in dead_letters_with_ids(redis_client)}
    assert set(letters) == {cut_entry, whole_entry}
    events_before = redis_client.xlen(EVENTS)
    report = replay(redis_client, settings(), ids=[], reason="too_large", dry_run=False)
    assert [item["dead_entry"] for item in report.replayed] == [letters[whole_entry]]
    assert [item["dead_entry"] for item in report.skipped] == [letters[cut_entry]]
    assert "max_entry_bytes" in report.skipped[0]["why"]
    assert redis_client.xlen(EVENTS) == events_before + 1
    [(_, requeued)] = redis_client.xrevrange(EVENTS, count=1)
    assert requeued == {name.encode(): value.encode() for name, value in whole.items()}
    assert [e.decode() for e, _ in redis_client.xrange(DEAD)] == [letters[cut_entry]]  # kept, not lost
    run_worker(redis_client)
    assert redis_client.hexists(FP, "whole") and not redis_client.hexists(FP, "cut")


def dead_letters_with_ids(client: Any) -> list[tuple[str, DeadLetter]]:
    return [(entry_id.decode(), DeadLetter.from_fields(fields)) for entry_id, fields in client.xrange(DEAD)]


def test_metrics_gauges_say_where_things_stand_from_the_start(redis_client: redis.Redis) -> None:
    """The gauges of /metrics (index size, group lag and pending) are right from the worker's first steps, not only
    after its first summary interval: a restarted worker must not read as an empty index with no lag for 30 s."""
    publish(redis_client, [{"incident_id": f"i{n}", "features": {f"t{n}": 2, "x": 1}} for n in range(3)])
    run_worker(redis_client)
    worker = run_worker(redis_client, consumer="w2", summary_interval_s=3600)
    assert worker.metrics.index_size._value.get() == 3
    assert worker.metrics.group_lag._value.get() == 0 and worker.metrics.group_pending._value.get() == 0


def test_dead_letter_keeps_an_original_field_named_like_its_own(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "x", "features": "{}", "reason": "mine", "original_note": "n"}])
    run_worker(redis_client)
    [(_, raw)] = redis_client.xrange(DEAD)
    assert raw[b"reason"] == b"empty_bag" and raw[b"original_reason"] == b"mine"
    [letter] = dead_letters(redis_client)
    assert letter.original == {"incident_id": "x", "features": "{}", "reason": "mine", "original_note": "n"}


def test_duplicate_id_with_another_bag_is_dead_lettered(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "47", "features": DOCK}, {"incident_id": "47", "features": ROAD}])
    run_worker(redis_client)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "duplicate_id" and "upsert" in letter.detail
    assert redis_client.hget(FP, "47") == format_fingerprint(fingerprint(DOCK)).encode()
    assert pending_count(redis_client) == 0


def test_repeated_event_gives_no_second_alert(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "47", "features": DOCK},
            {"incident_id": "90", "features": DOCK},
            {"incident_id": "90", "features": DOCK},
        ],
    )
    run_worker(redis_client)
    assert [a.incident_id for a in alerts(redis_client)] == ["90"]
    assert dead_letters(redis_client) == []
    publish(redis_client, [{"incident_id": "90", "features": DOCK}])  # once more, in a later batch
    run_worker(redis_client)
    assert len(alerts(redis_client)) == 1


def test_entry_processed_by_another_consumer_is_not_applied_twice(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "47", "features": DOCK}, {"incident_id": "90", "features": DOCK}])
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    slow = StreamWorker(redis_client, settings(consumer="slow"))
    slow.setup()
    entries = redis_client.xreadgroup(GROUP, "slow", {EVENTS: ">"})[0][1]
    fast = StreamWorker(redis_client, settings(consumer="fast", claim_idle_ms=1000))
    time.sleep(1.1)
    fast.setup()
    assert fast.recovery.claim_stuck() == 2  # the slow consumer looked dead; its entries were taken over and done
    slow.processor.process(entries)  # the slow one wakes up and finishes its batch anyway
    assert len(alerts(redis_client)) == 1
    assert slow.stats.outcomes == {"not_pending": 2}
    assert pending_count(redis_client) == 0


def test_upsert_and_delete_through_the_stream(redis_client: redis.Redis) -> None:
    near = {"dock": 3, "scanner": 2, "timeout": 1, "z": 1}  # distance 7 from DOCK
    publish(
        redis_client,
        [
            {"incident_id": "47", "features": DOCK},
            {"incident_id": "83", "features": ROAD},
            {"incident_id": "83", "features": near, "op": "upsert"},  # now near 47
            {"incident_id": "47", "op": "delete"},
            {"incident_id": "nobody", "op": "delete"},
            {"incident_id": "90", "features": DOCK},  # 47 is gone; 83 is near
        ],
    )
    run_worker(redis_client)
    got = [(a.incident_id, a.op, [(m.incident_id, m.distance) for m in a.matches]) for a in alerts(redis_client)]
    d = (fingerprint(DOCK) ^ fingerprint(near)).bit_count()
    assert d <= 7
    assert got == [("83", "upsert", [("47", d)]), ("90", "add", [("83", d)])]
    assert redis_client.hget(FP, "47") is None
    assert {k.decode() for k in redis_client.hkeys(FP)} == {"83", "90"}
    assert dead_letters(redis_client) == []


def test_changes_of_one_incident_in_one_batch_apply_in_order(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "a", "features": DOCK},
            {"incident_id": "a", "op": "delete"},
            {"incident_id": "a", "features": ROAD},  # a new add after the delete: no duplicate
            {"incident_id": "a", "features": {"z": 1}, "op": "upsert"},
            {"incident_id": "a", "features": {"z": 1}, "op": "upsert"},
            {"incident_id": "a", "op": "delete"},
            {"incident_id": "a", "features": DOCK, "op": "upsert"},
        ],
    )
    run_worker(redis_client, batch_size=100)
    assert redis_client.hget(FP, "a") == format_fingerprint(fingerprint(DOCK)).encode()
    assert dead_letters(redis_client) == [] and alerts(redis_client) == []
    assert pending_count(redis_client) == 0


def test_a_stored_value_that_is_not_a_fingerprint_stops_neither_the_worker_nor_other_entries(
    redis_client: redis.Redis,
) -> None:
    # {N}:fp values mangled by hand (verify reports them as bad values): the entries about those incidents are
    # handled like any other, and the worker goes on; before, reading them as fingerprints raised out of run()
    dock = format_fingerprint(fingerprint(DOCK))
    publish(redis_client, [{"incident_id": "47", "features": DOCK}])
    run_worker(redis_client)
    redis_client.hset(FP, mapping={"m1": "not-a-fingerprint", "m2": dock.upper(), "m3": "z" * 16})
    publish(
        redis_client,
        [
            {"incident_id": "m1", "features": DOCK},  # an add over the mangled value: a duplicate_id dead letter
            {"incident_id": "m1", "features": DOCK, "op": "upsert"},  # an upsert replaces it
            {"incident_id": "m2", "op": "delete"},
            {"incident_id": "m3", "features": ROAD, "op": "upsert"},
            {"incident_id": "after", "features": ROAD},
        ],
    )
    run_worker(redis_client)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "duplicate_id" and "not-a-fingerprint" in letter.detail and "upsert" in letter.detail
    assert [(a.incident_id, [(m.incident_id, m.distance) for m in a.matches]) for a in alerts(redis_client)] == [
        ("m1", [("47", 0)]),
        ("after", [("m3", 0)]),
    ]
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall(FP).items()}
    road = format_fingerprint(fingerprint(ROAD))
    assert stored == {"47": dock, "m1": dock, "m3": road, "after": road}
    assert pending_count(redis_client) == 0
    assert_postings_match(redis_client, "incidents", 4)


def test_segments_cut_where_an_incident_changes_twice() -> None:
    from worker.formats import IncidentEvent
    from worker.processing import _Item

    def item(incident_id: str, op: str) -> _Item:
        fields = {"incident_id": incident_id, "op": op}
        if op != "delete":
            fields["features"] = '{"a": 1}'
        return _Item("1-0", fields, event=IncidentEvent.from_fields(fields))

    ops = [("a", "add"), ("b", "add"), ("a", "add"), ("b", "delete"), ("c", "upsert"), ("b", "add"), ("d", "add")]
    cut = [[(i.event.incident_id, i.event.op) for i in seg] for seg in _segments([item(*o) for o in ops])]
    assert cut == [
        [("a", "add"), ("b", "add"), ("a", "add")],
        [("b", "delete"), ("c", "upsert")],
        [("b", "add"), ("d", "add")],
    ]


def test_max_matches_caps_the_list_but_counts_all(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": f"s{i:02d}", "features": DOCK} for i in range(12)])
    run_worker(redis_client, max_matches=3)
    last = alerts(redis_client)[-1]
    assert last.incident_id == "s11" and last.match_count == 11
    assert [m.incident_id for m in last.matches] == ["s00", "s01", "s02"]


@pytest.mark.parametrize("every", ["all", "none", "0"])
def test_max_matches_all_lists_every_match(
    redis_client: redis.Redis, every: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the default cap of 100: the closest 100 by default, every match with MAX_MATCHES=all (env or flag)."""
    publish(redis_client, [{"incident_id": f"s{i:03d}", "features": DOCK} for i in range(103)])
    monkeypatch.setenv("INCIDENT_WORKER_MAX_MATCHES", every)
    run_worker(redis_client)
    last = alerts(redis_client)[-1]
    assert last.incident_id == "s102" and last.match_count == 102
    assert [m.incident_id for m in last.matches] == [f"s{i:03d}" for i in range(102)]
    monkeypatch.delenv("INCIDENT_WORKER_MAX_MATCHES")
    assert Settings().max_matches == 100


def test_max_matches_takes_a_number_or_all_as_a_flag() -> None:
    from worker.cli import build_parser
    from worker.commands._shared import settings_from_args
    from worker.errors import UsageError

    parser = build_parser("run")
    assert settings_from_args(parser.parse_args(["run", "--max-matches", "all"])).max_matches == 0
    assert settings_from_args(parser.parse_args(["run", "--max-matches", "250"])).max_matches == 250
    with pytest.raises(UsageError, match="or all to list every match"):
        settings_from_args(parser.parse_args(["run", "--max-matches", "lots"]))
    with pytest.raises(UsageError, match="max_matches"):
        settings_from_args(parser.parse_args(["run", "--max-matches", "-1"]))


def test_stuck_entries_of_a_silent_consumer_are_claimed(redis_client: redis.Redis) -> None:
    events = [{"incident_id": str(i), "features": {f"w{i}": 1, "common": 1}} for i in range(25)]
    publish(redis_client, events)
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    redis_client.xreadgroup(GROUP, "ghost", {EVENTS: ">"}, count=10)  # a consumer that read and died
    worker = run_worker(redis_client, claim_idle_ms=1000)
    assert redis_client.hlen(FP) == 25
    assert pending_count(redis_client) == 0
    assert worker.stats.processed == 25


def test_poison_entries_are_dead_lettered_after_max_deliveries(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "a", "features": DOCK}])
    worker = StreamWorker(redis_client, settings(max_deliveries=3))
    checked = worker.preflight

    def then_break() -> None:  # (a worker refuses to start on such a key: it is broken once the worker runs)
        checked()
        # a posting set of the entry's fingerprint of another type: its apply fails with WRONGTYPE (before it writes
        # anything), entry after entry, so the entry can never be processed. (A key every call writes, such as
        # {N}:fp, replaced while workers run refuses every call whole instead, and the workers wait for the repair:
        # tests/test_wrong_types.py.)
        redis_client.set(FingerprintIndex(redis_client).posting_keys(fingerprint(DOCK))[0], "not a set")

    worker.preflight = then_break  # type: ignore[method-assign]
    worker.run(until_idle=True)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "poison" and letter.deliveries == 4 and "max_deliveries=3" in letter.detail
    assert pending_count(redis_client) == 0
    assert worker.stats.outcomes == counted_outcomes(worker) == {"failed": 3, "dead": 1}


def counted_outcomes(worker: StreamWorker) -> dict[str, int]:
    """`incident_worker_events_total` by outcome, as /metrics shows it."""
    return {
        sample.labels["outcome"]: int(sample.value)
        for family in worker.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "incident_worker_events_total"
    }


def test_stats_metrics_and_logs_count_the_same_outcomes(redis_client: redis.Redis) -> None:
    from structlog.testing import capture_logs

    publish(
        redis_client,
        [
            {"incident_id": "a", "features": DOCK},
            {"incident_id": "b", "features": DOCK},  # matches a: an alert
            {"incident_id": "a", "features": DOCK},  # the same fingerprint again: a repeat
            {"incident_id": "c", "features": "{not json"},
            {"incident_id": "r", "features": ROAD, "op": "upsert"},
            {"incident_id": "r", "op": "delete"},
        ],
    )
    worker = StreamWorker(redis_client, settings())
    with capture_logs() as logs:
        worker.run(until_idle=True)
    stats = worker.stats
    assert stats.outcomes == counted_outcomes(worker) == {"indexed": 3, "repeat": 1, "dead": 1, "deleted": 1}
    assert stats.processed == 6 and stats.alerts == 1 and stats.dead_letters == 1
    samples = {s.name: s for family in worker.metrics.registry.collect() for s in family.samples}
    assert samples["incident_worker_alerts_total"].value == 1
    assert samples["incident_worker_dead_letters_total"].labels == {"reason": "bad_json"}
    assert samples["incident_worker_dead_letters_total"].value == 1
    assert samples["incident_worker_candidates_count"].value == 5  # one observation an applied event
    assert [line["event"] for line in logs if line["log_level"] in {"info", "warning"}].count("alert") == 1
    assert [line["reason"] for line in logs if line["event"] == "dead letter"] == ["bad_json"]


def test_worker_refuses_an_index_of_another_layout(redis_client: redis.Redis) -> None:
    FingerprintIndex(redis_client, bands=4).add("a", DOCK)
    publish(redis_client, [{"incident_id": "b", "features": DOCK}])
    with pytest.raises(LayoutMismatchError, match="bands=4"):
        StreamWorker(redis_client, settings(bands=8)).run(until_idle=True)
    assert redis_client.hlen(FP) == 1


def test_worker_refuses_a_decoding_client() -> None:
    with pytest.raises(ValueError, match="decode_responses=False"):
        StreamWorker(fakeredis.FakeRedis(decode_responses=True), settings())


def test_heartbeat_while_running_and_removed_after(redis_client: redis.Redis) -> None:
    worker = StreamWorker(redis_client, settings(heartbeat_ttl_ms=5000))
    worker.setup()
    key = "{incidents}:heartbeat:w1"
    beat = json.loads(redis_client.get(key))
    assert beat["consumer"] == "w1" and 0 < redis_client.pttl(key) <= 5000
    worker.stop()
    worker.run()
    assert redis_client.exists(key) == 0


def test_custom_stream_names_must_carry_the_hash_tag() -> None:
    with pytest.raises(ValueError, match="hash tag"):
        settings(alerts_stream="alerts")
    ok = settings(alerts_stream="{incidents}:near-duplicates")
    assert ok.alerts_stream == "{incidents}:near-duplicates"


def test_synthetic_workload_every_pair_reported_once(redis_client: redis.Redis) -> None:
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=5).take(600)]
    publish(redis_client, events)
    run_worker(redis_client, batch_size=64)
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert redis_client.hlen(FP) == 600
    assert pending_count(redis_client) == 0


@pytest.mark.slow
def test_alerts_stream_is_trimmed_approximately(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": f"s{i}", "features": DOCK} for i in range(400)])
    run_worker(redis_client, alerts_maxlen=50)
    assert 50 <= redis_client.xlen(ALERTS) < 399


def test_entries_that_break_the_parser_are_dead_lettered_not_fatal(redis_client: redis.Redis) -> None:
    publish(
        redis_client,
        [
            {"incident_id": "1", "features": DOCK},
            {"incident_id": "2", "features": '{"a":' + "[" * 100_000},  # nested past the JSON parser's recursion limit
            {"incident_id": "3", "features": ROAD},
        ],
    )
    run_worker(redis_client)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "bad_json" and "nested" in letter.detail
    assert {k.decode() for k in redis_client.hkeys(FP)} == {"1", "3"}


def test_entry_with_thousands_of_fields_is_dead_lettered(redis_client: redis.Redis) -> None:
    fields = {f"f{i}": "x" for i in range(5000)}
    redis_client.xadd(EVENTS, {"incident_id": "wide", **fields})
    publish(redis_client, [{"incident_id": "ok", "features": DOCK}])
    run_worker(redis_client, max_entry_bytes=1_000_000)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "missing_field" and letter.original_fields_dropped == 5001 - 1000
    assert len(letter.original) == 1000
    assert pending_count(redis_client) == 0 and redis_client.hget(FP, "ok") is not None


def test_stream_names_may_not_be_index_keys() -> None:
    for name in (
        "{incidents}:fp",
        "{incidents}:meta",
        "{incidents}:changes",
        "{incidents}:band:0:0000",
        "{incidents}:heartbeat:w1",
        "{incidents}:inbox",
        "{incidents}:group",
        "{incidents}:groupsize",
        "{incidents}:groupmerged",
        "{incidents}:groupactive",
    ):
        with pytest.raises(ValueError, match="a key the index itself uses"):
            settings(alerts_stream=name)


def test_until_idle_ends_even_when_redis_cannot_count_the_lag(redis_client: redis.Redis) -> None:
    ids = publish(redis_client, [{"incident_id": str(i), "features": {f"w{i}": 1}} for i in range(20)])
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    redis_client.xdel(EVENTS, ids[5])  # a deletion inside the undelivered range: XINFO's lag becomes unknown
    worker = run_worker(redis_client)
    assert redis_client.hlen(FP) == 19 and worker.stats.processed == 19


def test_dead_letter_stream_is_trimmed_approximately(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": f"b{i}", "features": "{}"} for i in range(400)])
    run_worker(redis_client, dead_maxlen=50)
    assert 50 <= redis_client.xlen(DEAD) < 399
    assert pending_count(redis_client) == 0


def test_entry_deleted_while_pending_is_dead_lettered_as_missing(redis_client: redis.Redis) -> None:
    ids = publish(redis_client, [{"incident_id": "a", "features": DOCK}, {"incident_id": "b", "features": ROAD}])
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    redis_client.xreadgroup(GROUP, "w1", {EVENTS: ">"})  # this worker read both, then died before processing them
    redis_client.xdel(EVENTS, ids[0])
    run_worker(redis_client)  # consumer w1 again: it finishes its own pending entries first
    [letter] = dead_letters(redis_client)
    assert letter.reason == "missing_entry" and letter.source_entry == ids[0]
    assert redis_client.hget(FP, "b") is not None and pending_count(redis_client) == 0


def test_oversized_entry_is_dead_lettered_with_prefixes_sizes_and_every_repeated_field(
    redis_client: redis.Redis,
) -> None:
    big = b"\xff" + b"B" * 300_000  # not UTF-8 either: the prefix is kept as bytes
    entry = redis_client.execute_command("XADD", EVENTS, "*", "incident_id", "huge", "note", "a", "note", big, "x", "y")
    publish(redis_client, [{"incident_id": "ok", "features": DOCK}])
    worker = run_worker(redis_client, max_entry_bytes=100_000, dead_letter_prefix_bytes=64)
    [(_, raw)] = redis_client.xrange(DEAD)
    [(_, flat)] = _raw_entries(redis_client, DEAD)
    letter = DeadLetter.from_fields(raw)
    assert letter.reason == "too_large" and letter.source_entry == entry.decode()
    parts = (b"incident_id", b"huge", b"note", b"a", b"note", big, b"x", b"y")
    assert letter.original_bytes == sum(len(p) for p in parts)
    assert letter.original_sizes == [(11, 4), (4, 1), (4, len(big)), (1, 1)]
    assert flat[-8:] == [*parts[:5], big[:64], b"x", b"y"]  # both notes, in order
    assert "100000" in letter.detail and "300" in letter.detail
    assert redis_client.hget(FP, "ok") is not None and pending_count(redis_client) == 0
    assert worker.stats.dead_letters == 1


def test_repeated_field_names_are_all_kept_in_the_dead_letter(redis_client: redis.Redis) -> None:
    redis_client.execute_command("XADD", EVENTS, "*", "incident_id", "r", "features", "{", "features", "[", "tag", "1")
    run_worker(redis_client)
    [(_, flat)] = _raw_entries(redis_client, DEAD)
    assert flat[-8:] == [b"incident_id", b"r", b"features", b"{", b"features", b"[", b"tag", b"1"]


def _raw_entries(redis_client: Any, stream: str) -> list[tuple[bytes, list[bytes]]]:
    """XRANGE with the fields as the flat list Redis sends (redis-py's own reply makes a dict of them)."""
    connection = redis_client.connection_pool.get_connection()
    try:
        connection.send_command("XRANGE", stream, "-", "+")
        reply = connection.read_response()
    finally:
        redis_client.connection_pool.release(connection)
    return [(entry_id, list(fields)) for entry_id, fields in reply]


def test_rereading_own_pending_entries_counts_no_delivery(redis_client: redis.Redis) -> None:
    """A reply lost to a dropped connection leaves entries pending; reading them again must not bring poison nearer."""
    worker = StreamWorker(redis_client, settings(max_deliveries=1))
    worker.setup()
    worker.recover_own_pending()  # the start of the run: nothing pending yet
    publish(redis_client, [{"incident_id": "a", "features": DOCK}, {"incident_id": "b", "features": ROAD}])
    redis_client.xreadgroup(GROUP, "w1", {EVENTS: ">"})  # delivered to this worker, but the reply never arrived
    assert worker.recover_own_pending() == 2
    assert dead_letters(redis_client) == [] and redis_client.hlen(FP) == 2 and pending_count(redis_client) == 0


def test_entries_left_by_a_crashed_run_of_the_same_consumer_count_a_delivery(redis_client: redis.Redis) -> None:
    publish(redis_client, [{"incident_id": "a", "features": DOCK}])
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    redis_client.xreadgroup(GROUP, "w1", {EVENTS: ">"})  # a previous run of w1 read it and died: perhaps of this entry
    run_worker(redis_client, max_deliveries=1)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "poison" and letter.deliveries == 2


@pytest.mark.parametrize(
    ("error", "waited_out"),
    [
        (
            redis.ResponseError(
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
            ),
            True,
        ),
        (redis.BusyLoadingError("Redis is loading the dataset in memory"), True),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), True),
        (
            redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
            True,
        ),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"), True),
        (redis.exceptions.ClusterDownError("The cluster is down"), True),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), True),
        (redis.ResponseError("BUSYGROUP Consumer Group name already exists"), False),
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (redis.ResponseError("ERR user_function:12: attempt to index a nil value"), False),
    ],
)
def test_server_replies_that_mean_not_now_are_waited_out(error: Exception, waited_out: bool) -> None:
    from worker.processing import waits_out

    assert waits_out(error) is waited_out


class _Interleaved:
    """A client that runs `between` once, right after the first command it is given: another worker's read landing
    in the middle of a check that takes more than one command."""

    def __init__(self, client: Any, between: Any) -> None:
        self._client, self._between, self._done = client, between, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if not self._done:
                self._done = True
                self._between()
            return result

        return call


def test_until_idle_never_leaves_while_another_worker_holds_fresh_entries(redis_client: redis.Redis) -> None:
    """The idle check reads the group's pending count and last delivered entry in one reply (XINFO GROUPS). Read in
    two (XPENDING, then XINFO) it could see nothing pending, then the position after another worker's read of the
    last entries, and declare the group idle while that worker held them: had that worker then died, its entries
    would have stayed pending with nobody left to take them over (the two-worker storm test once ended with 50)."""
    publish(redis_client, [{"incident_id": str(i), "features": DOCK} for i in range(5)])
    redis_client.xgroup_create(EVENTS, GROUP, id="0")
    worker = StreamWorker(redis_client, fast_settings())

    def other_worker_reads_everything() -> None:
        redis_client.xreadgroup(GROUP, "other", {EVENTS: ">"}, count=100)

    worker.redis = _Interleaved(redis_client, other_worker_reads_everything)  # type: ignore[assignment]
    assert worker._idle() is False, "idle while another consumer holds 5 entries it just read"
    worker.redis = redis_client
    assert pending_count(redis_client) == 5 and worker._idle() is False
    redis_client.xack(EVENTS, GROUP, *[entry_id for entry_id, _ in redis_client.xrange(EVENTS)])
    assert worker._idle() is True


def test_a_worker_follows_a_migration_mid_run_and_says_so(redis_client: redis.Redis) -> None:
    """A running worker whose calls are refused after a move to another layout follows the index there (its next
    events are indexed in the new layout) and logs it once, so an operator sees every worker take the step."""
    from unittest import mock

    from worker.migrate import Migrator

    publish(redis_client, [{"incident_id": f"a{n}", "features": {f"t{n}": 1, "shared": 3}} for n in range(20)])
    worker = StreamWorker(redis_client, settings())
    worker.run(until_idle=True)
    Migrator(redis_client, worker.settings.namespace).migrate(3)
    publish(redis_client, [{"incident_id": f"b{n}", "features": {f"t{n}": 1, "shared": 3}} for n in range(20)])
    log = worker.processor.log = mock.Mock(wraps=worker.processor.log)
    worker.run(until_idle=True)
    assert redis_client.hlen(worker.settings.keys.fingerprints) == 40
    assert worker.index.layout.bands == 3
    followed = [c for c in log.info.call_args_list if c.args == ("following the index's layout",)]
    assert len(followed) == 1, log.info.call_args_list
    assert "bands=3" in followed[0].kwargs["layout"] and "bands=4" in followed[0].kwargs["layout_before"]


# -- read_new: several entries an XREADGROUP, the same entries as one at a time ---------------------------------

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from worker.library import FN_READ_NEW  # noqa: E402


def _carried(fields: list[bytes], limit: int, prefix: int) -> int:
    """The bytes an entry adds to a read_new reply: all of it when within `limit`, else its fields' prefixes."""
    total = sum(len(part) for part in fields)
    if total <= limit:
        return total
    return sum(min(len(part), prefix) for part in fields[: 2 * 1000])


@hypothesis_settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=0, max_size=30),
    count=st.integers(1, 12),
    budget=st.integers(1, 20_000),
    limit=st.integers(50, 3000),
    prefix=st.integers(1, 3),
)
def test_read_new_takes_the_entries_one_at_a_time_would_and_keeps_to_the_budget(
    redis_client: redis.Redis, sizes: list[int], count: int, budget: int, limit: int, prefix: int
) -> None:
    """read_new takes several entries an XREADGROUP when the bytes left would hold that many of the largest kind;
    each reply holds exactly the entries an XREADGROUP COUNT 1 loop would (until `count`, or until the entries so far
    carry `budget` bytes), each over `limit` as a summary of prefixes."""
    redis_client.flushall()
    redis_client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    entries = []
    for n, size in enumerate(sizes):
        fields = [b"incident_id", f"e{n}".encode(), b"features", b"x" * size]
        entry_id = redis_client.execute_command("XADD", EVENTS, "*", *fields)
        entries.append((entry_id.decode() if isinstance(entry_id, bytes) else entry_id, fields))
    # the one-at-a-time loop, in Python
    expected: list[list[str]] = []
    left = list(entries)
    while left:
        taken, room = [], budget
        while left and len(taken) < count and room > 0:
            entry_id, fields = left.pop(0)
            taken.append(entry_id)
            room -= _carried(fields, limit, prefix)
        expected.append(taken)
    got: list[list[str]] = []
    while True:
        reply = redis_client.fcall(FN_READ_NEW, 1, EVENTS, GROUP, "w1", count, budget, limit, prefix)
        items = reply[1:]
        if not items:
            break
        got.append([item[0].decode() if isinstance(item[0], bytes) else item[0] for item in items])
        for item in items:
            kind = item[2].decode() if isinstance(item[2], bytes) else item[2]
            fields = dict(entries)[got[-1][items.index(item)]]
            assert kind == ("f" if sum(len(part) for part in fields) <= limit else "o")
    assert got == expected
    assert pending_count(redis_client) == len(entries)  # each delivered once, to this consumer


# -- the validated event of an entry as read: the shortcut against pydantic's full validation -------------------------

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tests.hostile import LIMITS, corpus  # noqa: E402
from worker.formats import EventLimits, IncidentEvent, event_error  # noqa: E402


def _outcome(fields: dict[Any, Any], limits: EventLimits) -> Any:
    """What from_fields makes of an entry: the event with its fields set and fingerprint, or the dead letter's reason,
    detail and every error."""
    try:
        event = IncidentEvent.from_fields(fields, limits)
    except ValidationError as error:
        return ("error", event_error(error), error.errors(include_url=False, include_context=False))
    return ("event", event, event.model_fields_set, event.fingerprint)


def _assert_shortcut_matches_full_validation(fields: dict[Any, Any], limits: EventLimits) -> None:
    fast = _outcome(fields, limits)
    original = IncidentEvent._valid_as_read
    IncidentEvent._valid_as_read = classmethod(lambda cls, data, limits: None)  # type: ignore[assignment,method-assign]
    try:
        full = _outcome(fields, limits)
    finally:
        IncidentEvent._valid_as_read = original  # type: ignore[method-assign]
    assert fast == full


def _as_read(fields: dict[str, Any]) -> dict[bytes, bytes]:
    """An entry's fields as the stream gives them: bytes, a features dict as JSON."""
    return {
        (k.encode() if isinstance(k, str) else k): (
            json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else v
        ).encode("utf-8", "surrogatepass")
        if not isinstance(v, bytes)
        else v
        for k, v in fields.items()
    }


@pytest.mark.parametrize("digits", [17, 4300, 4301, 20_000])
def test_a_weight_with_too_many_digits_is_a_bad_weight_not_bad_json(digits: int) -> None:
    # before, a weight past Python's int-from-text limit (4,300 digits) was bad_json, "use sys.set_int_max_str_digits()"
    entry = {"incident_id": "x", "features": '{"dock": ' + "9" * digits + "}"}
    with pytest.raises(ValidationError) as caught:
        IncidentEvent.from_fields(entry, EventLimits(max_entry_bytes=1 << 20))
    reason, detail = event_error(caught.value)
    assert reason == "bad_weight" and "2**53 - 1" in detail and "sys." not in detail


def test_an_event_as_read_validates_like_pydantic_on_the_hostile_corpus() -> None:
    limits = EventLimits(**LIMITS)
    entries = corpus(7, valid=300, hostile_every=1)
    assert sum(not entry.valid for entry in entries) > 100
    for entry in entries:
        _assert_shortcut_matches_full_validation(_as_read(entry.fields), limits)
        _assert_shortcut_matches_full_validation(entry.fields, limits)  # fields given as text and objects


_values = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["add", "upsert", "delete", "", "null", "{}", "[]", '"x"', "1", "{bad", "Disk full", "a\ud800"]),
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(st.integers(-2, 2**54), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3)),
        max_size=4,
    ).map(lambda bag: json.dumps(bag, ensure_ascii=False)),
    st.binary(max_size=6),
)
_fields = st.fixed_dictionaries(
    {"incident_id": st.one_of(st.text(min_size=1, max_size=12), st.text(min_size=250, max_size=260), _values)},
    optional={
        "op": st.one_of(st.sampled_from(["add", "upsert", "delete"]), _values),
        "features": st.one_of(
            st.dictionaries(st.text(max_size=4), st.integers(1, 2**53), min_size=1, max_size=5).map(
                lambda bag: json.dumps(bag, ensure_ascii=False)
            ),
            _values,
        ),
        "text": st.one_of(st.text(max_size=30), _values),
        "other": _values,
    },
)

_bags = st.dictionaries(st.text(max_size=4), st.integers(1, 2**53), min_size=1, max_size=6).map(
    lambda bag: json.dumps(bag, ensure_ascii=False)
)
_near_valid = st.tuples(
    st.text(min_size=1, max_size=12),
    st.sampled_from([None, "add", "upsert", "delete"]),
    st.one_of(st.tuples(st.just("features"), _bags), st.tuples(st.just("text"), st.text(max_size=30)), st.none()),
).map(
    lambda t: {"incident_id": t[0]} | ({"op": t[1]} if t[1] else {}) | (dict([t[2]]) if t[2] else {})  # type: ignore[arg-type]
)


@hypothesis_settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.one_of(_fields, _near_valid), max_tokens=st.integers(1, 6))
def test_an_event_as_read_validates_like_pydantic_on_any_fields(fields: dict[str, Any], max_tokens: int) -> None:
    limits = EventLimits(max_tokens=max_tokens, max_token_length=3, max_entry_bytes=200)
    _assert_shortcut_matches_full_validation(fields, limits)
    _assert_shortcut_matches_full_validation(_as_read(fields), limits)
