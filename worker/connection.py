"""Redis clients built from the settings: standalone or cluster, with timeouts and retries sized for the worker.

`RedisClient` is the type every function of the package that talks to Redis takes: a redis-py `Redis` (fakeredis's
clients are ones) or a `RedisCluster`. The client is made here, by `connect`, and passed in; nothing deeper in the
package creates one.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from .errors import UsageError
from .logs import hide_secrets, redact
from .settings import Settings

__all__ = ["RedisClient", "connect"]

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
"""A standalone or cluster redis-py client, decoding responses or not."""


def connect(
    settings: Settings,
    *,
    decode_responses: bool = False,
    client_name: str | None = None,
    timeout_s: float | None = None,
    retries: int = 3,
) -> RedisClient:
    """A redis-py client for `settings.redis_url`: a cluster client when `settings.cluster`, the current primary of
    `settings.sentinel_service` when `settings.sentinels` are given (redis-py asks the Sentinels again after a
    failover, and drops a connection that meets READONLY from a demoted primary).

    redis-py retries a command `retries` times on a dropped connection, with jittered exponential backoff; the
    worker's own loop handles longer outages. `timeout_s` overrides the socket timeouts (the watchdog's PINGs). The
    worker itself needs `decode_responses=False` (see StreamWorker).
    """
    timeout = settings.socket_timeout_s if timeout_s is None else timeout_s
    backoff = ExponentialWithJitterBackoff(base=0.05, cap=min(2.0, settings.reconnect_max_backoff_s))
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout,
        "socket_connect_timeout": min(5.0, timeout),
        "retry": Retry(backoff, retries),
        "health_check_interval": 30,
        "client_name": client_name or f"incident-worker:{settings.consumer}",
    }
    # whatever goes wrong from here on, its message and log lines show none of the URL's secrets
    hide_secrets(*settings.secrets())
    url = settings.redis_url.get_secret_value()
    if settings.cluster:
        options.pop("health_check_interval")
        return _cluster(settings, url, options)
    if settings.sentinels:
        return _sentinel_primary(settings, url, options)
    return redis.Redis.from_url(url, **options)


def _cluster(settings: Settings, url: str, options: dict[str, Any]) -> RedisCluster:
    """The cluster client; a server that is not a Redis Cluster is a configuration mistake (UsageError, exit 2), a
    cluster that cannot be reached is a connection error, both said in one line instead of redis-py's traceback."""
    try:
        return RedisCluster.from_url(url, **options)
    except RedisClusterException as error:
        text = redact(str(error))
        if "cluster mode is not enabled" in text.lower() or "cluster support disabled" in text.lower():
            raise UsageError(
                f"Redis at {settings.safe_redis_url} is not a Redis Cluster (its cluster support is disabled), but "
                "cluster mode was asked for: drop --cluster (INCIDENT_WORKER_CLUSTER=false), or point the URL at a "
                "node of the cluster"
            ) from None
        raise redis.ConnectionError(text.removeprefix("Redis Cluster cannot be connected. ")) from None


def _sentinel_credentials(settings: Settings) -> dict[str, str]:
    credentials: dict[str, str] = {}
    if settings.sentinel_username:
        credentials["username"] = settings.sentinel_username
    if settings.sentinel_password is not None:
        credentials["password"] = settings.sentinel_password.get_secret_value()
    return credentials


def _sentinel_primary(settings: Settings, url: str, options: dict[str, Any]) -> redis.Redis:
    """The primary of the Sentinel service: host and port come from the Sentinels, the rest of redis_url (user,
    password, database, TLS) still applies to the primary. Sentinels are asked with the same timeouts and their own
    credentials, `sentinel_username` and `sentinel_password` (none by default)."""
    parsed = parse_url(url)
    for field in ("host", "port", "path", "connection_class"):
        parsed.pop(field, None)
    sentinel = Sentinel(
        settings.sentinel_addresses,
        socket_timeout=options["socket_timeout"],
        sentinel_kwargs={
            "socket_timeout": options["socket_timeout"],
            "socket_connect_timeout": options["socket_connect_timeout"],
            **_sentinel_credentials(settings),
        },
    )
    client: redis.Redis = sentinel.master_for(settings.sentinel_service, **{**options, **parsed})
    return client
