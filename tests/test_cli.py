"""The operator subcommands (worker/commands/) through the real `incident-worker` entry point, against a real Redis.

Each test starts from an empty server, prepares what it needs (mostly with `publish` and `run --until-idle`, as an
operator would), and checks what the commands print (the --json forms, parsed) and what they change in Redis.
The commands run by `worker.cli.main` in this process, as a child would see it (its own environment, stdin, stdout
and stderr; tests/streams.py's `run_in_process`): a child costs about half a CPU-second to start. The console script
itself runs as a child where that is the point: publishing a file, the liveness probe's exit codes and speed, a
command failing with exit 1, `alerts --follow` stopped by SIGINT, and the workers that `check` looks for.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.redis_server import RedisServer, free_port
from tests.streams import (
    ALERTS,
    DEAD,
    EVENTS,
    FAST,
    FP,
    GROUP,
    clean_env,
    dead_letters,
    publish,
    run_in_process,
    start_worker,
    stop,
    worker_command,
)
from worker.cli import main
from worker.fingerprint import fingerprint, format_fingerprint
from worker.formats import Alert, Heartbeat, Match
from worker.index import FingerprintIndex

DOCK = {"dock": 3, "scanner": 2, "timeout": 1}
ROAD = {"weather": 4, "road": 2}
SPEC_EVENTS = [
    {"incident_id": "47", "features": DOCK},
    {"incident_id": "83", "features": ROAD},
    {"incident_id": "90", "features": DOCK},
]


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    with server.client() as connection:
        yield connection


def cli(
    server: RedisServer | str,
    *args: str,
    stdin: str | bytes | None = None,
    process: bool = False,
    timeout: float = 30,
    **settings: Any,
) -> subprocess.CompletedProcess[str]:
    """`incident-worker ARGS` with only the given settings in its environment; text output. Run by the entry point
    in this process (tests/streams.py's `run_in_process`), or with `process` as a child of the console script: a few
    tests here keep that, for the exit codes and output a real process gives."""
    url = server if isinstance(server, str) else server.url
    data = stdin.encode() if isinstance(stdin, str) else stdin
    env = clean_env(redis_url=url, **settings)
    if process:
        done = subprocess.run([*worker_command(), *args], input=data, capture_output=True, timeout=timeout, env=env)
    else:
        done = run_in_process(args, env, data)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def run_worker(server: RedisServer, **settings: Any) -> None:
    done = cli(server, "run", "--until-idle", timeout=60, log_format="json", **{**FAST, **settings})
    assert done.returncode == 0, done.stderr


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def add_alert(client: redis.Redis, incident_id: str, matches: list[tuple[str, int]]) -> str:
    alert = Alert(
        incident_id=incident_id,
        fingerprint=format_fingerprint(fingerprint({incident_id: 1})),
        matches=[Match(incident_id=i, distance=d) for i, d in matches],
        match_count=len(matches),
        max_distance=7,
        source_entry="1-1",
        op="add",
    )
    return client.xadd(ALERTS, alert.to_fields()).decode()  # type: ignore[arg-type,union-attr]


def index_spec_example(server: RedisServer, tmp_path: Path) -> None:
    """The contract's example (docs/contract.md#alerts-out), published from JSON Lines and processed by a worker."""
    done = cli(server, "publish", str(write_jsonl(tmp_path / "spec.jsonl", SPEC_EVENTS)))
    assert done.returncode == 0, done.stderr
    run_worker(server, consumer="w1")


class LineReader:
    """Lines of a child's stdout, read by a thread, so a test can wait for one with a timeout."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.stream = process.stdout
        self.lines: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.stream:
            self.lines.put(line.decode())

    def next(self, timeout: float = 10) -> str:
        return self.lines.get(timeout=timeout)

    def close(self) -> None:
        """After the child has exited: the thread has read to the end."""
        self.thread.join(timeout=10)


# -- publish ----------------------------------------------------------------------------------------------------


def test_publish_validates_each_line_and_the_worker_alerts_as_in_the_spec(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    source = write_jsonl(
        tmp_path / "events.jsonl",
        [
            SPEC_EVENTS[0],
            SPEC_EVENTS[1],
            {"incident_id": "bad", "features": {"a": 1.5}},
            "",
            "{not json",
            SPEC_EVENTS[2],
        ],
    )
    done = cli(server, "publish", str(source), "--json", process=True)  # the console script, reading a file
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["published"], summary["skipped"], summary["lines"]) == (3, 2, 5)
    assert [(e["line"], e["reason"]) for e in summary["errors"]] == [(3, "bad_weight"), (5, "bad_json")]
    assert "line 3: bad_weight" in done.stderr and "line 5: bad_json" in done.stderr
    assert client.xlen(EVENTS) == 3
    assert [f[b"incident_id"] for _, f in client.xrange(EVENTS)] == [b"47", b"83", b"90"]

    run_worker(server)
    [alert] = json_lines(cli(server, "alerts", "--json").stdout)
    assert alert["incident_id"] == "90" and alert["matches"] == [{"incident_id": "47", "distance": 0}]
    assert alert["fingerprint"] == "0b61171015620fa1"


def test_publish_strict_sends_nothing_when_any_line_is_invalid(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "events.jsonl", [SPEC_EVENTS[0], {"incident_id": 47, "features": DOCK}])
    done = cli(server, "publish", "--strict", str(source))
    assert done.returncode == 1
    assert "line 2: bad_type" in done.stderr and "quote it" in done.stderr
    assert "nothing was published" in done.stderr
    assert client.xlen(EVENTS) == 0


def test_publish_text_lines_and_query_text_find_the_same_log_line(server: RedisServer, client: redis.Redis) -> None:
    lines = [
        "ERROR disk full on /var/log at web-03 (used 98%)",
        "   ",
        "Connection refused to db-7.prod:5432 after 3 retries",
        '{"incident_id": "json-text", "text": "Kernel panic on host db-9: not syncing"}',
        "!!!",
    ]
    done = cli(server, "publish", "--text", "--id-prefix", "app:", "--json", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["published"], summary["skipped"]) == (3, 1)
    assert summary["errors"][0]["line"] == 5
    ids = [f[b"incident_id"].decode() for _, f in client.xrange(EVENTS)]
    assert ids == ["app:1", "app:3", "json-text"]
    sent = [f for _, f in client.xrange(EVENTS)]
    assert all(b"text" in f and b"features" not in f for f in sent)  # text events: the worker tokenizes them
    assert sent[0][b"text"] == lines[0].encode()
    run_worker(server)

    # The same kind of line from another host, at another usage: the masked words are the same.
    done = cli(server, "query", "--text", "ERROR disk full on /var/log at web-11 (used 91%)", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(m["incident_id"], m["distance"]) for m in result["matches"]] == [("app:1", 0)]
    assert result["matches"][0]["fingerprint"] == client.hget(FP, "app:1").decode()  # type: ignore[union-attr]


def test_publish_says_how_far_it_got_when_redis_refuses(server: RedisServer, client: redis.Redis) -> None:
    client.config_set("maxmemory", "1")  # every write refused: OOM (noeviction, the default policy)
    try:
        done = cli(server, "publish", stdin=json.dumps(SPEC_EVENTS[0]) + "\n")
    finally:
        client.config_set("maxmemory", "0")
    assert done.returncode == 1
    assert "maxmemory" in done.stderr and "before any event was confirmed published" in done.stderr
    assert "Sending the whole input again is safe" in done.stderr
    assert "lines 1 to 0" not in done.stderr and ".;" not in done.stderr
    assert "Traceback" not in done.stderr


def test_publish_names_an_events_stream_of_another_type_and_says_nothing_was_sent(
    server: RedisServer, client: redis.Redis
) -> None:
    client.set(EVENTS, "not a stream")
    done = cli(server, "publish", stdin=json.dumps(SPEC_EVENTS[0]) + "\n")
    assert done.returncode == 2, done.stderr
    assert f"{EVENTS} holds a string, not the stream the index keeps there" in done.stderr
    assert "Nothing was published; send the whole input again once it is fixed" in done.stderr
    assert "WRONGTYPE" not in done.stderr and "Traceback" not in done.stderr


def test_an_interrupted_publish_names_the_lines_sent_and_where_to_resume() -> None:
    from worker.commands.publish import PublishReport, stopped_message

    report = PublishReport("{incidents}:events", lines=1200, published=1000, last_line=1004)
    message = stopped_message(report, "interrupted")
    assert "after publishing 1,000 events (input lines 1 to 1004)" in message
    assert "again from line 1005 is safe" in message


# -- query and inspect ------------------------------------------------------------------------------------------


def test_query_lists_matches_and_says_plainly_when_there_is_none(server: RedisServer, tmp_path: Path) -> None:
    index_spec_example(server, tmp_path)
    done = cli(server, "query", "--features", json.dumps(DOCK), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["fingerprint"] == "0b61171015620fa1" and result["max_distance"] == 7
    assert result["matches"] == [
        {"incident_id": "47", "distance": 0, "fingerprint": "0b61171015620fa1", "group": "47"},
        {"incident_id": "90", "distance": 0, "fingerprint": "0b61171015620fa1", "group": "47"},
    ]
    assert result["group"] == "47", "the group an incident with this bag would join"
    piped = cli(server, "query", stdin=json.dumps(ROAD))
    assert piped.returncode == 0 and "83" in piped.stdout and "1 match within 7" in piped.stdout

    nothing = cli(server, "query", "--features", '{"completely": 5, "unrelated": 3, "words": 1}')
    assert nothing.returncode == 0, nothing.stderr
    assert "no match within 7" in nothing.stdout
    near = {"dock": 3, "scanner": 2, "timeout": 1, "extra": 1}
    apart = (fingerprint(near) ^ fingerprint(DOCK)).bit_count()
    assert 0 < apart <= 7
    strict = json.loads(
        cli(server, "query", "--features", json.dumps(near), "--max-distance", str(apart - 1), "--json").stdout
    )
    assert strict["match_count"] == 0


def test_query_and_stats_on_a_fresh_namespace_do_not_write_its_layout(server: RedisServer, client: redis.Redis) -> None:
    done = cli(server, "query", "--features", json.dumps(DOCK))
    assert done.returncode == 0, done.stderr
    assert "no match within 7" in done.stdout
    stats = cli(server, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["index"]["incidents"] == 0
    assert not client.exists("{incidents}:meta"), "a read-only command fixed the namespace's layout"


def test_read_commands_use_the_layout_the_index_was_built_with(server: RedisServer, client: redis.Redis) -> None:
    index = FingerprintIndex(client, bands=8, max_distance=7)
    index.add("47", DOCK)
    done = cli(server, "query", "--features", json.dumps(DOCK), "--json")  # default settings say 4 bands
    assert done.returncode == 0, done.stderr
    assert [m["incident_id"] for m in json.loads(done.stdout)["matches"]] == ["47"]
    stats = json.loads(cli(server, "stats", "--json").stdout)
    assert stats["index"]["bands"] == 8 and stats["layout_mismatch"] is True
    assert "refuses to start" in cli(server, "stats").stdout


def test_groups_lists_shows_and_merges(server: RedisServer, client: redis.Redis) -> None:
    index = FingerprintIndex(client)
    for incident_id, bag in (("47", DOCK), ("90", DOCK), ("91", DOCK), ("83", ROAD), ("84", ROAD)):
        index.add(incident_id, bag)
    listed = cli(server, "groups", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["largest"] == [{"group": "47", "size": 3}, {"group": "83", "size": 2}]
    assert {g["group"] for g in json.loads(listed.stdout)["recent"]} == {"47", "83"}
    assert "largest groups" in cli(server, "groups").stdout
    assert json.loads(cli(server, "groups", "show", "83", "--json").stdout)["members"] == ["83", "84"]
    merged = cli(server, "groups", "merge", "47", "83")
    assert merged.returncode == 0 and "into 47: 5 incidents" in merged.stdout, merged
    assert json.loads(cli(server, "groups", "show", "83", "--json").stdout) == {
        "group": "47",
        "size": 5,
        "members": ["47", "83", "84", "90", "91"],
    }
    assert "would join group 47" in cli(server, "query", "--features", json.dumps(ROAD)).stdout
    missing = cli(server, "groups", "merge", "47", "nobody")
    assert missing.returncode == 1 and "names no group" in missing.stderr
    assert cli(server, "groups", "show", "nobody").returncode == 1
    assert "group        47 (5 incidents)" in cli(server, "inspect", "84").stdout


def test_inspect_shows_fingerprint_bands_posting_sets_and_matches(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    index_spec_example(server, tmp_path)
    done = cli(server, "inspect", "47", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    fp = fingerprint(DOCK)
    assert shown["fingerprint"] == format_fingerprint(fp)
    assert shown["bits"].replace(" ", "") == format(fp, "064b")
    index = FingerprintIndex(client)
    assert [band["key"] for band in shown["bands"]] == index.posting_keys(fp)
    # 47 and 90 are exact twins: the posting sets hold 47, their representative; {incidents}:twins:<fp> holds both
    assert [band["size"] for band in shown["bands"]] == [1, 1, 1, 1]
    assert all(band["member"] for band in shown["bands"])
    twin = json.loads(cli(server, "inspect", "90", "--json").stdout)
    assert all(band["member"] for band in twin["bands"]), "a twin is reachable through its representative"
    assert shown["matches"] == [
        {"incident_id": "90", "distance": 0, "fingerprint": format_fingerprint(fp), "group": "47"}
    ]
    assert (shown["group"], shown["group_size"]) == ("47", 2)
    assert shown["neighbours"] == shown["matches"], "the deprecated key stays for one release"

    twins = cli(server, "inspect", "47")
    assert twins.returncode == 0 and "1 match within 7:" in twins.stdout
    assert "neighbour" not in twins.stdout.lower()
    human = cli(server, "inspect", "83")
    assert human.returncode == 0 and format_fingerprint(fingerprint(ROAD)) in human.stdout
    assert "no other incident within 7" in human.stdout

    missing = cli(server, "inspect", "no-such-incident")
    assert missing.returncode == 1
    assert "'no-such-incident' is not indexed" in missing.stderr


def test_inspect_of_an_incident_whose_stored_value_is_not_a_fingerprint_says_so(
    server: RedisServer, client: redis.Redis
) -> None:
    # before, a traceback (ValueError: a fingerprint is 16 hex digits)
    FingerprintIndex(client).add("47", DOCK)
    client.hset("{incidents}:fp", "mangled", "not-a-fingerprint")
    done = cli(server, "inspect", "mangled")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "'not-a-fingerprint'" in done.stderr and "not a fingerprint" in done.stderr
    assert "incident-worker verify --repair" in done.stderr


# -- stats ------------------------------------------------------------------------------------------------------


def test_stats_reports_index_streams_group_workers_and_dead_letters(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    index_spec_example(server, tmp_path)
    publish(
        client,
        [
            {"incident_id": "x", "features": "{"},
            {"incident_id": "y", "features": "{"},
            {"incident_id": "z", "features": '{"a": true}'},
        ],
    )
    run_worker(server, consumer="w2")
    done = cli(server, "stats", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["index"]["incidents"] == 3
    assert stats["index"]["meta"]["bands"] == "4" and stats["index"]["meta"]["max_distance"] == "7"
    assert stats["index"]["used_memory_per_incident"] > 0
    # the 6 events are all processed: a worker's upkeep may have trimmed them (whole nodes) before it stopped, the
    # first worker's its 3 (the node they filled went, so the next 3 started another), the second's all of them
    trimmed = client.xlen(EVENTS)
    assert trimmed in (0, 3, 6)
    assert {name: s["length"] for name, s in stats["streams"].items()} == {"events": trimmed, "alerts": 1, "dead": 3}
    bounds = {name: (s["maxlen"], s["max_memory"]) for name, s in stats["streams"].items()}
    assert bounds == {"events": (None, None), "alerts": (100_000, 256 * 2**20), "dead": (100_000, 128 * 2**20)}
    assert stats["group"]["name"] == GROUP and stats["group"]["lag"] == 0 and stats["group"]["pending"] == 0
    assert {c["name"] for c in stats["consumers"]} == {"w1", "w2"}
    assert stats["dead_letters"] == {"by_reason": {"bad_json": 2, "bad_weight": 1}, "scanned": 3, "capped": False}
    assert stats["recommended_bands"] == 4, "a tiny index keeps the default layout"
    assert stats["workers"] == [], "workers that stopped cleanly have no heartbeat left"

    capped = json.loads(cli(server, "stats", "--json", "--dead-scan", "2").stdout)["dead_letters"]
    assert capped["scanned"] == 2 and capped["capped"] is True
    human = cli(server, "stats")
    assert "newest 2 of 3" not in human.stdout and "all 3" in human.stdout
    assert "the layout in use" in human.stdout
    assert "about 100,000 entries, 256.0 MB of memory" in human.stdout, human.stdout
    assert "trimmed below what every consumer group still needs" in human.stdout


def test_stats_shows_what_waits_in_the_inbox_and_warns_when_no_worker_moves_it(
    server: RedisServer, client: redis.Redis
) -> None:
    done = cli(server, "publish", "--inbox", "-", stdin="".join(json.dumps(event) + "\n" for event in SPEC_EVENTS))
    assert done.returncode == 0, done.stderr
    stats = json.loads(cli(server, "stats", "--json").stdout)
    assert stats["inbox"] == {"key": "{incidents}:inbox", "length": 3}
    assert stats["streams"]["events"]["length"] == 0, "nothing is in the stream before a worker moves it"
    assert any("3 entries wait in the inbox" in warning for warning in stats["warnings"]), stats["warnings"]
    human = cli(server, "stats").stdout
    assert "inbox {incidents}:inbox: 3 entries waiting" in human, human
    assert "WARNING: 3 entries wait in the inbox" in human and "incident-worker run" in human

    run_worker(server)
    stats = json.loads(cli(server, "stats", "--json").stdout)
    assert stats["inbox"]["length"] == 0 and stats["index"]["incidents"] == 3
    assert not any("inbox" in warning for warning in stats["warnings"]), stats["warnings"]
    assert "inbox {incidents}:inbox: empty" in cli(server, "stats").stdout


def test_stats_advises_the_default_layout_when_the_workers_search_their_own_copies(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    """On the snapshot read path the primary only validates, whatever the layout, and the copies search 16-bit bands
    fastest: `stats` goes by where the live workers say they search, not by the primary path's cost model."""
    index_spec_example(server, tmp_path)
    beat = Heartbeat(consumer="w9", at=time.time(), read_path="snapshot")
    client.set("{incidents}:heartbeat:w9", beat.to_value(), px=60_000)
    client.zadd("{incidents}:workers", {"w9": time.time() * 1000 + 60_000})  # as each beat enters it
    stats = json.loads(cli(server, "stats", "--json").stdout)
    assert stats["recommended_bands"] == 4
    assert "snapshot read path" in stats["recommendation"] and "the layout in use" in stats["recommendation"]
    client.set("{incidents}:heartbeat:w9", beat.model_copy(update={"read_path": "primary"}).to_value(), px=60_000)
    stats = json.loads(cli(server, "stats", "--json").stdout)
    assert "snapshot read path" not in stats["recommendation"]


# -- alerts -----------------------------------------------------------------------------------------------------


def test_alerts_prints_the_newest_or_those_after_an_id(server: RedisServer, client: redis.Redis) -> None:
    ids = [add_alert(client, f"i{n}", [(f"m{n}", n)]) for n in range(5)]
    newest = json_lines(cli(server, "alerts", "--count", "2", "--json").stdout)
    assert [a["incident_id"] for a in newest] == ["i3", "i4"]
    assert newest[1]["entry_id"] == ids[4] and newest[1]["matches"] == [{"incident_id": "m4", "distance": 4}]
    after = json_lines(cli(server, "alerts", "--since", ids[1], "--json").stdout)
    assert [a["entry_id"] for a in after] == ids[2:]
    human = cli(server, "alerts", "--count", "1")
    assert human.returncode == 0 and "incident i4" in human.stdout and "m4 (distance 4)" in human.stdout
    client.delete(ALERTS)
    empty = cli(server, "alerts")
    assert empty.returncode == 0 and empty.stdout == "" and "no alerts" in empty.stderr


def _interruptible() -> None:
    """In the follower, before it starts: SIGINT as a terminal delivers it. A suite started in the background (`make
    test &`, `setsid ... &`) has SIGINT ignored, which its children inherit, and the follower then never stopped."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_alerts_follow_prints_a_new_alert_and_exits_0_on_sigint(server: RedisServer, client: redis.Redis) -> None:
    add_alert(client, "old", [("a", 1)])
    command = [*worker_command(), "alerts", "--follow", "--json", "--count", "1"]
    with subprocess.Popen(
        command,
        env=clean_env(redis_url=server.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_interruptible,
    ) as follower:
        reader = LineReader(follower)
        try:
            assert json.loads(reader.next())["incident_id"] == "old"
            added = add_alert(client, "new", [("b", 2)])
            line = json.loads(reader.next())
            assert (line["incident_id"], line["entry_id"]) == ("new", added)
            follower.send_signal(signal.SIGINT)
            assert follower.wait(timeout=10) == 0
            assert follower.stderr is not None and b"Traceback" not in follower.stderr.read()
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
            reader.close()


@pytest.mark.parametrize("persistent", [True, False], ids=["aof", "no-persistence"])
@pytest.mark.parametrize("grouped", [False, True], ids=["since", "group"])
def test_alerts_follow_resumes_after_a_redis_restart(tmp_path: Path, grouped: bool, persistent: bool) -> None:
    """`--follow` keeps waiting until Ctrl-C: a Redis restart (with its AOF, or without any data, the group gone
    with it) is waited out, and the follower prints the next alert once, without the one it printed before."""
    from tests.conftest import require_redis_server

    require_redis_server()
    server = RedisServer(tmp_path, appendonly=persistent)
    server.start()
    follower: subprocess.Popen[bytes] | None = None
    try:
        with server.client() as connection:
            add_alert(connection, "before", [("a", 1)])
        group = ["--group", "pager", "--from-start"] if grouped else ["--since", "0"]
        follower = subprocess.Popen(
            [*worker_command(), "alerts", "--follow", "--json", *group],
            env=clean_env(redis_url=server.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_interruptible,
        )
        reader = LineReader(follower)
        assert json.loads(reader.next())["incident_id"] == "before"
        if grouped:  # printed, then acknowledged: wait for the acknowledgement before the crash
            with server.client() as connection:
                deadline = time.monotonic() + 10
                while connection.xpending(ALERTS, "pager")["pending"] and time.monotonic() < deadline:
                    time.sleep(0.05)
        server.kill()
        server.start()
        with server.client() as connection:
            added = add_alert(connection, "after", [("b", 2)])
        line = json.loads(reader.next(timeout=30))
        assert (line["incident_id"], line["entry_id"]) == ("after", added)
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0
        reader.close()
        assert reader.lines.empty()  # nothing printed twice
        assert follower.stderr is not None and b"Traceback" not in follower.stderr.read()
    finally:
        if follower is not None:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
            for pipe in (follower.stdout, follower.stderr):
                if pipe is not None:
                    pipe.close()
        server.stop()


def test_alerts_group_gives_each_alert_once_across_invocations(server: RedisServer, client: redis.Redis) -> None:
    for n in range(3):
        add_alert(client, f"a{n}", [("x", 1)])
    first = json_lines(cli(server, "alerts", "--group", "pager", "--from-start", "--json").stdout)
    assert [a["incident_id"] for a in first] == ["a0", "a1", "a2"]
    late = json_lines(cli(server, "alerts", "--group", "late", "--json").stdout)
    assert late == [], "a group created without --from-start begins at the end of the stream"
    for n in range(3, 5):
        add_alert(client, f"a{n}", [("x", 1)])
    one = json_lines(cli(server, "alerts", "--group", "pager", "--count", "1", "--json").stdout)
    rest = json_lines(cli(server, "alerts", "--group", "pager", "--json").stdout)
    again = json_lines(cli(server, "alerts", "--group", "pager", "--json").stdout)
    assert [a["incident_id"] for a in one + rest] == ["a3", "a4"] and again == []
    assert [a["incident_id"] for a in json_lines(cli(server, "alerts", "--group", "late", "--json").stdout)] == [
        "a3",
        "a4",
    ]
    assert client.xpending(ALERTS, "pager")["pending"] == 0, "printed alerts are acknowledged"


def test_alerts_group_prints_again_what_a_crashed_reader_never_acknowledged(
    server: RedisServer, client: redis.Redis
) -> None:
    client.xgroup_create(ALERTS, "pager", id="0", mkstream=True)
    add_alert(client, "a0", [("x", 1)])
    client.xreadgroup("pager", "reader-1", {ALERTS: ">"})  # delivered, then the reader died before its XACK
    add_alert(client, "a1", [("x", 1)])
    replay = json_lines(cli(server, "alerts", "--group", "pager", "--consumer", "reader-1", "--json").stdout)
    assert [a["incident_id"] for a in replay] == ["a0", "a1"]
    assert client.xpending(ALERTS, "pager")["pending"] == 0


# -- dead letters -----------------------------------------------------------------------------------------------


def test_dead_lists_letters_and_replay_requeues_them_after_a_fix(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    big = {"a": 1, "b": 2, "c": 3}
    publish(
        client,
        [
            {"incident_id": "7", "features": {"dock": 3, "scanner": 2}},
            {"incident_id": "7", "features": ROAD},  # another bag under the same ID: duplicate_id
            {"incident_id": "big", "features": big, "reason": "customer"},  # a field named like a dead letter's own
        ],
    )
    run_worker(server, max_tokens=2)  # too small for "big": the operator's mistake, fixed below
    listed = json_lines(cli(server, "dead", "--json").stdout)
    letters = {d["reason"]: d for d in listed}
    assert sorted(letters) == ["duplicate_id", "too_many_tokens"]
    assert letters["too_many_tokens"]["original"] == {
        "incident_id": "big",
        "features": json.dumps(big),
        "reason": "customer",
    }
    only = json_lines(cli(server, "dead", "--reason", "duplicate_id", "--json").stdout)
    assert [d["entry_id"] for d in only] == [letters["duplicate_id"]["entry_id"]]
    human = cli(server, "dead")
    assert "too_many_tokens" in human.stdout and "reason = customer" in human.stdout

    events = client.xlen(EVENTS)  # the workers may have trimmed what they processed
    dry = cli(server, "dead", "replay", "--all", "--dry-run", "--json")
    assert dry.returncode == 0 and len(json.loads(dry.stdout)["replayed"]) == 2
    assert client.xlen(DEAD) == 2 and client.xlen(EVENTS) == events, "a dry run changed something"

    # The fix: incident 7 is deleted so that the second bag may take its ID; the worker allows bigger bags.
    assert cli(server, "publish", stdin='{"incident_id": "7", "op": "delete"}\n').returncode == 0
    run_worker(server)
    done = cli(server, "dead", "replay", "--all", "--json")
    assert done.returncode == 0, done.stderr
    replayed = {r["reason"]: r for r in json.loads(done.stdout)["replayed"]}
    assert {reason: r["dead_entry"] for reason, r in replayed.items()} == {
        reason: d["entry_id"] for reason, d in letters.items()
    }
    assert client.xlen(DEAD) == 0
    new_entry = replayed["too_many_tokens"]["event_entry"]
    [(_, requeued)] = client.xrange(EVENTS, new_entry, new_entry)
    assert requeued == {b"incident_id": b"big", b"features": json.dumps(big).encode(), b"reason": b"customer"}

    run_worker(server)
    assert client.hget(FP, "7") == format_fingerprint(fingerprint(ROAD)).encode()
    assert client.hget(FP, "big") == format_fingerprint(fingerprint(big)).encode()
    assert client.xlen(DEAD) == 0


def test_dead_replay_by_id_keeps_raw_bytes_and_reports_unknown_ids(server: RedisServer, client: redis.Redis) -> None:
    client.xadd(EVENTS, {b"incident_id": b"raw", b"features": b'{"a": 1}', b"note": b"\xff\xfe"})
    run_worker(server)
    [letter] = dead_letters(client)
    assert letter.reason == "not_utf8"
    [(dead_id, _)] = client.xrange(DEAD)
    done = cli(server, "dead", "replay", dead_id.decode(), "1-1")
    assert done.returncode == 1, "an ID that is not in the dead stream makes the command fail"
    assert f"replayed {dead_id.decode()}" in done.stdout and "1-1: not found" in done.stderr
    [(_, fields)] = client.xrevrange(EVENTS, count=1)
    assert fields == {b"incident_id": b"raw", b"features": b'{"a": 1}', b"note": b"\xff\xfe"}
    assert client.xlen(DEAD) == 0


# -- check ------------------------------------------------------------------------------------------------------


def _wait_for_heartbeat(client: redis.Redis, pattern: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = list(client.scan_iter(match=pattern))
        if keys:
            return keys[0].decode()
        time.sleep(0.05)
    raise AssertionError(f"no heartbeat key {pattern} within {timeout}s")


def test_check_is_healthy_while_a_worker_runs_and_unhealthy_after(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    assert cli(server, "check").returncode == 1
    assert cli(server, "check", "--redis-only").returncode == 0
    worker = start_worker(server.url, log=tmp_path / "w.log", **FAST)  # default consumer: <hostname>-<pid>
    try:
        key = _wait_for_heartbeat(client, "{incidents}:heartbeat:*")
        consumer = key.removeprefix("{incidents}:heartbeat:")
        healthy = cli(server, "check")
        assert healthy.returncode == 0, healthy.stderr
        assert consumer in healthy.stdout
        assert cli(server, "check", "--consumer", consumer).returncode == 0
        assert cli(server, "check", consumer="someone-else").returncode == 1, "the env names another consumer"
        verdict = json.loads(cli(server, "check", "--json").stdout)
        assert verdict["healthy"] is True and verdict["workers"][0]["consumer"] == consumer
    finally:
        assert stop(worker) == 0
    gone = cli(server, "check")
    assert gone.returncode == 1
    assert len(gone.stderr.strip().splitlines()) == 1 and "no live heartbeat" in gone.stderr


def test_plain_check_finds_a_named_worker_of_this_host_and_names_those_elsewhere(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    elsewhere = json.dumps({"consumer": "far-away", "at": time.time(), "host": "another-host", "processed": 3})
    client.set("{incidents}:heartbeat:far-away", elsewhere, px=60_000)
    client.zadd("{incidents}:workers", {"far-away": time.time() * 1000 + 60_000})  # as each beat enters it
    lonely = cli(server, "check")
    assert lonely.returncode == 1, "a worker on another host does not make this one healthy"
    assert "no live heartbeat of a worker on host" in lonely.stderr and "far-away on another-host" in lonely.stderr
    assert len(lonely.stderr.strip().splitlines()) == 1
    worker = start_worker(server.url, log=tmp_path / "w.log", consumer="named-worker", **FAST)
    try:
        _wait_for_heartbeat(client, "{incidents}:heartbeat:named-worker")
        healthy = cli(server, "check")  # no consumer given: any worker of this host counts, whatever its name
        assert healthy.returncode == 0, healthy.stderr
        assert "named-worker" in healthy.stdout and "far-away" not in healthy.stdout
        verdict = json.loads(cli(server, "check", "--json").stdout)
        assert [beat["consumer"] for beat in verdict["workers"]] == ["named-worker"]
    finally:
        assert stop(worker) == 0


@pytest.mark.parametrize("args", [["migrate", "--bands", "3"], ["migrate", "--abort"]])
def test_commands_that_call_the_functions_say_what_to_run_when_they_are_missing(
    server: RedisServer, client: redis.Redis, args: list[str]
) -> None:
    """After an upgrade, before `load-functions` ran: the message names the library and what to run, as the
    worker's does, rather than Redis's bare 'Function not found'."""
    FingerprintIndex(client).add("47", DOCK)  # an index to move
    client.function_flush()
    done = cli(server, *args)
    assert done.returncode == 1, done.stderr
    assert "load-functions" in done.stderr and "Function not found" not in done.stderr, done.stderr


def test_run_says_so_when_the_metrics_port_is_taken(server: RedisServer) -> None:
    """A port already in use (another worker on the host, a leftover) is a configuration error for people: one line
    naming the address and the setting, exit 2, not a traceback."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = cli(server, "run", "--until-idle", metrics_port=port, log_format="json", **FAST)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "METRICS_PORT" in done.stderr


def test_check_fails_fast_with_one_line_when_redis_is_down() -> None:
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    for args in (["check"], ["check", "--redis-only"]):
        done = cli(url, *args, process=True)  # the liveness probe as Kubernetes runs it: a process, timed
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1 and "does not answer" in done.stderr
        assert "hunter2-secret" not in done.stderr + done.stdout and ":***@" in done.stderr
    # no retrying with backoff (that would take minutes); two CLI starts take seconds, more on a loaded machine
    assert time.monotonic() - started < 30


def test_commands_fail_with_exit_1_and_a_redacted_url_when_redis_is_down() -> None:
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    done = cli(url, "stats", process=True)
    assert done.returncode == 1 and "cannot reach Redis" in done.stderr and "Traceback" not in done.stderr
    assert "hunter2-secret" not in done.stderr
    assert ".;" not in done.stderr, "the error's own full stop does not run into our sentence"


# -- usage ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["query", "--features", '{"a": 1.5}'], "weight 1.5 of token 'a'"),
        (["query", "--features", "disk full"], "not valid JSON"),
        (["query", "--text", "!!!"], "--text"),
        (["query", "--max-distance", "70", "--features", '{"a": 1}'], "Hamming distance"),
        (["publish", "/no/such/file.jsonl"], "cannot read /no/such/file.jsonl"),
        (["alerts", "--since", "yesterday"], "not a stream entry ID"),
        (["alerts", "--since", "18446744073709551616"], "not a stream entry ID"),  # past Redis's 64-bit IDs
        (["alerts", "--since", "1-18446744073709551616"], "not a stream entry ID"),
        (["dead", "replay", "18446744073709551616-0"], "not a stream entry ID"),
        (["alerts", "--from-start"], "--from-start needs --group"),
        (["alerts", "--group", "g", "--since", "0"], "--since does not apply with --group"),
        (["dead", "replay"], "choose what to replay"),
        (["dead", "replay", "--all", "--reason", "poison"], "choose what to replay"),
        (["dead", "replay", "not-an-id"], "not a stream entry ID"),
        (["dead", "--reason", "nope"], "'nope': no dead letter has that reason; the reasons are bad_features, "),
        (["dead", "replay", "--reason", "nope"], "no dead letter has that reason; the reasons are "),
        (["stats", "--redis-url", "http://localhost:6379"], "must start with redis://"),
        (["check", "--namespace", "{bad}"], "namespace"),
    ],
)
def test_bad_usage_exits_2_with_a_message_saying_what_to_do(server: RedisServer, args: list[str], message: str) -> None:
    done = cli(server, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_query_beyond_the_index_max_distance_is_bad_usage(server: RedisServer, client: redis.Redis) -> None:
    FingerprintIndex(client).add("47", DOCK)
    done = cli(server, "query", "--features", json.dumps(DOCK), "--max-distance", "9")
    assert done.returncode == 2 and "beyond this index's max distance 7" in done.stderr


def test_every_subcommand_has_help_with_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (
        ["publish"],
        ["query"],
        ["inspect"],
        ["stats"],
        ["alerts"],
        ["dead"],
        ["dead", "replay"],
        ["check"],
        ["migrate"],
    ):
        with pytest.raises(SystemExit) as exited:
            main([*command, "--help"])
        assert exited.value.code == 0
        shown = capsys.readouterr().out
        assert "examples:" in shown and "exit codes:" in shown and "--redis-url" in shown, command


def test_cluster_mode_against_a_server_without_cluster_support_says_so_without_a_traceback(server: RedisServer) -> None:
    for command in (["stats"], ["check", "--redis-only"], ["run", "--until-idle"]):
        done = cli(server, *command, cluster="true")
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "is not a Redis Cluster" in done.stderr and "drop --cluster" in done.stderr, done.stderr
    port = free_port()
    unreachable = cli(f"redis://:s3cret@127.0.0.1:{port}/0", "stats", cluster="true")
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr, unreachable.stderr
    assert "cannot reach Redis" in unreachable.stderr and "s3cret" not in unreachable.stderr


def test_every_command_says_match_and_only_inspect_names_its_deprecated_key() -> None:
    from worker.cli import build_parser
    from worker.commands.inspect import DEPRECATED_KEY

    parser = build_parser()
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        text = " ".join(sub.format_help().split()).lower()
        if name == "inspect":
            assert f"the key `{DEPRECATED_KEY}` repeats `matches`" in text and "deprecated" in text
            text = text.replace(f"`{DEPRECATED_KEY}`", "")
        assert "neighbour" not in text, f"`incident-worker {name} --help` says neighbour"
    assert "neighbour" not in " ".join(parser.format_help().split()).lower()
