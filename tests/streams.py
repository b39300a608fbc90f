"""Helpers for stream tests: publishing events, reading alerts, and the invariants every run must keep."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import conftest
from worker.fingerprint import fingerprint
from worker.formats import Alert, DeadLetter
from worker.replies import text

EVENTS = "{incidents}:events"
ALERTS = "{incidents}:alerts"
DEAD = "{incidents}:dead"
FP = "{incidents}:fp"
GROUP = "incident-workers"

FAST = conftest.FAST
"""The suite's one set of quick worker settings (tests/conftest.py), here beside the helpers that start workers."""


def publish(client: Any, events: Iterable[Mapping[str, Any]], stream: str = EVENTS) -> list[str]:
    """XADD each event (features given as a dict are JSON-encoded); returns the entry IDs."""
    pipe = client.pipeline(transaction=False)
    for event in events:
        fields = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in event.items()}
        pipe.xadd(stream, fields)
    return [text(entry_id) for entry_id in pipe.execute()]


def alerts(client: Any, stream: str = ALERTS) -> list[Alert]:
    return [Alert.from_fields(fields) for _, fields in client.xrange(stream)]


def dead_letters(client: Any, stream: str = DEAD) -> list[DeadLetter]:
    return [DeadLetter.from_fields(fields) for _, fields in client.xrange(stream)]


def pending_count(client: Any, stream: str = EVENTS, group: str = GROUP) -> int:
    return int(client.xpending(stream, group)["pending"])


def pairs_within(fps: Mapping[str, int], r: int) -> set[tuple[str, str]]:
    """Every unordered pair within distance r (as sorted tuples), found by exact matches on r + 1 bands."""
    bands = r + 1
    width = 64 // bands
    found: set[tuple[str, str]] = set()
    for b in range(bands):
        shift = b * width
        mask = (1 << (width if b < bands - 1 else 64 - shift)) - 1
        buckets: dict[int, list[str]] = defaultdict(list)
        for incident_id, fp in fps.items():
            buckets[(fp >> shift) & mask].append(incident_id)
        for members in buckets.values():
            for i, x in enumerate(members):
                fx = fps[x]
                for y in members[i + 1 :]:
                    if ((fx ^ fps[y]).bit_count()) <= r:
                        found.add((x, y) if x < y else (y, x))
    return found


def assert_pairs_reported_once(fps: Mapping[str, int], published: list[Alert], r: int = 7) -> None:
    """Every pair within r is in exactly one alert: the one of whichever of the two was indexed second."""
    alerted = [alert.incident_id for alert in published]
    assert len(alerted) == len(set(alerted)), "an incident was alerted twice"
    reported: dict[tuple[str, str], int] = defaultdict(int)
    for alert in published:
        assert alert.match_count == len(alert.matches)
        assert [(m.distance, m.incident_id) for m in alert.matches] == sorted(
            (m.distance, m.incident_id) for m in alert.matches
        )
        for match in alert.matches:
            x, y = alert.incident_id, match.incident_id
            assert match.distance == (fps[x] ^ fps[y]).bit_count() <= r
            reported[(x, y) if x < y else (y, x)] += 1
    expected = pairs_within(fps, r)
    missing = expected - set(reported)
    assert not missing, f"{len(missing)} pairs within {r} never reported, e.g. {sorted(missing)[:3]}"
    extra = set(reported) - expected
    assert not extra, f"pairs reported that are not within {r}: {sorted(extra)[:3]}"
    twice = [pair for pair, count in reported.items() if count > 1]
    assert not twice, f"pairs reported more than once: {twice[:3]}"


def fingerprints(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The fingerprint each added incident should have (first add of an ID wins, as in the index)."""
    fps: dict[str, int] = {}
    for event in events:
        fps.setdefault(event["incident_id"], fingerprint(event["features"]))
    return fps


def worker_command() -> list[str]:
    script = Path(sys.executable).parent / "incident-worker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "worker"]


def clean_env(**settings: Any) -> dict[str, str]:
    """The environment for a worker process: ours without INCIDENT_WORKER_*, plus the given settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INCIDENT_WORKER_")}
    for name, value in settings.items():
        env[f"INCIDENT_WORKER_{name.upper()}"] = str(value)
    return env


def run_in_process(
    args: Sequence[str], env: Mapping[str, str], stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`incident-worker ARGS` as `worker.cli.main` runs it in this process, seen as a child would see it: `env` its
    whole environment, `stdin` its standard input (empty when None), its stdout and stderr captured as bytes, its exit
    code from main's return or a SystemExit; an exception that escapes main goes through the hook main installed (the
    redacted traceback a child prints) and exits 1. The environment, the standard streams, the exception hook, the
    SIGINT and SIGTERM handlers and structlog's configuration are put back after.

    About 0.5 CPU-seconds cheaper than a child (no interpreter start, no imports): the tests that check what a command
    prints, changes and returns use it. Tests of the console script itself, of signals and of what only a process
    shows (its exit on a second signal, its own memory, its logs on stderr) start real children."""
    import structlog

    from worker.cli import main

    saved_env = dict(os.environ)
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_hook = sys.excepthook
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    saved_logging = structlog.get_config()
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    os.environ.clear()
    os.environ.update(env)
    try:
        try:
            returned: object = main(list(args))
        except SystemExit as exited:
            returned = exited.code
        except Exception:  # a bug: the child's excepthook would print it and exit 1
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
            returned = 1
        if returned is not None and not isinstance(returned, int):  # sys.exit("message"), as the interpreter does
            print(returned, file=sys.stderr)
            returned = 1
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.CompletedProcess(list(args), returned or 0, out.getvalue(), err.getvalue())
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.excepthook = saved_hook
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        structlog.configure(**saved_logging)


_SPAWNED: list[subprocess.Popen[bytes]] = []


def spawn(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen, remembered until the test ends: a test that fails half-way leaves no worker running against
    the suite's shared redis-server (one once did, and a later test on that server failed for it)."""
    process: subprocess.Popen[bytes] = subprocess.Popen(command, **kwargs)
    _SPAWNED.append(process)
    return process


def reap_spawned() -> list[int]:
    """SIGKILL every process `spawn` started that still runs (the conftest does, after each test); returns their
    PIDs."""
    killed = []
    while _SPAWNED:
        process = _SPAWNED.pop()
        if process.poll() is None:
            process.kill()
            killed.append(process.pid)
        process.wait()
    return killed


def start_worker(url: str, *args: str, log: Path | None = None, **settings: Any) -> subprocess.Popen[bytes]:
    """`incident-worker run` as a child process, logging JSON lines to `log` (or discarding them)."""
    env = clean_env(redis_url=url, log_format="json", **settings)
    if log is None:
        return spawn([*worker_command(), "run", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return spawn([*worker_command(), "run", *args], env=env, stdout=out, stderr=out)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10) -> int:
    process.send_signal(sig)
    return process.wait(timeout=timeout)


def kill_once_indexed(client: Any, worker: subprocess.Popen[bytes], mark: int, rng: Any, fp_key: str = FP) -> bool:
    """SIGKILL `worker` at a random moment once the index holds `mark` incidents (so the kill lands mid-run);
    returns whether it was still running to be killed."""
    import time

    deadline = time.monotonic() + 60
    while client.hlen(fp_key) < mark and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.05))
    killed = worker.poll() is None
    if killed:
        worker.kill()
    worker.wait()
    return killed


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.05) -> None:
    """Poll `predicate` until it is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(step)
