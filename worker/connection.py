"""Redis clients built from the settings: standalone or cluster, with timeouts and retries sized for the worker.

`RedisClient` is the type every function of the package that talks to Redis takes: a redis-py `Redis` (fakeredis's
clients are ones) or a `RedisCluster`. The client is made here, by `connect`, and passed in; nothing deeper in the
package creates one.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Callable
from typing import Any, TypeAlias

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from .errors import UsageError
from .logs import error_message, hide_secrets, redact
from .settings import ENV_PREFIX, Settings

__all__ = ["RedisClient", "connect", "connect_replica", "tls_port_hint"]

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


REPLICA_TIMEOUT_S = 2.0
"""Socket timeout of the snapshot's replica (at most socket_timeout_s): its reads are a few milliseconds, and a hung
replica is left for the primary after this long instead of holding the worker for the primary's timeout."""


def connect_replica(settings: Settings) -> redis.Redis | None:
    """A client of `settings.snapshot_replica_url` (None when unset), for the snapshot's reads: the copy's load and
    the change log it follows. With `sentinel`, a replica the Sentinels name for the service (redis-py's slave_for,
    which takes another replica, or the primary when none answers), with redis_url's credentials and TLS.

    No retries and a short timeout: the read path leaves a replica that fails for the primary (worker/readpath.py).
    """
    if settings.snapshot_replica_url is None:
        return None
    timeout = min(REPLICA_TIMEOUT_S, settings.socket_timeout_s)
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 0),
        "health_check_interval": 30,
        "client_name": f"incident-worker:{settings.consumer}:snapshot",
    }
    hide_secrets(*settings.secrets())
    if settings.replica_of_sentinels:
        url = settings.redis_url.get_secret_value()
        check_tls_files(url)
        return _sentinel_replica(settings, url, options)
    url = settings.snapshot_replica_url.get_secret_value()
    check_tls_files(url)
    return redis.Redis.from_url(url, **options)


class _NoPassphraseError(Exception):
    """An encrypted key, and no ssl_password to open it."""


def tls_port_hint(url: str, error: BaseException) -> str | None:
    """What to check when a `rediss://` URL's connection timed out: a port that does not speak TLS never answers the
    handshake, so the client waits out its connect timeout and says only that it timed out."""
    if not url.startswith("rediss://") or not (
        isinstance(error, redis.TimeoutError) or "timed out" in str(error).lower() or "timeout" in str(error).lower()
    ):
        return None
    return (
        "the URL asks for TLS (rediss://), and a port that does not speak TLS leaves the handshake unanswered until "
        "the timeout: check that the port is the server's TLS port (tls-port), or use redis:// for a plain one"
    )


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
    """The primary of the Sentinel service (`_sentinel_of`)."""
    sentinel, merged = _sentinel_of(settings, url, options)
    client: redis.Redis = sentinel.master_for(settings.sentinel_service, **merged)
    return client


def _sentinel_replica(settings: Settings, url: str, options: dict[str, Any]) -> redis.Redis:
    """A replica of the Sentinel service, reached as `_sentinel_primary` reaches the primary."""
    sentinel, merged = _sentinel_of(settings, url, options)
    client: redis.Redis = sentinel.slave_for(settings.sentinel_service, **merged)
    return client


def _sentinel_of(settings: Settings, url: str, options: dict[str, Any]) -> tuple[Sentinel, dict[str, Any]]:
    """The Sentinels of the service, and the options of its servers: host and port come from the Sentinels, the rest
    of redis_url (user, password, database, TLS with rediss://) still applies to the primary (and its replicas).
    Sentinels are asked with the same timeouts, their own credentials, `sentinel_username` and `sentinel_password`
    (none by default), and over TLS when `settings.sentinels_over_tls` (`sentinel_tls`; unset, when redis_url is
    rediss://), with redis_url's TLS options: a deployment's Sentinels and Redis servers usually present certificates
    of one authority (a CA file may hold several), and the worker's client certificate is the worker's whichever it
    talks to."""
    parsed = parse_url(url)
    for field in ("host", "port", "path"):
        parsed.pop(field, None)
    # rediss:// makes parse_url name SSLConnection; Sentinel's pool picks its own connection class and takes TLS
    # from `ssl` alone: without it the primary was reached in plain text (password included), whatever the URL said
    if parsed.pop("connection_class", None) is not None and url.lower().startswith("rediss://"):
        parsed["ssl"] = True
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": options["socket_timeout"],
        "socket_connect_timeout": options["socket_connect_timeout"],
        **_sentinel_credentials(settings),
    }
    if settings.sentinels_over_tls:
        if not parsed.get("ssl"):  # the settings refuse it, but load-functions' copy takes admin_redis_url unchecked
            raise UsageError(
                "sentinel_tls=true asks the Sentinels over TLS with the TLS options of a rediss:// URL, and this "
                "command's URL (admin_redis_url, for load-functions) is not one: give it as rediss:// too"
            )
        # the CA, client certificate and key, and every other TLS option of the URL; not its user or password,
        # which are the primary's
        sentinel_kwargs.update({name: value for name, value in parsed.items() if name.startswith("ssl_")}, ssl=True)
    sentinel = _Sentinel(
        settings.sentinel_addresses,
        advice=functools.partial(sentinel_advice, settings, parsed),
        socket_timeout=options["socket_timeout"],
        sentinel_kwargs=sentinel_kwargs,
    )
    return sentinel, {**options, **parsed}


class _Sentinel(Sentinel):
    """redis-py's Sentinel client, whose failure to find the primary also says what to check, when the failure
    tells (`advice`): redis-py says only what each Sentinel's connection met ("certificate verify failed",
    "Connection reset by peer"), and the worker repeats that in its retry lines and `check` prints it."""

    def __init__(self, *args: Any, advice: Callable[[str], str | None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._advice = advice

    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)
        except MasterNotFoundError as error:
            # redis-py's text quotes the repr of each Sentinel client (socket_timeout=... among its options): the
            # advice reads what each connection met, without it
            advice = self._advice(error_message(error, with_type=False))
            if advice is None:
                raise
            raise MasterNotFoundError(f"{str(error).rstrip(' .')}; {advice}") from None


# what redis-py's connection errors say (OpenSSL's words, and the socket's), lowercase, by what they mean here
_NOT_VERIFIED = "certificate verify failed"
_NO_TLS_ANSWER = ("wrong version number", "record layer failure", "packet length too long", "timeout", "timed out")
_CLOSED = (
    "eof occurred",
    "unexpected eof",
    "connection reset",
    "connection closed",
    "broken pipe",
    "certificate required",
    "bad certificate",
    "unknown ca",
)


def sentinel_advice(settings: Settings, parsed: dict[str, Any], failure: str) -> str | None:
    """What to check when no Sentinel named the primary, for the mistakes of TLS that `failure` (the text of redis-py's
    MasterNotFoundError) shows; None when it shows none of them. Names settings and paths, never a secret."""
    text = failure.lower()
    addresses = ",".join(f"{host}:{port}" for host, port in settings.sentinel_addresses)
    switch = f"{ENV_PREFIX}SENTINEL_TLS"
    if not settings.sentinels_over_tls:
        if not any(words in text for words in _CLOSED):
            return None
        if settings.sentinel_tls is False:
            ask_with_tls = f"unset {switch} (drop --no-sentinel-tls): with a rediss:// redis_url they are then"
        else:
            ask_with_tls = "give redis_url as rediss:// with its TLS options: the Sentinels are then"
        return (
            f"the Sentinels ({addresses}) asked without TLS: a Sentinel closed the connection, as a tls-port does "
            f"when spoken to in plain text; if the Sentinels listen with TLS, {ask_with_tls} asked over TLS too"
        )
    asked = f"the Sentinels ({addresses}) asked over TLS"
    ca_certs, ca_path = parsed.get("ssl_ca_certs"), parsed.get("ssl_ca_path")
    give_ca = (
        "give the file of the certificate authority that signed the Sentinels' certificates as ssl_ca_certs in "
        "redis_url's query (the Sentinels are asked with redis_url's TLS options, as the primary is)"
    )
    if _NOT_VERIFIED in text:
        if "mismatch" in text:
            return (
                f"{asked}: a Sentinel's certificate does not name the address it was asked at; give each Sentinel in "
                "sentinels by a host name or IP address its certificate holds (subjectAltName), or add the address "
                "to its certificate"
            )
        if "expired" in text or "not yet valid" in text:
            return f"{asked}: a Sentinel's certificate is out of its dates; renew it, and check this machine's clock"
        if ca_certs or ca_path:
            given = " and ".join(
                f"{name}={value!r}" for name, value in (("ssl_ca_certs", ca_certs), ("ssl_ca_path", ca_path)) if value
            )
            return f"{asked}: a Sentinel's certificate is not signed by the certificate authority of {given}; {give_ca}"
        return (
            f"{asked}: a Sentinel's certificate is not signed by an authority this machine trusts (redis_url gives "
            f"no ssl_ca_certs, so only the system's are); {give_ca}"
        )
    if any(words in text for words in _NO_TLS_ANSWER):
        return (
            f"{asked}: a port without TLS never answers the TLS handshake; give each Sentinel's tls-port in "
            f"sentinels, or, for Sentinels without TLS, set {switch}=false (--no-sentinel-tls; their password, if "
            "any, then crosses the network in clear)"
        )
    if any(words in text for words in _CLOSED):
        if parsed.get("ssl_certfile"):
            return (
                f"{asked}: a Sentinel closed the TLS connection; does it accept this worker's client certificate "
                f"(ssl_certfile={parsed['ssl_certfile']!r})? It must be signed by the authority of the Sentinels' "
                "tls-ca-cert-file"
            )
        return (
            f"{asked}: a Sentinel closed the TLS connection, as Sentinels that want a client certificate "
            "(tls-auth-clients yes, Redis's default) do; give the worker's certificate and key as ssl_certfile and "
            "ssl_keyfile in redis_url's query"
        )
    return None
