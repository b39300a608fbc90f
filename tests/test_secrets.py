"""Secrets in Redis URLs: every form redis-py accepts is used and never shown; an ambiguous URL is refused.

The forms: a password in the user-info part (`redis://user:pw@`, `rediss://`, `unix://:pw@/path`), and as a query
parameter (`?password=`, `?ssl_password=`). Each is run through the real entry point, against a real redis-server
that wants the password, and the logs, messages and exception texts are searched for the password as written and
as decoded.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from redis.connection import parse_url

from tests.conftest import IN_CI, require_redis_server
from tests.redis_server import RedisServer, free_port
from tests.streams import FAST, clean_env, publish, worker_command
from tests.tls_sentinel import SENTINEL_TLS_PASSWORD, TLS_KEY_PASSPHRASE, TlsSentinel
from worker import library
from worker.logs import hide_secrets, redact
from worker.settings import Settings
from worker.urls import KNOWN_PARAMETERS, RedisUrlError, check_url, safe_url, url_secrets

# every character a URL gives a meaning to, so each has to be percent-encoded to be a password
PASSWORD = "s3cret:p@ss#w/rd?x%y+z &q=1"
ENCODED = quote(PASSWORD, safe="")
KEY_PASSPHRASE = "tls-key-passphrase-9"


def forms(port: int, socket: Path) -> dict[str, str]:
    """Every URL form of a password redis-py accepts, for a server on `port` and `socket` wanting PASSWORD."""
    return {
        "password before the host": f"redis://:{ENCODED}@127.0.0.1:{port}/0",
        "user and password": f"redis://default:{ENCODED}@127.0.0.1:{port}/0",
        "?password=": f"redis://127.0.0.1:{port}/0?password={ENCODED}",
        "?username=&password=": f"redis://127.0.0.1:{port}/0?username=default&password={ENCODED}",
        "user before the host, ?password=": f"redis://default@127.0.0.1:{port}/0?password={ENCODED}",
        "unix socket, password before the path": f"unix://:{ENCODED}@{socket}",
        "unix socket, ?password=": f"unix://{socket}?password={ENCODED}&db=0",
    }


def tls_forms(port: int) -> dict[str, str]:
    """TLS forms: no TLS server here, so these fail at the handshake, and the failure is what is searched."""
    return {
        "rediss:// with a password": f"rediss://default:{ENCODED}@127.0.0.1:{port}/0",
        "rediss:// with ?password= and ?ssl_password=": (
            f"rediss://127.0.0.1:{port}/0?password={ENCODED}&ssl_password={KEY_PASSPHRASE}&ssl_cert_reqs=none"
        ),
    }


def assert_hidden(text: str) -> None:
    for secret in (PASSWORD, ENCODED, KEY_PASSPHRASE, "s3cret"):
        assert secret not in text, f"{secret!r} shown in:\n{text[-2000:]}"


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server wanting PASSWORD, on a port and on a unix socket."""
    require_redis_server()
    directory = tmp_path_factory.mktemp("protected")
    server = RedisServer(
        directory,
        extra=["--requirepass", PASSWORD, "--unixsocket", str(directory / "redis.sock"), "--unixsocketperm", "700"],
    )
    server.start()
    yield server
    server.stop()


def _run(url: str, *args: str, timeout: float = 60, **settings_: object) -> subprocess.CompletedProcess[str]:
    env = clean_env(redis_url=url, log_format="json", **settings_)
    return subprocess.run([*worker_command(), *args], env=env, capture_output=True, text=True, timeout=timeout)


# -- every accepted form: connects, and shows no secret ------------------------------------------------------


def test_every_form_is_read_as_the_same_password(tmp_path: Path) -> None:
    for name, url in {**forms(6379, tmp_path / "s.sock"), **tls_forms(6379)}.items():
        check_url(url)
        assert parse_url(url)["password"] == PASSWORD, name
        shown = safe_url(url)
        assert_hidden(shown)
        assert "***" in shown, name
        assert PASSWORD in url_secrets(url) and ENCODED in url_secrets(url), name
        assert_hidden(redact(f"connecting to {url} failed"))


@pytest.mark.parametrize("form", list(forms(0, Path("/s"))))
def test_worker_logs_show_no_password_in_any_form(protected: RedisServer, form: str, tmp_path: Path) -> None:
    url = forms(protected.port, protected.directory / "redis.sock")[form]
    with redis.Redis(port=protected.port, password=PASSWORD) as admin:
        admin.flushall()
        admin.function_flush()
        library.load(admin)  # the administrator's step
        publish(admin, [{"incident_id": "1", "features": {"a": 1}}, {"incident_id": "2", "features": "{"}])
    done = _run(url, "run", "--until-idle", log_level="debug", **FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_hidden(done.stdout + done.stderr)
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    shown = {line["redis"] for line in lines if "redis" in line}
    assert shown and all("***" in url for url in shown), shown


def _main(url: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """`incident-worker ARGS` in this process, as a fresh one would run it; its output, and any exception's text."""
    import sys
    import traceback

    import worker.logs
    from worker.cli import main

    monkeypatch.setattr(worker.logs, "_hidden", set())  # nothing hidden from an earlier test: each run hides its own
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    for name, value in clean_env(redis_url=url, socket_timeout_s=2, log_format="json").items():
        monkeypatch.setenv(name, value)
    try:
        code = main(args)
    except Exception as error:  # what the process would print through its excepthook
        code = 1
        shown = "".join(traceback.format_exception(error))
        print(worker.logs.redact(shown), file=sys.stderr)
    out = capsys.readouterr()
    assert code != 0, out
    return out.out + out.err


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["standalone", "cluster client", "sentinel"])
def test_failures_show_no_password_in_any_form(
    protected: RedisServer,
    tmp_path: Path,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A wrong password, a server that is not there, TLS against a plain port, the cluster client against a server
    # that is no cluster: each fails with a message, and none of the messages shows the password.
    # (with Sentinels, the password of redis_url is the primary's: the same forms, reached through another client)
    cluster = mode == "cluster client"
    monkeypatch.setenv("INCIDENT_WORKER_CLUSTER", str(cluster).lower())
    if mode == "sentinel":
        monkeypatch.setenv("INCIDENT_WORKER_SENTINELS", f"127.0.0.1:{free_port()}")
    wrong = quote("s3cret-but-wrong:@/#?", safe="")
    urls = {
        **tls_forms(protected.port),
        **{
            f"wrong password, {name}": url.replace(ENCODED, wrong)
            for name, url in forms(protected.port, protected.directory / "redis.sock").items()
        },
        **{f"nobody listening, {name}": url for name, url in forms(free_port(), tmp_path / "absent.sock").items()},
    }
    for name, url in urls.items():
        if mode == "sentinel" and not name.startswith("nobody listening"):
            continue  # the Sentinel is absent: the primary's URL forms are what is searched, once each
        if cluster and url.startswith("unix"):
            continue  # the cluster client takes host:port URLs only
        for args in [["check", "--redis-only"]] if mode == "sentinel" else [["stats"], ["check", "--redis-only"]]:
            shown = _main(url, args, monkeypatch, capsys)
            assert_hidden(shown)
            assert "s3cret-but-wrong" not in shown and wrong not in shown, (name, shown)


def test_exception_texts_and_log_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.logs import configure_logging, get_logger

    hide_secrets(*url_secrets(f"redis://:{ENCODED}@h:1/0"))
    configure_logging("json", "debug")
    try:
        raise redis.ConnectionError(f"Error connecting to redis://:{ENCODED}@h:1/0: refused ({PASSWORD})")
    except redis.ConnectionError:
        get_logger(url=f"redis://h:1/0?password={ENCODED}").exception("failed", detail={"password": PASSWORD})
    assert_hidden(capsys.readouterr().err)
    structlog.reset_defaults()  # the logger wrote to this test's captured stderr, which pytest closes after it


@pytest.mark.parametrize(
    "text",
    [
        "redis://user:hunter2-pw@host:6379/0",
        "rediss://:hunter2-pw@host",
        "redis://user:hunter2@pw@host",  # an unencoded '@' in the password
        "redis://hunter2-pw@host:6379",  # a password typed without the ':' before it
        "unix:///run/redis.sock?db=0&password=hunter2-pw",
        "redis://host:6379/0?ssl_password=hunter2-pw&db=0",
        "redis://host/0?PASSWORD=hunter2-pw",
        "connecting to redis://:hunter2-pw@host failed: refused",
    ],
)
def test_redact_hides_passwords_in_free_text_without_being_told_them(text: str) -> None:
    shown = redact(text)
    assert "hunter2" not in shown and "***" in shown


# -- ambiguous URLs: refused, with advice, never quoted --------------------------------------------------------

REFUSED = {
    # (the URL, words the refusal must hold)
    "unencoded @ in the password": ("redis://u:hunter2@secret@db:6379/0", "%40"),
    "unencoded # in the password": ("redis://u:hunter2#secret@db:6379/0", "%23"),
    "unencoded / in the password": ("redis://:hunter2/secret@db:6379/0", "%2F"),
    "unencoded ? in the password": ("redis://:hunter2?secret@db:6379/0", "%3F"),
    "unencoded : in the password makes a port": ("redis://hunter2:secret:6379/0", "port"),
    "a bare % in the password": ("redis://u:hunter2%secret@db:6379/0", "%25"),
    "a password without its ':'": ("redis://hunter2secret@db:6379/0", "between the user name and the '@'"),
    "a + in ?password=": ("redis://db:6379/0?password=hunter2+secret", "%2B"),
    "a space": ("redis://u:hunter2 secret@db:6379/0", "%20"),
    "password twice": ("redis://:hunter2secret@db/0?password=hunter2secret", "once"),
    "?password= twice": ("redis://db/0?password=hunter2secret&password=other", "once"),
    "a misspelt parameter": ("redis://db/0?passwd=hunter2secret", "'passwd'"),
    "a TLS parameter without TLS": ("redis://db/0?ssl_password=hunter2secret", "'ssl_password'"),
    "database twice": ("redis://:hunter2secret@db/0?db=1", "once"),
    "a path that is no database": ("redis://:hunter2secret@db/zero", "database number"),
    "unix socket with two slashes": ("unix://run/redis.sock?password=hunter2secret", "three slashes"),
    "no host": ("redis://:hunter2secret@:6379/0", "no host"),
    "another scheme": ("http://:hunter2secret@db:6379", "redis://"),
    "a bad value": ("redis://:hunter2secret@db/0?socket_timeout=soon", "socket_timeout"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_ambiguous_url_is_refused_with_advice_and_not_quoted(case: str) -> None:
    url, advice = REFUSED[case]
    with pytest.raises(RedisUrlError) as refused:
        check_url(url)
    assert advice in str(refused.value)
    assert "hunter2" not in str(refused.value) and "secret" not in str(refused.value).replace("secrets", "")
    assert "hunter2" not in safe_url(url)
    with pytest.raises(ValidationError) as invalid:
        Settings(redis_url=url)
    assert "hunter2" not in str(invalid.value)


@pytest.mark.parametrize("case", ["unencoded @ in the password", "unencoded / in the password", "a + in ?password="])
def test_cli_refuses_an_ambiguous_url_with_exit_2_and_no_traceback(case: str) -> None:
    url, advice = REFUSED[case]
    for args in (["check", "--redis-only"], ["run"]):
        done = _run(url, *args, timeout=30)
        assert done.returncode == 2, done.stderr
        assert advice in done.stderr
        assert "Traceback" not in done.stderr and "hunter2" not in done.stdout + done.stderr


def test_every_query_parameter_allowed_is_one_redis_py_passes_on() -> None:
    import inspect

    from redis.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection

    classes = {"redis": Connection, "rediss": SSLConnection, "unix": UnixDomainSocketConnection}
    pool_level = {"max_connections"}  # taken by the connection pool, not by the connection
    for scheme, connection in classes.items():
        accepted = set()
        for cls in (connection, *[base for base in connection.__mro__ if issubclass(base, AbstractConnection)]):
            accepted |= set(inspect.signature(cls.__init__).parameters)
        assert KNOWN_PARAMETERS[scheme] - pool_level <= accepted, scheme
    with pytest.raises(RedisUrlError, match="'timeout'"):
        check_url("redis://db:6379/0?timeout=1")  # redis-py would fail at the first command
    # TLS settings belong to rediss:// alone (a plain connection refuses them), whichever redis-py parses them
    for name in KNOWN_PARAMETERS["rediss"] - KNOWN_PARAMETERS["redis"]:
        assert name.startswith("ssl_")
        with pytest.raises(RedisUrlError, match=f"'{name}'"):
            check_url(f"redis://db:6379/0?{name}=x")


@settings(max_examples=300, deadline=None)
@given(password=st.text(min_size=1, max_size=24).filter(lambda p: "\x00" not in p))
def test_any_password_written_raw_is_read_right_or_refused(password: str) -> None:
    # The bug this pins: a password written into a URL without encoding that silently names another host.
    raw = f"redis://user:{password}@redis.example:6379/0"
    try:
        check_url(raw)
    except RedisUrlError:
        pass
    else:
        parsed = parse_url(raw)
        assert (parsed["host"], parsed["port"], parsed["db"], parsed["username"]) == ("redis.example", 6379, 0, "user")
        assert parsed["password"] == password
    encoded = f"redis://user:{quote(password, safe='')}@redis.example:6379/0"
    check_url(encoded)
    assert parse_url(encoded)["password"] == password
    assert safe_url(encoded) == "redis://user:***@redis.example:6379/0"
    assert quote(password, safe="") in url_secrets(encoded) and password in url_secrets(encoded)


# -- the metrics endpoint -------------------------------------------------------------------------------------


def test_metrics_listen_on_loopback_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INCIDENT_WORKER_METRICS_ADDRESS", raising=False)
    assert Settings().metrics_address == "127.0.0.1"
    assert Settings(metrics_address="0.0.0.0").metrics_address == "0.0.0.0"
    assert Settings(metrics_address="::").metrics_address == "::"
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings(metrics_address="everywhere")


def _outside_address() -> str | None:
    """An address of this machine that is not loopback, if it has one (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_worker_serves_metrics_on_loopback_by_default(server: RedisServer, tmp_path: Path) -> None:
    import socket
    import urllib.request

    from tests.streams import start_worker, stop

    port = free_port()
    log = tmp_path / "w.log"
    worker = start_worker(server.url, log=log, metrics_port=port, **FAST)
    try:
        deadline = time.monotonic() + 30
        while "metrics endpoint listening" not in log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.1)
        [line] = [json.loads(line) for line in log.read_text().splitlines() if "metrics endpoint" in line]
        assert (line["address"], line["port"]) == ("127.0.0.1", port)
        assert b"incident_worker_events_total" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
        outside = _outside_address()
        if outside is not None:
            with pytest.raises(OSError), socket.create_connection((outside, port), timeout=2):
                pass
    finally:
        assert stop(worker) == 0


def test_the_sentinels_password_is_a_secret_and_needs_sentinels(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sentinel_pw = "s3ntinel-Pw:@/#"
    settings = Settings(sentinels="127.0.0.1:1", sentinel_username="watch", sentinel_password=sentinel_pw)
    assert sentinel_pw in settings.secrets() and sentinel_pw not in repr(settings)
    with pytest.raises(ValueError, match="set sentinels"):
        Settings(sentinel_password=sentinel_pw)
    # a Sentinel that is not there, with its password: the failure names it, without the password
    monkeypatch.setenv("INCIDENT_WORKER_SENTINELS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("INCIDENT_WORKER_SENTINEL_PASSWORD", sentinel_pw)
    shown = _main(f"redis://:{ENCODED}@127.0.0.1:{free_port()}/0", ["check", "--redis-only"], monkeypatch, capsys)
    assert "s3ntinel-Pw" not in shown and quote(sentinel_pw, safe="") not in shown, shown
    assert_hidden(shown)


# -- TLS files: a mistake in them is one of configuration, said with the setting and the path -------------------


TLS_MISTAKES = {
    "no such CA file": ("?ssl_ca_certs={d}/absent.pem", "ssl_ca_certs='{d}/absent.pem' names no file"),
    "a CA file that is no certificate": ("?ssl_ca_certs={d}/garbage.pem", "holds no PEM certificate"),
    "no such CA directory": ("?ssl_ca_path={d}/absent", "ssl_ca_path='{d}/absent' names no directory"),
    "a key without its certificate": ("?ssl_keyfile={d}/key.pem", "ssl_keyfile but no ssl_certfile"),
    "no such certificate": ("?ssl_certfile={d}/absent.pem", "ssl_certfile='{d}/absent.pem' names no file"),
    "a certificate that is no PEM": ("?ssl_certfile={d}/garbage.pem", "not a PEM certificate and its private key"),
    "an encrypted key without its passphrase": (
        "?ssl_certfile={d}/cert.pem&ssl_keyfile={d}/key.pem",
        "is encrypted: give its passphrase as the Redis URL's ssl_password",
    ),
    "an encrypted key with a wrong passphrase": (
        f"?ssl_certfile={{d}}/cert.pem&ssl_keyfile={{d}}/key.pem&ssl_password={KEY_PASSPHRASE}",
        "ssl_password does not open the key",
    ),
}


@pytest.mark.parametrize("mistake", list(TLS_MISTAKES))
@pytest.mark.parametrize("command", [["check", "--redis-only"], ["stats"]])
def test_a_tls_file_that_cannot_be_used_is_named_as_a_configuration_error(
    tls_files: Path,
    mistake: str,
    command: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """redis-py reads the files at each connection attempt: a missing or unreadable one failed as "Error 2 connecting
    to host:port. No such file or directory" (or "[SSL] PEM lib"), naming no file, and the worker retried it as an
    outage, forever. It is a configuration mistake: exit 2, the setting and the path said, no secret shown."""
    import worker.logs
    from worker.cli import main

    query, expected = (part.format(d=tls_files) for part in TLS_MISTAKES[mistake])
    if "key.pem" in query and not (tls_files / "key.pem").exists():
        if IN_CI:
            pytest.fail("openssl is not installed: CI must try the encrypted key cases", pytrace=False)
        pytest.skip("openssl is not installed: no key to try")
    monkeypatch.setattr(worker.logs, "_hidden", set())
    url = f"rediss://default:{ENCODED}@127.0.0.1:{free_port()}/0{query}"
    for name, value in clean_env(redis_url=url, socket_timeout_s=2, log_format="json").items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    shown = capsys.readouterr().err
    assert expected in shown, shown
    assert_hidden(shown)


@pytest.mark.parametrize(
    "sentinels",
    ["watch:s3ntinel-pw@127.0.0.1:26379", "redis://:s3ntinel-pw@127.0.0.1:26379", "127.0.0.1:26379:s3ntinel-pw"],
)
def test_credentials_written_into_the_sentinel_addresses_are_refused_unshown(
    sentinels: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`user:password@host:port`, the way a Redis URL carries them, was taken for a host named `user:password@host`:
    accepted, and then every connection failure showed it ("Error -2 connecting to watch:s3ntinel-pw@127.0.0.1")."""
    with pytest.raises(ValidationError) as refused:
        Settings(sentinels=f"127.0.0.1:1,{sentinels}")
    assert "s3ntinel-pw" not in str(refused.value)
    assert "sentinel_password" in str(refused.value) or "not host:port" in str(refused.value)
    monkeypatch.setenv("INCIDENT_WORKER_SENTINELS", sentinels)
    shown = _main(f"redis://127.0.0.1:{free_port()}/0", ["check", "--redis-only"], monkeypatch, capsys)
    assert "s3ntinel-pw" not in shown, shown
    assert "invalid settings" in shown, shown


def test_a_sentinel_failure_is_said_without_the_repr_of_redis_pys_client(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """redis-py's MasterNotFoundError quotes the repr of the Sentinel client it asked (some 1,500 characters of
    connection options) before the reason; check and the worker's retry lines showed all of it."""
    from worker.logs import error_message

    monkeypatch.setenv("INCIDENT_WORKER_SENTINELS", f"127.0.0.1:{free_port()}")
    shown = _main(f"redis://:{ENCODED}@127.0.0.1:{free_port()}/0", ["check", "--redis-only"], monkeypatch, capsys)
    assert "No master found for 'incidents' - " in shown and "connecting to 127.0.0.1" in shown, shown
    assert "<redis." not in shown and len(shown) < 400, shown
    error = redis.sentinel.MasterNotFoundError(
        "No master found for 'incidents' : <redis.client.Redis(<redis.connection.ConnectionPool("
        "<redis.connection.Connection(db=0,host=h,port=1)>)>)> - network:ConnectionError: Error 111 connecting to h:1."
    )
    assert error_message(error) == (
        "MasterNotFoundError: No master found for 'incidents' - network:ConnectionError: Error 111 connecting to h:1."
    )


@pytest.mark.parametrize("query", ["", "?ssl_cert_reqs=none"])
def test_a_rediss_url_reaches_the_primary_a_sentinel_names_over_tls_only(
    real_redis: redis.Redis, sentinel_of: int, query: str
) -> None:
    """With sentinels, the primary's connections came from the Sentinel pool with the URL's connection class
    dropped: a rediss:// URL talked to the primary in plain text, password and all (and one with ?ssl_...= failed
    with a TypeError). The primary here speaks plain text only, so a client that keeps its word about TLS fails.
    (The Sentinel here has no TLS either: sentinel_tls=false asks it in plain text, so it is the primary that fails.)
    """
    from worker.connection import connect

    base = {"sentinels": f"127.0.0.1:{sentinel_of}", "socket_timeout_s": 1}
    plain = connect(Settings(redis_url="redis://127.0.0.1:6379/0", **base), retries=0)
    assert plain.ping()  # the Sentinel names the primary; a plain URL reaches it in plain text
    plain.close()
    tls = connect(Settings(redis_url=f"rediss://127.0.0.1:6379/0{query}", sentinel_tls=False, **base), retries=0)
    assert tls.connection_pool.get_master_address()  # the Sentinel answered, in plain text
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)) as failed:  # a TLS handshake never answered
        tls.ping()
    assert not isinstance(failed.value, redis.sentinel.MasterNotFoundError), failed.value
    tls.close()


def _tls_sentinel_hidden(text: str) -> None:
    """None of the secrets of a worker of the TLS Sentinel: the primary's password, the Sentinel's, the key's."""
    assert_hidden(text)
    for secret in (SENTINEL_TLS_PASSWORD, TLS_KEY_PASSPHRASE, quote(SENTINEL_TLS_PASSWORD, safe="")):
        assert secret not in text, f"{secret!r} shown in:\n{text[-2000:]}"


@pytest.mark.parametrize("ca", ["other-ca.pem", None], ids=["another CA", "no CA"])
def test_a_tls_sentinel_that_is_not_trusted_is_said_without_a_secret(
    tls_sentinel: TlsSentinel, ca: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked over TLS, each Sentinel's client carries redis_url's TLS options, the key's passphrase (ssl_password)
    among them, beside the Sentinel's password; redis-py's failure quotes those clients, and the worker adds advice
    to it. `check` shows the advice and none of the three secrets."""
    monkeypatch.setenv("INCIDENT_WORKER_SENTINELS", tls_sentinel.sentinels)
    monkeypatch.setenv("INCIDENT_WORKER_SENTINEL_PASSWORD", SENTINEL_TLS_PASSWORD)
    shown = _main(tls_sentinel.url(password=PASSWORD, ca=ca), ["check", "--redis-only"], monkeypatch, capsys)
    assert "certificate verify failed" in shown and "ssl_ca_certs" in shown, shown
    _tls_sentinel_hidden(shown)


@pytest.mark.parametrize("through", ["sentinels", "primary"])
def test_a_worker_that_cannot_verify_tls_at_start_exits_2_without_a_secret(
    tls_sentinel: TlsSentinel, tmp_path: Path, through: str
) -> None:
    """A certificate the worker cannot verify before it ever set up is a configuration mistake, as refused
    credentials are: exit 2 with the failure and what to check (the Sentinels' advice too), none of the secrets.
    It used to retry for ever, the advice in every retry line."""
    from tests.streams import start_worker

    log = tmp_path / "worker.log"
    if through == "sentinels":
        url = tls_sentinel.url(password=PASSWORD, ca="other-ca.pem")
        settings: dict[str, object] = {"sentinels": tls_sentinel.sentinels, "sentinel_password": SENTINEL_TLS_PASSWORD}
    else:
        url = tls_sentinel.url(password=PASSWORD, ca="other-ca.pem").replace(":1/0", f":{tls_sentinel.primary_port}/0")
        settings = {}
    worker = start_worker(url, log=log, log_level="debug", socket_timeout_s=2, reconnect_max_backoff_s=0.2, **settings)
    assert worker.wait(timeout=30) == 2
    shown = log.read_text()
    assert "TLS certificate could not be verified; not starting" in shown, shown[-2000:]
    assert "certificate verify failed" in shown and "ssl_ca_certs" in shown, shown[-2000:]
    if through == "sentinels":
        assert "is not signed by the certificate authority of ssl_ca_certs" in shown, shown[-2000:]
    _tls_sentinel_hidden(shown)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--redis_url", f"redis://:{ENCODED}@127.0.0.1:6379/0"],  # a flag mistyped: its value is unrecognized
        ["stats", f"redis://:{ENCODED}@127.0.0.1:6379/0"],
        ["run", "--sentinel_password", PASSWORD],
        ["run", f"--sentinel_password={PASSWORD}"],
        ["check", f"--cluster={PASSWORD}"],
    ],
)
def test_a_command_line_argparse_refuses_is_not_echoed_with_its_secret(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse quoted every unrecognized word ("unrecognized arguments: --redis_url redis://:PASSWORD@..."), and
    a value given to a switch ("ignored explicit argument 'PASSWORD'")."""
    from worker.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    shown = capsys.readouterr().err
    assert "error:" in shown
    assert_hidden(shown)


def test_a_mistyped_variable_is_refused_by_name_and_never_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pydantic-settings ignores an INCIDENT_WORKER_* variable that is no setting: INCIDENT_WORKER_REDIS_UR (one letter
    short) left every command on redis://localhost:6379/0, and `check` called that healthy when a Redis ran there."""
    from worker.cli import main

    for name in list(os.environ):
        if name.startswith("INCIDENT_WORKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INCIDENT_WORKER_REDIS_UR", f"redis://:{ENCODED}@127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("INCIDENT_WORKER_NO_SUCH_THING", PASSWORD)
    assert main(["check", "--redis-only"]) == 2
    shown = capsys.readouterr().err
    assert "INCIDENT_WORKER_REDIS_UR is not a setting; did you mean INCIDENT_WORKER_REDIS_URL?" in shown, shown
    assert "INCIDENT_WORKER_NO_SUCH_THING is not a setting" in shown, shown
    assert_hidden(shown)


def test_a_rediss_url_on_a_port_that_does_not_speak_tls_says_so() -> None:
    """A rediss:// URL pointed at a port whose server never answers the TLS handshake (a plain Redis port reads it as
    a command and waits for the rest) said only that it timed out, after the timeout; it now names the likely cause."""
    import socket

    from tests.streams import run_in_process

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        env = clean_env(redis_url=f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none", socket_timeout_s=0.5)
        done = run_in_process(["stats"], env)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "cannot reach Redis" in err and "the server's TLS port (tls-port)" in err, err
