"""The worker's settings: one pydantic-settings object, read from `INCIDENT_WORKER_*` variables and CLI flags.

Every field is also a flag of `incident-worker run` (`--batch-size` for `INCIDENT_WORKER_BATCH_SIZE`); a flag wins
over the environment, the environment over the default. The object is built once in the CLI and passed in.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .bands import DEFAULT_BANDS, DEFAULT_MAX_DISTANCE, validate
from .keys import DEFAULT_NAMESPACE, IndexKeys, hash_tag, validate_namespace
from .limits import ALERT_FIELDS, DEFAULT_MAX_CANDIDATES, DEFAULT_SNAPSHOT_MAX_CANDIDATES, EventLimits
from .urls import check_url, safe_url, url_secrets

__all__ = ["ENV_PREFIX", "REPLICA_OF_SENTINELS", "Settings", "parse_duration", "parse_size"]

ENV_PREFIX = "INCIDENT_WORKER_"

REPLICA_OF_SENTINELS = "sentinel"
"""The word of snapshot_replica_url for a replica the Sentinels name (no URL of its own: redis_url's credentials)."""

_LIMITS = EventLimits()

ALERT_EVENT_FIELDS_MAX = 8
"""Most event fields ALERT_EVENT_FIELDS copies into an alert."""
ALERT_EVENT_FIELD_CHARS = 256
"""The characters of each copied field's value an alert carries: the alerts stream's size stays bounded."""
"""The event size limits' defaults live with `EventLimits`; the settings only expose them as flags."""


_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _is_host(host: str) -> bool:
    """A host name, an IPv4 address, or an IPv6 one (written bare, as in ::1:26379)."""
    if _HOST_NAME.fullmatch(host):
        return True
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration(text: str, name: str = "duration") -> int:
    """Milliseconds of a duration such as `30d`, `12h`, `90m`, `45s` or `500ms`; `off` and `0` give 0 (off)."""
    value = str(text).strip().lower()
    if value in {"off", "0", ""}:
        return 0
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number) :]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _UNITS_MS or not amount > 0 or amount * _UNITS_MS[unit] < 1:
        raise ValueError(
            f"{name}={text!r} is not a duration; write a number and a unit (ms, s, m, h, d, w) such as 30d or 12h, "
            "or off"
        )
    return int(amount * _UNITS_MS[unit])


NO_MATCH_CAP = frozenset({"all", "none", "off", "unlimited", "0"})
"""The words `max_matches` takes for listing every match of an alert (no cap)."""

_UNITS_BYTES = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_size(text: str, name: str = "size") -> int:
    """Bytes of a size such as `256mb`, `64kb`, `2gb` or `4096` (units of 1024, as in redis.conf); `off` and `0` give
    0 (off)."""
    value = str(text).strip().lower()
    if value in {"off", "0", ""}:
        return 0
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number) :] or "b"
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _UNITS_BYTES or not amount > 0 or amount * _UNITS_BYTES[unit] < 1:
        raise ValueError(
            f"{name}={text!r} is not a size; write a number of bytes or a number and a unit (kb, mb, gb: units of "
            "1024) such as 256mb, or off"
        )
    return int(amount * _UNITS_BYTES[unit])


class Settings(BaseSettings):
    """Configuration of `incident-worker run` (and of the other subcommands that talk to the index)."""

    # hide_input_in_errors: a rejected redis_url would otherwise be quoted whole, password included
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, hide_input_in_errors=True
    )

    redis_url: SecretStr = Field(
        SecretStr("redis://localhost:6379/0"),
        description="Redis to connect to: redis://[user:password@]host:port/db, rediss:// for TLS, "
        "unix:///path/to/socket; special characters in the password percent-encoded (urllib.parse.quote). "
        "The password never reaches a log.",
    )
    admin_redis_url: SecretStr | None = Field(
        None,
        description="An administrator's Redis URL, for `incident-worker load-functions` only (default: redis_url); "
        "never give it to workers.",
    )
    cluster: bool = Field(False, description="Connect to a Redis Cluster (redis-py's cluster client) at redis_url.")
    sentinels: str | None = Field(
        None,
        description="Redis Sentinels as host:port,host:port: the worker connects to the primary they name and "
        "follows it after a failover (redis_url then only gives the user, password, database and TLS, rediss://, "
        "of the primary; with rediss:// the Sentinels are asked over TLS too: see sentinel_tls).",
    )
    sentinel_service: str = Field("incidents", description="The Sentinel service (master name) of the primary.")
    sentinel_username: str | None = Field(
        None,
        description="User name the worker gives the Sentinels, when they have ACL users (default: none, or the "
        "default user with sentinel_password).",
    )
    sentinel_password: SecretStr | None = Field(
        None,
        description="Password of the Sentinels themselves (their requirepass or ACL user), not the primary's: that one "
        "stays in redis_url. Never logged.",
    )
    sentinel_tls: bool | None = Field(
        None,
        description="Ask the Sentinels over TLS, with the TLS options of redis_url (ssl_ca_certs, ssl_certfile, "
        "ssl_keyfile, ...). Unset: when redis_url is rediss://. false: Sentinels without TLS while the primary has "
        "it (sentinel_password then crosses the network in clear); true needs a rediss:// redis_url.",
    )
    namespace: str = Field(DEFAULT_NAMESPACE, description="Index namespace N: every key is {N}:...")
    consumer: str = Field(
        default_factory=_default_consumer,
        description="This worker's name in the consumer group (default: host name and PID).",
    )
    group: str = Field("incident-workers", description="Consumer group shared by all workers of the namespace.")
    # The three stream names: empty means the namespace's default, filled in once the namespace is known.
    events_stream: str = Field("", description="Stream of incoming events (default {N}:events).")
    alerts_stream: str = Field("", description="Stream the alerts are published to (default {N}:alerts).")
    dead_stream: str = Field("", description="Stream of dead letters (default {N}:dead).")
    bands: int = Field(DEFAULT_BANDS, description="Bands the 64 fingerprint bits are cut into (see docs/contract.md).")
    max_distance: int = Field(DEFAULT_MAX_DISTANCE, description="Largest Hamming distance reported as a match.")
    batch_size: int = Field(100, ge=1, le=10_000, description="Entries read per XREADGROUP and pipelined together.")
    block_ms: int = Field(
        100,
        ge=1,
        le=60_000,
        description="Longest pause between two reads of an idle stream (the worker polls: a blocking read would "
        "send a new entry whole before its size is known).",
    )
    claim_idle_ms: int = Field(
        60_000,
        ge=1000,
        description="How long an entry may sit pending with a silent consumer before another worker takes it over.",
    )
    claim_interval_ms: int = Field(
        5000, ge=100, description="How often a worker looks for stuck pending entries (XAUTOCLAIM) and its own."
    )
    max_deliveries: int = Field(
        5, ge=1, description="An entry delivered more times than this is dead-lettered as poison."
    )
    alerts_maxlen: int = Field(
        100_000,
        ge=0,
        description="Approximate length the alerts stream is trimmed to, at each alert (0 = no length cap).",
    )
    alerts_max_memory: str = Field(
        "256mb",
        description="Redis memory the alerts stream may take, such as 256mb (off = no budget): the upkeep trims "
        "the oldest alerts past it every 2 s.",
    )
    dead_maxlen: int = Field(
        100_000,
        ge=0,
        description="Approximate length the dead-letter stream is trimmed to, at each dead letter (0 = no length cap).",
    )
    dead_max_memory: str = Field(
        "128mb",
        description="Redis memory the dead-letter stream may take, such as 128mb (off = no budget): the upkeep "
        "trims the oldest dead letters past it every 2 s, with a warning.",
    )
    max_matches: int = Field(
        100,
        ge=0,
        description="Most matches listed in one alert, closest first; all (or 0) removes the cap. Either way the "
        "list stops before its JSON passes 8 KiB, and match_count counts every match.",
        json_schema_extra={"flag_takes_words": True},
    )
    max_candidates: int = Field(
        DEFAULT_MAX_CANDIDATES,
        ge=0,
        description="The per-event budget: most candidates one event's search verifies (0 = no bound). Past it the "
        "search stops, and its alert says incomplete: its matches are real, match_count a lower bound "
        "(docs/contract.md).",
    )
    alert_text_chars: int = Field(
        0,
        ge=0,
        le=4096,
        description="Characters of a text incident's text copied into its alert's `text` field (0 = none).",
    )
    group_open_alerts: bool = Field(
        False,
        description="Also publish an alert for an incident that opens a group (no matches): `match_count` 0, "
        "`opens_group` 1, so a subscriber can open one ticket per group and append to it.",
    )
    alert_event_fields: str = Field(
        "",
        description="Event fields copied into the event's own alert, comma-separated (such as service,title): at "
        f"most {ALERT_EVENT_FIELDS_MAX} names, each value's first {ALERT_EVENT_FIELD_CHARS} characters; an event "
        "without one leaves it out. Not the alert's own field names.",
    )
    read_path: Literal["auto", "primary", "snapshot"] = Field(
        "auto",
        description=(
            "Where the search for matches runs: primary (inside the atomic step on the primary) or snapshot (on "
            "the worker's own copy of the index, validated by the atomic step); auto: the copy once the index "
            "holds snapshot_min_incidents, or once a storm is met on the primary (snapshot_storm_candidates)."
        ),
    )
    snapshot_min_incidents: int = Field(
        100_000, ge=0, description="Index size from which read_path=auto searches the worker's own copy."
    )
    snapshot_storm_candidates: int = Field(
        500,
        ge=0,
        description="With read_path=auto, a batch on the primary whose indexed events verified this many candidates "
        "each on average, or a tenth of that of which at least half matched, or any event cut at max_candidates (a "
        "near-duplicate storm, or bags crafted to share band values), has the worker search its own copy from then "
        "on, whatever the index's size: the storm's cost then "
        "falls on the worker, not on the primary's one thread (with read_path=primary the worker stays, and says "
        "once that it met one). 0: only snapshot_min_incidents decides, and nothing is said.",
    )
    snapshot_max_candidates: int = Field(
        DEFAULT_SNAPSHOT_MAX_CANDIDATES,
        ge=0,
        description="The per-event budget of the search of the worker's own copy (the snapshot read path): most "
        "candidates it verifies (0 = no bound). It costs the worker's CPU, not Redis's (the atomic step only "
        "validates), so it is larger than max_candidates, which bounds the searches on the primary. Past it the "
        "search stops, and its alert says incomplete (docs/contract.md).",
    )
    snapshot_sends_alone: int = Field(
        64,
        ge=1,
        le=1024,
        description="Sends of 16 events that a snapshot worker writes in a row while it is the only live worker of its "
        "namespace (by the heartbeats in {N}:workers, counted with each read of the change log), each before the "
        "previous one's reply is read, so that its search overlaps the primary's work, and each with a read of the "
        "change log behind it that keeps its copy up to date; the row goes on from one batch to the next. A worker "
        "with peers sends one at a time, each after a refresh, so a fleet's windows stay a send long. 1: one send at "
        "a time always.",
    )
    snapshot_replica_url: SecretStr | None = Field(
        None,
        description="A replica of the primary to load the worker's copy from and to follow the change log on (URL "
        "as redis_url's; sentinel: a replica the Sentinels name for sentinel_service, with redis_url's user, "
        "password and TLS), so that the copies' loads and change-log reads leave the primary; the atomic step, "
        "with its validation, stays on the primary. Unset: the primary. A replica that fails, lags or leaves the "
        "primary is left for the primary (logged, counted) and tried again later. Not with cluster. The password "
        "never reaches a log.",
    )
    retention: str | None = Field(
        None,
        description="Retention window, such as 30d: an incident leaves the index once its last add or upsert is "
        "older than this; off turns it off (keep every incident). Recorded in {N}:meta by a worker that starts "
        "with another value, so run every worker of a namespace with the same one. Unset: the worker keeps the "
        "window the namespace has (none at first: off), so a worker started without it changes nothing.",
    )
    changes_keep: str = Field(
        "1d",
        description="How much of the {N}:changes log the workers keep, such as 1d (off = all of it); snapshot "
        "readers further behind fall back to the full search.",
    )
    stream_group_max_age: str = Field(
        "off",
        description="A consumer group of the events stream (other than the workers' own) whose oldest unread or "
        "unacknowledged entry is older than this, such as 7d, stops holding back the trimming (off = never).",
    )
    max_tokens: int = Field(
        _LIMITS.max_tokens, ge=1, description="Most tokens in one bag; a larger bag is dead-lettered."
    )
    max_token_length: int = Field(_LIMITS.max_token_length, ge=1, description="Longest token, in characters.")
    max_entry_bytes: int = Field(
        _LIMITS.max_entry_bytes,
        ge=64,
        description="Largest stream entry (field names and values), in bytes; a larger one never leaves Redis whole.",
    )
    max_batch_bytes: int = Field(
        8_388_608, ge=1024, description="Most bytes of entries one read brings into the worker (plus one entry)."
    )
    dead_letter_prefix_bytes: int = Field(
        1024,
        ge=16,
        le=65_536,
        description="Bytes kept of each field of an entry over max_entry_bytes in its dead letter (sizes kept too).",
    )
    heartbeat_ttl_ms: int = Field(
        30_000, ge=1000, description="TTL of the worker's heartbeat key; `check` fails once it has expired."
    )
    summary_interval_s: float = Field(30.0, gt=0, description="Seconds between summary log lines.")
    socket_timeout_s: float = Field(
        30.0, gt=0, description="Redis socket timeout; must exceed the server time of one batch."
    )
    reconnect_max_backoff_s: float = Field(
        30.0, gt=0, description="Cap of the exponential backoff between reconnection attempts."
    )
    metrics_port: int = Field(0, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint (0 = off).")
    metrics_address: str = Field(
        "127.0.0.1",
        description="Address the /metrics endpoint listens on: loopback by default; 0.0.0.0 (or ::) for a scraper "
        "in another container or pod.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="json lines, or console for people; auto picks console on a terminal."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Lowest level logged.")

    @field_validator("redis_url", "admin_redis_url", "snapshot_replica_url")
    @classmethod
    def _check_url(cls, value: SecretStr | None, info: Any) -> SecretStr | None:
        # the message never quotes the URL: a refused URL's password cannot be told from the rest of it
        if value is None:
            return None
        if info.field_name == "snapshot_replica_url":
            text = value.get_secret_value().strip()
            if text.lower() in {"", "off", "none"}:
                return None
            if text.lower() == REPLICA_OF_SENTINELS:
                return SecretStr(REPLICA_OF_SENTINELS)
        check_url(value.get_secret_value())
        return value

    @field_validator("metrics_address")
    @classmethod
    def _check_metrics_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not an IP address; use 127.0.0.1 (this machine only), 0.0.0.0 (every IPv4 "
                "interface, for a scraper in another container) or ::"
            ) from None
        return value

    @field_validator("retention", "changes_keep", "stream_group_max_age")
    @classmethod
    def _check_duration(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None  # retention only: unset keeps the namespace's window
        parse_duration(value, info.field_name)
        return value.strip().lower()

    @field_validator("alert_event_fields")
    @classmethod
    def _check_alert_event_fields(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        taken = sorted(set(names) & ALERT_FIELDS)
        if taken:
            raise ValueError(
                f"{', '.join(taken)} {'is' if len(taken) == 1 else 'are'} the alert's own field"
                f"{'' if len(taken) == 1 else 's'}; name event fields other than {', '.join(sorted(ALERT_FIELDS))}"
            )
        if len(names) > ALERT_EVENT_FIELDS_MAX:
            raise ValueError(f"{len(names)} fields named; at most {ALERT_EVENT_FIELDS_MAX} are copied into an alert")
        return ",".join(dict.fromkeys(names))

    @property
    def alert_event_field_names(self) -> tuple[str, ...]:
        """The event fields copied into an alert (ALERT_EVENT_FIELDS), in order."""
        return tuple(name for name in self.alert_event_fields.split(",") if name)

    @field_validator("max_matches", mode="before")
    @classmethod
    def _check_max_matches(cls, value: Any) -> Any:
        # "list every match" in words: 0 has meant that since the cap came in, and stays accepted
        if value is None:
            return 0
        if isinstance(value, str):
            word = value.strip().lower()
            if word in NO_MATCH_CAP:
                return 0
            if not word.isdigit():
                raise ValueError(
                    f"{value!r} is not a number of matches; give a whole number such as 100 (the default), or all "
                    "to list every match"
                )
        return value

    @field_validator("alerts_max_memory", "dead_max_memory")
    @classmethod
    def _check_size(cls, value: str, info: Any) -> str:
        parse_size(value, info.field_name)
        return value.strip().lower()

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        return validate_namespace(value)

    @field_validator("consumer", "group")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be a non-empty name without spaces")
        return value

    @model_validator(mode="after")
    def _check_layout_and_streams(self) -> Settings:
        validate(self.bands, self.max_distance)
        if self.cluster and self.sentinels:
            raise ValueError("cluster and sentinels exclude each other: a Redis Cluster fails over by itself")
        if self.snapshot_replica_url is not None and self.cluster:
            raise ValueError(
                "snapshot_replica_url is not supported with cluster yet (the copy would have to follow each shard's "
                "replica): leave it unset, and the copies read the cluster's primaries"
            )
        if self.replica_of_sentinels and not self.sentinels:
            raise ValueError(
                f"snapshot_replica_url={REPLICA_OF_SENTINELS} reads a replica the Sentinels name: set sentinels "
                "(host:port,...) too, or give the replica's URL"
            )
        if (self.sentinel_password or self.sentinel_username) and not self.sentinels:
            raise ValueError(
                "sentinel_password and sentinel_username are for the Sentinels: set sentinels (host:port,...) too, "
                "or put the primary's password in redis_url"
            )
        if self.sentinel_tls is not None and not self.sentinels:
            raise ValueError(
                "sentinel_tls is for the Sentinels: set sentinels (host:port,...) too, or leave sentinel_tls unset "
                "(the primary's TLS is redis_url's rediss://)"
            )
        if self.sentinel_tls and not self._primary_tls:
            # the Sentinels' TLS options (CA, client certificate) are redis_url's, and only rediss:// takes them
            raise ValueError(
                "sentinel_tls=true asks the Sentinels over TLS with the TLS options of redis_url (ssl_ca_certs, "
                "ssl_certfile, ...), which only a rediss:// redis_url gives: reach the primary over TLS too "
                "(rediss://, the options in its query), or leave sentinel_tls unset for Sentinels without TLS"
            )
        keys = IndexKeys(self.namespace)
        for name in ("events_stream", "alerts_stream", "dead_stream"):
            stream = getattr(self, name)
            if not stream:
                setattr(self, name, getattr(keys, name))
            elif not keys.owns(stream):
                raise ValueError(
                    f"{name}={stream!r} must carry the namespace's hash tag {keys.tag} (it hashes by "
                    f"{hash_tag(stream)!r}), so that one atomic call can reach it on Redis Cluster; "
                    f"for example {keys.tag}:{stream.replace('{', '').replace('}', '')}"
                )
        names = [self.events_stream, self.alerts_stream, self.dead_stream]
        if len(set(names)) != 3:
            raise ValueError(f"the events, alerts and dead-letter streams must differ, got {names}")
        taken = {keys.meta, keys.fingerprints, keys.changes, keys.workers, keys.expiry, keys.migration, keys.inbox}
        taken |= {keys.groups, keys.group_sizes, keys.group_merged, keys.group_active}
        prefixes = (keys.postings_prefix(), keys.twin_prefix, keys.heartbeat(""), keys.lease(""))
        for stream in names:
            if stream in taken or stream.startswith(prefixes):
                raise ValueError(
                    f"stream name {stream!r} is a key the index itself uses; pick another, such as {keys.tag}:alerts"
                )
        return self

    @field_validator("sentinels")
    @classmethod
    def _check_sentinels(cls, value: str | None) -> str | None:
        if not value:
            return None
        # An address is not quoted when refused: credentials written into it (user:password@host:port, as in a
        # Redis URL; host:port:password) would be shown, and taken for a host name they reach every connection error.
        addresses = value.split(",")
        for number, address in enumerate(addresses, 1):
            which = f"sentinel address {number} of {len(addresses)}"
            if "@" in address or "/" in address:
                raise ValueError(
                    f"{which} holds an '@' or a '/': give host:port only, as in sentinel-0:26379; the Sentinels' own "
                    "user and password go in sentinel_username and sentinel_password, the primary's in redis_url"
                )
            host, _, port = address.strip().rpartition(":")
            if not _is_host(host) or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{which} is not host:port, as in sentinel-0:26379")
        return value

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """`sentinels` as (host, port) pairs."""
        pairs = [address.strip().rpartition(":") for address in (self.sentinels or "").split(",") if address.strip()]
        return [(host, int(port)) for host, _, port in pairs]

    @property
    def _primary_tls(self) -> bool:
        return self.redis_url.get_secret_value().lower().startswith("rediss://")

    @property
    def sentinels_over_tls(self) -> bool:
        """Whether the Sentinels are asked over TLS: `sentinel_tls`, or (unset) whether the primary is reached so."""
        return self._primary_tls if self.sentinel_tls is None else self.sentinel_tls

    @property
    def keys(self) -> IndexKeys:
        return IndexKeys(self.namespace)

    @property
    def retention_ms(self) -> int:
        return parse_duration(self.retention or "off")

    @property
    def retention_configured(self) -> bool:
        """Whether this worker was given a retention window (a duration or off) to record for its namespace."""
        return self.retention is not None

    @property
    def changes_keep_ms(self) -> int:
        return parse_duration(self.changes_keep)

    @property
    def alerts_max_memory_bytes(self) -> int:
        return parse_size(self.alerts_max_memory)

    @property
    def dead_max_memory_bytes(self) -> int:
        return parse_size(self.dead_max_memory)

    @property
    def stream_group_max_age_ms(self) -> int:
        return parse_duration(self.stream_group_max_age)

    # Deprecated aliases of events_stream, alerts_stream and dead_stream, kept while code written against them
    # lands; new code uses the *_stream names.
    @property
    def events(self) -> str:
        return self.events_stream

    @property
    def alerts(self) -> str:
        return self.alerts_stream

    @property
    def dead(self) -> str:
        return self.dead_stream

    @property
    def event_limits(self) -> EventLimits:
        """The size limits an event must meet (max_tokens, max_token_length, max_entry_bytes)."""
        return EventLimits(
            max_tokens=self.max_tokens,
            max_token_length=self.max_token_length,
            max_entry_bytes=self.max_entry_bytes,
        )

    @property
    def safe_redis_url(self) -> str:
        """The Redis URL for logs and messages: password redacted."""
        return safe_url(self.redis_url.get_secret_value())

    @property
    def replica_of_sentinels(self) -> bool:
        """Whether the snapshot's replica is one the Sentinels name (snapshot_replica_url=sentinel)."""
        url = self.snapshot_replica_url
        return url is not None and url.get_secret_value() == REPLICA_OF_SENTINELS

    @property
    def safe_replica_url(self) -> str | None:
        """The snapshot's replica for logs and messages: its URL with the password redacted, or `sentinel`."""
        url = self.snapshot_replica_url
        if url is None or self.replica_of_sentinels:
            return None if url is None else f"a replica of {self.sentinel_service} (Sentinels)"
        return safe_url(url.get_secret_value())

    def secrets(self) -> list[str]:
        """Every secret these settings hold (the URL's password, any secret setting), for the logs to hide."""
        found: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                text = value.get_secret_value()
                if name == "snapshot_replica_url" and text == REPLICA_OF_SENTINELS:
                    continue  # a word, not a secret: hidden, it would be blanked out of every log line
                found += url_secrets(text) if "://" in text else [text]
        return found


def shown_default(name: str) -> str:
    """A setting's default as people read it (in --help and in docs/configuration.md)."""
    default = Settings.model_fields[name].get_default(call_default_factory=False)
    if name == "consumer":
        return "host name and PID"
    if name == "admin_redis_url":
        return "redis_url"
    if name == "sentinel_tls":
        return "as redis_url"
    if isinstance(default, SecretStr):
        return default.get_secret_value()
    if name.endswith("_stream"):
        return "{N}:" + name.removesuffix("_stream")
    if default is None:
        return "unset"
    return str(default).lower() if isinstance(default, bool) else str(default)


def settings_table() -> str:
    """The configuration table of docs/configuration.md, generated from the fields above (a test keeps them equal)."""
    rows = ["| variable | flag of `run` | default | meaning |", "|---|---|---|---|"]
    for name, info in Settings.model_fields.items():
        flag = f"`--{name.replace('_', '-')}`"
        if name == "admin_redis_url":
            flag = "(`load-functions --admin-redis-url`)"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | {flag} | `{shown_default(name)}` | {info.description} |")
    return "\n".join(rows)
