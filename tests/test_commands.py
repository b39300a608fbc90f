"""The subcommand package (worker/commands/): lazy imports, signals, and the pure parts of the commands' output."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tests.streams import clean_env
from worker.cli import build_parser
from worker.commands import SUBCOMMANDS
from worker.commands._format import matches_text
from worker.devtools.benchmark import markdown
from worker.formats import Match

HEAVY = ("worker.devtools", "worker.metrics", "prometheus_client", "worker.stream", "worker.commands.demo", "fakeredis")
"""Modules the liveness probe must never import: the benchmark, the metrics server, the worker loop, the demo."""


def _modules_after(code: str, env: dict[str, str]) -> tuple[int, list[str], str]:
    """Run `code` in a fresh interpreter; its exit code, the modules it had imported by then, its stderr."""
    script = "import json, sys\n" + code + "\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else [], done.stderr


def test_check_imports_neither_the_benchmark_nor_the_metrics_server(server: RedisServer) -> None:
    code = "from worker.cli import main\nrc = main(['check'])\nassert rc == 1, rc  # no worker runs"
    returncode, modules, stderr = _modules_after(code, clean_env(redis_url=server.url))
    assert returncode == 0, stderr
    assert "worker.commands.check" in modules
    heavy = [name for name in modules if name.startswith(HEAVY)]
    assert not heavy, f"check imported {heavy}"
    others = {f"worker.commands.{s.name}" for s in SUBCOMMANDS if s.name != "check"}
    assert not others & set(modules), f"check imported other subcommands: {sorted(others & set(modules))}"


def test_the_top_level_help_imports_no_subcommand() -> None:
    code = "from worker.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    returncode, modules, stderr = _modules_after(code, clean_env())
    assert returncode == 0, stderr
    assert not [name for name in modules if name.startswith("worker.commands.") and "._" not in name]


def test_every_subcommand_module_follows_the_convention() -> None:
    """Each module configures its parser and sets a handler that returns an exit code."""
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert set(choices) == {s.name for s in SUBCOMMANDS}
    for name, sub in choices.items():
        assert callable(sub.get_default("handler")), f"{name} sets no handler"
        assert sub.description, f"{name} has no description"


def test_a_second_signal_exits_at_once_with_130_after_ctrl_c() -> None:
    """The first SIGINT asks to stop; a second one, before the stop finished, exits 128 + 2 at once."""
    script = textwrap.dedent(
        """
        import os, signal, threading, time
        from worker.commands.run import install_stop_signals
        asked = threading.Event()
        def stop():  # a stop that never finishes, as a batch stuck on a slow Redis
            asked.set()
            time.sleep(60)
        install_stop_signals(stop)
        os.kill(os.getpid(), signal.SIGINT)
        assert asked.wait(10), "the first signal did not ask to stop"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, timeout=60)
    assert done.returncode == 128 + signal.SIGINT == 130, done.stderr


def test_run_help_says_what_a_second_signal_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser("run").parse_args(["run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "a second one exits at once with 130 (Ctrl-C) or 143 (SIGTERM)" in shown


def test_alert_matches_read_the_same_in_alerts_and_demo() -> None:
    matches = [Match(incident_id="DUP-011", distance=1), Match(incident_id="47", distance=3)]
    assert matches_text(matches, 2) == "DUP-011 (distance 1), 47 (distance 3)"
    assert matches_text(matches, 9, limit=1) == "DUP-011 (distance 1) and 8 more"


def _results(capped: bool) -> dict[str, Any]:
    run = {
        "events": 10,
        "offered": 10,
        "events_per_s": 100,
        "candidates_mean": 1.0,
        "candidates_p99": 2,
        "fcall_usec_per_event": 3.0,
        "redis_cpu_usec_per_event": 4.0,
        "capped": False,
    }
    layout = {
        "bands": 4,
        "probes": 68,
        "memory_per_incident": 120,
        "one_worker": run,
        "two_workers": {**run, "capped": capped},
        "latency_half_load": {"p50_ms": 1.0, "p99_ms": 2.0},
    }
    return {
        "date": "2026-12-03",
        "command": "incident-worker bench",
        "machine": {"cpus": 2, "platform": "linux", "python": "3.12", "redis": "7.0"},
        "workload": "synthetic",
        "fingerprint": {
            "tokens_per_bag": 20,
            "reference_us": 200,
            "fast_repeating_us": 10,
            "speedup_repeating": 20,
            "fast_unique_us": 30,
            "speedup_unique": 6.7,
        },
        "sizes": [
            {
                "indexed": 1000,
                "layouts": {"default": layout, "classic": {**layout, "bands": 8}},
                "baseline": {"events": 10, "offered": 10, "events_per_s": 50, "candidates_mean": 5.0},
            }
        ],
    }


def test_bench_explains_the_capped_mark_only_when_something_was_capped() -> None:
    assert "capped" not in markdown(_results(capped=False))
    report = markdown(_results(capped=True))
    assert "100*" in report and "(* capped at the time limit.)" in report


def test_a_heartbeat_says_its_host_and_an_old_one_is_matched_by_its_default_name() -> None:
    import socket

    from worker.commands.check import on_host
    from worker.formats import Heartbeat

    here = socket.gethostname()
    written = Heartbeat(consumer="worker-0", at=1.0, started=0.5, processed=3).to_value()
    read = Heartbeat.from_value("{incidents}:heartbeat:worker-0", "worker-0", written)
    assert read.host == here and on_host(read, here) and not on_host(read, "elsewhere")
    old = Heartbeat.from_value("k", f"{here}-4242", json.dumps({"consumer": f"{here}-4242", "at": 1.0}))
    assert old.host is None and on_host(old, here), "a worker that does not write its host: its default name"
    assert not on_host(Heartbeat.from_value("k", "worker-1", b'{"at": 1}'), here)
    assert Heartbeat.from_value("k", "worker-1", b"not json").host is None
