"""`incident-worker demo`: the README's first command, on its embedded Redis, from a clean environment."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.redis_server import free_port
from tests.streams import clean_env, worker_command

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _demo(*args: str, background: bool = False) -> subprocess.Popen[str]:
    # A Redis URL that points nowhere: the demo must not need (or touch) any Redis of the machine.
    env = clean_env(redis_url="redis://127.0.0.1:9/0")
    return subprocess.Popen(
        [*worker_command(), "demo", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # as a shell starts `incident-worker demo --keep &`: SIGINT ignored, so Python raises no KeyboardInterrupt
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None,
    )


def _wait_for(demo: subprocess.Popen[str], text: str, deadline: float) -> list[str]:
    assert demo.stdout is not None
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = demo.stdout.readline()
        lines.append(line)
        if text in line:
            return lines
        if not line and demo.poll() is not None:
            break
    demo.kill()
    pytest.fail(f"the demo never printed {text!r}:\n" + "".join(lines))


def test_demo_runs_the_sample_and_prints_the_alerts() -> None:
    demo = _demo()
    out, _ = demo.communicate(timeout=120)
    assert demo.returncode == 0, out
    assert "ALERT  90 matches 47 (distance 0)" in out
    assert "Done: 55 incidents indexed" in out
    assert out.count("ALERT ") >= 10  # the near-duplicate groups of the sample
    assert "0 dead letters" in out
    assert "redis-cli -p " in out and "HGET '{incidents}:fp' 47" in out
    shown = README.split("<!-- demo-output -->", 1)[1].split("<!-- end demo-output -->", 1)[0].split("```")[1]
    for line in shown.strip().splitlines():
        assert line in out.splitlines(), f"the README shows the demo printing {line!r}; it prints:\n{out}"


def test_demo_keep_serves_redis_cli_and_alerts_new_events() -> None:
    if shutil.which("redis-cli") is None:
        message = "redis-cli is not installed (apt-get install redis-tools)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    demo = _demo("--keep", "--port", str(port))
    assert demo.stdout is not None
    deadline = time.monotonic() + 60
    _wait_for(demo, "Waiting for more events", deadline)

    def cli(*args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    assert cli("HGET", "{incidents}:fp", "47") == "0b61171015620fa1"
    assert "bands" in cli("HGETALL", "{incidents}:meta")
    cli("XADD", "{incidents}:events", "*", "incident_id", "91", "features", '{"dock":3,"scanner":2,"timeout":1}')
    alert = ""
    while time.monotonic() < deadline and "ALERT  91" not in alert:
        alert = demo.stdout.readline()
    assert alert.startswith("ALERT  91 matches 47 (distance 0), 90 (distance 0)")
    # an incident the demo did not publish is described by its bag, read back from the events stream
    assert demo.stdout.readline().split() == ["91:", "dockx3", "scannerx2", "timeoutx1"]
    demo.send_signal(signal.SIGINT)
    demo.communicate(timeout=30)
    assert demo.returncode == 0


def test_demo_in_a_network_without_any_redis() -> None:
    """In a fresh network namespace nothing listens on 6379: the demo must not care."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("unshare -n is not permitted here; test_demo_runs_the_sample_and_prints_the_alerts covers the rest")
    command = " ".join([*worker_command(), "demo"])
    script = (
        "ip link set lo up 2>/dev/null; "
        "if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then echo 'REDIS ON 6379'; exit 3; fi; "
        f"exec {command}"
    )
    done = subprocess.run(
        ["unshare", "-n", "bash", "-c", script], env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALERT  90 matches 47 (distance 0)" in done.stdout


def test_demo_keep_started_in_the_background_stops_on_sigint() -> None:
    demo = _demo("--keep", background=True)
    _wait_for(demo, "Waiting for more events", time.monotonic() + 60)
    demo.send_signal(signal.SIGINT)
    out, _ = demo.communicate(timeout=30)
    assert demo.returncode == 0, out
