"""`incident-worker check`: the health check behind Docker's HEALTHCHECK and Kubernetes probes.

Light on purpose: a probe runs it every few seconds, so it imports neither the index, the metrics server nor the
benchmark (tests/test_commands.py pins that).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ..connection import RedisClient
from ..formats import Heartbeat
from ..keys import IndexKeys
from ..replies import text
from ..settings import ENV_PREFIX, Settings
from ._format import json_line, shown
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    LIFECYCLE,
    add_settings_flags,
    command_client,
    describe,
    error_text,
    json_flag,
    setting_given,
    with_settings,
)

__all__ = ["Health", "check_health", "configure", "live_heartbeats"]

CHECK_TIMEOUT_S = 2.0
"""Health checks must answer well within a Docker or Kubernetes probe's timeout."""

WAIT_STEP_S = 2.0
"""How often `check --wait` asks again."""

LISTED_HEARTBEATS = 1000
"""Names of `{N}:workers` read at most (the newest heartbeats first): enough for any deployment, and bounded for a
probe."""


def live_heartbeats(client: RedisClient, keys: IndexKeys, consumer: str | None = None) -> list[Heartbeat]:
    """The live heartbeats of one consumer, or of the workers of the namespace: those `{N}:workers` names (at most
    LISTED_HEARTBEATS, newest first) whose heartbeat key is alive. Two commands, whatever the size of the keyspace."""
    if consumer is not None:
        names = [keys.heartbeat(consumer)]
    else:
        # ZRANGE ... REV: redis-py's zrange(desc=True) sends ZREVRANGE, which the worker's user need not have
        registered = client.execute_command("ZRANGE", keys.workers, 0, LISTED_HEARTBEATS - 1, "REV")
        names = [keys.heartbeat(text(name)) for name in registered]
    if not names:
        return []
    prefix = keys.heartbeat("")
    return sorted(
        (
            Heartbeat.from_value(name, name.removeprefix(prefix), value)
            for name, value in zip(names, client.mget(names), strict=True)
            if value is not None  # expired (a crashed worker's name, forgotten within the hour)
        ),
        key=lambda beat: beat.consumer,
    )


def on_host(beat: Heartbeat, host: str) -> bool:
    """Whether the worker beating runs on `host`: it says so, or (a worker that does not) its name is the default
    `<host>-<pid>`."""
    if beat.host is not None:
        return beat.host == host
    return beat.consumer.startswith(f"{host}-")


@dataclass
class Health:
    """The verdict of a check: healthy or not, why, and the heartbeats it rests on."""

    healthy: bool
    message: str
    redis: str
    namespace: str
    workers: list[Heartbeat] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "redis": self.redis,
            "namespace": self.namespace,
            "workers": [beat.model_dump(exclude_none=True) for beat in self.workers],
            "message": self.message,
            "warnings": self.warnings,
        }


def _beats_text(beats: list[Heartbeat], now: float) -> str:
    parts = []
    for beat in beats:
        ago = f"beat {max(0.0, now - beat.at):.1f} s ago" if beat.at is not None else "beating"
        where = f" on {shown(beat.host)}" if beat.host else ""
        processed = "?" if beat.processed is None else beat.processed
        parts.append(f"{shown(beat.consumer)}{where} {ago}, processed {processed}")
    return "; ".join(parts)


def check_health(
    client: RedisClient, settings: Settings, *, consumer: str | None, redis_only: bool, host: str
) -> Health:
    """Redis answers PING, and a heartbeat is alive: the consumer's, or (no consumer given) one of a worker of this
    host, whatever its consumer name. Never raises for Redis errors: they make the verdict unhealthy."""
    url, namespace = settings.safe_redis_url, settings.namespace
    try:
        client.ping()
        if redis_only:
            return Health(True, f"Redis answers at {url}", url, namespace)
        beats = live_heartbeats(client, settings.keys, consumer)
    except redis.RedisError as error:
        if isinstance(error, redis.ResponseError) and "WRONGTYPE" in str(error):
            from ..keytypes import another_type, held_type  # only now: the probe stays light

            key = settings.keys.workers
            return Health(False, another_type(settings.keys, key, "zset", held_type(client, key)), url, namespace)
        return Health(False, f"Redis at {url} does not answer: {error_text(error)}", url, namespace)
    now = time.time()
    if consumer is not None:
        if beats:
            return Health(True, f"Redis answers at {url}; {_beats_text(beats, now)}", url, namespace, beats)
        return Health(
            False,
            f"no live heartbeat of consumer {consumer!r} ({settings.keys.heartbeat(consumer)}): the worker is not "
            "running, has not started yet (use --redis-only for readiness), or stopped beating for longer than "
            "heartbeat_ttl_ms",
            url,
            namespace,
        )
    here = [beat for beat in beats if on_host(beat, host)]
    if here:
        return Health(True, f"Redis answers at {url}; {_beats_text(here, now)}", url, namespace, here)
    elsewhere = f"; live elsewhere: {_beats_text(beats, now)} (check one with --consumer NAME)" if beats else ""
    return Health(
        False,
        f"no live heartbeat of a worker on host {host!r} in namespace {namespace!r}: the worker is not running, "
        "has not started yet (use --redis-only for readiness), or stopped beating for longer than "
        f"heartbeat_ttl_ms{elsewhere}",
        url,
        namespace,
        beats,
    )


def check_functions(client: RedisClient, settings: Settings) -> Health:
    """Redis answers and holds the functions library of this version of the code (what a worker needs to start).

    Asked as the worker asks: one read-only call of a library function (FCALL_RO, which the worker's Redis user may
    send; FUNCTION LIST is an administrator's command). Any reply but "function not found" means it is there: the
    call writes nothing, and a namespace without its meta yet answers with an error of the library's own."""
    from .. import library  # only for this check: the liveness probe stays light

    url, namespace = settings.safe_redis_url, settings.namespace
    try:
        client.fcall_ro(library.FN_MATCHES, 1, settings.keys.meta)
    except redis.ResponseError as error:
        if library.is_missing_function(error):
            return Health(False, library.missing_message(), url, namespace)
    except redis.RedisError as error:
        return Health(False, f"Redis at {url} does not answer: {error_text(error)}", url, namespace)
    return Health(True, f"Redis at {url} holds the functions library {library.LIBRARY_NAME}", url, namespace)


def _one_check(args: argparse.Namespace, settings: Settings) -> Health:
    consumer = settings.consumer if setting_given(args, "consumer") else None
    try:
        client = command_client(settings, "check", timeout=CHECK_TIMEOUT_S)
    except redis.RedisError as error:  # the client itself could not be made (a cluster that does not answer)
        url = settings.safe_redis_url
        return Health(False, f"Redis at {url} does not answer: {error_text(error)}", url, settings.namespace)
    try:
        if args.functions:
            return check_functions(client, settings)
        health = check_health(
            client, settings, consumer=consumer, redis_only=args.redis_only, host=socket.gethostname()
        )
        if not args.redis_only:
            health.warnings = _warnings(client, settings, memory=args.capacity)
        return health
    finally:
        client.close()  # --wait makes one a try


@with_settings("check")
def _check(args: argparse.Namespace, settings: Settings) -> int:
    health = _one_check(args, settings)
    if args.wait and not health.healthy:
        # an init container's wait: one line now, one when it is over, and a try every WAIT_STEP_S in between
        print(f"waiting up to {args.wait:g} s: {health.message}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.wait
        while not health.healthy and time.monotonic() < deadline:
            time.sleep(min(WAIT_STEP_S, max(0.0, deadline - time.monotonic())))
            health = _one_check(args, settings)
    if args.json:
        print(json_line(health.as_json()))
        return EXIT_OK if health.healthy else EXIT_FAILURE
    if health.healthy:
        print(f"healthy: {health.message}")
    else:
        print(f"unhealthy: {health.message}", file=sys.stderr)
    for warning in health.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK if health.healthy else EXIT_FAILURE


def _warnings(client: RedisClient, settings: Settings, *, memory: bool) -> list[str]:
    """What will fill Redis unless someone acts (they never make the verdict unhealthy: a restart would not help)."""
    from ..upkeep import warnings  # the probe imports the index's code only when it gets this far

    try:
        return warnings(client, settings, memory="asked" if memory else False)
    except redis.RedisError:
        return []  # a user without XINFO or INFO still gets its liveness verdict


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Exit 0 when Redis answers PING and a worker's heartbeat key is alive, else exit 1 with a one-line "
        "reason on stderr. The worker refreshes {N}:heartbeat:<consumer> (a key with a TTL of heartbeat_ttl_ms) "
        f"while its loop runs and deletes it on a clean stop. With --consumer or {ENV_PREFIX}CONSUMER set, that "
        "consumer's key is checked; otherwise any worker running on this host counts, whatever its consumer name "
        "(and when none does, the message names the workers alive elsewhere), found in {N}:workers, which each "
        "heartbeat writes: a few commands, whatever the size of the keyspace. Socket timeouts are 2 s. Warnings "
        "go to stderr without changing the verdict: a consumer group of the events stream that stopped reading, "
        "and with --capacity Redis using over 80% of maxmemory.",
        examples="""
  HEALTHCHECK --interval=30s --timeout=5s CMD incident-worker check
  livenessProbe:  exec: {command: [incident-worker, check]}
  readinessProbe: exec: {command: [incident-worker, check, --redis-only]}
  incident-worker check --consumer worker-0 --json
  initContainers: [{args: [check, --functions, --wait, "600"]}]   # hold the workers until load-functions ran
""",
        exits="""
  0  healthy
  1  unhealthy: Redis does not answer, or no live heartbeat (reason on stderr)
  2  bad usage or settings
""",
    )
    parser.add_argument(
        "--redis-only",
        action="store_true",
        help="only check that Redis answers (readiness before the worker's first heartbeat)",
    )
    parser.add_argument(
        "--functions",
        action="store_true",
        help="check that Redis holds the functions library of this version (what `load-functions` loads) instead "
        "of a heartbeat: for an init container that holds the workers back until it is there",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ask again every 2 s for up to SECONDS until healthy (default 0: once)",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="also warn when Redis uses over 80%% of maxmemory (reads INFO, which the "
        "least-privilege worker user of deploy/redis/users.acl may not run)",
    )
    json_flag(parser, "the verdict and the live heartbeats as one JSON object")
    add_settings_flags(parser, only=[*CONNECTION, "consumer", "group", "events_stream", *LIFECYCLE])
    parser.set_defaults(handler=_check)
