"""What the stream worker checks and creates before it reads: the consumer group, the index's layout and functions,
and the Redis user's rights. A refusal here stops the worker with exit 2 and what to do (PreflightError), before a
call could stop midway and keep half of what it wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.connection import parse_url
from redis.exceptions import OutOfMemoryError, ResponseError

from .connection import RedisClient
from .errors import PreflightError
from .index import FingerprintIndex
from .keys import IndexKeys
from .keytypes import another_type, held_type, is_wrong_type
from .library import FN_PREFLIGHT, StreamTarget
from .replies import group_info, text
from .settings import Settings

__all__ = ["open_namespace", "preflight"]


def open_namespace(
    redis: RedisClient, index: FingerprintIndex, target: StreamTarget, log: Any, *, preflight: Callable[[], None]
) -> None:
    """Create the consumer group at the start of the stream (tolerating only BUSYGROUP), open the index (its layout
    and functions), check the user's rights and the keys' types (`preflight`, this module's function as the worker
    calls it) and the tokenizer."""
    try:
        redis.xgroup_create(target.events_stream, target.group, id="0", mkstream=True)
        log.info("consumer group created", group=target.group)
    except OutOfMemoryError:
        # refused before Redis looks for the group (maxmemory): go on when it exists, to reach the upkeep that may
        # free the memory
        if group_info(redis, target.events_stream, target.group) is None:
            raise
    except ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise _start_refused_on_another_type(error, redis, index.keys, target.events_stream, "stream") from None
    try:
        index.open()
    except ResponseError as error:
        raise _start_refused_on_another_type(error, redis, index.keys, index.keys.meta, "hash") from None
    preflight()
    if index.adopted:
        log.warning(
            "the index was moved to another layout (incident-worker migrate); using the index's",
            configured=index.configured_tag,
            index_layout=index.layout.description,
            hint="set the bands and max distance to the index's layout",
        )
    index.check_tokenizer()


def preflight(redis: RedisClient, settings: Settings, index: FingerprintIndex, target: StreamTarget) -> None:
    """Refuse to start (PreflightError) when this worker's Redis user may not run a command the index's functions
    send, or one of the namespace's keys holds another type: a call would stop there, keeping what it wrote before
    (an incident indexed without its change-log entry or its alert, which its retry takes for a repeat)."""
    keys = index.keys
    reply = index.call(
        FN_PREFLIGHT,
        [
            *(keys.meta, keys.fingerprints, keys.changes),
            *(target.events_stream, target.alerts_stream, target.dead_stream),
            *(index.posting_keys(0)[0], keys.twins("0" * 16), keys.expiry),
        ],
        [target.group],
    )
    found = [text(value) for value in reply]
    problems = []
    denied = [(found[k + 1], found[k + 2]) for k in range(0, len(found), 3) if found[k] == "denied"]
    if denied:
        user = parse_url(settings.redis_url.get_secret_value()).get("username") or "default"
        refused = ", ".join(f"{command} on {key}" if key else command for command, key in denied)
        grants = " ".join(sorted({f"+{command.lower()}" for command, _ in denied}))
        problems.append(
            f"the Redis user {user!r} may not run {refused}, which the index's functions send; grant them "
            f"(ACL SETUSER {user} {grants}; the user's keys must include {keys.tag}:*), as deploy/redis/users.acl "
            "does for incident-worker"
        )
    problems += [
        another_type(keys, found[k + 1], found[k + 2], held_type(redis, found[k + 1]))
        for k in range(0, len(found), 3)
        if found[k] == "type"
    ]
    if problems:
        raise PreflightError(
            "; and ".join(problems) + ". A call refused midway would keep what it wrote before (an incident "
            "indexed without its alert), so the worker does not start"
        )


def _start_refused_on_another_type(
    error: ResponseError, redis: RedisClient, keys: IndexKeys, key: str, kind: str
) -> Exception:
    """A WRONGTYPE reply about `key` as the PreflightError that stops the worker (exit 2), naming it, the type it
    holds and what to do (`keytypes.another_type`); other errors as they are."""
    if not is_wrong_type(error):
        return error
    return PreflightError(another_type(keys, key, kind, held_type(redis, key)) + "; so the worker does not start")
