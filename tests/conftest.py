"""Shared fixtures: a real redis-server started by the suite, fakeredis beside it, and the tests' worker settings.

Behaviour that depends on Redis runs against both: `redis_client` is parametrized over a real server (responses as
bytes) and fakeredis (responses decoded unless a module overrides `fake_decodes`), so both reply shapes are covered
too. Under CI=true a missing redis-server is a failure, never a skip. `FAST` (for worker processes) and
`fast_settings()` (for workers in the test process) are the one set of quick worker settings. For TLS: the suite's
certificates (`tls_files`, made with openssl; without it under CI=true, a failure too) and a TLS-only primary with its
Sentinel (`tls_sentinel`); `sentinel_of` is a Sentinel without TLS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import hypothesis
import pytest
import redis
import structlog

from tests.redis_server import RedisServer, free_port, redis_server_available
from tests.tls_sentinel import TlsSentinel, make_tls_files
from worker import library
from worker.settings import Settings

FAST = {"block_ms": 100, "claim_idle_ms": 1000, "claim_interval_ms": 200, "summary_interval_s": 1}
"""Worker settings for tests: quick to notice new entries, to take over a silent consumer's, and to stop."""


def fast_settings(**overrides: Any) -> Settings:
    """Settings of a worker run inside the test process: `FAST`, consumer w1, then `overrides`."""
    return Settings(**{"consumer": "w1", **FAST, **overrides})


@pytest.fixture
def no_worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No INCIDENT_WORKER_* variable of the caller's shell reaches the settings of an in-process worker."""
    for name in list(os.environ):
        if name.startswith("INCIDENT_WORKER_"):
            monkeypatch.delenv(name)


IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# No per-example deadline: the suite runs in several processes on a machine that may be busy, where an example that
# takes 1 ms alone sometimes took 250 ms, and hypothesis reported the test as flaky. A hung example still fails, on
# the suite's timeout.
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the fakeredis half of every real/fake pair `fakeredis`, so `make test-fast` can leave it to `make test`:
    the same behaviour on the real server runs in both."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "fake" in callspec.params.values():
            item.add_marker(pytest.mark.fakeredis)


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Put structlog back after each test: one that configures logging onto its captured stderr would otherwise leave
    every later in-process worker writing to a closed file."""
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Kill what a test started and left running (it failed before stopping its workers), before the next test."""
    yield
    from tests.streams import reap_spawned  # streams imports this module

    reap_spawned()


def _require(available: bool, message: str, tests: str) -> None:
    """Skip when something the test needs is missing; under CI=true, fail instead: CI must run those tests."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{message} -- CI must run the {tests}", pytrace=False)
    pytest.skip(message)


def require_redis_server() -> None:
    """Skip without redis-server; under CI=true, fail instead: the real-server tests must run there."""
    _require(
        redis_server_available(),
        "redis-server is not on PATH; install Redis 7 (apt-get install redis-server)",
        "real-server tests",
    )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session: its own port, no persistence."""
    require_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


def require_openssl() -> None:
    """Skip without openssl (the suite's certificates are made with it); under CI=true, fail instead."""
    _require(
        shutil.which("openssl") is not None, "openssl is not installed: no certificate to try TLS with", "TLS tests"
    )


def require_promtool() -> None:
    """Skip without promtool (Prometheus's rule checker); under CI=true, fail instead: .ci/run installs it."""
    _require(
        shutil.which("promtool") is not None,
        "promtool is not on PATH; install Prometheus's tools (apt-get install prometheus)",
        "alert rule tests",
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1 and localhost (cert.pem, its own certificate authority), its key
    encrypted (key.pem, tests.tls_sentinel.TLS_KEY_PASSPHRASE), another authority's certificate (other-ca.pem), and
    a non-PEM file (garbage.pem). Without openssl, only garbage.pem: the tests that need a key call
    `require_openssl` (or skip, and fail under CI, by themselves)."""
    directory = tmp_path_factory.mktemp("tls")
    (directory / "garbage.pem").write_text("not a certificate\n")
    if shutil.which("openssl") is not None:
        make_tls_files(directory)
    return directory


@pytest.fixture(scope="session")
def tls_sentinel(tmp_path_factory: pytest.TempPathFactory, tls_files: Path) -> Iterator[TlsSentinel]:
    """A real redis-server and a real Sentinel watching it, both TLS only (tests/tls_sentinel.py), for the session:
    own ports, no persistence, the functions library loaded on the primary."""
    require_redis_server()
    require_openssl()
    servers = TlsSentinel(tmp_path_factory.mktemp("tls-sentinel"), tls_files)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def sentinel_of(redis_server: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A Sentinel without TLS (a redis-server --sentinel on a port of its own) watching the session's server as
    `incidents`; its port."""
    with sentinel_watching(redis_server.port, tmp_path) as port:
        yield port


@contextlib.contextmanager
def sentinel_watching(primary_port: int, tmp_path: Path) -> Iterator[int]:
    """A Sentinel without TLS (a redis-server --sentinel on a port of its own) watching the primary on `primary_port`
    as `incidents`, once it answers for it; its port. Stopped on leaving."""
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nlogfile {tmp_path / 'sentinel.log'}\n"
        f"sentinel monitor incidents 127.0.0.1 {primary_port} 1\n"
    )
    sentinel = subprocess.Popen(["redis-server", str(conf), "--sentinel"])
    try:
        with redis.Redis(port=port, retry=None) as asked:
            for _ in range(100):
                with contextlib.suppress(redis.ConnectionError):
                    if asked.sentinel_get_master_addr_by_name("incidents"):
                        break
                time.sleep(0.05)
        yield port
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own that keeps an append-only file (fsync always), with the library loaded: for
    tests that kill it (`kill`) and start it again (`start`) to see what a crash and restart do."""
    require_redis_server()
    server = RedisServer(tmp_path, appendonly=True)
    server.start()
    try:
        library.load(server.client())
        yield server
    finally:
        server.stop()


@pytest.fixture
def real_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    client.function_flush()
    library.load(client)  # as the deployment's administrator step does (incident-worker load-functions)
    yield client
    client.close()


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's real redis-server, emptied (keys and functions) for this test."""
    with redis_server.client() as client:
        client.flushall()
        client.function_flush()
        library.load(client)  # as the deployment's administrator step does
    yield redis_server


@pytest.fixture
def fake_decodes() -> bool:
    """Whether the fakeredis side of `redis_client` decodes replies (so the suite meets both reply shapes).

    A module whose code needs bytes (the stream worker refuses a decoding client) overrides it with False.
    """
    return True


@pytest.fixture(params=["real", "fake"])
def redis_client(request: pytest.FixtureRequest, fake_decodes: bool) -> Iterator[redis.Redis]:
    """A clean Redis: the real server (bytes replies) or fakeredis (decoded replies unless `fake_decodes` is off)."""
    if request.param == "real":
        yield request.getfixturevalue("real_redis")
    else:
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(version=7), decode_responses=fake_decodes)
        library.load(client)
        yield client
        client.close()


@pytest.fixture(params=[2048, 3, 1], ids=["tail", "tiers-of-3", "a-tier-a-row"])
def seal_at(request: pytest.FixtureRequest) -> Iterator[int]:
    """A snapshot copy's rows made after its load: compared one by one (the tail, as it runs), or sealed into numpy
    tiers every few rows, or after every row (so that merges of tiers, and tiers holding emptied rows, come up in
    every example); in this process's copies."""
    import worker.snapshot

    saved = worker.snapshot._SEAL_AT
    worker.snapshot._SEAL_AT = request.param
    yield request.param
    worker.snapshot._SEAL_AT = saved


def loops_compiled() -> None:
    """Wait for the copy's compiled loops (a search made while they compile uses their numpy steps, and lists in
    Python)."""
    import worker.copyarrays

    worker.copyarrays.wait_compiled(timeout=120)


@pytest.fixture
def compiled_loops() -> None:
    """The copies' searches run the compiled loops (`loops_compiled`): for a module, `pytestmark =
    pytest.mark.usefixtures("compiled_loops")`."""
    loops_compiled()


@pytest.fixture(
    params=[(2**62, False), (0, True), (-1, True), (-1, False)],
    ids=["python-always", "arrays-written", "scan-written", "scan-python"],
)
def few_hits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """How a snapshot copy counts and lists a send's matches: in plain Python (as it does when they are few) or in
    arrays (as it does a near storm's) whatever their number, through the bands; or (-1) by comparing every send
    that no budget cut with every row (`MemoryIndex._scan`, as it does a near storm's); in this process's copies.
    In arrays, each query's listing written by the compiled loop (`copylisting._written`: the loops compiled first)
    or made in Python (`_listed`, as while they compile, or for IDs that are not ASCII)."""
    import worker.copylisting
    import worker.snapshot

    few, written = request.param
    if written:
        loops_compiled()
    else:
        monkeypatch.setattr(worker.copylisting, "_written", lambda *args: None)
    if few < 0:
        monkeypatch.setattr(worker.snapshot, "_SCAN_SHARE", 2**62)
    else:
        monkeypatch.setattr(worker.snapshot, "_SCAN_SHARE", 0)
        monkeypatch.setattr(worker.snapshot, "_FEW_HITS", few)
    return int(few)


@pytest.fixture(params=["as-set", "tables-from-3-rows", "binary-searches"])
def direct_tables(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a snapshot copy's tiers find a probe's postings: as configured (tables of every band value for bands up
    to 20 bits, and for wider ones in large tiers only), or with tables in every tier of 3 rows or more whatever
    the bands' width up to 24 bits (so that 22-bit bands meet tables, and one search meets tiers of both kinds), or
    with binary searches in every tier; in this process's copies."""
    import worker.snapshot

    if request.param == "tables-from-3-rows":
        monkeypatch.setattr(worker.snapshot.MemoryIndex, "_direct", lambda self, rows: self._widest <= 24 and rows >= 3)
    elif request.param == "binary-searches":
        monkeypatch.setattr(worker.snapshot.MemoryIndex, "_direct", lambda self, rows: False)
    return str(request.param)


# -- the commands in this process, against a real server and fakeredis's TCP server --------------------------------


@pytest.fixture(params=["real", "fake"])
def cli_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a clean Redis for `worker.cli.main` run in this process: the session's real redis-server, or
    fakeredis's TCP server started for this test."""
    if request.param == "real":
        server: RedisServer = request.getfixturevalue("server")
        yield server.url
        return
    from fakeredis import TcpFakeServer

    port = free_port()
    fake = TcpFakeServer(("127.0.0.1", port), server_version=(7, 0))
    thread = threading.Thread(target=fake.serve_forever, name="fake-redis", daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)


@pytest.fixture
def cli_admin(cli_redis_url: str) -> Iterator[redis.Redis]:
    """A client of that Redis (bytes replies), emptied, with the functions loaded (the administrator's step)."""
    client = redis.Redis.from_url(cli_redis_url)
    client.flushall()
    client.function_flush()
    library.load(client)
    yield client
    client.close()


@pytest.fixture
def cli_env(cli_redis_url: str, no_worker_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' environment: that Redis, nothing else from the caller's shell."""
    monkeypatch.setenv("INCIDENT_WORKER_REDIS_URL", cli_redis_url)
