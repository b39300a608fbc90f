"""Groups of incidents (docs/contract.md, "Groups") as the Python API reads and merges them: `Group`, and
`GroupReads`, the group methods of `FingerprintIndex` (worker/index.py). The decisions themselves are made inside the
atomic apply step (worker/lua/groups.lua); this module only asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from . import library
from .errors import FingerprintIndexError
from .replies import text

if TYPE_CHECKING:
    from .connection import RedisClient
    from .keys import IndexKeys

__all__ = ["Group", "GroupReads", "Matches"]


class Group(NamedTuple):
    """An incident's group: its label (the ID of the incident that opened it) and how many incidents it has."""

    label: str
    size: int


class Matches(list[tuple[str, int]]):
    """What `FingerprintIndex.add` and `upsert` return: the matches, closest first, as the list of (ID, distance)
    they always were (it compares equal to a plain list), and `group`: the incident's group after the step, its
    label and size as the alert's `group_id` and `group_size` give them (also for a repeat, which changes nothing;
    None only where no group was read)."""

    group: Group | None

    def __init__(self, matches: Iterable[tuple[str, int]] = (), group: Group | None = None) -> None:
        super().__init__(matches)
        self.group = group

    def __repr__(self) -> str:
        return f"Matches({list(self)!r}, group={self.group!r})"


class GroupReads:
    """The group methods of `FingerprintIndex`: its `redis`, `keys` and `_fcall` are theirs to use."""

    redis: RedisClient
    keys: IndexKeys
    _fcall: Callable[..., Any]

    def groups_of(self, incident_ids: Sequence[str]) -> dict[str, Group | None]:
        """The group of each incident (None when it is not indexed), in one atomic read."""
        if not incident_ids:
            return {}
        reply = self._fcall(
            library.FN_GROUP_OF, [self.keys.meta, self.keys.fingerprints], list(incident_ids), readonly=True
        )
        return {
            i: None if not label else Group(text(label), int(size))
            for i, (label, size) in zip(incident_ids, reply, strict=True)
        }

    def group_of(self, incident_id: str) -> Group | None:
        """The incident's group: its label and how many incidents it has (None when the incident is not indexed)."""
        return self.groups_of([incident_id])[incident_id]

    def merge_groups(self, into: str, other: str) -> tuple[Group, Group]:
        """Fold group `other` into group `into`, atomically: `other`'s members, and incidents that would later join
        it, belong to `into` from now on. Returns `into` after the merge and `other` before it; raises ResponseError
        (NOGROUP ...) when either names no group."""
        a, size_a, b, size_b = self._fcall(
            library.FN_GROUP_MERGE, [self.keys.meta, self.keys.fingerprints], [into, other]
        )
        return Group(text(a), int(size_a)), Group(text(b), int(size_b))

    def largest_groups(self, count: int = 20) -> list[Group]:
        """The `count` largest groups of more than one incident, largest first (then by label); reads every group's
        size (HSCAN), so its cost follows the number of groups."""
        sizes = [Group(text(k), self._size(k, v)) for k, v in self.redis.hscan_iter(self.keys.group_sizes, count=1000)]
        return sorted(sizes, key=lambda g: (-g.size, g.label))[:count]

    def active_groups(self, count: int = 20) -> list[tuple[Group, int]]:
        """The `count` groups an incident joined most recently, with when (ms of the server's clock), latest first."""
        rows: list[Any] = self.redis.zrevrange(self.keys.group_active, 0, count - 1, withscores=True)
        labels = [text(row[0]) for row in rows]
        sizes = self.redis.hmget(self.keys.group_sizes, labels) if labels else []
        return [
            (Group(label, self._size(label, size or 1)), int(row[1]))
            for label, row, size in zip(labels, rows, sizes, strict=True)
        ]

    def _size(self, label: Any, raw: Any) -> int:
        """A group's size as `{N}:groupsize` holds it; a value no version writes there (a hand edit) is named."""
        try:
            return int(raw)
        except ValueError:
            raise FingerprintIndexError(
                f"{self.keys.group_sizes} field {text(label)!r} holds {text(raw)[:40]!r}, not a number of incidents "
                "(a hand edit?): run `incident-worker verify --repair`, which counts the group's members again"
            ) from None

    def group_members(self, label: str) -> list[str]:
        """The incidents of a group, in byte order (a merged-away label names the group it was merged into). Reads
        every group entry (HSCAN), so its cost follows the number of incidents in groups of more than one."""
        merged = {text(k): text(v) for k, v in self.redis.hgetall(self.keys.group_merged).items()}
        label = merged.get(label, label)
        members = {
            text(i)
            for i, raw in self.redis.hscan_iter(self.keys.groups, count=1000)
            if merged.get(text(raw), text(raw)) == label
        }
        # incidents with no entry are in the group their own ID names: the label itself, or a label merged into it
        own = [label, *(m for m, into in merged.items() if into == label)]
        entries = self.redis.hmget(self.keys.groups, own)
        indexed = self.redis.hmget(self.keys.fingerprints, own)
        members |= {i for i, entry, fp in zip(own, entries, indexed, strict=True) if entry is None and fp is not None}
        return sorted(members, key=lambda i: i.encode("utf-8", "surrogateescape"))
