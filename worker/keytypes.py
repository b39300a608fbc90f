"""Keys of a namespace that hold another type than the index keeps there, found and explained for people.

Redis answers a command on a key of another type with "WRONGTYPE Operation against a key holding the wrong kind of
value", naming neither the key nor the types. An operator's slip with redis-cli (`SET {incidents}:alerts x`), a
restore into the wrong database or another application's key is met that way, by the worker and by every command.
`another_type` is the one sentence for people (which key, what it holds, what it should hold, what to do);
`diagnose` finds the key after a WRONGTYPE reply, asking each candidate with a command of its expected type (the
worker's user has those) and TYPE for what it holds instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from .errors import KeyTypeError
from .keys import IndexKeys
from .replies import text
from .transport import execute

__all__ = [
    "another_type",
    "diagnose",
    "fixed_keys",
    "held_type",
    "incident_keys",
    "is_wrong_type",
    "search_keys",
    "wrong_types",
]

KIND_NAMES = {
    "string": "string",
    "list": "list",
    "set": "set",
    "zset": "sorted set",
    "hash": "hash",
    "stream": "stream",
}
"""Redis's TYPE names, as the contract's key table writes them."""

_PROBES: dict[str, tuple[str, ...]] = {
    "hash": ("HLEN",),
    "set": ("SCARD",),
    "zset": ("ZCARD",),
    "stream": ("XREVRANGE", "+", "-", "COUNT", "1"),  # the subscriber's user may not XLEN; it may XREVRANGE
    "string": ("GET",),
    "list": ("LLEN",),
}
"""A command of each type that reads little, and that the users of deploy/redis/users.acl may send on the keys
they need: its WRONGTYPE reply says the key holds another type."""


def is_wrong_type(error: BaseException) -> bool:
    """Whether an error is Redis's WRONGTYPE (alone, in a pipeline's error, or from inside a function)."""
    return isinstance(error, ResponseError) and "WRONGTYPE" in str(error)


def _a(kind: str) -> str:
    name = KIND_NAMES.get(kind, kind)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _advice(keys: IndexKeys, key: str, streams: Sequence[str]) -> str:
    """What to do about `key`, by what the index keeps there."""
    rename = f"redis-cli RENAME '{key}' '{key}.wrongtype'"
    delete = f"redis-cli DEL '{key}'"
    if key == keys.fingerprints:
        return (
            "it is the index's source of truth (incident ID -> fingerprint): move it aside to look at it "
            f"({rename}), then restore {key} from a backup or send the events again; if the key is another "
            "application's, give the workers a namespace of their own (NAMESPACE)"
        )
    if key == keys.meta:
        return (
            f"move it aside to look at it ({rename}) or delete it ({delete}); `incident-worker verify --repair` then "
            "writes the layout again from the configured one (BANDS, MAX_DISTANCE), as the first worker of an empty "
            "namespace does; if the key is another application's, give the workers a namespace of their own "
            "(NAMESPACE)"
        )
    if key.startswith((keys.postings_prefix(), keys.twin_prefix)):
        return (
            f"delete it ({delete}), then run `incident-worker verify --repair`, which rebuilds the posting sets and "
            f"twin groups from {keys.fingerprints}"
        )
    if key == keys.expiry:
        return (
            f"delete it ({delete}), then run `incident-worker verify --repair`, which enters every incident again "
            "(with the time of the repair, so none expires before a whole window has passed)"
        )
    if key == keys.migration:
        return (
            f"delete it ({delete}): it holds the state of a move to another layout (`incident-worker migrate`), which "
            "cannot go on from it; start the move again if one was under way"
        )
    if key.startswith((keys.heartbeat(""), keys.lease(""))) or key == keys.workers:
        return f"delete it ({delete}): the workers write it again within seconds"
    if key == keys.inbox:
        return (
            f"move it aside to look at it ({rename}); producers' next appends create the list again, and the "
            "workers move it into the events stream as before"
        )
    if key in (keys.events_stream, keys.alerts_stream, keys.dead_stream, *streams):
        return (
            f"move it aside to look at it ({rename}) or delete it ({delete}); the workers create the stream again "
            "(set up again, or at their next write), or give them other stream names (EVENTS_STREAM, ALERTS_STREAM, "
            "DEAD_STREAM)"
        )
    return f"move it aside to look at it ({rename}) or delete it ({delete})"


def another_type(
    keys: IndexKeys, key: str, expected: str, held: str | None = None, *, streams: Sequence[str] = ()
) -> str:
    """The sentence for people about a key of another type: which key, what it holds (None: Redis would not say,
    for lack of permission), what the index keeps there, and what to do. `expected` and `held` are TYPE's names."""
    what = KIND_NAMES.get(expected, expected)
    holds = f"holds {_a(held)}, not the {what}" if held else f"holds another type than the {what}"
    return f"{key} {holds} the index keeps there: {_advice(keys, key, streams)}"


def held_type(client: Any, key: str) -> str | None:
    """What TYPE says `key` holds, or None when the user may not ask (deploy/redis/users.acl grants TYPE to the
    worker's and the subscriber's users; the producer's key access is write-only) or the key is gone."""
    try:
        kind = text(client.type(key))
    except ResponseError:
        return None
    return None if kind == "none" else kind


def fixed_keys(keys: IndexKeys, streams: Sequence[str] = ()) -> dict[str, str]:
    """The namespace's keys of fixed names, each with the type the index keeps there: where most commands meet a key
    of another type. `streams` are the configured stream names."""
    names = [keys.meta, keys.fingerprints, keys.changes, keys.expiry, keys.migration, keys.lease("upkeep")]
    names.append(keys.workers)
    names += [keys.groups, keys.group_sizes, keys.group_merged, keys.group_active]
    names += [keys.events_stream, keys.alerts_stream, keys.dead_stream, *streams]
    names.append(keys.inbox)
    return {name: kind for name in dict.fromkeys(names) if (kind := keys.kind_of(name, streams)) is not None}


def wrong_types(client: Any, candidates: Mapping[str, str]) -> list[tuple[str, str, str | None]]:
    """Each candidate key (-> the type it should hold) that holds another type, as (key, expected, held); in one
    round trip, plus a TYPE of each one found. A refused probe (no permission) proves nothing and is passed over."""
    names = list(candidates)
    replies = execute(
        client, [(*_PROBES[candidates[name]][:1], name, *_PROBES[candidates[name]][1:]) for name in names]
    )
    found = [name for name, reply in zip(names, replies, strict=True) if is_wrong_type(reply)]
    return [(name, candidates[name], held_type(client, name)) for name in found]


def diagnose(
    client: Any,
    keys: IndexKeys,
    *,
    streams: Sequence[str] = (),
    extra: Iterable[str] = (),
    only: Iterable[str] | None = None,
) -> KeyTypeError:
    """The KeyTypeError a WRONGTYPE reply stands for: the namespace's fixed keys (or `only` those) and `extra` keys
    asked one by one. When none holds another type any more (or none of these was the one), the message says so and
    how to find it."""
    names = list(fixed_keys(keys, streams) if only is None else only)
    names += list(extra)
    candidates = {name: kind for name in dict.fromkeys(names) if (kind := keys.kind_of(name, streams)) is not None}
    try:
        found = wrong_types(client, candidates)
    except Exception:  # the diagnosis is a courtesy: a Redis gone meanwhile leaves the general message
        found = []
    if found:
        key, expected, held = found[0]
        message = another_type(keys, key, expected, held, streams=streams)
        if len(found) > 1:
            message += "; and " + "; and ".join(another_type(keys, *more, streams=streams) for more in found[1:])
        return KeyTypeError(message, key, expected, held)
    return KeyTypeError(
        f"a key of namespace {keys.namespace!r} holds another type than the index keeps there (Redis answered "
        "WRONGTYPE), and none of those this command could name does by now: a posting set "
        f"({keys.postings_prefix()}...) or a twin group ({keys.twin_prefix}...), most likely; `incident-worker "
        "verify` names it (and `redis-cli TYPE KEY` shows what a key holds)"
    )


def incident_keys(index: Any, fp: int) -> list[str]:
    """The posting sets and the twin group of a fingerprint."""
    from .fingerprint import format_fingerprint

    return [*index.posting_keys(fp), index.keys.twins(format_fingerprint(fp))]


def search_keys(index: Any, fp: int, max_distance: int | None = None) -> list[str]:
    """The keys a search for `fp` reads: the posting sets it probes, and the twin groups of the candidates they hold
    (read here as a search would; a probe set of another type is left for the caller's diagnosis to name)."""
    from .fingerprint import format_fingerprint

    own, _, others = index.probe_keys(fp, max_distance)
    probes = [*own, *others]
    members: set[Any] = set()
    for reply in execute(index.redis, [("SMEMBERS", key) for key in probes]):
        if not isinstance(reply, Exception):
            members.update(reply)
    try:
        stored = index.stored_values(sorted(text(member) for member in members))
    except ResponseError:  # {N}:fp itself holds another type: the fixed keys' diagnosis names it
        stored = {}
    twins = {index.keys.twins(format_fingerprint(value)) for value in stored.values() if isinstance(value, int)}
    return [*probes, index.keys.twins(format_fingerprint(fp)), *sorted(twins)]
