"""What every benchmark (worker/devtools/benchmark.py, near_storm.py, storm.py, fleet.py) shares: the header its
results start with (when, the command, the code, the machine), the server's two clocks, and a backlog written
before the clock starts and sent in it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from .. import __version__, library
from ..bands import DEFAULT_BANDS, DEFAULT_MAX_DISTANCE
from ..formats import IncidentEvent
from ..readpath import SNAPSHOT_SEND
from ..replies import group_info
from ..text import TOKENIZER_VERSION

__all__ = [
    "backlog_done",
    "code_version",
    "fcall_usec",
    "packed_xadds",
    "publish",
    "run_header",
    "send_xadds",
    "server_cpu",
    "stream_fields",
]


def code_version() -> dict[str, Any]:
    """What the figures describe: the code the run measured.

    `library` (a hash of the Lua source), the tokenizer's version and the layout and read-path defaults are what
    tests/test_benchmarks_page.py holds against today's code, so that BENCHMARKS.md cannot show figures of code that
    has since changed where the time goes; `commit` (and whether worker/ had changes not committed) is for people.
    """
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(_git("status", "--porcelain", "--", "worker")),
        "version": __version__,
        "library": library.LIBRARY_NAME,
        "tokenizer_version": TOKENIZER_VERSION,
        "default_bands": DEFAULT_BANDS,
        "max_distance": DEFAULT_MAX_DISTANCE,
        "snapshot_send": SNAPSHOT_SEND,
    }


def _git(*args: str) -> str | None:
    """Output of a git command in the checkout the worker runs from; None outside one (an installed package)."""
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def run_header(client: redis.Redis) -> dict[str, Any]:
    """What every benchmark's results start with: when, the command, the code, the machine (load average included)."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "incident-worker bench " + " ".join(sys.argv[2:]),
        "code": code_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "redis": client.info("server").get("redis_version"),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
    }


def fcall_usec(client: redis.Redis) -> float:
    """Microseconds Redis spent in the worker's function calls (INFO commandstats of FCALL: the atomic step and the
    reads of new entries, with the commands they run; commandstats counts those commands under their own names too,
    so adding them would count them twice). What the workers run outside the functions (the change log their copies
    follow, above all) is the server's CPU less this."""
    stats = client.info("commandstats")
    return float(stats.get("cmdstat_fcall", {}).get("usec", 0))


def server_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the server has used, user and system."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def backlog_done(client: redis.Redis, events: str, group: str) -> bool:
    """Whether `group` has read and acknowledged every entry of `events`."""
    try:
        info = group_info(client, events, group)
    except redis.ResponseError:
        return False
    return info is not None and int(info["pending"]) == 0 and int(info.get("lag") or 0) == 0


def stream_fields(items: list[tuple[str, dict[str, int]]]) -> list[dict[str, str]]:
    """Incidents (ID, bag) as the producer's stream entries."""
    return [IncidentEvent(incident_id=i, features=bag).to_fields() for i, bag in items]


def publish(client: redis.Redis, stream: str, events: list[dict[str, str]]) -> None:
    """XADD `events` to `stream`, written and sent at once (a throughput measure writes them before its clock)."""
    send_xadds(client, packed_xadds(client, stream, events))


def packed_xadds(client: redis.Redis, stream: str, events: list[dict[str, str]]) -> list[tuple[list[bytes], int]]:
    """The XADDs of `events` written for the wire, 2,000 a chunk (with each chunk's count): the producer's work, which
    a throughput measurement does before its clock starts (`send_xadds` sends them in it). On this 2-core machine
    the benchmark's own redis-py pipeline took about 25 us of CPU an event from the workers."""
    connection = client.connection_pool.get_connection()
    chunks = [events[k : k + 2000] for k in range(0, len(events), 2000)]
    try:
        pack = connection.pack_commands
        return [(pack([("XADD", stream, "*", *(p for f in e.items() for p in f)) for e in c]), len(c)) for c in chunks]
    finally:
        client.connection_pool.release(connection)


def send_xadds(client: redis.Redis, chunks: list[tuple[list[bytes], int]]) -> None:
    """Send `packed_xadds`' chunks, each after the previous one's replies (an error reply raises)."""
    connection = client.connection_pool.get_connection()
    try:
        for packed, count in chunks:
            connection.send_packed_command(packed)
            for _ in range(count):
                connection.read_response()
    except BaseException:
        connection.disconnect()
        raise
    finally:
        client.connection_pool.release(connection)
