"""Every Redis key name of an index, in one place (SPEC section 3).

All keys of namespace N carry the hash tag ``{N}``, so an index and its streams live in one Redis Cluster slot and
one server-side call can touch all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_NAMESPACE", "IndexKeys", "hash_tag", "validate_namespace"]

DEFAULT_NAMESPACE = "incidents"
"""SPEC section 3: `{incidents}:fp`, `{incidents}:band:3:a7`, ..."""

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
    """The key names of one index namespace N."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)

    @property
    def tag(self) -> str:
        """`{N}`: the hash tag every key of the index starts with."""
        return "{" + self.namespace + "}"

    @property
    def meta(self) -> str:
        """Hash: the layout the index was built with; a worker with another layout refuses to start."""
        return f"{self.tag}:meta"

    @property
    def fingerprints(self) -> str:
        """Hash: incident ID -> 16 hex digits. The source of truth: postings can be rebuilt from it."""
        return f"{self.tag}:fp"

    def band_prefix(self, band: int) -> str:
        """`{N}:band:<b>:`; the posting key of a value appends its zero-padded lowercase hex."""
        return f"{self.tag}:band:{band}:"

    def band(self, band: int, value: int, digits: int) -> str:
        """Set: incident IDs whose band `band` has value `value`."""
        return f"{self.tag}:band:{band}:{value:0{digits}x}"

    @property
    def changes(self) -> str:
        """Stream: one entry per index change, `<op> <incident ID>`; its entry ID is the time of the change.

        Kept so that a retention window can expire incidents by age (XRANGE up to a time, then XTRIM MINID) and
        changes can be audited; 16 bytes an entry, where a set of IDs per hour would cost 60 past 512 members.
        """
        return f"{self.tag}:changes"

    @property
    def events(self) -> str:
        """Stream: incoming incident events (the default; configurable)."""
        return f"{self.tag}:events"

    @property
    def alerts(self) -> str:
        """Stream: near-duplicate alerts (the default; configurable)."""
        return f"{self.tag}:alerts"

    @property
    def dead(self) -> str:
        """Stream: entries that could not be processed, with the reason (the default; configurable)."""
        return f"{self.tag}:dead"

    def heartbeat(self, consumer: str) -> str:
        """String with a TTL: a worker's proof of life, read by `incident-worker check`."""
        return f"{self.tag}:heartbeat:{consumer}"

    def owns(self, key: str) -> bool:
        """Whether Redis Cluster hashes `key` by this index's tag, so it lives in the index's slot."""
        return hash_tag(key) == self.namespace


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: the text inside the first non-empty `{...}`, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key
