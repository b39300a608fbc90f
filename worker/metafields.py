"""`{N}:meta`'s fields: the layout tag every call checks (`layout_tag`, its scheme and format version), and the fields
that people can edit by hand, read with a check: a value no version writes there is named, with
what to run, as a `DamagedMetaError`, instead of failing deep inside a worker (and so every worker of the fleet, one
after the other) with a ValueError or a KeyError.

A worker meeting one does not exit: what needs the field waits (a migration target it cannot read stops the event
processing until the field is repaired) or steps aside (a change-log floor it cannot read turns the snapshot read path
and the change log's trimming off), and says so in its log until someone repairs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import DamagedMetaError
from .keys import IndexKeys
from .replies import text

SCHEME = "simhash64-blake2b8le"
"""docs/contract.md#the-fingerprint: SimHash over 64 bits of BLAKE2b-8 token hashes read little-endian."""

FORMAT_VERSION = 2
"""How the index is laid out in Redis (docs/contract.md#what-lives-in-redis); another version refuses the index.

1: every incident in the posting sets of its bands. 2: one incident per distinct fingerprint in the posting sets,
its exact twins in a `{N}:twins:<fingerprint>` group, so that a storm of duplicates costs no more per event.
"""


def layout_tag(bands: int, max_distance: int, generation: int = 0) -> str:
    """What `{N}:meta`'s `layout` says and every call checks: scheme, bands, max distance, format, and for an index
    moved to another layout (`incident-worker migrate`) the generation its postings are kept under."""
    tag = f"{SCHEME}/bands={bands}/max_distance={max_distance}/format={FORMAT_VERSION}"
    return tag if generation == 0 else f"{tag}/generation={generation}"


def parse_layout_tag(tag: str) -> dict[str, str]:
    """The parts of a layout tag: scheme, bands, max_distance, format and generation (0 when it has none)."""
    scheme, *parts = tag.split("/")
    fields = {"scheme": scheme, "generation": "0"}
    for part in parts:
        name, _, value = part.partition("=")
        fields[name] = value
    return fields


def base_tag(tag: str) -> str:
    """A layout tag without its generation: the layout itself, wherever its postings are kept."""
    return tag.split("/generation=", 1)[0]


__all__ = [
    "FORMAT_VERSION",
    "SCHEME",
    "base_tag",
    "building_damaged",
    "changes_floor",
    "floor_ahead",
    "is_entry_id",
    "is_layout_tag",
    "layout_damaged",
    "layout_tag",
    "parse_layout_tag",
]

_ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")
_LAYOUT_TAG = re.compile(r"[^/]+/bands=\d+/max_distance=\d+/format=\d+(/generation=\d+)?")


def is_entry_id(value: str) -> bool:
    """Whether `value` is a stream entry ID as Redis writes one (`<ms>-<seq>`)."""
    return _ENTRY_ID.fullmatch(value) is not None


def is_layout_tag(value: str) -> bool:
    """Whether `value` is a layout tag as the functions write it (`<scheme>/bands=4/max_distance=7/format=2[/...]`)."""
    return _LAYOUT_TAG.fullmatch(value) is not None


def changes_floor(client: Any, keys: IndexKeys, value: Any) -> str | None:
    """`{N}:meta`'s `changes_trimmed_to` as read (None when absent), checked to be a stream entry ID."""
    if value is None:
        return None
    floor = text(value)
    if _ENTRY_ID.fullmatch(floor):
        return floor
    first = client.xrange(keys.changes, count=1)
    if first:
        safe = text(first[0][0])
    else:
        seconds, micros = client.time()
        safe = f"{int(seconds) * 1000 + int(micros) // 1000}-0"
    raise DamagedMetaError(
        f"{keys.meta} field changes_trimmed_to holds {floor[:60]!r}, not a stream entry ID (a hand edit?): no "
        f"snapshot copy can be validated and {keys.changes} is not trimmed until it is repaired. Set it to the "
        f"first entry of the change log, as an administrator: HSET {keys.meta} changes_trimmed_to {safe}",
        "changes_trimmed_to",
    )


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def floor_ahead(client: Any, keys: IndexKeys, floor: str, last: str | None) -> DamagedMetaError | None:
    """The error for a `changes_trimmed_to` past both the server's clock and the change log's last entry `last` (a
    hand edit, or a clock stepped back by more than changes_keep), else None. Changes written later may get lower
    IDs than such a floor: a copy placed at it would never see them, and its claims would pass validation."""
    seconds, micros = client.time()
    now = (int(seconds) * 1000 + int(micros) // 1000, 0)
    if _entry_key(floor) <= now or (last is not None and _entry_key(floor) <= _entry_key(last)):
        return None
    first = client.xrange(keys.changes, count=1)
    safe = text(first[0][0]) if first else f"{now[0]}-0"
    return DamagedMetaError(
        f"{keys.meta} field changes_trimmed_to is {floor}, ahead of the server's clock and of {keys.changes}'s last "
        "entry (a hand edit, or the server's clock stepped back by more than changes_keep): changes written now could "
        "fall below it, unseen by any snapshot copy, so none is used until it is repaired. Set it to the first "
        f"entry of the change log, as an administrator: HSET {keys.meta} changes_trimmed_to {safe}",
        "changes_trimmed_to",
    )


def layout_damaged(keys: IndexKeys, value: str, meta: Mapping[str, str]) -> DamagedMetaError:
    """The error for a `layout` field that is not a layout tag (a hand edit): every call checks it, so no worker can
    index anything; the tag to restore is rebuilt from the meta's other fields where they are whole."""
    try:
        tag = layout_tag(int(meta["bands"]), int(meta["max_distance"]), int(meta.get("generation") or 0))
        repair = (
            "restore it (rebuilt from its bands, max_distance and generation) as an administrator: "
            f"HSET {keys.meta} layout {tag}"
        )
    except (KeyError, ValueError):
        tag = layout_tag(4, 7)
        repair = (
            "restore the layout the index was built with (the workers' settings say it; bands=4, max_distance=7 "
            f"by default) as an administrator: HSET {keys.meta} layout {tag}"
        )
    return DamagedMetaError(
        f"{keys.meta} field layout holds {value[:60]!r}, not a layout tag (a hand edit?): every call of the index "
        f"checks it, so no worker can index an incident and the workers wait; {repair}",
        "layout",
    )


def building_damaged(client: Any, keys: IndexKeys, value: str) -> DamagedMetaError:
    """The error for a `building` field that is not a layout tag: what to run depends on whether a move is under
    way (`{N}:migration`, which `migrate --abort` reads, names its target)."""
    target = client.hget(keys.migration, "target")
    if target is not None:
        repair = (
            f"a migration to {text(target)} is under way: stop it with `incident-worker migrate --abort`, or restore "
            f"the field as an administrator to resume it: HSET {keys.meta} building {text(target)}"
        )
    else:
        repair = (
            f"no migration is under way ({keys.migration} is missing): remove the field, as an administrator: "
            f"HDEL {keys.meta} building"
        )
    return DamagedMetaError(
        f"{keys.meta} field building holds {value[:60]!r}, not a layout tag (a hand edit?): no worker can index an "
        f"incident while it names no layout, so the workers wait; {repair}",
        "building",
    )
