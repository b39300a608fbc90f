"""Sentinels asked over TLS: `sentinel_tls`, against a real primary and a real Sentinel that speak TLS only.

The worker asked its Sentinels without TLS whatever redis_url said: where the Sentinels have a `tls-port` only it
could not find its primary, and where they have a plain port too their password crossed the network in clear. With
a rediss:// redis_url the Sentinels are now asked over TLS (with redis_url's CA, client certificate and key) unless
`sentinel_tls=false` says they have no TLS. Each mistake a person can make in that (a wrong CA, none, no client
certificate, TLS against a plain port and the reverse) ends in a message that says what to change.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from pydantic import ValidationError
from redis.sentinel import MasterNotFoundError, SentinelManagedSSLConnection

from tests.streams import ALERTS, FAST, clean_env, publish, worker_command
from tests.tls_sentinel import SENTINEL_TLS_PASSWORD, TLS_KEY_PASSPHRASE, TlsSentinel
from worker.connection import connect
from worker.logs import error_message
from worker.settings import ENV_PREFIX, Settings

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_worker_env")]


def _settings(servers: TlsSentinel, url: str | None = None, **overrides: Any) -> Settings:
    """The worker's settings for the TLS Sentinel: its address and password, redis_url's TLS options."""
    return Settings(
        redis_url=url or servers.url(),
        sentinels=servers.sentinels,
        sentinel_password=SENTINEL_TLS_PASSWORD,
        socket_timeout_s=2,
        **overrides,
    )


def _failure(settings: Settings) -> str:
    """What asking for the primary fails with, as people see it (the worker's log lines and `check`)."""
    client = connect(settings, retries=0)
    try:
        with pytest.raises(MasterNotFoundError) as failed:
            client.ping()
    finally:
        client.close()
    return error_message(failed.value)


def _check(settings: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = clean_env(log_format="json", socket_timeout_s=2, **settings)
    return subprocess.run(
        [*worker_command(), "check", "--redis-only"], env=env, capture_output=True, text=True, timeout=60
    )


def _hidden(text: str) -> None:
    for secret in (SENTINEL_TLS_PASSWORD, TLS_KEY_PASSPHRASE, "primary-pw-7"):
        assert secret not in text, f"{secret!r} shown in:\n{text[-2000:]}"


# -- the setting --------------------------------------------------------------------------------------------------


def test_sentinels_are_asked_over_tls_when_the_primary_is() -> None:
    """Unset, sentinel_tls follows redis_url: rediss:// asks the Sentinels over TLS too, redis:// does not."""
    assert Settings(redis_url="rediss://h:1/0", sentinels="s:26379").sentinels_over_tls
    assert not Settings(redis_url="redis://h:1/0", sentinels="s:26379").sentinels_over_tls
    assert not Settings(redis_url="rediss://h:1/0", sentinels="s:26379", sentinel_tls=False).sentinels_over_tls
    assert Settings(redis_url="rediss://h:1/0", sentinels="s:26379", sentinel_tls=True).sentinels_over_tls
    assert Settings().sentinel_tls is None


@pytest.mark.parametrize(
    ("given", "advice"),
    [
        ({"sentinel_tls": True}, "set sentinels"),
        ({"sentinel_tls": False}, "set sentinels"),
        ({"sentinel_tls": True, "sentinels": "s:26379", "redis_url": "redis://:primary-pw-7@h:1/0"}, "rediss://"),
    ],
)
def test_sentinel_tls_that_cannot_apply_is_refused_with_what_to_do(given: dict[str, Any], advice: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**given)
    assert advice in str(refused.value)
    assert "primary-pw-7" not in str(refused.value)


def test_sentinel_tls_is_a_variable_and_a_flag_of_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.cli import build_parser
    from worker.commands._shared import settings_from_args

    monkeypatch.setenv(f"{ENV_PREFIX}SENTINELS", "s:26379")
    monkeypatch.setenv(f"{ENV_PREFIX}REDIS_URL", "rediss://h:1/0")
    monkeypatch.setenv(f"{ENV_PREFIX}SENTINEL_TLS", "false")
    parser = build_parser("run")
    assert settings_from_args(parser.parse_args(["run"])).sentinel_tls is False
    assert settings_from_args(parser.parse_args(["run", "--sentinel-tls"])).sentinel_tls is True
    monkeypatch.delenv(f"{ENV_PREFIX}SENTINEL_TLS")
    assert settings_from_args(parser.parse_args(["run", "--no-sentinel-tls"])).sentinel_tls is False
    assert settings_from_args(parser.parse_args(["run"])).sentinel_tls is None


# -- against a real TLS primary and Sentinel ------------------------------------------------------------------


def test_connect_finds_the_primary_through_sentinels_that_speak_tls_only(tls_sentinel: TlsSentinel) -> None:
    """The Sentinel and the primary have no plain port: the address comes from the Sentinel over TLS (with its
    password, the CA, and the client certificate the Sentinel wants), and the primary is reached over TLS."""
    client = connect(_settings(tls_sentinel), retries=0)
    try:
        assert client.ping()
        assert client.connection_pool.get_master_address() == ("127.0.0.1", tls_sentinel.primary_port)
        assert client.connection_pool.connection_class is SentinelManagedSSLConnection
        client.set("{incidents}:tls-probe", "through the Sentinel")
    finally:
        client.close()
    with tls_sentinel.primary() as primary:
        assert primary.getdel("{incidents}:tls-probe") == b"through the Sentinel"


def test_the_worker_runs_through_sentinels_that_speak_tls_only(tls_sentinel: TlsSentinel) -> None:
    """`incident-worker run`, configured as a deployment would be, finds its primary through the TLS Sentinel and
    processes the stream there; its logs show neither the Sentinel's password nor the key's passphrase."""
    with tls_sentinel.primary() as primary:
        primary.flushall()
        bag = {f"token{i}": 1 for i in range(20)}
        publish(primary, [{"incident_id": "a", "features": bag}, {"incident_id": "b", "features": bag}])
    env = clean_env(
        redis_url=tls_sentinel.url(),
        sentinels=tls_sentinel.sentinels,
        sentinel_password=SENTINEL_TLS_PASSWORD,
        log_format="json",
        log_level="debug",
        **FAST,
    )
    done = subprocess.run(
        [*worker_command(), "run", "--until-idle"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _hidden(done.stdout + done.stderr)
    events = [json.loads(line)["event"] for line in done.stderr.splitlines() if line.startswith("{")]
    assert events.count("alert") == 1, done.stderr[-3000:]
    with tls_sentinel.primary() as primary:
        assert primary.xlen(ALERTS) == 1
    checked = _check(
        {
            "redis_url": tls_sentinel.url(),
            "sentinels": tls_sentinel.sentinels,
            "sentinel_password": SENTINEL_TLS_PASSWORD,
        }
    )
    assert checked.returncode == 0, checked.stderr
    assert "healthy: Redis answers" in checked.stdout


CA_MISTAKES = {
    # (the CA file of redis_url, words of the advice)
    "a CA that did not sign the Sentinel's certificate": (
        "other-ca.pem",
        "is not signed by the certificate authority of ssl_ca_certs",
    ),
    "no CA given": (None, "give the file of the certificate authority that signed the Sentinels' certificates"),
}


@pytest.mark.parametrize("mistake", list(CA_MISTAKES))
def test_a_wrong_or_missing_ca_is_said_with_what_to_do(tls_sentinel: TlsSentinel, mistake: str) -> None:
    ca, advice = CA_MISTAKES[mistake]
    url = tls_sentinel.url(password="primary-pw-7", ca=ca)
    shown = _failure(_settings(tls_sentinel, url))
    assert "certificate verify failed" in shown, shown
    assert advice in shown and "ssl_ca_certs" in shown, shown
    assert f"Sentinels ({tls_sentinel.sentinels}) asked over TLS" in shown, shown
    _hidden(shown)
    checked = _check(
        {"redis_url": url, "sentinels": tls_sentinel.sentinels, "sentinel_password": SENTINEL_TLS_PASSWORD}
    )
    assert checked.returncode == 1, checked.stderr
    assert advice in checked.stderr and "Traceback" not in checked.stderr, checked.stderr
    _hidden(checked.stdout + checked.stderr)


def test_no_client_certificate_for_a_sentinel_that_wants_one_is_said(tls_sentinel: TlsSentinel) -> None:
    shown = _failure(_settings(tls_sentinel, tls_sentinel.url(client_certificate=False)))
    assert "client certificate" in shown and "ssl_certfile and ssl_keyfile" in shown, shown
    _hidden(shown)


def test_sentinels_asked_without_tls_at_a_tls_port_say_to_ask_with_tls(tls_sentinel: TlsSentinel) -> None:
    shown = _failure(_settings(tls_sentinel, sentinel_tls=False))
    assert f"Sentinels ({tls_sentinel.sentinels}) asked without TLS" in shown, shown
    assert f"{ENV_PREFIX}SENTINEL_TLS" in shown and "tls-port" in shown, shown
    _hidden(shown)


def test_sentinels_asked_over_tls_at_a_plain_port_say_to_ask_without(
    tls_sentinel: TlsSentinel, sentinel_of: int
) -> None:
    """A rediss:// URL and Sentinels with a plain port only: the case that worked before sentinel_tls, and now fails
    (the Sentinels are asked over TLS), with the way back in the message."""
    settings = Settings(redis_url=tls_sentinel.url(), sentinels=f"127.0.0.1:{sentinel_of}", socket_timeout_s=1)
    shown = _failure(settings)
    assert "asked over TLS" in shown and f"{ENV_PREFIX}SENTINEL_TLS=false" in shown, shown
    assert "tls-port" in shown, shown


ADVICE = {
    # (redis-py's words for one Sentinel's failure, the settings' TLS query, words of the advice; None: no advice)
    "an address the certificate does not name": (
        "Error 1 connecting to s:26379. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname "
        "mismatch, certificate is not valid for 's'. (_ssl.c:1006)",
        "?ssl_ca_certs=/ca.pem",
        "does not name the address it was asked at",
    ),
    "an expired certificate": (
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired (_ssl.c:1006)",
        "?ssl_ca_certs=/ca.pem",
        "out of its dates",
    ),
    "a CA directory that does not hold the authority": (
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate",
        "?ssl_ca_path=/etc/ca",
        "the certificate authority of ssl_ca_path='/etc/ca'",
    ),
    "a client certificate the Sentinel does not accept": (
        "Error 1 while reading from s:26379. [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca",
        "?ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
        "does it accept this worker's client certificate (ssl_certfile='/c.pem')",
    ),
    "TLS answered in plain text": (
        "Error 1 connecting to s:26379. [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)",
        "",
        f"{ENV_PREFIX}SENTINEL_TLS=false",
    ),
    "nobody listening": ("Error 111 connecting to s:26379. Connection refused.", "", None),
}


@pytest.mark.parametrize("case", list(ADVICE))
def test_each_tls_failure_of_the_sentinels_gets_its_advice(case: str) -> None:
    """The failures the real servers above cannot be made to show here, from the words redis-py and OpenSSL use."""
    from redis.connection import parse_url

    from worker.connection import sentinel_advice

    failure, query, advice = ADVICE[case]
    settings = Settings(redis_url=f"rediss://h:1/0{query}", sentinels="s:26379")
    shown = sentinel_advice(settings, parse_url(settings.redis_url.get_secret_value()), f"No master found - {failure}")
    if advice is None:
        assert shown is None
    else:
        assert shown is not None and advice in shown, shown
        assert shown.startswith("the Sentinels (s:26379) asked over TLS: "), shown


def test_load_functions_with_a_plain_admin_url_and_sentinel_tls_true_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """load-functions connects with admin_redis_url in redis_url's place, past the settings' own check."""
    from worker.errors import UsageError

    settings = Settings(redis_url="rediss://h:1/0", sentinels="127.0.0.1:1", sentinel_tls=True)
    admin = settings.model_copy(update={"redis_url": Settings().redis_url})
    with pytest.raises(UsageError, match="give it as rediss:// too"):
        connect(admin)
