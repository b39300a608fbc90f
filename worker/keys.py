"""Every Redis key name of an index, in one place (docs/contract.md#what-lives-in-redis).

All keys of namespace N carry the hash tag ``{N}``, so an index and its streams live in one Redis Cluster slot and
one server-side call can touch all of them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bands import BandLayout

__all__ = ["DEFAULT_NAMESPACE", "BandKeys", "IndexKeys", "glob_escape", "hash_tag", "validate_namespace"]

DEFAULT_NAMESPACE = "incidents"
"""As in the contract: `{incidents}:fp`, `{incidents}:band:3:a7`, ..."""

MAX_NAMESPACE_LENGTH = 64
"""Long enough for any sensible name; every key repeats it, so it costs memory per posting key."""


def validate_namespace(namespace: str) -> str:
    """A non-empty name without braces (it becomes the hash tag) or spaces (it must read well in redis-cli)."""
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("namespace must be a non-empty string, such as 'incidents'")
    if len(namespace) > MAX_NAMESPACE_LENGTH:
        raise ValueError(f"namespace {namespace[:20]!r}... is longer than {MAX_NAMESPACE_LENGTH} characters")
    bad = [c for c in namespace if c in "{}" or c.isspace() or not c.isprintable()]
    if bad:
        raise ValueError(
            f"namespace {namespace!r} contains {bad[0]!r}; use letters, digits and punctuation other than braces"
        )
    return namespace


@dataclass(frozen=True)
class IndexKeys:
    """The key names of one index namespace N (each name made once: the apply call of every event names several)."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)

    @functools.cached_property
    def tag(self) -> str:
        """`{N}`: the hash tag every key of the index starts with."""
        return "{" + self.namespace + "}"

    @functools.cached_property
    def meta(self) -> str:
        """Hash: the layout the index was built with; a worker with another layout refuses to start."""
        return f"{self.tag}:meta"

    @functools.cached_property
    def fingerprints(self) -> str:
        """Hash: incident ID -> 16 hex digits. The source of truth: postings can be rebuilt from it."""
        return f"{self.tag}:fp"

    def band_prefix(self, band: int, generation: int = 0) -> str:
        """`{N}:band:<b>:`: set of the incident IDs whose band b has the value that follows, in zero-padded
        lowercase hex of the band's `BandLayout.hex_digits` (`BandKeys` builds them).

        An index moved to another layout (`incident-worker migrate`) keeps its postings under a new generation g:
        `{N}:band:g<g>:<b>:`, so the layout being built never shares a key with the one in use. Generation 0, the
        layout an index is created with, has no generation part."""
        return f"{self.postings_prefix(generation)}{band}:"

    def postings_prefix(self, generation: int = 0) -> str:
        """`{N}:band:` (generation 0) or `{N}:band:g<g>:`: what every posting key of that generation starts with,
        followed by the band number (a digit: that is what tells generation 0's keys from the others')."""
        return f"{self.tag}:band:" if generation == 0 else f"{self.tag}:band:g{generation}:"

    def postings_pattern(self, generation: int = 0) -> str:
        """A SCAN MATCH pattern for every posting key of one generation, and of no other."""
        return glob_escape(self.postings_prefix(generation)) + "[0-9]*"

    def band_keys(self, layout: BandLayout, generation: int = 0) -> list[BandKeys]:
        """The posting-key builder of each band of `layout` (in that generation's keys), band 0 first."""
        return [
            BandKeys(self.band_prefix(b, generation), width, digits, masks)
            for b, (width, digits, masks) in enumerate(
                zip(layout.widths, layout.hex_digits, layout.probe_masks, strict=True)
            )
        ]

    @functools.cached_property
    def twin_prefix(self) -> str:
        """`{N}:twins:`; the twin group of a fingerprint appends its 16 lowercase hex digits."""
        return f"{self.tag}:twins:"

    def twins(self, fingerprint_hex: str) -> str:
        """Sorted set (all scores 0, so in byte order): every incident with this exact fingerprint, its
        representative in the posting sets included. Exists only while two or more incidents share it (twin groups,
        docs/contract.md#what-lives-in-redis)."""
        return self.twin_prefix + fingerprint_hex

    @functools.cached_property
    def migration(self) -> str:
        """Hash: a move to another layout under way (`incident-worker migrate`): its state, source and target
        layout, the target's generation, the cursor of its current pass and its progress. Absent otherwise."""
        return f"{self.tag}:migration"

    @functools.cached_property
    def changes(self) -> str:
        """Stream: one entry per index change, `<op> <incident ID> fp <new> prev <old>`; its entry ID is the time
        of the change. Snapshot readers follow it; the workers trim it to `changes_keep`. Retention does not read it
        (it reads `expiry`), so how long it is kept does not depend on the retention window."""
        return f"{self.tag}:changes"

    @functools.cached_property
    def expiry(self) -> str:
        """Sorted set, only while a retention window is on: incident ID -> time of its last add or upsert (ms of the
        server's clock). The retention pass reads the oldest from it, so its cost follows what expires."""
        return f"{self.tag}:expiry"

    @functools.cached_property
    def groups(self) -> str:
        """Hash: incident ID -> the label of its group, only for an incident whose label is not its own ID (one that
        opened its own group has no entry). The Lua library builds the group keys' names from `meta`'s."""
        return f"{self.tag}:group"

    @functools.cached_property
    def group_sizes(self) -> str:
        """Hash: group label -> its members, for every group but one whose only member is the incident that opened
        it (such a group costs nothing: no entry here or in `groups`)."""
        return f"{self.tag}:groupsize"

    @functools.cached_property
    def group_merged(self) -> str:
        """Hash: the label of a group merged into another -> that group's label (`incident-worker groups merge`)."""
        return f"{self.tag}:groupmerged"

    @functools.cached_property
    def group_active(self) -> str:
        """Sorted set: group label -> when an incident last joined it (ms of the server's clock), for the 1,000 groups
        joined most recently (at most 1,100 between trims): a bounded size whatever the index's."""
        return f"{self.tag}:groupactive"

    def lease(self, job: str) -> str:
        """String with a TTL: the worker that runs `job` (one at a time); it lapses when that worker dies."""
        return f"{self.tag}:lease:{job}"

    @functools.cached_property
    def events_stream(self) -> str:
        """Stream: incoming incident events (the default; configurable)."""
        return f"{self.tag}:events"

    @functools.cached_property
    def alerts_stream(self) -> str:
        """Stream: near-duplicate alerts (the default; configurable)."""
        return f"{self.tag}:alerts"

    @functools.cached_property
    def dead_stream(self) -> str:
        """Stream: entries that could not be processed, with the reason (the default; configurable)."""
        return f"{self.tag}:dead"

    @functools.cached_property
    def inbox(self) -> str:
        """List: events producers appended (RPUSH, or the library's `submit`), one encoded event an element, waiting
        for a worker's `intake` to move them into the events stream with server-assigned IDs. A producer's user may
        append here and nothing else (deploy/redis/users.acl)."""
        return f"{self.tag}:inbox"

    def heartbeat(self, consumer: str) -> str:
        """String with a TTL: a worker's proof of life, read by `incident-worker check`."""
        return f"{self.tag}:heartbeat:{consumer}"

    @functools.cached_property
    def workers(self) -> str:
        """Sorted set: the consumer name of every worker that beat within the last hour, scored with the time its
        heartbeat expires (ms, the worker's clock). Each heartbeat enters it; `check` and `stats` read it instead of
        scanning the keyspace for heartbeat keys."""
        return f"{self.tag}:workers"

    def owns(self, key: str) -> bool:
        """Whether Redis Cluster hashes `key` by this index's tag, so it lives in the index's slot."""
        return hash_tag(key) == self.namespace

    def kind_of(self, key: str, streams: Sequence[str] = ()) -> str | None:
        """The type the index keeps at `key`, as Redis's TYPE names it (hash, set, zset, stream, string), or None for
        a key that is none of the index's. `streams` are the configured stream names, when not the defaults."""
        fixed = {self.meta: "hash", self.fingerprints: "hash", self.migration: "hash", self.expiry: "zset"}
        fixed |= {self.groups: "hash", self.group_sizes: "hash", self.group_merged: "hash", self.group_active: "zset"}
        fixed[self.workers] = "zset"
        fixed[self.inbox] = "list"
        if key in fixed:
            return fixed[key]
        if key in (self.changes, self.events_stream, self.alerts_stream, self.dead_stream, *streams):
            return "stream"
        prefixes = {
            self.postings_prefix(): "set",
            self.twin_prefix: "zset",
            self.heartbeat(""): "string",
            self.lease(""): "string",
        }
        return next((kind for prefix, kind in prefixes.items() if key.startswith(prefix)), None)


def glob_escape(text: str) -> str:
    """`text` with the characters SCAN MATCH treats as special escaped, so that it matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: the text inside the first non-empty `{...}`, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


_HEX4 = [f"{v:04x}" for v in range(1 << 16)]


@functools.lru_cache(maxsize=64)
def _key_table(prefix: str, bits: int, digits: int) -> list[str]:
    """`prefix` + each `bits`-bit value in `digits` hex digits; shared by every index of a namespace."""
    return [f"{prefix}{v:0{digits}x}" for v in range(1 << bits)]


class BandKeys:
    """Builds the posting key names of one band fast: one list lookup (and at most one concatenation) per key.

    Each query builds 68 keys under the default layout and 508 under 3 bands; `format` per key would cost more
    client time than the server spends on the whole call at small index sizes. The probe keys of recent band
    values are kept too: incident fingerprints cluster, so the same band values come back again and again.
    """

    _CACHE_KEYS = 100_000  # per band: ~6,000 band values under the default layout, 400 to 4,700 under 3 bands (~30 MB)

    def __init__(self, prefix: str, width: int, digits: int, masks: Sequence[int]) -> None:
        self.prefix, self.width, self.digits, self.masks = prefix, width, digits, tuple(masks[1:])
        self._cache_size = max(64, self._CACHE_KEYS // max(1, len(self.masks)))
        self._full: list[str] | None = None
        self._high: list[str] | None = None
        self._probes: dict[int, tuple[str, ...]] = {}
        if width <= 16:
            self._full = _key_table(prefix, width, digits)
        elif width <= 32:
            self._high = _key_table(prefix, width - 16, digits - 4)

    def key(self, value: int) -> str:
        """The posting key of band value `value`."""
        if self._full is not None:
            return self._full[value]
        return self.keys(value, (0,))[0]

    def probes(self, value: int) -> tuple[str, ...]:
        """The keys of every other value this band probes around `value` (at its own radius in the layout)."""
        found = self._probes.get(value)
        if found is None:
            if len(self._probes) >= self._cache_size:
                self._probes.clear()
            found = self._probes[value] = tuple(self.keys(value, self.masks))
        return found

    def keys(self, value: int, masks: Sequence[int]) -> list[str]:
        """The key of `value ^ mask` for each mask."""
        if self._full is not None:
            full = self._full
            return [full[value ^ mask] for mask in masks]
        if self._high is not None:
            high, low = self._high, _HEX4
            return [high[(v := value ^ mask) >> 16] + low[v & 0xFFFF] for mask in masks]
        return [f"{self.prefix}{value ^ mask:0{self.digits}x}" for mask in masks]
