"""The second and third attacks on reliability and security, one test a finding, each on a real redis-server loaded
with the shipped ACL (deploy/redis/users.acl) and, where it matters, the shipped redis.conf's limits.

Every test here failed on the build the attack was made against; each is bounded in time. Run them alone against any
build with `pytest tests/test_attacks.py`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.conftest import FAST, require_redis_server
from tests.redis_server import RedisServer
from tests.streams import (
    alerts,
    assert_pairs_reported_once,
    clean_env,
    fingerprints,
    pending_count,
    publish,
    run_in_process,
    start_worker,
    worker_command,
)
from tests.test_deploy import (
    PASSWORDS,
    PRODUCER_USER,
    SUBSCRIBER_USER,
    USER_PASSWORDS,
    WORKER_USER,
    render_acl,
    worker_url,
)
from worker import inbox, library, upkeep
from worker.devtools.workload import Workload
from worker.index import FingerprintIndex
from worker.settings import Settings
from worker.upkeep import Upkeep

FP = "{incidents}:fp"
INBOX = "{incidents}:inbox"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (its memory limit may be changed) whose users are the rendered users.acl,
    noeviction as redis.conf sets it, and the library loaded by the admin."""
    require_redis_server()
    result = render_acl(tmp_path / "users.acl")
    assert result.returncode == 0, result.stderr
    server = RedisServer(tmp_path, extra=["--aclfile", str(tmp_path / "users.acl"), "--maxmemory-policy", "noeviction"])
    server.start()
    try:
        with admin_of(server) as admin:
            library.load(admin)
        yield server
    finally:
        server.stop()


def admin_of(server: RedisServer, **kwargs: object) -> redis.Redis:
    return server.client(username="admin", password=PASSWORDS["REDIS_ADMIN_PASSWORD"], **kwargs)


def user_of(server: RedisServer, user: str, **kwargs: object) -> redis.Redis:
    return server.client(username=user, password=PASSWORDS[USER_PASSWORDS[user]], **kwargs)


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


# -- 1. at maxmemory, a worker holds its batch and keeps its heartbeat as the ACL user --------------------------------


@pytest.mark.parametrize("acl", ["shipped", "without-pexpire"])
def test_worker_of_the_acl_user_holds_its_batch_at_maxmemory(acl_redis: RedisServer, tmp_path: Path, acl: str) -> None:
    admin = admin_of(acl_redis)
    if acl == "without-pexpire":  # a user made from an older users.acl
        admin.acl_setuser(WORKER_USER, enabled=True, commands=["-pexpire"])
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=21).take(3000)]
    publish(admin, events)
    log = tmp_path / "w.log"
    # a short heartbeat TTL: several beats fall inside the spell
    worker = start_worker(
        worker_url(acl_redis), "--until-idle", log=log, heartbeat_ttl_ms=1000, reconnect_max_backoff_s=0.3, **FAST
    )
    try:
        _wait_for(lambda: admin.hlen(FP) >= 100 or worker.poll() is not None, 30, "the worker to be at work")
        admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) + 100_000))
        _wait_for(lambda: "out of memory" in log.read_text() or worker.poll() is not None, 30, "the spell")
        time.sleep(2.5)  # beats every 1/3 s, each SET refused
        assert worker.poll() is None, log.read_text()[-3000:]
        [consumer] = admin.zrange("{incidents}:workers", 0, -1)
        if acl == "shipped":
            assert admin.exists(b"{incidents}:heartbeat:" + consumer), "the heartbeat lapsed: `check` says it is dead"
        else:
            assert "+pexpire" in log.read_text()
        admin.config_set("maxmemory", "0")
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        admin.config_set("maxmemory", "0")
    fps = fingerprints(events)
    assert {k.decode(): int(v, 16) for k, v in admin.hgetall(FP).items()} == fps
    assert_pairs_reported_once(fps, alerts(admin))
    assert pending_count(admin) == 0
    refused = {entry["object"] for entry in admin.acl_log()} - {"client|setinfo"}
    assert refused == ({"pexpire"} if acl != "shipped" else set()), "the worker was refused something it swallowed"


# -- 3. a subscriber group that never acknowledges costs nobody else their alerts ------------------------------------

ALERTS = "{incidents}:alerts"


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))


def _add_alerts(client: redis.Redis, first: int, count: int) -> None:
    """Alerts of two matches, one a millisecond (a busy worker's pace: how far apart the IDs are sets what a pending
    entry costs)."""
    pipe = client.pipeline(transaction=False)
    for n in range(first, first + count):
        matches = json.dumps(
            [{"incident_id": f"inc-{n - 1}", "distance": 3}, {"incident_id": f"inc-{n}", "distance": 5}]
        )
        fields = {"incident_id": f"inc-{n}", "fingerprint": f"{n:016x}", "matches": matches, "op": "add"}
        pipe.xadd(ALERTS, fields, id=f"{1_733_000_000_000 + n}-0")
    pipe.execute()


def _entries_bytes(admin: redis.Redis) -> int:
    """What the alerts' entries alone take: the same entries in a stream without consumer groups."""
    admin.delete("{incidents}:copy")
    pipe = admin.pipeline(transaction=False)
    for entry_id, fields in admin.xrange(ALERTS):
        pipe.xadd("{incidents}:copy", fields, id=entry_id)
    pipe.execute()
    used = int(admin.memory_usage("{incidents}:copy", samples=0) or 0)
    admin.delete("{incidents}:copy")
    return used


def test_a_subscriber_that_never_acknowledges_does_not_make_the_memory_budget_trim_the_alerts(
    acl_redis: RedisServer,
) -> None:
    admin = admin_of(acl_redis)
    subscriber = user_of(acl_redis, SUBSCRIBER_USER)
    _add_alerts(admin, 0, 4000)
    entries = _entries_bytes(admin)
    # one subscriber reads every alert and never acknowledges one; another reads and acknowledges
    for group in ("silent", "pager"):
        subscriber.xgroup_create(ALERTS, group, id="0")
    subscriber.xreadgroup("silent", "s-1", {ALERTS: ">"})
    read = subscriber.xreadgroup("pager", "p-1", {ALERTS: ">"})
    subscriber.xack(ALERTS, "pager", *[entry_id for entry_id, _ in read[0][1]])
    budget = entries * 3 // 2
    assert int(admin.memory_usage(ALERTS, samples=0)) > budget, "the silent group's pending entries pass the budget"
    job = Upkeep(FingerprintIndex(user_of(acl_redis, WORKER_USER)), Settings(alerts_max_memory=str(budget)), _Log())
    for _ in range(3):
        job.trim_memory()
    assert admin.xlen(ALERTS) == 4000, "alerts within the budget were trimmed for the silent group's pending list"
    [warned] = [fields for level, event, fields in job.log.lines if "never acknowledged" in event]
    assert warned["groups"] == {"silent": 4000}
    # past the budget by their own size, the oldest go, down to the budget and no further (less exactly: what the
    # silent group's pending list holds is estimated high, so that none of the budget's alerts go for it)
    held = int(admin.memory_usage(ALERTS, samples=0)) - entries
    _add_alerts(admin, 4000, 4000)
    for _ in range(3):
        job.trim_memory()
    kept = _entries_bytes(admin)
    slack = 4000 * upkeep.PENDING_ENTRY_BYTES - held + 2 * 300 * 100  # the estimate's excess, two stream nodes
    assert budget * 0.8 < kept <= budget + slack, f"the alerts take {kept:,} bytes for a budget of {budget:,}"
    assert admin.xrevrange(ALERTS, count=1)[0][1][b"incident_id"] == b"inc-7999"


# -- 7. a hand-edited {N}:meta: named, with what to run, and no worker taken down -------------------------------------

META = "{incidents}:meta"


def _repair_from(message: str) -> list[str]:
    """The redis-cli command a message tells an administrator to run (the text after its last colon)."""
    return message.rsplit(": ", 1)[1].split()


@pytest.mark.parametrize(
    ("field", "value"), [("changes_trimmed_to", "garbage"), ("building", "oops"), ("layout", "garbage")]
)
@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_a_damaged_meta_field_is_named_and_takes_no_worker_down(
    acl_redis: RedisServer, tmp_path: Path, field: str, value: str, read_path: str
) -> None:
    admin = admin_of(acl_redis)
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=27).take(400)]
    publish(admin, events[:200])
    url = worker_url(acl_redis)
    first = start_worker(url, "--until-idle", log=tmp_path / "first.log", read_path=read_path, **FAST)
    assert first.wait(timeout=60) == 0, (tmp_path / "first.log").read_text()[-3000:]
    admin.hset(META, field, value)
    publish(admin, events[200:])
    # a log each: two processes writing one file can interleave the pieces of their lines
    logs = [tmp_path / f"w{n}.log" for n in range(2)]

    def logged() -> str:
        return "".join(log.read_text() for log in logs)

    workers = [
        start_worker(url, log=log, read_path=read_path, consumer=f"w{n}", reconnect_max_backoff_s=0.5, **FAST)
        for n, log in enumerate(logs)
    ]
    try:
        # the upkeep's first trim of the change log comes within a second of a worker's start
        _wait_for(
            lambda: f"field {field} holds" in logged() or any(w.poll() is not None for w in workers), 20, "the finding"
        )
        time.sleep(2)
        assert [w.poll() for w in workers] == [None, None], logged()[-3000:]
        lines = [json.loads(line) for line in logged().splitlines() if f"field {field} holds" in line]
        message = lines[0]["error"]
        assert f"{META} field {field} holds {value!r}" in message
        if field == "building":
            assert admin.hlen(FP) == 200, "an incident was indexed while the migration's target was unreadable"
        if field == "layout":
            assert admin.hlen(FP) == 200, "an incident was indexed while the layout was unreadable"
        admin.execute_command(*_repair_from(message))
        _wait_for(lambda: admin.hlen(FP) == 400 and pending_count(admin) == 0, 60, "the events after the repair")
        for worker in workers:
            worker.terminate()
            assert worker.wait(timeout=30) == 0, logged()[-3000:]
    finally:
        for worker in workers:
            worker.kill()
    fps = fingerprints(events)
    assert {k.decode(): int(v, 16) for k, v in admin.hgetall(FP).items()} == fps
    assert_pairs_reported_once(fps, alerts(admin))


def test_the_operator_commands_name_a_damaged_layout_instead_of_a_traceback(acl_redis: RedisServer) -> None:
    """`HSET {N}:meta layout garbage`: stats, inspect, query, groups, expire and migrate printed KeyError 'bands'."""
    admin = admin_of(acl_redis)
    FingerprintIndex(user_of(acl_redis, WORKER_USER)).add("INC-1", {"dock": 3, "scanner": 2})
    admin.hset(META, "layout", "garbage")
    env = clean_env(redis_url=worker_url(acl_redis))
    for argv in (
        ["stats"],
        ["inspect", "INC-1"],
        ["query", "--features", '{"dock": 3}'],
        ["groups"],
        ["expire", "--dry-run"],
        ["migrate", "--bands", "3"],
    ):
        done = run_in_process(argv, env)
        err = done.stderr.decode()
        assert done.returncode == 2 and "Traceback" not in err, (argv, err)
        assert f"{META} field layout holds 'garbage', not a layout tag" in err, (argv, err)
        assert f"HSET {META} layout simhash64-blake2b8le/bands=4/max_distance=7/format=" in err, (argv, err)


# -- 10. suspected, settled by test --------------------------------------------------------------------------------


def _admin_url(server: RedisServer) -> str:
    return f"redis://admin:{PASSWORDS['REDIS_ADMIN_PASSWORD']}@127.0.0.1:{server.port}/0"


def test_load_functions_deletes_only_this_codes_other_versions(acl_redis: RedisServer) -> None:
    admin = admin_of(acl_redis)
    # another application's libraries whose names merely start like ours, and an older version of this code
    foreign = {
        "incident_index_audit": "redis.register_function('incident_index_audit_count', function() return 1 end)",
        "incident_index_0123456789": "redis.register_function('audit_apply', function() return 1 end)",
    }
    for name, body in foreign.items():
        admin.function_load(f"#!lua name={name}\n{body}\n")
    older = library.LIBRARY_SOURCE.replace(library.LIBRARY_NAME, "incident_index_ffffffffff")
    admin.function_load(older)
    result = subprocess.run(
        [*worker_command(), "load-functions", "--delete-other-versions", "--json"],
        env=clean_env(admin_redis_url=_admin_url(acl_redis)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["deleted"] == ["incident_index_ffffffffff"]
    left = set(library.installed_versions(admin_of(acl_redis)))
    assert left == {library.LIBRARY_NAME, *foreign}, "another application's library was deleted"


def test_a_copy_that_cannot_be_loaded_leaves_the_worker_on_the_primary(
    acl_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHANGES_KEEP shorter than a copy's load: every load loses its position to a trim, three times over."""
    from worker import readpath
    from worker.stream import StreamWorker

    def lost(self: readpath.ChangeFollower) -> None:
        raise readpath.SnapshotLostError(f"{self.keys.changes} was trimmed past this copy's position")

    monkeypatch.setattr(readpath.ChangeFollower, "_load_once", lost)
    admin = admin_of(acl_redis)
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=29).take(300)]
    publish(admin, events)
    client = user_of(acl_redis, WORKER_USER)
    settings = Settings(consumer="w1", read_path="snapshot", changes_keep="1s", **FAST)
    worker = StreamWorker(client, settings)
    worker.run(until_idle=True)
    fps = fingerprints(events)
    assert {k.decode(): int(v, 16) for k, v in admin.hgetall(FP).items()} == fps
    assert_pairs_reported_once(fps, alerts(admin))
    assert worker.snapshot is None


@pytest.mark.parametrize(
    ("stream", "allowed"), [("{incidents}:events", False), (ALERTS, False), ("{incidents}:dead", True)]
)
def test_the_worker_user_deletes_dead_letters_only(acl_redis: RedisServer, stream: str, allowed: bool) -> None:
    admin = admin_of(acl_redis)
    entry_id = admin.xadd(stream, {"incident_id": "7"})
    worker = user_of(acl_redis, WORKER_USER)
    if allowed:
        assert worker.xdel(stream, entry_id) == 1  # dead replay
    else:
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.xdel(stream, entry_id)
        assert admin.xlen(stream) == 1


# -- 5. one huge producer entry: refused by the shipped redis.conf's request limits ----------------------------------


def _conf_limits(*names: str) -> list[str]:
    """The shipped redis.conf's request limits (or the directives `names`), as redis-server arguments."""
    from tests.test_deploy import REDIS_CONF, _conf_directives

    directives = _conf_directives(REDIS_CONF.read_text())
    arguments = []
    for name in names or ("proto-max-bulk-len", "client-query-buffer-limit"):
        arguments += [f"--{name}", directives[name]]
    return arguments


@pytest.mark.parametrize("way_in", ["inbox", "stream"])
def test_the_shipped_request_limits_refuse_a_huge_entry_and_keep_the_worker_whole(tmp_path: Path, way_in: str) -> None:
    """Through the inbox (the shipped producer user, RPUSH of encoded events, unchecked) and through XADD (a user that
    may XADD: here the worker's), the same events end the same way."""
    require_redis_server()
    assert render_acl(tmp_path / "users.acl").returncode == 0
    server = RedisServer(tmp_path, extra=["--aclfile", str(tmp_path / "users.acl"), *_conf_limits()])
    server.start()
    try:
        admin = admin_of(server)
        library.load(admin)
        events = "{incidents}:events"
        limit = Settings().max_entry_bytes
        if way_in == "inbox":
            client = user_of(server, PRODUCER_USER, retry=None)

            def append(event: dict[str, Any]) -> None:
                fields = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in event.items()}
                client.rpush(INBOX, inbox.encode(fields))

            count: Any = lambda: admin.llen(INBOX)  # noqa: E731
        else:
            client = user_of(server, WORKER_USER, retry=None)

            def append(event: dict[str, Any]) -> None:
                publish(client, [event])

            count = lambda: admin.xlen(events)  # noqa: E731
        append({"incident_id": "ok", "features": {"dock": 3, "scanner": 2}})
        # at the limit, invalid: its dead letter carries all of it back (the largest command a worker sends)
        append({"incident_id": "big", "features": "x" * (limit - 100)})
        # over the limit, under the request limits: dead-lettered with a prefix of each field
        append({"incident_id": "over", "features": "x" * (limit + limit // 2)})
        with pytest.raises(redis.exceptions.RedisError):
            append({"incident_id": "huge", "features": "x" * (8 * 1024 * 1024)})
        assert count() == 3
        log = tmp_path / "w.log"
        worker = start_worker(worker_url(server), "--until-idle", log=log, **FAST)
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert admin.hkeys(FP) == [b"ok"]
        letters = {fields[b"incident_id"]: fields for _, fields in admin.xrange("{incidents}:dead")}
        assert set(letters) == {b"big", b"over"}
        assert len(letters[b"big"][b"features"]) == limit - 100
        assert letters[b"over"][b"reason"] == b"too_large"
        assert len(letters[b"over"][b"features"]) == Settings().dead_letter_prefix_bytes
        assert admin.exists(INBOX) == 0
    finally:
        server.stop()


# -- 9. the tokenizer's work is bounded by the size of the text it reads ----------------------------------------------

_EXPANDING = "\ufdfa"  # NFKC: 18 characters


def test_a_text_that_nfkc_expands_many_times_over_is_dead_lettered_within_bounded_memory() -> None:
    import tracemalloc

    from pydantic import ValidationError

    from worker.errors import TextTooLargeError
    from worker.formats import EventLimits, IncidentEvent, event_error
    from worker.text import features_from_text

    attack = _EXPANDING * (1_048_576 // 3 - 100)  # just under 1 MiB of UTF-8, the entry size limit
    tracemalloc.start()
    try:
        with pytest.raises(TextTooLargeError):
            features_from_text(attack)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"tokenizing it took {peak / 2**20:.0f} MiB at its peak"
    with pytest.raises(ValidationError) as refused:
        IncidentEvent.from_fields({b"incident_id": b"7", b"text": attack.encode()}, EventLimits())
    assert event_error(refused.value)[0] == "bad_text"
    # a few of them in an ordinary text are no attack
    assert features_from_text(f"payment failed {_EXPANDING} {_EXPANDING} retry")


def test_a_text_of_combining_marks_is_dead_lettered_in_time_linear_in_its_size() -> None:
    """NFKC puts a run of combining marks in order by insertion, in time that grows with the run's square: 1 MiB of
    marks of alternating classes took minutes. A run longer than a slice with no place to cut is `bad_text`; runs of
    marks as long as real texts hold, even a "zalgo" text's hundreds, are tokenized."""
    from pydantic import ValidationError

    from worker.errors import TextTooLargeError
    from worker.formats import EventLimits, IncidentEvent, event_error
    from worker.text import features_from_text

    attack = "a" + "\u0301\u0316" * (1_048_576 // 4 - 100)  # classes 230, 220, ...: each 220 sorts back past all
    started = time.process_time()
    with pytest.raises(TextTooLargeError, match="none of which NFKC can be cut before"):
        features_from_text(attack)
    assert time.process_time() - started < 5, "about 190 s of CPU before the bound"
    with pytest.raises(ValidationError) as refused:
        IncidentEvent.from_fields({b"incident_id": b"7", b"text": attack.encode()}, EventLimits())
    assert event_error(refused.value)[0] == "bad_text"
    zalgo = ("disk full " + "e" + "\u0301\u0316" * 150 + " ") * 400  # runs of 300 marks, 250 KB
    assert "disk" in features_from_text(zalgo)


_ALPHABET = st.sampled_from(
    [
        "a",
        "E",
        " ",
        "\n",
        "1",
        "=",
        "/",  # ASCII
        "\u0301",
        "\u0327",
        "\u0344",
        "\u0f73",
        "\u0f71",
        "\u0f72",  # combining marks, and decompositions into them
        "\u1100",
        "\u1161",
        "\u11a8",
        "\uac00",  # Hangul jamo (L, V, T) and a syllable: they compose as starters
        "\u0b47",
        "\u0b3e",
        "\u0b57",
        "\u0cc6",
        "\u0cd5",  # starters that compose with the starter before them
        "\ufb01",
        "\uff25",
        "\u2168",
        "\u3315",
        "\ufdfa",
        "\u00b4",
        "\u1e9b",  # compatibility forms that expand
        "\u0645",
        "\u00e9",
        "\u0130",
        "\u03d3",  # letters
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, min_size=1, max_size=120))
@example(list("abc\u1100\u1161\u11a8"))  # jamo that compose into one syllable across a cut
@example(list("a\u1100\u1161\u11a8"))  # the trailing jamo after a cut joins the syllable made before it
@example(list("abc\u0b47\u0b3e"))  # a vowel sign that composes with the starter before it
@example(list("abc\u0f71\u0f73\u0301"))  # a decomposition into marks that reorder with the marks before
def test_nfkc_a_slice_at_a_time_is_nfkc_of_the_whole(chars: list[str]) -> None:
    import unicodedata

    from worker import text as text_module

    sample = "".join(chars)
    saved = text_module._NFKC_SLICE
    text_module._NFKC_SLICE = 3  # a cut every few characters: every kind of neighbour meets a boundary
    try:
        try:
            sliced = text_module._nfkc(sample * 2)
        except ValueError:
            return  # grows past the bound (U+FDFA is 18 characters in one)
    finally:
        text_module._NFKC_SLICE = saved
    assert sliced == unicodedata.normalize("NFKC", sample * 2)


# -- 2. producers: what the ACL can and cannot fence ----------------------------------------------------------------

EVENTS = "{incidents}:events"
MAX_ID = "18446744073709551615-18446744073709551615"


def test_a_group_delivered_past_the_streams_end_is_named_with_its_repair(acl_redis: RedisServer) -> None:
    admin = admin_of(acl_redis, decode_responses=True)
    # the shipped producer user may not (test_a_producer_appends_to_the_inbox_and_can_do_nothing_else); a user that
    # may XADD, an older producer user or the worker's, still can: the ACL cannot refuse an ID chosen by hand
    producer = user_of(acl_redis, WORKER_USER)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user_of(acl_redis, PRODUCER_USER).xadd(EVENTS, {"incident_id": "7"}, id=MAX_ID)
    admin.xgroup_create(EVENTS, "incident-workers", id="0", mkstream=True)
    producer.xadd(EVENTS, {"incident_id": "7"}, id=MAX_ID)
    with pytest.raises(redis.exceptions.ResponseError):
        producer.xadd(EVENTS, {"incident_id": "8"})  # every later XADD * fails
    admin.xreadgroup("incident-workers", "w1", {EVENTS: ">"})
    admin.xack(EVENTS, "incident-workers", MAX_ID)
    # the obvious repair: the entry deleted, the stream's ID set back
    admin.xdel(EVENTS, MAX_ID)
    admin.execute_command("XSETID", EVENTS, "1-0")
    producer.xadd(EVENTS, {"incident_id": "8"})
    assert admin.xreadgroup("incident-workers", "w1", {EVENTS: ">"}) == [], "silently nothing"
    [warning] = upkeep.warnings(user_of(acl_redis, WORKER_USER), Settings(), memory=False)
    assert f"consumer group 'incident-workers' of {EVENTS} has delivered up to {MAX_ID}" in warning
    assert warning.endswith(f"XGROUP SETID {EVENTS} incident-workers <that entry's ID>")
    admin.xgroup_setid(EVENTS, "incident-workers", "1-0")  # the entry before the repair's first
    assert admin.xreadgroup("incident-workers", "w1", {EVENTS: ">"})[0][1][0][1] == {"incident_id": "8"}
    assert upkeep.warnings(user_of(acl_redis, WORKER_USER), Settings(), memory=False) == []


def test_a_function_cannot_append_for_a_producer_that_may_not_xadd(acl_redis: RedisServer) -> None:
    """Why the fence is a list and not a function: a function's XADD is checked against its caller's permissions, so
    a producer that may not XADD cannot append to the stream through one either (and one that may can XADD with
    MAXLEN 0 or an ID of its choice directly). A function's RPUSH is checked the same way, which is what `submit`
    relies on (the next test)."""
    admin = admin_of(acl_redis)
    admin.function_load(
        "#!lua name=append_probe\n"
        "redis.register_function('append_probe', function(keys, args)\n"
        "  return redis.call('XADD', keys[1], '*', 'incident_id', args[1])\n"
        "end)\n"
    )
    producer = user_of(acl_redis, PRODUCER_USER)
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.fcall("append_probe", 1, EVENTS, "7")  # the stream is not among its keys
    with pytest.raises(redis.exceptions.ResponseError, match="can't run this command"):
        producer.fcall("append_probe", 1, INBOX, "7")  # its own key: the function's XADD refused
    assert admin.exists(EVENTS, INBOX) == 0


def test_a_producer_appends_to_the_inbox_and_can_do_nothing_else(acl_redis: RedisServer, tmp_path: Path) -> None:
    """SPEC 7 (2026-12-05): the shipped producer user appends events with server-assigned IDs and can do nothing
    else. Each attack of finding 2 is tried and refused (or, an entry over the limit, dead-lettered), the stream and
    its group stay whole, and what it appended comes out as alerts."""
    admin = admin_of(acl_redis)
    producer = user_of(acl_redis, PRODUCER_USER)
    limit = Settings().max_entry_bytes
    dock = {"incident_id": "a", "features": json.dumps({"dock": 3, "scanner": 2})}
    publish(user_of(acl_redis, WORKER_USER), [{"incident_id": "x", "features": {"dock": 3, "scanner": 2}}])
    admin.xgroup_create(EVENTS, "incident-workers", id="0")
    before = admin.xrange(EVENTS)
    target = library.StreamTarget(EVENTS, "{incidents}:alerts", "{incidents}:dead", "incident-workers")
    refused = {
        "XADD MAXLEN 0 (empties the stream)": lambda: producer.xadd(EVENTS, dock, maxlen=0),
        "XADD of the largest ID": lambda: producer.xadd(EVENTS, dock, id=MAX_ID),
        "XADD of any ID": lambda: producer.xadd(EVENTS, dock),
        "XTRIM": lambda: producer.xtrim(EVENTS, maxlen=0),
        "XDEL": lambda: producer.xdel(EVENTS, before[0][0]),
        "DEL of the stream": lambda: producer.delete(EVENTS),
        "XGROUP SETID": lambda: producer.xgroup_setid(EVENTS, "incident-workers", "$"),
        "LTRIM of the inbox": lambda: producer.ltrim(INBOX, 1, 0),
        "LPOP of the inbox": lambda: producer.lpop(INBOX),
        "LREM of the inbox": lambda: producer.lrem(INBOX, 0, b"x"),
        "LPUSH ahead of the others": lambda: producer.lpush(INBOX, inbox.encode(dock)),
        "DEL of the inbox": lambda: producer.delete(INBOX),
        "UNLINK of the inbox": lambda: producer.unlink(INBOX),
        "the workers' intake": lambda: inbox.intake(producer, INBOX, target, Settings(), "p"),
    }
    for what, attempt in refused.items():
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
            pytest.fail(f"the producer's user may {what}")
    with pytest.raises(redis.exceptions.ResponseError, match="over the limit"):
        inbox.submit(producer, INBOX, {"incident_id": "b", "features": "x" * limit}, limit)
    inbox.submit(producer, INBOX, dock, limit)  # through the library
    producer.rpush(INBOX, inbox.encode({"incident_id": "c", "features": dock["features"]}))  # or by hand
    producer.rpush(INBOX, inbox.encode({"incident_id": "d", "features": "x" * (limit + 1)}))  # unchecked: too large
    log = tmp_path / "w.log"
    worker = start_worker(worker_url(acl_redis), "--until-idle", log=log, **FAST)
    assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert admin.xinfo_stream(EVENTS)["entries-added"] == 3, "x, then a and c through the inbox"
    assert sorted(admin.hkeys(FP)) == [b"a", b"c", b"x"]
    assert sorted(a.incident_id for a in alerts(admin)) == ["a", "c"]
    [letter] = [fields for _, fields in admin.xrange("{incidents}:dead")]
    assert letter[b"reason"] == b"too_large" and letter[b"incident_id"] == b"d"
    assert admin.exists(INBOX) == 0
    last = admin.xinfo_stream(EVENTS)["last-generated-id"]
    assert admin.xinfo_groups(EVENTS)[0]["last-delivered-id"] == last
    assert int(last.split(b"-")[0]) < 2**63, "an ID of the server's choosing"
    assert upkeep.warnings(user_of(acl_redis, WORKER_USER), Settings(), memory=False) == []


@pytest.mark.parametrize(
    "taken", [["lpop", "llen", "lpush"], ["lpop"], ["lpush"]], ids=["older acl", "without lpop only", "without lpush"]
)
def test_a_worker_user_from_an_older_acl_processes_the_stream_and_names_the_inbox_grant(
    acl_redis: RedisServer, tmp_path: Path, taken: list[str]
) -> None:
    """A worker whose user may not LPOP (a users.acl from before the inbox) is not stopped by it: the stream's
    events are processed, the inbox waits (and `--until-idle` does not wait for it), and the log says what to grant;
    once granted, the inbox is moved."""
    admin = admin_of(acl_redis)
    admin.acl_setuser(WORKER_USER, enabled=True, commands=[f"-{command}" for command in taken])
    publish(user_of(acl_redis, WORKER_USER), [{"incident_id": "x", "features": {"dock": 3}}])
    inbox.submit(user_of(acl_redis, PRODUCER_USER), INBOX, {"incident_id": "y", "features": '{"dock": 3}'})
    log = tmp_path / "w.log"
    worker = start_worker(worker_url(acl_redis), "--until-idle", log=log, **FAST)
    assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert admin.hkeys(FP) == [b"x"] and admin.llen(INBOX) == 1
    assert "inbox not moved" in log.read_text() and "grant +lpop +llen" in log.read_text()
    admin.acl_setuser(WORKER_USER, enabled=True, commands=[f"+{command}" for command in taken])
    worker = start_worker(worker_url(acl_redis), "--until-idle", log=log, **FAST)
    assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert sorted(admin.hkeys(FP)) == [b"x", b"y"] and admin.exists(INBOX) == 0
    assert [a.incident_id for a in alerts(admin)] == ["y"]


def test_the_functions_name_a_damaged_change_log_floor_instead_of_failing(acl_redis: RedisServer) -> None:
    """The Lua side of finding 7: a claim made before the floor was mangled is not validated (the full search runs
    instead), and the change log's trim names the field; neither fails with a Lua error in every worker."""
    from worker.library import FN_TRIM_CHANGES, SnapshotClaim, parse_apply
    from worker.readpath import ChangeFollower

    client = user_of(acl_redis, WORKER_USER)
    index = FingerprintIndex(client)
    index.add_fingerprint("a", 1)
    follower = ChangeFollower(client, index.keys, index.layout)
    follower.load()
    found = follower.index.search(7, exclude="c", limit=100)
    claim = SnapshotClaim(follower.index.position, found.match_count, found.matches, True)
    admin_of(acl_redis).hset(META, "changes_trimmed_to", "garbage")
    command = index.apply_command("add", "c", 7, snapshot=claim, max_matches=100)
    assert parse_apply(client.execute_command(*command)).status == "unvalidated"
    assert index.get("c") is None
    with pytest.raises(redis.exceptions.ResponseError, match='changes_trimmed_to holds "garbage"'):
        client.fcall(FN_TRIM_CHANGES, 2, index.keys.meta, index.keys.changes, "1-0", 100)


# -- 8. alert amplification: an alert's bytes are bounded, whatever the IDs it lists ---------------------------------


def test_alerts_of_long_ids_are_bounded_in_bytes(acl_redis: RedisServer, tmp_path: Path) -> None:
    admin = admin_of(acl_redis)
    wide = "\U0001d538" * 250  # 4 bytes a character: 1 KB of ID
    bag = {"disk": 3, "full": 2, "db-7": 1}
    events = [{"incident_id": f"{wide}{n:06d}", "features": bag} for n in range(120)]
    publish(admin, events)
    log = tmp_path / "w.log"
    worker = start_worker(worker_url(acl_redis), "--until-idle", log=log, **FAST)
    assert worker.wait(timeout=120) == 0, log.read_text()[-3000:]
    published = admin.xrange(ALERTS)
    assert len(published) == 119
    for n, (_, fields) in enumerate(published, start=1):
        assert int(fields[b"match_count"]) == n, "match_count counts every match"
        listed = json.loads(fields[b"matches"])
        assert 1 <= len(listed) <= 100 and len(fields[b"matches"]) <= 8192
        # the closest first (all at distance 0: by ID), as many as fit
        assert [m["incident_id"] for m in listed] == [e["incident_id"] for e in events[: len(listed)]]
        assert sum(len(k) + len(v) for k, v in fields.items()) < 10 * 1024, "an alert ten times its event"


# -- 4. a change-log floor ahead of the log ------------------------------------------------------------------------


def test_a_change_log_floor_ahead_of_the_log_is_not_where_a_copy_starts(acl_redis: RedisServer, tmp_path: Path) -> None:
    """A copy placed at a floor past the server's clock never saw the changes written after it (their IDs fall below
    the floor), and its claims passed validation: missed pairs, false alerts. Now the floor is named and the worker
    searches on the primary."""
    admin = admin_of(acl_redis)
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=31, near_duplicates=0.6).take(400)]
    publish(admin, events[:100])
    url = worker_url(acl_redis)
    first = start_worker(url, "--until-idle", log=tmp_path / "first.log", read_path="primary", **FAST)
    assert first.wait(timeout=60) == 0, (tmp_path / "first.log").read_text()[-3000:]
    seconds, _ = admin.time()
    admin.hset(META, "changes_trimmed_to", f"{(int(seconds) + 86_400) * 1000}-0")  # a day ahead
    publish(admin, events[100:])
    log = tmp_path / "w.log"
    worker = start_worker(url, "--until-idle", log=log, read_path="snapshot", **FAST)
    assert worker.wait(timeout=120) == 0, log.read_text()[-3000:]
    fps = fingerprints(events)
    assert {k.decode(): int(v, 16) for k, v in admin.hgetall(FP).items()} == fps
    assert_pairs_reported_once(fps, alerts(admin))
    assert "ahead of the server's clock" in log.read_text()


# -- 6. {N}:meta deleted during a migration --------------------------------------------------------------------------


def test_a_meta_deleted_during_a_migration_stops_its_switch(acl_redis: RedisServer) -> None:
    """A worker re-creates a deleted meta without `building`: what it indexes then gets no postings in the target,
    so the switch must not happen; the move is aborted and made again, and every pair is found in the new layout."""
    from worker.bands import BandLayout
    from worker.migrate import Migrator

    admin = admin_of(acl_redis)
    client = user_of(acl_redis, WORKER_USER)
    index = FingerprintIndex(client)
    spread = 0x9E3779B97F4A7C15
    fps = {str(i): i * spread % 2**64 for i in range(300)}
    index.bulk_load(list(fps.items()))
    migrator = Migrator(client, "incidents", batch=50)
    stored = FingerprintIndex.stored(client)
    assert stored is not None
    migrator._start(stored, BandLayout(8, 7))
    migrator.step()
    admin.delete(META)  # by hand, mid-move
    fps["near"] = fps["7"] ^ 0b111111  # distance 6 from incident 7
    worker = FingerprintIndex(client)
    assert worker.add_fingerprint("near", fps["near"]) == [("7", 6)]
    assert admin.hget(META, "building") is None, "the meta came back without the move's target"
    with pytest.raises(redis.exceptions.ResponseError, match="migrate --abort"):
        while not migrator.step():
            pass
    assert FingerprintIndex.stored(client).layout.bands == 4, "the move switched without its target"  # type: ignore[union-attr]
    migrator.abort()
    assert Migrator(client, "incidents", batch=50).migrate(8).startswith("moved from")
    moved = FingerprintIndex(client, bands=8)
    for incident_id, fp in fps.items():
        expected = sorted(
            ((other, (fp ^ ofp).bit_count()) for other, ofp in fps.items() if (fp ^ ofp).bit_count() <= 7),
            key=lambda pair: (pair[1], pair[0]),
        )
        assert moved.matches_of(fp) == expected, incident_id


def test_a_worker_puts_back_an_inbox_entry_the_full_stream_refused_and_processes_the_stream(
    acl_redis: RedisServer, tmp_path: Path
) -> None:
    """A user that may XADD (an older producer user, or the worker's) can still append the largest ID, after which
    every XADD * fails. The shipped worker user then moves nothing out of the inbox for nowhere: the entry goes back
    to the inbox's head (its user may LPUSH), the stream's own entry is processed, and the log names the repair."""
    admin = admin_of(acl_redis)
    worker_user = user_of(acl_redis, WORKER_USER)
    worker_user.xadd(EVENTS, {"incident_id": "x", "features": json.dumps({"dock": 3})}, id=MAX_ID)
    element = inbox.encode({"incident_id": "y", "features": json.dumps({"dock": 3})})
    user_of(acl_redis, PRODUCER_USER).rpush(INBOX, element)
    log = tmp_path / "w.log"
    worker = start_worker(worker_url(acl_redis), "--until-idle", log=log, **FAST)
    assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert admin.hkeys(FP) == [b"x"] and admin.lrange(INBOX, 0, -1) == [element]
    assert "inbox not moved" in log.read_text() and "XSETID" in log.read_text()


# -- the third attack ------------------------------------------------------------------------------------------------


def test_no_function_spins_for_a_producer_that_names_huge_counts(acl_redis: RedisServer) -> None:
    """The producer may FCALL (its submit function's name changes with each version), and a function's commands are
    checked only when it runs them: a call of a few bytes that names 1e15 calls must be refused at once, never loop
    before its first command. apply_batch looped 1e15 times there, and every client got BUSY until an admin's
    FUNCTION KILL. Every function of the library is tried; a spin would time the producer's call out."""
    producer = user_of(acl_redis, PRODUCER_USER, socket_timeout=10)
    shapes = (([], ["1e15", "0"]), ([], ["1e15", "1e15", "0"]), ([INBOX], ["1e15"] * 4), ([], ["3", "-1", "0.5"]))
    for name, function in sorted(library.FUNCTIONS.items()):
        for keys, args in shapes:
            try:
                producer.fcall(function, len(keys), *keys, *args)
            except redis.exceptions.ResponseError as refused:
                if name == "apply_batch":
                    assert "apply_batch: " in str(refused), str(refused)
    with pytest.raises(
        redis.exceptions.ResponseError, match="add up to 8 keys and 21 arguments; the call has 8 and 22"
    ):
        producer.fcall(library.FUNCTIONS["apply_batch"], 8, *[INBOX] * 8, "1", "8", "18", *["0"] * 19)
    assert admin_of(acl_redis, socket_timeout=10).ping()


def _raw_connection(server: RedisServer, user: str) -> socket.socket:
    """A socket logged in as `user`, for commands sent by hand (a client library would read every reply)."""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    password = PASSWORDS[USER_PASSWORDS[user]]
    connection.sendall(f"AUTH {user} {password}\r\n".encode())
    assert connection.recv(64).startswith(b"+OK")
    return connection


@pytest.mark.parametrize("attack", ["unread replies", "half-sent commands"])
def test_client_buffers_cannot_fill_memory_and_refuse_every_write(tmp_path: Path, attack: str) -> None:
    """A subscriber that pipelines XRANGE of the whole alerts stream and never reads the replies, or producer
    connections each part-way through a 2 MB command, held 1.3 GB of client buffers against a 1gb maxmemory, and
    every write was refused with OOM. With the shipped redis.conf's client limits (here against 128mb) the
    attacker's connections are closed and the producer's appends go on."""
    require_redis_server()
    assert render_acl(tmp_path / "users.acl").returncode == 0
    limits = _conf_limits(
        "proto-max-bulk-len", "client-query-buffer-limit", "client-output-buffer-limit", "maxmemory-clients"
    )
    server = RedisServer(
        tmp_path,
        extra=[
            "--aclfile",
            str(tmp_path / "users.acl"),
            "--maxmemory",
            "128mb",
            "--maxmemory-policy",
            "noeviction",
            *limits,
        ],
    )
    server.start()
    sockets: list[socket.socket] = []
    try:
        admin = admin_of(server, socket_timeout=10)
        producer = user_of(server, PRODUCER_USER, socket_timeout=10)
        if attack == "unread replies":
            pipe = admin.pipeline(transaction=False)
            for n in range(16_000):  # about 16 MB of alerts
                pipe.xadd("{incidents}:alerts", {"incident_id": f"i{n}", "matches": "x" * 1000})
            pipe.execute()
            reader = _raw_connection(server, SUBSCRIBER_USER)
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.sendall(b"XRANGE {incidents}:alerts - +\r\n" * 12)  # 190 MB of replies, none read
            sockets.append(reader)
        else:
            head = b"*3\r\n$5\r\nRPUSH\r\n$" + str(len(INBOX)).encode() + b"\r\n" + INBOX.encode() + b"\r\n"
            for _ in range(80):  # 160 MB of arguments announced and mostly sent, none finished
                connection = _raw_connection(server, PRODUCER_USER)
                sockets.append(connection)
                with contextlib.suppress(OSError):  # closed by the server: what the limits are for
                    connection.sendall(head + b"$2000000\r\n" + b"x" * 1_990_000)
        time.sleep(0.5)
        producer.rpush(INBOX, inbox.encode({"incident_id": "after", "features": json.dumps({"dock": 3})}))
        memory = admin.info("memory")
        assert memory["used_memory"] < memory["maxmemory"]
        assert admin.llen(INBOX) == 1
    finally:
        for connection in sockets:
            connection.close()
        server.stop()


def test_consumer_names_a_subscriber_chose_do_not_make_the_memory_budget_trim_the_alerts(
    acl_redis: RedisServer,
) -> None:
    """MEMORY USAGE counts a stream's consumers, whose names a subscriber chooses (up to proto-max-bulk-len each), and
    trimming cannot free them: eight consumers of 1 MB names, nothing pending, put the alerts 2x over their budget,
    and every pass trimmed them until none was left. The trim now removes none where the stream is over budget by
    more than its nodes of alerts could take, and says why, once; alerts of their own size past the budget are still
    trimmed."""
    admin = admin_of(acl_redis)
    subscriber = user_of(acl_redis, SUBSCRIBER_USER)
    _add_alerts(admin, 0, 4000)
    subscriber.xgroup_create(ALERTS, "team", id="0")
    for n in range(8):
        name = f"c{n}-" + "x" * 1_000_000
        [[_, [(entry_id, _)]]] = subscriber.xreadgroup("team", name, {ALERTS: ">"}, count=1)
        subscriber.xack(ALERTS, "team", entry_id)
    budget = 4 * 1024**2
    assert int(admin.memory_usage(ALERTS, samples=0)) > 2 * budget
    job = Upkeep(FingerprintIndex(user_of(acl_redis, WORKER_USER)), Settings(alerts_max_memory=str(budget)), _Log())
    for _ in range(5):
        job.trim_memory()
    assert admin.xlen(ALERTS) == 4000, "alerts were trimmed for the consumers' names"
    [warned] = [fields for level, event, fields in job.log.lines if "outside its entries" in event]
    assert warned["outside_bytes"] > budget and "XGROUP DELCONSUMER" in warned["hint"]
    # the names gone, alerts of their own size past the budget go down to it
    for n in range(8):
        admin.xgroup_delconsumer(ALERTS, "team", f"c{n}-" + "x" * 1_000_000)
    _add_alerts(admin, 4000, 36_000)
    for _ in range(6):
        job.trim_memory()
    used = int(admin.memory_usage(ALERTS, samples=0))
    assert budget * 0.8 < used <= budget + 2 * 300 * 100, f"the alerts take {used:,} bytes for a budget of {budget:,}"
