"""Read-only helpers over the index shared by `query`, `inspect` and `stats`: the stored index, match rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..connection import RedisClient
from ..errors import CommandError, LayoutMismatchError
from ..fingerprint import format_fingerprint
from ..index import FingerprintIndex
from ..settings import Settings
from ._format import print_table

__all__ = ["match_rows", "print_matches", "stored_index"]


def stored_index(client: RedisClient, settings: Settings) -> tuple[FingerprintIndex | None, dict[str, str]]:
    """The index with the layout it was built with (None when it has no meta yet), and its meta.

    Never writes `{N}:meta`: a namespace gets its layout from its first worker, not from a query run before it."""
    try:
        index = FingerprintIndex.stored(client, settings.namespace)
    except LayoutMismatchError as error:
        raise CommandError(f"{error}; check --namespace") from None
    return index, FingerprintIndex.read_meta(client, settings.namespace) if index else {}


def match_rows(index: FingerprintIndex, matches: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """Each match with its stored fingerprint (hex; None if it was deleted meanwhile) and its group's ID."""
    ids = [incident_id for incident_id, _ in matches]
    stored = index.fingerprints_of(ids)
    groups = index.groups_of(ids)
    return [
        {
            "incident_id": incident_id,
            "distance": dist,
            "fingerprint": format_fingerprint(fp) if (fp := stored.get(incident_id)) is not None else None,
            "group": group.label if (group := groups.get(incident_id)) is not None else None,
        }
        for incident_id, dist in matches
    ]


def print_matches(rows: list[dict[str, Any]], indent: str = "") -> None:
    print_table(
        [(r["incident_id"], r["distance"], r["fingerprint"] or "?", r.get("group") or "?") for r in rows],
        ("INCIDENT_ID", "DISTANCE", "FINGERPRINT", "GROUP"),
        indent,
        right=(1,),
    )
