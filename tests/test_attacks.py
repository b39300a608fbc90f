"""The second attack on reliability and security, one test a finding, each on a real redis-server loaded with the
shipped ACL (deploy/redis/users.acl) and, where it matters, the shipped redis.conf's limits.

Every test here failed on the build the attack was made against; each is bounded in time. Run them alone against any
build with `pytest tests/test_attacks.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import FAST, require_redis_server
from tests.redis_server import RedisServer
from tests.streams import alerts, assert_pairs_reported_once, fingerprints, pending_count, publish, start_worker
from tests.test_deploy import PASSWORDS, USER_PASSWORDS, WORKER_USER, render_acl, worker_url
from worker import library
from worker.devtools.workload import Workload

FP = "{incidents}:fp"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (its memory limit may be changed) whose users are the rendered users.acl,
    noeviction as redis.conf sets it, and the library loaded by the admin."""
    require_redis_server()
    result = render_acl(tmp_path / "users.acl")
    assert result.returncode == 0, result.stderr
    server = RedisServer(tmp_path, extra=["--aclfile", str(tmp_path / "users.acl"), "--maxmemory-policy", "noeviction"])
    server.start()
    try:
        with admin_of(server) as admin:
            library.load(admin)
        yield server
    finally:
        server.stop()


def admin_of(server: RedisServer, **kwargs: object) -> redis.Redis:
    return server.client(username="admin", password=PASSWORDS["REDIS_ADMIN_PASSWORD"], **kwargs)


def user_of(server: RedisServer, user: str, **kwargs: object) -> redis.Redis:
    return server.client(username=user, password=PASSWORDS[USER_PASSWORDS[user]], **kwargs)


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


# -- 1. at maxmemory, a worker holds its batch and keeps its heartbeat as the ACL user --------------------------------


@pytest.mark.parametrize("acl", ["shipped", "without-pexpire"])
def test_worker_of_the_acl_user_holds_its_batch_at_maxmemory(acl_redis: RedisServer, tmp_path: Path, acl: str) -> None:
    admin = admin_of(acl_redis)
    if acl == "without-pexpire":  # a user made from an older users.acl
        admin.acl_setuser(WORKER_USER, enabled=True, commands=["-pexpire"])
    events = [{"incident_id": i, "features": bag} for i, bag in Workload(seed=21).take(3000)]
    publish(admin, events)
    log = tmp_path / "w.log"
    # a short heartbeat TTL: several beats fall inside the spell
    worker = start_worker(
        worker_url(acl_redis), "--until-idle", log=log, heartbeat_ttl_ms=1000, reconnect_max_backoff_s=0.3, **FAST
    )
    try:
        _wait_for(lambda: admin.hlen(FP) >= 100 or worker.poll() is not None, 30, "the worker to be at work")
        admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) + 100_000))
        _wait_for(lambda: "out of memory" in log.read_text() or worker.poll() is not None, 30, "the spell")
        time.sleep(2.5)  # beats every 1/3 s, each SET refused
        assert worker.poll() is None, log.read_text()[-3000:]
        [consumer] = admin.zrange("{incidents}:workers", 0, -1)
        if acl == "shipped":
            assert admin.exists(b"{incidents}:heartbeat:" + consumer), "the heartbeat lapsed: `check` says it is dead"
        else:
            assert "+pexpire" in log.read_text()
        admin.config_set("maxmemory", "0")
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        admin.config_set("maxmemory", "0")
    fps = fingerprints(events)
    assert {k.decode(): int(v, 16) for k, v in admin.hgetall(FP).items()} == fps
    assert_pairs_reported_once(fps, alerts(admin))
    assert pending_count(admin) == 0
    refused = {entry["object"] for entry in admin.acl_log()} - {"client|setinfo"}
    assert refused == ({"pexpire"} if acl != "shipped" else set()), "the worker was refused something it swallowed"
