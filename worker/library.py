"""The server side of the index: the Redis Functions library under `worker/lua/`, and the calls of its functions.

* `LIBRARY_NAME`, `LIBRARY_SOURCE`: the library, assembled from the files `worker/lua/index.lua` includes (one
  concern a file; `assemble`) and named after a hash of it, so that workers of two versions can share a server during
  a rolling upgrade; `FUNCTIONS` and `FN_APPLY`, `FN_MATCHES`, ...: its functions' names, read from the `register`
  calls of the source.
* `load(client)`: FUNCTION LOAD REPLACE (on a cluster, on every primary): the deployment step
  `incident-worker load-functions`, run with an administrator's credentials; workers never load code.
  `is_missing_function(error)` tells an error reply that means the library is not there, and `missing_message()`
  says what to run about it.
* Calls: `ApplyKeys` and `ApplyArgs`, the apply function's KEYS and ARGV declared once, named and in order (the index
  fills them: `FingerprintIndex.apply_command`), and `apply_command` the FCALL of them; `apply_batch`,
  `dead_letter_command`, `fcall`; `parse_apply` for the apply function's reply.
* `StreamTarget`: the streams and group a stream-mode call acknowledges in and publishes to.

Which keys a call touches is the index's business (worker/index.py builds them); the order they travel in is here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from .connection import RedisClient
from .copywritten import WrittenListing
from .replies import pairs, text
from .transport import Command

__all__ = [
    "FN_APPLY",
    "FN_APPLY_BATCH",
    "FN_CLAIM",
    "FN_DEAD_LETTER",
    "FN_ENSURE_META",
    "FN_EXPIRE",
    "FN_EXPIRY_BACKFILL",
    "FN_FORGET_CONSUMER",
    "FN_GROUP_MERGE",
    "FN_GROUP_OF",
    "FN_INTAKE",
    "FN_LEASE",
    "FN_MATCHES",
    "FN_MIGRATE_ABORT",
    "FN_MIGRATE_BUILD",
    "FN_MIGRATE_REMOVE",
    "FN_MIGRATE_START",
    "FN_MIGRATE_SWITCH",
    "FN_PREFLIGHT",
    "FN_RAISE_POSTING_BOUND",
    "FN_READ_NEW",
    "FN_READ_PENDING",
    "FN_SERVER_RUN",
    "FN_SET_RETENTION",
    "FN_SUBMIT",
    "FN_TRIM_CHANGES",
    "FN_TRIM_EVENTS",
    "FN_VERIFY_CHECK",
    "FN_VERIFY_GROUPS_CHECK",
    "FN_VERIFY_GROUPS_REPAIR",
    "FN_VERIFY_POSTINGS",
    "FN_VERIFY_REPAIR",
    "FUNCTIONS",
    "LIBRARY_NAME",
    "LIBRARY_SOURCE",
    "ApplyArgs",
    "ApplyKeys",
    "ApplyResult",
    "SnapshotClaim",
    "StreamTarget",
    "apply_batch",
    "apply_command",
    "assemble",
    "dead_letter_command",
    "fcall",
    "installed_versions",
    "is_missing_function",
    "load",
    "missing_message",
    "pack_limits",
    "pack_migration",
    "pack_snapshot",
    "parse_apply",
    "parse_count",
    "registered_names",
    "stored_value",
]

_SOURCE_NAME = "incident_index_v2"
"""The library's name as written in worker/lua/; replaced by the versioned name when loaded."""

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"\n', re.MULTILINE)
_REGISTER = re.compile(r"^register\('([a-z_]+)'", re.MULTILINE)


def assemble(read: Callable[[str], str], root: str = "index") -> str:
    """The library's source: `root` (worker/lua/index.lua) with each `--- @include "<name>"` line replaced by the
    file `read(name)` gives, itself assembled the same way, the first time the name occurs (later lines of that name
    go: what a file defines is visible to all the text after it, in one chunk)."""
    placed: set[str] = set()

    def expand(name: str, within: tuple[str, ...]) -> str:
        placed.add(name)
        chain = (*within, name)

        def include(match: re.Match[str]) -> str:
            wanted = match.group(1)
            if wanted in chain:  # its text would come before what it uses
                raise ValueError(f"worker/lua/{wanted}.lua includes itself through {' -> '.join(chain)}")
            return "" if wanted in placed else expand(wanted, chain)

        return _INCLUDE.sub(include, read(name))

    return expand(root, ())


def _read_packaged(name: str) -> str:
    return resources.files(__package__).joinpath(f"lua/{name}.lua").read_text(encoding="utf-8")


def registered_names(source: str) -> list[str]:
    """The names the library's `register` calls give its functions (without the library's prefix), in order."""
    return _REGISTER.findall(source)


def _versioned_source() -> tuple[str, str]:
    """The Lua library with its name and function names made unique to this code (a hash of it)."""
    source = assemble(_read_packaged)
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    name = f"incident_index_{digest}"
    return name, source.replace(_SOURCE_NAME, name)


LIBRARY_NAME, LIBRARY_SOURCE = _versioned_source()
FUNCTIONS = {name: f"{LIBRARY_NAME}_{name}" for name in registered_names(LIBRARY_SOURCE)}
"""Each function of the library by its name in worker/lua/ (`register('apply', ...)`): the name to FCALL."""


def _function(name: str) -> str:
    """The FCALL name of a function the library registers; an unknown name fails as this module is imported."""
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise ImportError(f"worker/lua/ registers no function {name!r}; it registers {sorted(FUNCTIONS)}") from None


FN_APPLY = _function("apply")
FN_APPLY_BATCH = _function("apply_batch")
FN_MATCHES = _function("matches")
FN_DEAD_LETTER = _function("dead_letter")
FN_ENSURE_META = _function("ensure_meta")
FN_PREFLIGHT = _function("preflight")
FN_RAISE_POSTING_BOUND = _function("raise_posting_bound")
FN_FORGET_CONSUMER = _function("forget_consumer")
FN_READ_NEW = _function("read_new")
FN_READ_PENDING = _function("read_pending")
FN_CLAIM = _function("claim")
FN_SUBMIT = _function("submit")
FN_INTAKE = _function("intake")
FN_TRIM_EVENTS = _function("trim_events")
FN_TRIM_CHANGES = _function("trim_changes")
FN_LEASE = _function("lease")
FN_SET_RETENTION = _function("set_retention")
FN_EXPIRY_BACKFILL = _function("expiry_backfill")
FN_EXPIRE = _function("expire")
FN_GROUP_MERGE = _function("group_merge")
FN_GROUP_OF = _function("group_of")
FN_VERIFY_CHECK = _function("verify_check")
FN_VERIFY_REPAIR = _function("verify_repair")
FN_VERIFY_POSTINGS = _function("verify_postings")
FN_VERIFY_GROUPS_CHECK = _function("verify_groups_check")
FN_VERIFY_GROUPS_REPAIR = _function("verify_groups_repair")
FN_MIGRATE_START = _function("migrate_start")
FN_MIGRATE_BUILD = _function("migrate_build")
FN_MIGRATE_SWITCH = _function("migrate_switch")
FN_MIGRATE_ABORT = _function("migrate_abort")
FN_MIGRATE_REMOVE = _function("migrate_remove")
FN_SERVER_RUN = _function("server_run")


LIBRARY_PREFIX = "incident_index_"
"""Every version's library name starts with this."""

LOAD_COMMAND = "incident-worker load-functions --admin-redis-url redis://admin:PASSWORD@HOST:6379/0"
"""What an administrator runs to load the library (see deploy/README.md for compose and Kubernetes)."""


def load(client: RedisClient) -> None:
    """Load (or reload) the library; on a cluster, on every primary. Needs FUNCTION LOAD: an administrator's step."""
    client.function_load(LIBRARY_SOURCE, replace=True)


def installed_versions(client: RedisClient) -> list[str]:
    """The names of every version of the library the server holds (FUNCTION LIST: an administrator's command).

    A cluster client may answer per node ({node: libraries}); the names of all nodes are merged."""
    listed = client.function_list(library=LIBRARY_PREFIX + "*")
    replies = list(listed.values()) if isinstance(listed, dict) else [listed]
    names = set()
    for reply in replies:
        for entry in reply:
            fields = dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
            names.add(text(fields.get(b"library_name", fields.get("library_name", ""))))
    return sorted(names - {""})


def missing_message() -> str:
    """What a worker says when the library of its version is not on the server, and what to run about it."""
    return (
        f"Redis has no functions library {LIBRARY_NAME}, the one this version of the worker calls: it was never "
        "loaded, was lost when Redis restarted without persistence, or only another version's is loaded. Workers "
        "may not load code; an administrator loads it before the workers start: "
        f"`{LOAD_COMMAND}` (docker compose: `docker compose run --rm load-functions`; Kubernetes: "
        "`kubectl delete job incident-worker-load-functions --ignore-not-found && kubectl apply -k "
        "deploy/kubernetes`; see deploy/README.md), then start the workers again"
    )


def is_missing_function(error: ResponseError) -> bool:
    """Whether an error reply says the function does not exist (the server lost the library)."""
    return "function not found" in str(error).lower()


def fcall(function: str, keys: Sequence[str], args: Sequence[Any]) -> Command:
    """One FCALL as a command for a pipeline or a transport."""
    return ("FCALL", function, len(keys), *keys, *args)


def apply_batch(commands: Sequence[Command]) -> Command:
    """One FCALL of the apply_batch function that runs these apply calls (each `fcall(FN_APPLY, ...)`) in order.

    Its reply is a list of their replies, in order (an error reply in it arrives as a ResponseError instance). The
    snapshot path sends the calls of one send this way: the change log after their position is read once.
    """
    keys: list[Any] = []
    counts: list[int] = []
    args: list[Any] = []
    for command in commands:
        if command[1] != FN_APPLY:
            raise ValueError(f"only apply calls can be batched, not {command[1]}")
        first = 3 + command[2]
        keys += command[3:first]
        counts += [command[2], len(command) - first]
        args += command[first:]
    return fcall(FN_APPLY_BATCH, keys, [len(commands), *counts, *args])


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """Where stream-mode calls acknowledge entries and publish alerts and dead letters."""

    events_stream: str
    alerts_stream: str
    dead_stream: str
    group: str
    alerts_maxlen: int = 0
    dead_maxlen: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotClaim:
    """What a search of a copy of the index at `position` of its change log found, for the apply call to validate.

    The match count, the closest matches, and whether those are all of them (docs/contract.md, "Snapshot reads").
    """

    position: str
    count: int
    listed: Sequence[tuple[str, int]]
    complete: bool
    cut: bool = False
    """The copy's search stopped at the per-event budget: `listed` are matches, not the closest; `count` is a lower
    bound (the alert then says `incomplete`)."""
    holder: str | bool | None = True
    """Who held the new fingerprint in the copy (its own incident aside), found by the fingerprint itself whatever
    the budget: an incident ID, or None for nobody; True (the default) when the claim does not say. The apply call
    then needs no read of the postings to find the fingerprint's twin (docs/contract.md, "Snapshot reads")."""


@dataclass(slots=True)
class ApplyResult:
    """What one atomic index step did.

    `status` is one of indexed, repeat, duplicate, stale, deleted, absent, not_pending, unvalidated, deferred (an
    apply_batch call after an unvalidated or stale one: not run) (`found` for a search); `candidates` counts the
    representatives verified (never their twins), or on the snapshot path the changes validated; `matches` lists the
    matches (at most max_matches of them when that is set), closest first, while `match_count` counts them all,
    unless `incomplete`: the search was cut at the per-event budget, the matches listed are real ones but not
    necessarily the closest, and `match_count` is a lower bound.
    """

    status: str
    match_count: int = 0
    candidates: int = 0
    alert_id: str | None = None
    matches: list[tuple[str, int]] = field(default_factory=list)
    stored: int | str | None = None
    """For a duplicate: the fingerprint already indexed, or the stored text when it is not one (`stored_value`)."""
    incomplete: bool = False
    group_id: str | None = None
    """For indexed and repeat: the incident's group after the step (the alert's `group_id`) and its size."""
    group_size: int = 0


def stored_value(value: Any) -> int | str | None:
    """A value of `{N}:fp` (bytes or str; None: no field) as a fingerprint, or as the text itself when it is not 16
    lowercase hex digits: a value mangled by hand (`incident-worker verify` reports it), which a call that replaces
    or removes it must name exactly as stored, and which must not stop a worker."""
    if value is None:
        return None
    stored = text(value)
    if len(stored) == 16 and all(c in _LOWER_HEX for c in stored):
        return int(stored, 16)
    return stored


_LOWER_HEX = frozenset("0123456789abcdef")


def parse_count(value: Any) -> tuple[int, bool]:
    """A match count as the functions reply it: the number, and whether the search was cut at the budget (the reply
    then says '<n>+': n matches found, more may exist)."""
    if type(value) is bytes:  # (the usual reply: one type test, not text's and a union's)
        raw = value.decode("utf-8", "surrogateescape")
    else:
        raw = text(value) if isinstance(value, bytes | str) else str(value)
    if raw.endswith("+"):
        return int(raw[:-1]), True
    return int(raw), False


def parse_apply(reply: Sequence[Any]) -> ApplyResult:
    """Turn the reply of the apply function into an `ApplyResult`."""
    status = text(reply[0])
    extra = text(reply[3])
    if status == "duplicate":
        return ApplyResult(status, stored=stored_value(extra))
    match_count, incomplete = parse_count(reply[1])
    # indexed and repeat carry the incident's group before the matches (worker/lua/apply.lua, apply_at's header)
    if (status == "indexed" or status == "repeat") and len(reply) >= 6:
        listed = reply[6:]
        return ApplyResult(
            status,
            match_count,
            int(reply[2]),
            extra or None,
            pairs(listed) if listed else [],
            None,
            incomplete,
            text(reply[4]),
            int(reply[5]),
        )
    return ApplyResult(
        status, match_count, int(reply[2]), extra or None, pairs(reply[4:]), incomplete=incomplete, group_id=None
    )


class ApplyKeys(NamedTuple):
    """The apply function's KEYS, named and in the order of the header of `apply_at` in worker/lua/apply.lua (a test
    holds the two equal): eight keys, then five lists of keys."""

    meta: str
    fingerprints: str
    changes: str
    events: str
    alerts: str
    new_group: str
    """The twin group of the new fingerprint (of the expected one for a delete)."""
    old_group: str
    """The twin group of the fingerprint replaced; `new_group` when there is only one fingerprint."""
    expiry: str
    new_postings: list[str]
    """The new fingerprint's posting keys, band 0 first; the first `ApplyArgs.probed` of them are probed too."""
    old_postings: list[str]
    probes: list[str]
    """The new fingerprint's other probe keys."""
    target_new: list[str]
    """While a migration builds another layout: the new fingerprint's posting keys in it."""
    target_old: list[str]


class ApplyArgs(NamedTuple):
    """The apply function's ARGV, named and in the order of the header of `apply_at` in worker/lua/apply.lua (a test
    holds the two equal). The optional parts travel packed (`pack_snapshot`, `pack_migration`), one value each;
    `listed`, the snapshot's listed matches, goes last as a list of its own."""

    op: str
    incident_id: str
    fingerprint: str
    expected: str
    layout_tag: str
    max_distance: int
    n_new: int
    n_old: int
    group: str
    entry_id: str
    alerts_maxlen: int
    limits: str
    """`pack_limits`: most matches to list, the per-event budget, and most matches the reply repeats."""
    probed: int
    alert_text: str
    tokenizer: str
    snapshot: str
    migration: str
    alert_extra: str
    listed: list[Any]


def pack_snapshot(snapshot: SnapshotClaim | None) -> tuple[str, list[Any]]:
    """A snapshot's claim as `ApplyArgs.snapshot` and `ApplyArgs.listed` ('' and [] without one)."""
    if snapshot is None:
        return "", []
    listed = snapshot.listed
    if isinstance(listed, WrittenListing):  # (its arguments as written: one, the listing as JSON, or two a match)
        return pack_claim(snapshot), listed.values()
    return pack_claim(snapshot), [part for pair in listed for part in pair]


def pack_claim(snapshot: SnapshotClaim) -> str:
    """`ApplyArgs.snapshot` of a claim: its position, count, completeness and holder."""
    complete = 2 if snapshot.cut else 1 if snapshot.complete else 0
    holder = snapshot.holder
    held = "" if holder is True else " 0" if holder is None or holder is False else f" 1{holder}"
    return f"{snapshot.position} {snapshot.count} {complete}{held}"


def pack_limits(max_matches: int, max_candidates: int, max_replied: int | None = None) -> str:
    """`ApplyArgs.limits`: most matches listed (0 = all), most candidates verified (0 = no budget), and most of the
    listed matches the reply repeats (None: all; the alert lists `max_matches` whatever it is)."""
    if max_replied is None:
        return f"{max_matches} {max_candidates}"
    return f"{max_matches} {max_candidates} {max_replied}"


def pack_alert_extra(open_alerts: bool, fields: Sequence[tuple[str, str]] = ()) -> str:
    """`ApplyArgs.alert_extra`: whether an incident that opens a group gets an alert too, and the event fields copied
    into the alert ('' for neither). Each name and value goes as `<bytes>:<text>`, its length in UTF-8 bytes as the
    server counts them (text decoded with surrogate escapes keeps its bytes)."""
    if not open_alerts and not fields:
        return ""
    parts = ["1" if open_alerts else "0"]
    for name, value in fields:
        for part in (name, value):
            parts.append(f"{len(part.encode('utf-8', 'surrogateescape'))}:{part}")
    return "".join(parts)


def pack_migration(building: str, bands: int) -> str:
    """`ApplyArgs.migration`: the layout a migration is building and its number of bands ('' for none)."""
    return f"{bands} {building}" if building else ""


def apply_command(keys: ApplyKeys, args: ApplyArgs) -> Command:
    """The FCALL of the apply function with these keys and arguments (its reply: `parse_apply`)."""
    flat = [*keys[:8], *keys.new_postings, *keys.old_postings, *keys.probes, *keys.target_new, *keys.target_old]
    return ("FCALL", FN_APPLY, len(flat), *flat, *args[:-1], *args.listed)


def dead_letter_command(
    stream: StreamTarget, entry_id: str, fields: Mapping[Any, Any] | Sequence[tuple[Any, Any]]
) -> Command:
    """A dead-letter call: publish `fields` (a mapping, or pairs in order with repeated names kept) and acknowledge
    the entry, if it is still pending.

    Its reply is the dead letter's ID, or '' when the entry was no longer pending.
    """
    items = fields.items() if isinstance(fields, Mapping) else fields
    flat = [part for name, value in items for part in (name, value)]
    return fcall(
        FN_DEAD_LETTER, [stream.events_stream, stream.dead_stream], [stream.group, entry_id, stream.dead_maxlen, *flat]
    )
