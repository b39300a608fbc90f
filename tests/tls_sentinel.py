"""TLS for tests: the suite's certificate files (made with openssl), and a Redis primary with a Sentinel watching it
that both speak TLS only (`port 0`, a `tls-port` each), for the tests of Sentinels asked over TLS.

The primary and the Sentinel present the suite's self-signed certificate (cert.pem, which names 127.0.0.1 and
localhost and is its own certificate authority), want one from their clients (Redis's default, `tls-auth-clients
yes`), and talk to each other over TLS (`tls-replication yes`). Nothing is persisted but the configuration file
Sentinel rewrites, in the test's directory. The Sentinel wants a password of its own (`requirepass`): the password a
plain port would carry in clear text.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from tests.redis_server import free_port

TLS_KEY_PASSPHRASE = "another-passphrase"
"""The passphrase of key.pem (test_secrets tries KEY_PASSPHRASE, another one, as a wrong passphrase)."""

SENTINEL_TLS_PASSWORD = "tls-s3ntinel-Pw:@"
"""The TLS Sentinel's own password (requirepass), with characters a URL would give a meaning to."""

SERVICE = "incidents"


def _self_signed(directory: Path, name: str, subject: str, *options: str) -> None:
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-days", "1"),
            *("-subj", subject, "-out", str(directory / f"{name}.pem"), *options),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


def make_tls_files(directory: Path) -> None:
    """cert.pem (self-signed, for 127.0.0.1 and localhost) with key.pem (encrypted with TLS_KEY_PASSPHRASE), and
    other-ca.pem: another self-signed certificate, a certificate authority that signed nothing here."""
    _self_signed(
        directory,
        "cert",
        "/CN=redis",
        *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        *("-keyout", str(directory / "key.pem"), "-passout", f"pass:{TLS_KEY_PASSPHRASE}"),
    )
    _self_signed(
        directory, "other-ca", "/CN=another-authority", "-keyout", str(directory / "other-ca-key.pem"), "-nodes"
    )


def _server_tls(files: Path) -> dict[str, str]:
    """The TLS directives of both servers: their certificate and key, and the authority that signs their clients'."""
    return {
        "tls-cert-file": str(files / "cert.pem"),
        "tls-key-file": str(files / "key.pem"),
        "tls-key-file-pass": TLS_KEY_PASSPHRASE,
        "tls-ca-cert-file": str(files / "cert.pem"),
    }


@dataclass
class TlsSentinel:
    """A TLS-only primary and a TLS-only Sentinel (with SENTINEL_TLS_PASSWORD) that names it as SERVICE."""

    directory: Path
    files: Path
    primary_port: int = field(default_factory=free_port)
    sentinel_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def sentinels(self) -> str:
        return f"127.0.0.1:{self.sentinel_port}"

    def query(self, *, ca: str | None = "cert.pem", client_certificate: bool = True) -> str:
        """The TLS options of a rediss:// URL: the CA file (`ca`, None for none), the client certificate and key."""
        options = [f"ssl_ca_certs={self.files / ca}"] if ca else []
        if client_certificate:
            options += [
                f"ssl_certfile={self.files / 'cert.pem'}",
                f"ssl_keyfile={self.files / 'key.pem'}",
                f"ssl_password={quote(TLS_KEY_PASSPHRASE, safe='')}",
            ]
        return "?" + "&".join(options) if options else ""

    def url(self, *, password: str = "", **query: Any) -> str:
        """A rediss:// URL of the primary (host and port are the Sentinel's to say: these are never used)."""
        userinfo = f":{quote(password, safe='')}@" if password else ""
        return f"rediss://{userinfo}127.0.0.1:1/0{self.query(**query)}"

    def _client(self, port: int, **kwargs: Any) -> redis.Redis:
        return redis.Redis(
            port=port,
            ssl=True,
            ssl_ca_certs=str(self.files / "cert.pem"),
            ssl_certfile=str(self.files / "cert.pem"),
            ssl_keyfile=str(self.files / "key.pem"),
            ssl_password=TLS_KEY_PASSPHRASE,
            socket_timeout=2,
            retry=None,
            **kwargs,
        )

    def primary(self) -> redis.Redis:
        """An administrator's client of the primary (over TLS: it has no other port)."""
        return self._client(self.primary_port)

    def sentinel(self) -> redis.Redis:
        return self._client(self.sentinel_port, password=SENTINEL_TLS_PASSWORD, decode_responses=True)

    def start(self) -> None:
        primary = [
            *("redis-server", "--port", "0", "--tls-port", str(self.primary_port), "--bind", "127.0.0.1"),
            *("--dir", str(self.directory), "--save", "", "--appendonly", "no"),
            *("--logfile", str(self.directory / "primary.log")),
            *(word for name, value in _server_tls(self.files).items() for word in (f"--{name}", value)),
        ]
        self.processes.append(subprocess.Popen(primary, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._until("the TLS primary answers", lambda: bool(self.primary().ping()))
        from worker import library

        with self.primary() as admin:
            library.load(admin)  # the administrator's step, as load-functions does
        conf = self.directory / "sentinel.conf"
        lines = [
            f"port 0\ntls-port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.directory}",
            f"logfile {self.directory / 'sentinel.log'}",
            *(f"{name} {value}" for name, value in _server_tls(self.files).items()),
            "tls-replication yes",
            f"requirepass {SENTINEL_TLS_PASSWORD}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 1",
        ]
        conf.write_text("\n".join(lines) + "\n")
        self.processes.append(
            subprocess.Popen(
                ["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )

        def heard_from_the_primary() -> bool:
            # Sentinel has had an INFO reply from the primary, over TLS: it names it as a primary that is up
            state = self.sentinel().sentinel_masters()[SERVICE]
            return bool(state["is_master"] and not state["is_sdown"] and int(state["info-refresh"]) < 5000)

        self._until("the TLS Sentinel names its primary", heard_from_the_primary)

    def _until(self, what: str, ready: Any, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{what}: a redis-server exited at start (code {process.returncode}){self._logs()}"
                    )
            with contextlib.suppress(redis.RedisError, KeyError):
                if ready():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{what}: not within {seconds:.0f} s{self._logs()}")

    def _logs(self) -> str:
        tails = [
            f"\n--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}"
            for path in (self.directory / "primary.log", self.directory / "sentinel.log")
            if path.exists()
        ]
        return "".join(tails)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
