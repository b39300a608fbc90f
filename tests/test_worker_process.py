"""`incident-worker run` as a real process against a real redis-server: crashes, signals, restarts, scale-out."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.oracle import assert_postings_match
from tests.redis_server import RedisServer
from tests.streams import (
    EVENTS,
    FAST,
    FP,
    GROUP,
    alerts,
    assert_pairs_reported_once,
    dead_letters,
    fingerprints,
    kill_once_indexed,
    pending_count,
    publish,
    start_worker,
    stop,
    worker_command,
)
from worker import library
from worker.devtools.workload import Workload
from worker.fingerprint import fingerprint, format_fingerprint


def _workload(count: int, seed: int, bad_every: int = 0) -> tuple[list[dict[str, object]], int]:
    events: list[dict[str, object]] = []
    bad = 0
    for n, (incident_id, bag) in enumerate(Workload(seed=seed).take(count)):
        events.append({"incident_id": incident_id, "features": bag})
        if bad_every and n % bad_every == 0:
            events.append({"incident_id": f"bad-{n}", "features": "{not json"})
            bad += 1
    return events, bad


def _check_run(client: redis.Redis, events: list[dict[str, object]], bad: int) -> None:
    good = [e for e in events if isinstance(e["features"], dict)]
    fps = fingerprints(good)
    stored = {k.decode(): int(v, 16) for k, v in client.hgetall(FP).items()}
    assert stored == fps, "every valid incident is indexed once, with its own fingerprint"
    assert_pairs_reported_once(fps, alerts(client))
    letters = dead_letters(client)
    assert len(letters) == bad and {d.reason for d in letters} <= {"bad_json"}
    assert len({d.source_entry for d in letters}) == bad, "a bad entry was dead-lettered twice"
    assert pending_count(client) == 0


def _wait(process: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def test_spec_example_through_the_real_process(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    publish(
        client,
        [
            {"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
            {"incident_id": "83", "features": {"weather": 4, "road": 2}},
            {"incident_id": "90", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
        ],
    )
    log = tmp_path / "worker.log"
    assert _wait(start_worker(server.url, "--until-idle", log=log, **FAST), 30) == 0
    [alert] = alerts(client)
    assert alert.incident_id == "90" and [(m.incident_id, m.distance) for m in alert.matches] == [("47", 0)]
    assert client.hget(FP, "90") == format_fingerprint(fingerprint({"dock": 3, "scanner": 2, "timeout": 1})).encode()
    lines = log.read_text().splitlines()
    assert sum('"event": "alert"' in line for line in lines) == 1


def test_sigterm_finishes_the_batch_and_exits_0(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    events, _ = _workload(3000, seed=2)
    publish(client, events)
    worker = start_worker(server.url, log=tmp_path / "w.log", consumer="term", batch_size=50, **FAST)
    deadline = time.monotonic() + 30
    while client.hlen(FP) < 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    assert stop(worker, signal.SIGTERM) == 0
    assert time.monotonic() - started < 5
    consumers = {c["name"].decode(): c for c in client.xinfo_consumers(EVENTS, GROUP)}
    assert consumers["term"]["pending"] == 0, "the stopped consumer left entries pending"
    assert client.get("{incidents}:heartbeat:term") is None


def test_second_signal_exits_at_once(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        worker = start_worker(server.url, log=tmp_path / "w.log", consumer="twice")
        client = server.client()
        deadline = time.monotonic() + 20
        while not client.exists("{incidents}:heartbeat:twice") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)  # the worker's next call waits for an answer that does not come
        time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)  # the first signal waits for the call, a while
        time.sleep(0.3)
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        assert _wait(worker, 5) == 128 + signal.SIGTERM
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        server.stop()


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    events, bad = _workload(10_000, seed=3, bad_every=97)
    publish(client, events)
    rng = random.Random(3)
    kills = 0
    # Kill each worker at a random moment once the index has grown past a random mark, so every kill lands mid-run.
    for round_, mark in enumerate(sorted(rng.sample(range(500, 9000), 5))):
        worker = start_worker(server.url, log=tmp_path / f"w{round_}.log", batch_size=rng.choice([20, 50, 100]), **FAST)
        kills += kill_once_indexed(client, worker, mark, rng)
    assert kills == 5
    assert client.hlen(FP) < len(events) - bad, "the run finished before the last kill"
    final = start_worker(server.url, "--until-idle", log=tmp_path / "final.log", **FAST)
    assert _wait(final, 240) == 0
    _check_run(client, events, bad)


@pytest.mark.slow
def test_three_workers_at_once(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    events, bad = _workload(6000, seed=4, bad_every=211)
    publish(client, events)
    workers = [
        start_worker(server.url, "--until-idle", log=tmp_path / f"w{k}.log", consumer=f"w{k}", batch_size=25, **FAST)
        for k in range(3)
    ]
    assert [_wait(w, 240) for w in workers] == [0, 0, 0]
    consumers = {c["name"].decode(): c for c in client.xinfo_consumers(EVENTS, GROUP)}
    assert set(consumers) == {"w0", "w1", "w2"}
    _check_run(client, events, bad)
    assert sum(1 for k in range(3) if '"event": "alert"' in (tmp_path / f"w{k}.log").read_text()) >= 2


@pytest.mark.slow
def test_redis_restart_mid_run(aof_server: RedisServer, tmp_path: Path) -> None:
    client = aof_server.client()
    events, bad = _workload(5000, seed=6, bad_every=101)
    publish(client, events)
    worker = start_worker(
        aof_server.url, "--until-idle", log=tmp_path / "w.log", batch_size=50, reconnect_max_backoff_s=1, **FAST
    )
    deadline = time.monotonic() + 30
    while client.hlen(FP) < 1000 and time.monotonic() < deadline:
        time.sleep(0.02)
    aof_server.kill()  # a crash: only the AOF (fsync always) survives
    time.sleep(1.5)
    aof_server.start()
    client = aof_server.client()
    assert _wait(worker, 240) == 0
    _check_run(client, events, bad)
    log = (tmp_path / "w.log").read_text()
    assert "redis unavailable; retrying" in log


def test_password_never_reaches_the_logs(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, extra=["--requirepass", "s3cret-pa55"])
    server.start()
    try:
        url = f"redis://:s3cret-pa55@127.0.0.1:{server.port}/0"
        log = tmp_path / "w.log"
        client = redis.Redis(port=server.port, password="s3cret-pa55")
        library.load(client)
        publish(client, [{"incident_id": "1", "features": {"a": 1}}, {"incident_id": "2", "features": "{"}])
        assert _wait(start_worker(url, "--until-idle", log=log, log_level="debug", **FAST), 30) == 0
        wrong = f"redis://:wrong-pa55@127.0.0.1:{server.port}/0"
        # credentials refused at start are a configuration mistake: exit 2 at once, not retries forever
        assert _wait(start_worker(wrong, log=log, reconnect_max_backoff_s=0.2), 30) == 2
        text = log.read_text()
        assert "s3cret-pa55" not in text and "wrong-pa55" not in text
        assert "redis://:***@127.0.0.1" in text
        [refusal] = [json.loads(line) for line in text.splitlines() if '"level": "error"' in line]
        assert refusal["event"] == "redis refused the worker's credentials; not starting"
        assert "check the user name and password of REDIS_URL" in refusal["error"]
    finally:
        server.stop()


def test_out_of_memory_holds_the_batch_instead_of_poisoning_it(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, extra=["--maxmemory-policy", "noeviction"])
    server.start()
    try:
        client = server.client()
        library.load(client)
        events, bad = _workload(3000, seed=8, bad_every=0)
        publish(client, events)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used + 300_000))  # room for a few hundred incidents, not 3,000
        log = tmp_path / "w.log"
        worker = start_worker(
            server.url, "--until-idle", log=log, max_deliveries=2, reconnect_max_backoff_s=0.5, **FAST
        )
        deadline = time.monotonic() + 30
        while "out of memory" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "out of memory" in log.read_text()
        time.sleep(2)  # long enough for claims and recoveries to have run up delivery counts, were they counted
        assert worker.poll() is None
        client.config_set("maxmemory", "0")
        assert _wait(worker, 120) == 0
        _check_run(client, events, bad)
    finally:
        server.stop()


def test_metrics_endpoint_counts_what_the_worker_did(server: RedisServer, tmp_path: Path) -> None:
    import urllib.request

    from tests.redis_server import free_port

    client = server.client()
    publish(
        client,
        [
            {"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
            {"incident_id": "90", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
            {"incident_id": "91", "features": "{}"},
        ],
    )
    port = free_port()
    worker = start_worker(server.url, log=tmp_path / "w.log", metrics_port=port, **FAST)
    try:
        deadline = time.monotonic() + 30
        text = ""
        wanted = ('outcome="dead"', "incident_worker_upkeep_lease_held 1.0", 'memory_bytes{stream="alerts"}')
        while time.monotonic() < deadline and not all(part in text for part in wanted):
            time.sleep(0.2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
        assert 'incident_worker_events_total{outcome="indexed"} 2.0' in text
        assert 'incident_worker_events_total{outcome="dead"} 1.0' in text
        assert "incident_worker_alerts_total 1.0" in text
        assert 'incident_worker_dead_letters_total{reason="empty_bag"} 1.0' in text
        assert "incident_worker_end_to_end_seconds_count 2.0" in text
        assert "incident_worker_candidates_bucket" in text
        # what the alert rules of deploy/prometheus need beyond the counts: the upkeep's view, the read path's
        assert "incident_worker_upkeep_lease_held 1.0" in text, "the only worker holds the upkeep lease"
        assert 'incident_worker_stream_memory_budget_bytes{stream="alerts"} 2.68435456e+08' in text
        assert "incident_worker_retention_seconds 0.0" in text
        assert "incident_worker_snapshot_fallbacks_total 0.0" in text
    finally:
        assert stop(worker) == 0


def test_metrics_endpoint_reads_the_snapshot_fallbacks_of_a_worker_on_the_snapshot_path(
    server: RedisServer, tmp_path: Path
) -> None:
    import urllib.request

    from tests.redis_server import free_port

    client = server.client()
    publish(client, [{"incident_id": str(n), "features": {"dock": 3, f"t{n}": 1}} for n in range(20)])
    port = free_port()
    worker = start_worker(server.url, log=tmp_path / "w.log", metrics_port=port, read_path="snapshot", **FAST)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline and 'outcome="indexed"} 20.0' not in text:
            time.sleep(0.2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
        assert 'incident_worker_events_total{outcome="indexed"} 20.0' in text
        [fallbacks] = re.findall(r"^incident_worker_snapshot_fallbacks_total (\S+)$", text, re.M)
        assert float(fallbacks) >= 0
    finally:
        assert stop(worker) == 0


@pytest.mark.slow
def test_sigkill_with_upserts_and_deletes_keeps_postings_consistent(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    rng = random.Random(9)
    events: list[dict[str, object]] = []
    added: list[str] = []
    touched: set[str] = set()
    for incident_id, bag in Workload(seed=9).take(4000):
        events.append({"incident_id": incident_id, "features": bag})
        added.append(incident_id)
        roll = rng.random()
        if roll < 0.10:
            target = rng.choice(added)
            touched.add(target)
            events.append(
                {"incident_id": target, "features": Workload(seed=rng.randrange(10**6)).next()[1], "op": "upsert"}
            )
        elif roll < 0.15:
            target = rng.choice(added)
            touched.add(target)
            events.append({"incident_id": target, "op": "delete"})
    publish(client, events)
    for round_, mark in enumerate(sorted(rng.sample(range(300, 3500), 3))):
        worker = start_worker(server.url, log=tmp_path / f"w{round_}.log", batch_size=rng.choice([20, 50]), **FAST)
        deadline = time.monotonic() + 60
        while client.xlen("{incidents}:changes") < mark and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        worker.kill()
        worker.wait()
    assert _wait(start_worker(server.url, "--until-idle", log=tmp_path / "final.log", **FAST), 240) == 0
    assert pending_count(client) == 0
    assert_postings_match(client, "incidents", 4)
    stored = {k.decode(): int(v, 16) for k, v in client.hgetall(FP).items()}
    first = fingerprints([e for e in events if e.get("op") is None])
    assert set(stored) <= set(first)
    assert all(stored[i] == fp for i, fp in first.items() if i not in touched), "an untouched incident changed"
    assert set(first) - touched <= set(stored), "an incident nobody deleted is missing"
    # A killed worker's entries are taken over after CLAIM_IDLE_MS, after newer ones: an add can then arrive after
    # an upsert of its incident and be refused as a duplicate. Only touched incidents may see that.
    letters = dead_letters(client)
    assert {d.reason for d in letters} <= {"duplicate_id"}
    assert {d.original["incident_id"] for d in letters} <= touched


@pytest.mark.slow
def test_heartbeat_is_refreshed_and_check_sees_a_frozen_worker(server: RedisServer, tmp_path: Path) -> None:
    import subprocess as sp

    from tests.streams import clean_env, worker_command

    worker = start_worker(server.url, log=tmp_path / "w.log", consumer="beat", heartbeat_ttl_ms=1000, **FAST)

    def check() -> int:
        env = clean_env(redis_url=server.url, consumer="beat")
        return sp.run([*worker_command(), "check"], env=env, capture_output=True, timeout=30).returncode

    try:
        # started first (on a busy machine that alone took longer than the sleep below)
        client = server.client()
        deadline = time.monotonic() + 60
        while not client.exists("{incidents}:heartbeat:beat") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)  # longer than the TTL: only refreshes keep the key alive
        assert check() == 0
        worker.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        assert check() == 1
        worker.send_signal(signal.SIGCONT)
    finally:
        worker.send_signal(signal.SIGCONT)
        assert stop(worker) == 0


def test_worker_survives_its_stream_and_state_vanishing(server: RedisServer, tmp_path: Path) -> None:
    """FLUSHALL while the worker blocks: a restart without persistence, after which the administrator's
    deployment step has loaded the functions again."""
    client = server.client()
    log = tmp_path / "w.log"
    worker = start_worker(server.url, log=log, consumer="phoenix", **FAST)
    try:
        publish(client, [{"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}}])
        deadline = time.monotonic() + 30
        while client.hlen(FP) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        # in one transaction: a worker call between FUNCTION FLUSH and the load would find no library and stop
        # (exit 2, by design), where a server that restarts comes back with the library its deployment loads
        restart = client.pipeline(transaction=True)
        restart.flushall()
        restart.function_flush()
        restart.function_load(library.LIBRARY_SOURCE, replace=True)
        restart.execute()
        time.sleep(0.5)
        publish(
            client,
            [
                {"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
                {"incident_id": "90", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
            ],
        )
        while len(alerts(client)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [a.incident_id for a in alerts(client)] == ["90"]
        assert worker.poll() is None, log.read_text()[-2000:]
    finally:
        assert stop(worker) == 0
    assert "setting up again" in log.read_text()


def _functions_missing_message(log: str) -> str:
    [line] = [json.loads(line) for line in log.splitlines() if "functions library missing" in line]
    assert line["level"] == "error" and "Traceback" not in log
    return str(line["error"])


def test_worker_without_the_functions_exits_2_saying_what_to_run(server: RedisServer, tmp_path: Path) -> None:
    client = server.client()
    client.function_flush()
    publish(client, [{"incident_id": "47", "features": {"dock": 3}}])
    log = tmp_path / "w.log"
    assert _wait(start_worker(server.url, "--until-idle", log=log, **FAST), 30) == 2
    message = _functions_missing_message(log.read_text())
    assert library.LIBRARY_NAME in message and "incident-worker load-functions --admin-redis-url" in message
    assert "docker compose run --rm load-functions" in message and "kubectl" in message
    assert client.function_list() == [], "the worker loaded code"
    assert client.hlen(FP) == 0 and client.xlen("{incidents}:dead") == 0, "an event was handled without functions"
    # the administrator's step, through the real entry point, and the worker gets on with it
    loaded = subprocess.run(
        [*worker_command(), "load-functions", "--admin-redis-url", server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0 and library.LIBRARY_NAME in loaded.stdout, loaded.stderr
    assert _wait(start_worker(server.url, "--until-idle", log=log, **FAST), 30) == 0
    assert client.hlen(FP) == 1


def test_worker_whose_functions_vanish_stops_and_leaves_the_entry_pending(server: RedisServer, tmp_path: Path) -> None:
    # Functions lost while a worker runs (FUNCTION FLUSH by someone, a restart without persistence): the worker
    # cannot put them back, so it stops with the message; the entries it held stay pending for the next worker.
    client = server.client()
    log = tmp_path / "w.log"
    worker = start_worker(server.url, log=log, **FAST)
    publish(client, [{"incident_id": "47", "features": {"dock": 3}}])
    deadline = time.monotonic() + 30
    while client.hlen(FP) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.function_flush()
    publish(client, [{"incident_id": "90", "features": {"dock": 3}}])
    assert _wait(worker, 30) == 2
    assert library.LIBRARY_NAME in _functions_missing_message(log.read_text())
    # entry 90 is either pending with the stopped worker or not yet delivered (the read itself is a function call
    # that failed): never processed, never dead-lettered, so the next worker takes it
    [group] = client.xinfo_groups(EVENTS)
    last_delivered = group["last-delivered-id"].decode()
    undelivered = len(client.xrange(EVENTS, min=f"({last_delivered}"))
    assert client.hlen(FP) == 1 and pending_count(client) + undelivered == 1 and client.xlen("{incidents}:dead") == 0
    library.load(client)
    assert _wait(start_worker(server.url, "--until-idle", log=log, **FAST), 30) == 0
    assert [alert.incident_id for alert in alerts(client)] == ["90"] and pending_count(client) == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--bands", "8"], "bands=4"), (["--bands", "2"], "10,978 probe keys per query")],
)
def test_run_refuses_a_wrong_layout_with_exit_2(
    server: RedisServer, tmp_path: Path, flags: list[str], message: str
) -> None:
    import subprocess as sp

    from tests.streams import clean_env, worker_command
    from worker.index import FingerprintIndex

    FingerprintIndex(server.client(), bands=4).add("a", {"x": 1})
    done = sp.run(
        [*worker_command(), "run", *flags],
        env=clean_env(redis_url=server.url, log_format="json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stdout + done.stderr
    assert "--settings" not in done.stderr
