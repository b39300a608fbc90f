"""The README's five-minute walkthrough works as written: its files exist and its commands do what it says.

The commands are taken from the README itself, run against the suite's redis-server instead of port 6390. The
worker runs with --until-idle after each step that feeds it, where a person would have it running in the
background; `alerts --follow` (which waits for Ctrl-C) is left out.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.streams import clean_env, worker_command

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def walkthrough() -> list[list[str]]:
    """The walkthrough's commands, each as its words, comments and shell plumbing taken off."""
    block = README.split("<!-- walkthrough -->", 1)[1].split("<!-- end walkthrough -->", 1)[0]
    code = block.split("```", 2)[1]
    commands = []
    for line in code.strip().splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def run(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*worker_command(), *args], capture_output=True, timeout=60, cwd=ROOT, env=clean_env(redis_url=url)
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_the_walkthrough_files_exist() -> None:
    named = {word for words in walkthrough() for word in words if word.startswith("examples/")}
    assert named, "the walkthrough names no example file"
    for path in named:
        assert (ROOT / path).is_file(), f"the README's walkthrough uses {path}, which is not in the repository"


@pytest.mark.slow
def test_the_walkthrough_commands_do_what_the_readme_says(server: RedisServer) -> None:
    client = server.client()
    outputs: dict[str, str] = {}
    for words in walkthrough():
        if words[0] == "redis-server" or words[0] == "export" or "--follow" in words:
            continue
        if words[0] == "incident-worker" and words[1] == "run":
            continue  # runs as --until-idle below, after each step that feeds it
        if words[0] == "redis-cli":
            assert words[1:3] == ["-p", "6390"], words
            client.execute_command(*words[3:])
            if words[3] == "XADD":
                assert run(["run", "--until-idle"], server.url).returncode == 0
            continue
        assert words[0] == "incident-worker", words
        done = run(words[1:], server.url)
        assert done.returncode == 0, (words, done.stderr)
        outputs[words[1]] = done.stdout
        if words[1] == "publish":
            worker = run(["run", "--until-idle"], server.url)
            assert worker.returncode == 0, worker.stderr
    assert client.xlen("{incidents}:alerts") == 3
    for incident, match in (("INC-4", "INC-1"), ("INC-5", "INC-2"), ("INC-7", "INC-3")):
        assert incident in outputs["alerts"] and match in outputs["alerts"], outputs["alerts"]
    assert "INC-1" in outputs["query"] and "INC-4" in outputs["query"]
    assert "INC-2" in outputs["inspect"]
    assert "bad_weight" in outputs["dead"]
    assert client.hget("{incidents}:fp", "INC-3") is None, "the example deletes INC-3"
