"""Redis Cluster: a real local cluster of three masters, two namespaces, workers for each, the usual invariants."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from tests.conftest import IN_CI
from tests.redis_server import RedisServer, free_port
from tests.streams import (
    FAST,
    assert_pairs_reported_once,
    clean_env,
    fingerprints,
    publish,
    start_worker,
    wait_until,
    worker_command,
)
from worker import inbox, library
from worker.devtools.workload import Workload
from worker.formats import Alert, DeadLetter
from worker.index import FingerprintIndex


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    servers = _start_cluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=0)
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def _namespaces_on_different_masters(client: RedisCluster) -> tuple[str, str]:
    """Two namespace names whose hash tags live on different masters."""
    first = "incidents"
    home = client.get_node_from_key("{incidents}:fp").name
    for n in range(100):
        other = f"tenant{n}"
        if client.get_node_from_key(f"{{{other}}}:fp").name != home:
            return first, other
    raise AssertionError("no namespace on another master")


@pytest.mark.slow
def test_two_namespaces_on_a_three_master_cluster(cluster: list[RedisServer], tmp_path: Path) -> None:
    url = cluster[0].url
    client = RedisCluster.from_url(url)
    first, second = _namespaces_on_different_masters(client)
    workloads = {first: Workload(seed=21).take(1500), second: Workload(seed=22).take(1500)}
    for namespace, items in workloads.items():
        pipe = client.pipeline(transaction=False)
        for n, (incident_id, bag) in enumerate(items):
            event = {"incident_id": incident_id, "features": _json(bag)}
            if n % 3 == 0:  # a third through the producers' inbox, which each read round moves into the stream
                pipe.rpush(f"{{{namespace}}}:inbox", inbox.encode(event))
            else:
                pipe.xadd(f"{{{namespace}}}:events", event)
            if n % 97 == 0:
                pipe.xadd(f"{{{namespace}}}:events", {"incident_id": f"bad-{n}", "features": "[]"})
        pipe.execute()
    # the deployment's administrator step, through the real entry point: the library on every master
    loaded = subprocess.run(
        [*worker_command(), "load-functions", "--cluster", "--admin-redis-url", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    for server in cluster:
        with server.client() as node:
            assert library.installed_versions(node) == [library.LIBRARY_NAME]
    workers = [
        start_worker(
            url,
            "--until-idle",
            log=tmp_path / f"{namespace}-{k}.log",
            cluster="true",
            namespace=namespace,
            consumer=f"{namespace}-{k}",
            batch_size=50,
            # one namespace searches inside the atomic step, the other on each worker's own validated copy
            read_path="snapshot" if namespace == second else "primary",
            **FAST,
        )
        for namespace in workloads
        for k in range(2)
    ]
    codes = [w.wait(timeout=300) for w in workers]
    assert codes == [0, 0, 0, 0], [
        (tmp_path / f).read_text()[-2000:] for f in sorted(p.name for p in tmp_path.iterdir())
    ]

    for namespace, items in workloads.items():
        events = [{"incident_id": i, "features": bag} for i, bag in items]
        fps = fingerprints(events)
        stored = {k.decode(): int(v, 16) for k, v in client.hgetall(f"{{{namespace}}}:fp").items()}
        assert stored == fps
        alerts = [Alert.from_fields(f) for _, f in client.xrange(f"{{{namespace}}}:alerts")]
        assert_pairs_reported_once(fps, alerts)
        dead = [DeadLetter.from_fields(f) for _, f in client.xrange(f"{{{namespace}}}:dead")]
        assert len(dead) == len(range(0, 1500, 97)) and {d.reason for d in dead} == {"bad_features"}
        assert int(client.xpending(f"{{{namespace}}}:events", "incident-workers")["pending"]) == 0
        assert client.exists(f"{{{namespace}}}:inbox") == 0
        index = FingerprintIndex(client, namespace)
        incident_id, bag = items[0]
        assert (incident_id, 0) in index.matches(bag)
        assert index.stats()["incidents"] == len(fps)
    # every key of a namespace sits on the master that owns its hash tag
    for namespace in workloads:
        node = client.get_node_from_key(f"{{{namespace}}}:fp")
        with redis.Redis(host=node.host, port=node.port) as direct:
            assert direct.hlen(f"{{{namespace}}}:fp") == len(workloads[namespace])
    client.close()


@pytest.mark.slow
def test_a_live_move_and_an_integrity_check_on_a_cluster(cluster: list[RedisServer]) -> None:
    """migrate and verify walk the keys of their index on the master of its slot (a cluster client's SCAN would
    answer a cursor per master, which a walk cannot resume from): the move ends in the new layout, exact."""
    import random

    url = cluster[0].url
    client = RedisCluster.from_url(url)
    loaded = subprocess.run(
        [*worker_command(), "load-functions", "--cluster", "--admin-redis-url", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    rng = random.Random(5)
    base = [rng.getrandbits(64) for _ in range(40)]
    fps = {f"m{n}": base[n % 40] ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64)) for n in range(800)}
    index = FingerprintIndex(client, "moving", 4, 7)
    for incident_id, fp in fps.items():
        index.add_fingerprint(incident_id, fp)
    env = clean_env(redis_url=url, cluster="true", namespace="moving")
    for args in (["migrate", "--bands", "3", "--batch", "50"], ["verify"]):
        done = subprocess.run([*worker_command(), *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    moved = FingerprintIndex(client, "moving", 3, 7)
    assert FingerprintIndex.read_meta(client, "moving")["bands"] == "3"
    for query in base[:10]:
        expected = sorted((i, (fp ^ query).bit_count()) for i, fp in fps.items() if (fp ^ query).bit_count() <= 7)
        assert sorted(moved.matches_of(query)) == expected
    node = client.get_node_from_key("{moving}:fp")
    with redis.Redis(host=node.host, port=node.port) as home:
        assert not home.keys("{moving}:band:[0-9]*"), "the old layout's postings are all removed"
    client.close()


def _json(bag: dict[str, int]) -> str:
    import json

    return json.dumps(bag)


# -- a failover inside the cluster --------------------------------------------------------------------------------


def _start_cluster(base: Path, masters: int, replicas: int) -> list[RedisServer]:
    """`masters` * (1 + `replicas`) nodes made into one cluster by redis-cli, every slot served when it returns."""
    if shutil.which("redis-cli") is None or shutil.which("redis-server") is None:
        message = "redis-server and redis-cli are needed for the cluster tests"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    servers: list[RedisServer] = []
    for k in range(masters * (1 + replicas)):
        directory = base / f"node{k}"
        directory.mkdir(parents=True)
        server = RedisServer(
            directory,
            port=free_port(cluster=True),
            extra=["--cluster-enabled", "yes", "--cluster-config-file", str(directory / "nodes.conf"),
                   "--cluster-node-timeout", "5000"],
        )  # fmt: skip
        server.start()
        servers.append(server)
    try:
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        wait_until(lambda: all(s.client().cluster("info")["cluster_state"] == "ok" for s in servers), 60, "cluster ok")
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


@pytest.mark.slow
def test_a_worker_follows_its_namespace_to_the_promoted_replica(tmp_path: Path) -> None:
    """CLUSTER FAILOVER moves the namespace's slot to the replica while a worker processes the stream: the worker
    follows the redirection to the new master (waiting out what the switch refuses), and the index, the alerts and
    the pending list end as without the failover."""
    servers = _start_cluster(tmp_path / "cluster", masters=3, replicas=1)
    worker = None
    try:
        url = servers[0].url
        client = RedisCluster.from_url(url)
        items = Workload(seed=31).take(2000)
        events = [{"incident_id": incident_id, "features": bag} for incident_id, bag in items]
        loaded = subprocess.run(
            [*worker_command(), "load-functions", "--cluster", "--admin-redis-url", url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert loaded.returncode == 0, loaded.stderr
        publish(client, [{**e, "features": _json(e["features"])} for e in events[:1000]])
        worker = start_worker(url, log=tmp_path / "worker.log", cluster="true", batch_size=20, **FAST)
        wait_until(lambda: client.hlen("{incidents}:fp") >= 300, 120, "the worker to index 300 incidents")

        home = client.get_node_from_key("{incidents}:fp")
        with redis.Redis(host=home.host, port=home.port) as old_master:
            master_id = old_master.execute_command("CLUSTER", "MYID")
            known: list[Any] = []

            def replica_known() -> bool:  # a cluster is "ok" before every master has heard of its replica
                known[:] = old_master.execute_command("CLUSTER", "REPLICAS", master_id)
                return bool(known)

            wait_until(replica_known, 60, "the master to know its replica")
            replica_line = known[0]
        replica_address = (replica_line.decode() if isinstance(replica_line, bytes) else replica_line).split()[1]
        host, _, port = replica_address.split("@")[0].rpartition(":")
        with redis.Redis(host=host, port=int(port)) as replica:
            wait_until(lambda: replica.info("replication")["master_link_status"] == "up", 30, "the replica's link")
            replica.execute_command("CLUSTER", "FAILOVER")
            wait_until(lambda: replica.info("replication")["role"] == "master", 60, "the replica's promotion")
        # the rest arrives after the switch, through a client that follows the redirection
        after = RedisCluster.from_url(url)

        def owner_is_the_promoted_replica() -> bool:
            after.nodes_manager.initialize()  # the client keeps the slot map it read: ask the cluster again
            return bool(after.get_node_from_key("{incidents}:fp").port == int(port))

        wait_until(owner_is_the_promoted_replica, 60, "the new slot owner")
        publish(after, [{**e, "features": _json(e["features"])} for e in events[1000:]])
        fps = fingerprints(events)
        wait_until(lambda: after.hlen("{incidents}:fp") == len(fps), 240, "every incident indexed after the failover")
        pending = lambda: int(after.xpending("{incidents}:events", "incident-workers")["pending"])  # noqa: E731
        wait_until(lambda: pending() == 0, 60, "no entry pending")
        worker.terminate()
        assert worker.wait(timeout=30) == 0
        log = (tmp_path / "worker.log").read_text()

        stored = {k.decode(): int(v, 16) for k, v in after.hgetall("{incidents}:fp").items()}
        assert stored == fps, log[-2000:]
        assert_pairs_reported_once(fps, [Alert.from_fields(f) for _, f in after.xrange("{incidents}:alerts")])
        assert after.xlen("{incidents}:dead") == 0, log[-2000:]
        after.close()
        client.close()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        for server in servers:
            server.stop()
