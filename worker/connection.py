"""Redis clients built from the settings: standalone or cluster, with timeouts and retries sized for the worker.

`RedisClient` is the type every function of the package that talks to Redis takes: a redis-py `Redis` (fakeredis's
clients are ones) or a `RedisCluster`. The client is made here, by `connect`, and passed in; nothing deeper in the
package creates one.
"""

from __future__ import annotations

import os
import ssl
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
    check_tls_files(url)
    if settings.cluster:
        options.pop("health_check_interval")
        return _cluster(settings, url, options)
    if settings.sentinels:
        return _sentinel_primary(settings, url, options)
    return redis.Redis.from_url(url, **options)


class _NoPassphraseError(Exception):
    """An encrypted key, and no ssl_password to open it."""


def _no_passphrase() -> str:
    # without ssl_password, OpenSSL would ask for an encrypted key's passphrase on the terminal (and wait)
    raise _NoPassphraseError


def check_tls_files(url: str) -> None:
    """Read a rediss:// URL's certificate and key files as its connections will, before the first one.

    redis-py reads them at each connection attempt, and a missing or unreadable file then fails as a connection
    error that names no file ("Error 2 connecting to host:6379. No such file or directory", "[SSL] PEM lib"): the
    worker retried it as an outage, forever. A mistake in them is one of configuration (UsageError, exit 2), said
    with the setting and the path (never the key's passphrase).
    """
    if not url.lower().startswith("rediss://"):
        return
    params = parse_url(url)
    certfile, keyfile = params.get("ssl_certfile"), params.get("ssl_keyfile")
    ca_certs, ca_path = params.get("ssl_ca_certs"), params.get("ssl_ca_path")
    for name, path, directory in (
        ("ssl_ca_certs", ca_certs, False),
        ("ssl_ca_path", ca_path, True),
        ("ssl_certfile", certfile, False),
        ("ssl_keyfile", keyfile, False),
    ):
        if not path:
            continue
        kind = "directory" if directory else "file"
        if not (os.path.isdir(path) if directory else os.path.isfile(path)):
            raise UsageError(
                f"the Redis URL's {name}={path!r} names no {kind} here; give the path of the {kind} as this "
                "process sees it (in a container: where the secret is mounted)"
            )
        if not os.access(path, os.R_OK | (os.X_OK if directory else 0)):
            raise UsageError(
                f"the Redis URL's {name}={path!r} cannot be read by this process (uid {os.getuid()}); "
                f"make the {kind} readable to it"
            )
    if keyfile and not certfile:
        raise UsageError(
            "the Redis URL gives ssl_keyfile but no ssl_certfile: a client certificate is the pair, give the "
            "certificate as ssl_certfile too"
        )
    context = ssl.create_default_context()
    if certfile:
        password = params.get("ssl_password")
        try:
            context.load_cert_chain(certfile, keyfile, password=_no_passphrase if password is None else password)
        except _NoPassphraseError:
            raise UsageError(
                f"the private key in {keyfile or certfile!r} is encrypted: give its passphrase as the Redis URL's "
                "ssl_password (percent-encoded)"
            ) from None
        except (ssl.SSLError, ValueError):
            pair = f"ssl_certfile={certfile!r}" + (f" with ssl_keyfile={keyfile!r}" if keyfile else "")
            raise UsageError(
                f"the Redis URL's {pair}: not a PEM certificate and its private key, or ssl_password does not "
                "open the key; check the files (openssl x509 -in CERT -noout; openssl pkey -in KEY -noout) and the "
                "passphrase"
            ) from None
    if ca_certs:
        try:
            context.load_verify_locations(cafile=ca_certs)
        except ssl.SSLError:
            raise UsageError(
                f"the Redis URL's ssl_ca_certs={ca_certs!r} holds no PEM certificate; give the file of the "
                "certificate authority that signed the server's certificate"
            ) from None


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
    password, database, TLS with rediss://) still applies to the primary (the Sentinels themselves are asked without
    TLS). Sentinels are asked with the same timeouts and their own
    credentials, `sentinel_username` and `sentinel_password` (none by default)."""
    parsed = parse_url(url)
    for field in ("host", "port", "path"):
        parsed.pop(field, None)
    # rediss:// makes parse_url name SSLConnection; Sentinel's pool picks its own connection class and takes TLS
    # from `ssl` alone: without it the primary was reached in plain text (password included), whatever the URL said
    if parsed.pop("connection_class", None) is not None and url.lower().startswith("rediss://"):
        parsed["ssl"] = True
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
