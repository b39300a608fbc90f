"""The producers' inbox (worker/inbox.py, worker/lua/inbox.lua): events appended to `{N}:inbox` come out of the
workers as if they had been XADDed, none lost or doubled when workers die or race while moving them; elements that
are not events, or too large, are dead-lettered. What the producer's user may not do is in tests/test_attacks.py
and tests/test_deploy.py."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FAST, fast_settings
from tests.streams import (
    ALERTS,
    DEAD,
    EVENTS,
    FP,
    alerts,
    assert_pairs_reported_once,
    dead_letters,
    fingerprints,
    publish,
    start_worker,
    stop,
    wait_until,
)
from worker import inbox
from worker.library import StreamTarget
from worker.stream import StreamWorker

INBOX = "{incidents}:inbox"
TARGET = StreamTarget(EVENTS, ALERTS, DEAD, "incident-workers")

pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a redis_client that decodes replies


WORDS = ["disk", "full", "dock", "scanner", "timeout", "road", "weather", "pump", "valve", "alarm", "fan", "heat"]


def random_events(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Bags over a small vocabulary, so that many pairs land within the distance limit."""
    return [
        {"incident_id": f"i{n}", "features": {w: rng.randint(1, 3) for w in rng.sample(WORDS, rng.randint(2, 5))}}
        for n in range(count)
    ]


def fields_of(event: dict[str, Any]) -> dict[str, str]:
    import json

    return {k: json.dumps(v) if isinstance(v, dict) else v for k, v in event.items()}


def append(client: Any, event: dict[str, Any], way: str) -> None:
    """One event in by `way`: XADD (`stream`), the library's `submit`, or an RPUSH of its encoding (`rpush`)."""
    if way == "stream":
        publish(client, [event])
    elif way == "submit":
        inbox.submit(client, INBOX, fields_of(event), 1024 * 1024)
    else:
        client.rpush(INBOX, inbox.encode(fields_of(event)))


def _raw_entries(client: Any) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
    """The events stream's entries with every field in order (repeated names kept)."""
    out = []
    callback = client.response_callbacks.pop("XRANGE", None)  # it makes a dict of each entry's fields
    try:
        reply = client.execute_command("XRANGE", EVENTS, "-", "+")
    finally:
        if callback is not None:
            client.response_callbacks["XRANGE"] = callback
    for entry_id, flat in reply:
        raw = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
        out.append((entry_id, list(zip(raw[::2], raw[1::2], strict=True))))
    return out


# -- the encoding -------------------------------------------------------------------------------------------------

FIELD_BYTES = st.binary(max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.lists(st.tuples(FIELD_BYTES, FIELD_BYTES), min_size=1, max_size=6), min_size=1, max_size=5))
def test_an_encoded_event_becomes_a_stream_entry_of_the_same_fields(
    redis_client: redis.Redis, events: list[list[tuple[bytes, bytes]]]
) -> None:
    redis_client.delete(INBOX, EVENTS, DEAD)
    for fields in events:
        redis_client.rpush(INBOX, inbox.encode(fields))
    done = inbox.intake(redis_client, INBOX, TARGET, fast_settings(), "w1")
    assert done == inbox.Intake(len(events), 0, 0, 0)
    assert [fields for _, fields in _raw_entries(redis_client)] == events


@pytest.mark.parametrize(
    ("element", "problem"),
    [
        (b"garbage", "starts no length"),
        (b"", "no field"),
        (b"3:abc", "a field name without its value"),
        (b"11:incident_id2:4", "runs past the end"),
        (b"1:a" * 2001, "more than 1000 fields"),
        (b"99999999999:x", "starts no length"),
    ],
)
def test_an_element_that_is_no_event_is_dead_lettered_and_the_rest_go_on(
    redis_client: redis.Redis, element: bytes, problem: str
) -> None:
    append(redis_client, {"incident_id": "a", "features": {"dock": 1}}, "rpush")
    redis_client.rpush(INBOX, element)
    append(redis_client, {"incident_id": "b", "features": {"dock": 1}}, "submit")
    StreamWorker(redis_client, fast_settings()).run(until_idle=True)
    [letter] = dead_letters(redis_client)
    assert letter.reason == "bad_inbox_entry" and problem in letter.detail
    assert letter.source_stream == INBOX and letter.original_bytes == len(element)
    assert (
        letter.original["entry"].encode("utf-8", "surrogateescape")
        == element[: fast_settings().dead_letter_prefix_bytes]
    )
    assert [a.incident_id for a in alerts(redis_client)] == ["b"]
    assert redis_client.exists(INBOX) == 0


def test_submit_refuses_an_event_over_the_limit_and_appends_nothing(redis_client: redis.Redis) -> None:
    with pytest.raises(redis.exceptions.ResponseError, match="over the limit of 100"):
        inbox.submit(redis_client, INBOX, {"incident_id": "1", "features": "x" * 100}, 100)
    with pytest.raises(redis.exceptions.ResponseError, match="field, value pairs"):
        redis_client.execute_command(*inbox.submit_command(INBOX, {}, 100))
    assert redis_client.exists(INBOX) == 0
    assert inbox.submit(redis_client, INBOX, {"incident_id": "1", "features": "x" * 80}, 100) == 1


def test_an_inbox_entry_over_max_entry_bytes_is_dead_lettered_with_a_prefix_never_appended(
    redis_client: redis.Redis,
) -> None:
    limit = 2000
    append(redis_client, {"incident_id": "big", "features": "x" * limit}, "rpush")
    StreamWorker(redis_client, fast_settings(max_entry_bytes=limit)).run(until_idle=True)
    assert redis_client.xlen(EVENTS) == 0
    [letter] = dead_letters(redis_client)
    assert letter.reason == "too_large" and letter.original_bytes == limit + len("incident_idbigfeatures")
    assert letter.original_sizes == [(11, 3), (8, limit)]
    assert letter.original == {"incident_id": "big", "features": "x" * fast_settings().dead_letter_prefix_bytes}


# -- inbox events alert as XADDed ones do ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_events_through_the_inbox_alert_as_xadded_ones_do(redis_client: redis.Redis, seed: int) -> None:
    """Every event through the inbox (in the same order) gives the same alerts as every event XADDed; events mixed
    over the three ways in report every pair within r exactly once (the brute-force pairs)."""
    rng = random.Random(seed)
    events = random_events(rng, 150)

    def run(ways: list[str]) -> list[tuple[str, list[tuple[str, int]], int]]:
        redis_client.flushdb()
        from worker import library

        library.load(redis_client)
        for event, way in zip(events, ways, strict=True):
            append(redis_client, event, way)
        StreamWorker(redis_client, fast_settings(batch_size=17)).run(until_idle=True)
        assert redis_client.exists(INBOX) == 0
        assert redis_client.hlen(FP) == len(events)
        published = alerts(redis_client)
        assert_pairs_reported_once(fingerprints(events), published)
        return [(a.incident_id, [(m.incident_id, m.distance) for m in a.matches], a.match_count) for a in published]

    xadded = run(["stream"] * len(events))
    assert xadded, "the workload has near duplicates"
    assert run(["submit"] * len(events)) == xadded
    assert run(["rpush"] * len(events)) == xadded
    run([rng.choice(["stream", "submit", "rpush"]) for _ in events])


def test_an_idle_worker_moves_the_inbox_within_its_block_time(real_redis: redis.Redis) -> None:
    worker = StreamWorker(real_redis, fast_settings(block_ms=100))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        append(real_redis, {"incident_id": "a", "features": {"dock": 3}}, "stream")
        wait_until(lambda: real_redis.hlen(FP) == 1, 10, "the first event")
        time.sleep(0.3)  # idle long enough to poll at block_ms
        latencies = []
        for n in range(5):
            started = time.monotonic()
            append(real_redis, {"incident_id": f"b{n}", "features": {"dock": 3}}, "submit")
            wait_until(lambda n=n: len(alerts(real_redis)) == n + 1, 10, "the inbox event's alert", step=0.002)
            latencies.append(time.monotonic() - started)
            time.sleep(0.25)
        assert max(latencies) < 0.1 + 0.5, latencies  # one block_ms poll, plus a loaded machine's slack
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


# -- racing and dying while moving -------------------------------------------------------------------------------


def test_two_movers_at_once_move_each_entry_exactly_once(real_redis: redis.Redis, redis_server: Any) -> None:
    count = 3000
    pipe = real_redis.pipeline(transaction=False)
    for n in range(count):
        pipe.rpush(INBOX, inbox.encode({"incident_id": f"i{n}", "n": str(n)}))
    pipe.execute()
    settings_ = fast_settings(batch_size=7)

    def mover() -> None:
        client = redis_server.client()
        while inbox.intake(client, INBOX, TARGET, settings_, "w").left:
            pass

    threads = [threading.Thread(target=mover) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    ids = [dict(fields)[b"incident_id"].decode() for _, fields in _raw_entries(real_redis)]
    assert ids == [f"i{n}" for n in range(count)], "each entry once, in the inbox's order"
    assert real_redis.exists(INBOX) == 0


def test_a_worker_sigkilled_while_moving_loses_and_duplicates_nothing(
    real_redis: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    client = real_redis  # the suite's server, emptied for this test
    rng = random.Random(7)
    events = random_events(rng, 2500)
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.rpush(INBOX, inbox.encode(fields_of(event)))
    pipe.execute()
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    settings_ = {**FAST, "batch_size": 10}
    other = start_worker(url, log=tmp_path / "other.log", consumer="other", **settings_)
    try:
        kills = 0
        while client.llen(INBOX) and kills < 6:
            # a name of its own each time: a restarted consumer counts a delivery of each entry it held, and six
            # kills of one name could make an entry poison (the peer takes a dead consumer's over, counting one)
            victim = start_worker(url, log=tmp_path / "victim.log", consumer=f"victim{kills}", **settings_)
            before = client.llen(INBOX)
            wait_until(lambda b=before: client.llen(INBOX) < b or not b, 20, "the victim to move something")
            time.sleep(rng.uniform(0, 0.05))
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            kills += 1
        assert kills >= 2, "the inbox emptied before the kills were done: add events"
        try:
            wait_until(lambda: client.hlen(FP) == len(events), 120, "every event indexed")
        except AssertionError:
            state = (
                client.llen(INBOX),
                client.hlen(FP),
                client.xlen(EVENTS),
                client.xpending(EVENTS, "incident-workers"),
            )
            raise AssertionError(f"{state}; {(tmp_path / 'other.log').read_text()[-3000:]}") from None
    finally:
        stop(other)
    assert client.exists(INBOX) == 0 and client.xlen(DEAD) == 0
    # the upkeep trims what was processed from the stream: its count of entries ever added says none came twice
    assert client.xinfo_stream(EVENTS)["entries-added"] == len(events), "an event moved twice"
    assert sorted(k.decode() for k in client.hkeys(FP)) == sorted(e["incident_id"] for e in events)
    assert_pairs_reported_once(fingerprints(events), alerts(client))


# -- a worker that cannot move the inbox still processes the stream -------------------------------------------------


def test_an_inbox_of_another_type_is_named_and_the_stream_goes_on(real_redis: redis.Redis) -> None:
    real_redis.set(INBOX, "by hand")
    append(real_redis, {"incident_id": "a", "features": {"dock": 3}}, "stream")
    append(real_redis, {"incident_id": "b", "features": {"dock": 3}}, "stream")
    worker = StreamWorker(real_redis, fast_settings())
    worker.run(until_idle=True)
    assert [a.incident_id for a in alerts(real_redis)] == ["b"]
    assert real_redis.get(INBOX) == b"by hand"


def test_a_worker_is_not_idle_while_the_inbox_holds_events(redis_client: redis.Redis) -> None:
    """`run --until-idle` must not leave events in the inbox that arrived after its last read round."""
    worker = StreamWorker(redis_client, fast_settings())
    worker.setup()
    assert worker._idle()
    append(redis_client, {"incident_id": "a", "features": {"dock": 3}}, "submit")
    assert not worker._idle()
    worker.run(until_idle=True)
    assert redis_client.hlen(FP) == 1 and worker._idle()


# -- a move that cannot append keeps the entry in the inbox ----------------------------------------------------------


@pytest.mark.parametrize("full", ["events", "dead"])
def test_a_stream_that_takes_no_more_ids_loses_no_inbox_entry(redis_client: redis.Redis, full: str) -> None:
    """A stream whose last ID is the largest (what the inbox keeps producers from doing, done before it, or by an
    older user) refuses every `XADD *`: the entry that could not be appended stays at the head of the inbox, in its
    order, and the call says why, instead of the entry leaving the inbox for nowhere at each read round."""
    stream, element = (EVENTS, inbox.encode({"incident_id": "a", "n": "1"})) if full == "events" else (DEAD, b"junk")
    redis_client.xadd(stream, {"x": "1"}, id="18446744073709551615-18446744073709551615")
    redis_client.rpush(INBOX, element, inbox.encode({"incident_id": "b", "n": "2"}))
    for _ in range(3):
        with pytest.raises(redis.exceptions.ResponseError, match="last possible ID"):
            inbox.intake(redis_client, INBOX, TARGET, fast_settings(), "w1")
        assert [bytes(e) if isinstance(e, bytes) else e.encode() for e in redis_client.lrange(INBOX, 0, -1)] == [
            element,
            inbox.encode({"incident_id": "b", "n": "2"}),
        ]


def test_until_idle_ends_on_a_stream_delivered_up_to_the_largest_id(redis_client: redis.Redis) -> None:
    """`run --until-idle` asks for the entries after the group's last delivered one: after the largest ID (XADDed by
    hand) there are none, and Redis refuses the interval; the worker ends instead of failing on it."""
    redis_client.xadd(
        EVENTS, {"incident_id": "x", "features": '{"dock": 3}'}, id="18446744073709551615-18446744073709551615"
    )
    StreamWorker(redis_client, fast_settings()).run(until_idle=True)
    assert redis_client.hlen(FP) == 1


def test_a_worker_that_found_the_inbox_empty_looks_again_only_after_a_quiet_while(
    real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady load of XADDed events a worker reads a round every few milliseconds; looking at an empty inbox
    each round was one more call on the primary a round for every worker. An inbox found empty is looked at again
    _QUIET_S later, and what arrived meanwhile is moved then, once."""
    from worker import inbox

    monkeypatch.setattr(inbox, "_QUIET_S", 3600.0)  # every round below falls within one
    worker = StreamWorker(real_redis, fast_settings())
    worker.setup()
    append(real_redis, {"incident_id": "a0", "features": {"dock": 3}}, "stream")
    assert worker.read_and_process() == 1  # looked at the inbox: empty
    real_redis.config_resetstat()
    for n in range(1, 10):
        append(real_redis, {"incident_id": f"a{n}", "features": {"dock": 3}}, "stream")
        assert worker.read_and_process() == 1
    assert "cmdstat_llen" not in real_redis.info("commandstats")  # no look at the inbox
    append(real_redis, {"incident_id": "b", "features": {"dock": 3}}, "submit")
    assert worker.read_and_process() == 0 and real_redis.llen(INBOX) == 1  # waits out the quiet while
    worker.processor.inbox._quiet_until = 0.0  # as _QUIET_S later
    assert worker.read_and_process() == 1 and real_redis.llen(INBOX) == 0
    assert real_redis.hlen(FP) == 11 and len(alerts(real_redis)) == 10
