"""Start and stop local redis-server processes: for the test suite and the benchmark, each on a free port.

No persistence unless asked for (`appendonly=True`). Needs the redis-server binary of Redis 7 on PATH.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis


def redis_server_available() -> bool:
    return shutil.which("redis-server") is not None


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral_floor() -> int:
    """The lowest port the system hands out for outgoing connections (Linux's ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default, and below the range IANA reserves (49152 and up)


def free_port(*, cluster: bool = False) -> int:
    """A free local port; with `cluster`, one whose cluster bus port (port + 10000) is free and valid too.

    Taken at random below the ephemeral range where it can be: a port the system handed out (bind to port 0) can be
    taken again as the local end of any outgoing connection before the server binds it, which with several test
    workers starting servers at once made a start fail now and then. At random, so that concurrent runs rarely meet;
    a meeting is caught by the bind check, or by the server failing to start.
    """
    high = _ephemeral_floor() - (10_000 if cluster else 0)
    rng = random.Random()
    if high - 10_000 >= 2_000:
        for _ in range(1000):
            port = rng.randrange(10_000, high)
            if _bindable(port) and (not cluster or _bindable(port + 10_000)):
                return port
    if not cluster:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(1000):
        port = rng.randrange(20_000, 50_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free pair of ports (port, port + 10000) for a cluster node")


SHIPPED_SETTINGS = ("--set-max-intset-entries", "8192")
"""The settings of deploy/redis/redis.conf that change what the index costs (tests/test_deploy.py holds the two
equal), given to every server started here, so that a benchmark measures the Redis the project ships: posting sets
of up to 8,192 decimal IDs kept as intsets (about 4 bytes an ID, not 50)."""


class RedisServer:
    """A redis-server child process. `appendonly=True` gives it an AOF in its directory, for persistence tests.
    It runs with the shipped redis.conf's `SHIPPED_SETTINGS`; `extra` may override them.

    Started, it holds the index's functions library, as a deployment's administrator step (`load-functions`) leaves
    a server, unless `load_functions=False` or it wants a password (an ACL's admin loads it then) or is a cluster
    node (load through the cluster client once the cluster is formed).
    """

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra: list[str] | None = None,
        load_functions: bool = True,
    ) -> None:
        self.directory = directory
        self.load_functions = load_functions and "--cluster-enabled" not in (extra or [])
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra = extra or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--logfile",
            str(self.directory / f"redis-{self.port}.log"),
            *SHIPPED_SETTINGS,
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                log = self.directory / f"redis-{self.port}.log"
                tail = log.read_text()[-1000:] if log.exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} exited at start: {stderr}{tail}")
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as probe:
                    if probe.ping():
                        if self.load_functions:
                            self._load_functions(probe)
                        return
            except (redis.AuthenticationError, redis.ResponseError):
                return  # it answers; it wants a password (NOAUTH)
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    @staticmethod
    def _load_functions(client: redis.Redis) -> None:
        from .. import library

        with contextlib.suppress(redis.ReadOnlyError):  # a replica gets the library from its primary
            library.load(client)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the server dies as in a crash."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, **kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def scratch_server(**options: Any) -> Iterator[RedisServer]:
    """A started redis-server of its own in a temporary directory (the functions library loaded, unless `options`
    say otherwise), stopped at the end: what a benchmark script measures on."""
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory), **options)
        server.start()
        try:
            yield server
        finally:
            server.stop()
