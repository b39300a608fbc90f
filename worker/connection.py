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
from redis.retry import Retry

from .logs import hide_secrets
from .settings import Settings

__all__ = ["RedisClient", "connect"]

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
"""A standalone or cluster redis-py client, decoding responses or not."""


def connect(settings: Settings, *, decode_responses: bool = False, client_name: str | None = None) -> RedisClient:
    """A redis-py client for `settings.redis_url` (a cluster client when `settings.cluster`).

    redis-py retries a command three times on a dropped connection, with jittered exponential backoff; the worker's
    own loop handles longer outages. The worker itself needs `decode_responses=False` (see StreamWorker).
    """
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": min(5.0, settings.socket_timeout_s),
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=min(2.0, settings.reconnect_max_backoff_s)), 3),
        "health_check_interval": 30,
        "client_name": client_name or f"incident-worker:{settings.consumer}",
    }
    # whatever goes wrong from here on, its message and log lines show none of the URL's secrets
    hide_secrets(*settings.secrets())
    url = settings.redis_url.get_secret_value()
    if settings.cluster:
        options.pop("health_check_interval")
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)
