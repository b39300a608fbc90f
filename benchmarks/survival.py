"""Figures for the README's "What it survives": real worker processes on a redis-server this script starts.

* storm: two workers through the hostile corpus (tests/hostile.py) while every client connection is killed every
  5 ms for 3 s, with max_deliveries=2; counts connections killed and poison dead letters, and (with
  --counting-rereads) the same with re-reads of own pending entries counted as deliveries, as before the fix.
* huge: 20 entries of 25 MB ahead of and behind 200 valid events, one worker; its peak resident memory.
* hang: Redis SIGSTOPped under a running worker; seconds until the worker logs it, seconds from SIGTERM to exit.
* reads: server time of reading 100 new entries of ~600 bytes through the read_new function vs one XREADGROUP.

Usage: python benchmarks/survival.py [storm] [huge] [hang] [reads]
"""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from tests.hostile import LIMITS, corpus, publish_corpus  # noqa: E402
from tests.streams import EVENTS, FAST, FP, GROUP, clean_env, dead_letters, worker_command  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402


def _worker(url: str, log: Path, *args: str, **settings: Any) -> subprocess.Popen[bytes]:
    env = clean_env(redis_url=url, log_format="json", **{**FAST, **LIMITS, **settings})
    with open(log, "ab") as out:
        return subprocess.Popen([*worker_command(), "run", *args], env=env, stdout=out, stderr=out)


def storm(directory: Path) -> dict[str, Any]:
    server = RedisServer(directory)
    server.start()
    try:
        client = server.client()
        entries = corpus(11)
        publish_corpus(client, entries)
        workers = [
            _worker(server.url, directory / f"s{k}.log", "--until-idle", consumer=f"s{k}", max_deliveries=2)
            for k in range(2)
        ]
        while client.hlen(FP) < 200:
            time.sleep(0.01)
        killed = 0
        until = time.monotonic() + 3
        while time.monotonic() < until:
            with contextlib.suppress(redis.RedisError):
                killed += int(client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            time.sleep(0.005)
        codes = [w.wait(timeout=300) for w in workers]
        letters = dead_letters(client)
        return {
            "valid": sum(e.valid for e in entries),
            "hostile": sum(not e.valid for e in entries),
            "connections_killed": killed,
            "exit_codes": codes,
            "poison": sum(d.reason == "poison" for d in letters),
            "dead_letters": len(letters),
            "indexed": client.hlen(FP),
        }
    finally:
        server.stop()


def huge(directory: Path) -> dict[str, Any]:
    server = RedisServer(directory)
    server.start()
    try:
        client = server.client()
        blob = b"x" * 25_000_000
        for k in range(20):
            client.xadd(EVENTS, {"incident_id": f"huge{k}", "features": blob})
            if k == 9:
                publish_corpus(client, corpus(19, valid=200, hostile_every=0))
        del blob
        started = time.monotonic()
        worker = _worker(server.url, directory / "h.log", "--until-idle", max_entry_bytes=1_048_576)
        code = worker.wait(timeout=300)
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return {
            "exit_code": code,
            "seconds": round(time.monotonic() - started, 1),
            "worker_peak_rss_mib": round(peak_kib / 1024, 1),
            "dead_letters": len(dead_letters(client)),
            "dead_stream_bytes": client.memory_usage("{incidents}:dead"),
            "indexed": client.hlen(FP),
        }
    finally:
        server.stop()


def hang(directory: Path) -> dict[str, Any]:
    server = RedisServer(directory)
    server.start()
    try:
        client = server.client()
        publish_corpus(client, corpus(18, valid=2000))
        log = directory / "g.log"
        worker = _worker(server.url, log)
        while client.hlen(FP) < 300:
            time.sleep(0.01)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        while "redis is not answering" not in log.read_text():
            time.sleep(0.05)
        noticed = time.monotonic() - stopped
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        server.process.send_signal(signal.SIGCONT)
        return {
            "noticed_after_s": round(noticed, 1),
            "exit_after_sigterm_s": round(time.monotonic() - signalled, 1),
            "exit_code": code,
        }
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        server.stop()


def reads(directory: Path) -> dict[str, Any]:
    from worker.library import FN_READ_NEW, load

    server = RedisServer(directory)
    server.start()
    try:
        client = server.client()
        load(client)
        rounds = 200
        publish_corpus(client, corpus(21, valid=100 * rounds, hostile_every=0)[: 100 * rounds])
        client.xgroup_create(EVENTS, GROUP, id="0")
        client.xgroup_create(EVENTS, "plain", id="0")

        def server_usec(command: str) -> float:
            stats = client.info("commandstats")
            return float(stats.get(f"cmdstat_{command}", {}).get("usec", 0))

        client.config_resetstat()
        for _ in range(rounds):
            client.fcall(FN_READ_NEW, 1, EVENTS, GROUP, "c", 100, 8_388_608, 1_048_576, 1024)
        function = server_usec("fcall")
        client.config_resetstat()
        for _ in range(rounds):
            client.xreadgroup("plain", "c", {EVENTS: ">"}, count=100)
        plain = server_usec("xreadgroup")
        return {
            "read_new_us_per_100": round(function / rounds),
            "xreadgroup_us_per_100": round(plain / rounds),
        }
    finally:
        server.stop()


def main(argv: list[str]) -> None:
    chosen = argv or ["storm", "huge", "hang", "reads"]
    with tempfile.TemporaryDirectory() as temporary:
        for name in chosen:
            directory = Path(temporary) / name
            directory.mkdir()
            print(json.dumps({name: globals()[name](directory)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
