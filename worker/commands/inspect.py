"""`incident-worker inspect`: what the index holds for one incident (fingerprint, bands, posting sets, matches)."""

from __future__ import annotations

import argparse
import string
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..connection import RedisClient
from ..errors import CommandError
from ..fingerprint import format_fingerprint
from ..index import FingerprintIndex, Group, Posting
from ..keytypes import incident_keys, is_wrong_type, search_keys
from ..settings import Settings
from ._format import json_line, plural, print_table, shown
from ._index import match_rows, print_matches, stored_index
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    add_settings_flags,
    command_client,
    describe,
    json_flag,
    say,
    with_settings,
    wrong_type_error,
)

__all__ = ["DEPRECATED_KEY", "Inspection", "configure", "inspect_incident"]

DEPRECATED_KEY = "neighbours"
"""The JSON key `inspect` gave its matches under before every command said "matches"; kept for one release."""


@dataclass
class Inspection:
    """One indexed incident: its fingerprint, each band's posting set, and its current matches."""

    namespace: str
    incident_id: str
    fingerprint: int
    index: FingerprintIndex
    postings: list[Posting]
    matches: list[dict[str, Any]]
    group: Group | None = None

    @property
    def bits(self) -> str:
        """The 64 bits, most significant first, a space between bands (the last band first)."""
        layout = self.index.layout
        values = zip(layout.values(self.fingerprint), layout.widths, strict=True)
        return " ".join(reversed([format(value, f"0{width}b") for value, width in values]))

    @property
    def missing(self) -> list[str]:
        """Posting keys that should hold the incident and do not (an inconsistent index)."""
        return [p.key for p in self.postings if not p.member]

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "incident_id": self.incident_id,
            "fingerprint": format_fingerprint(self.fingerprint),
            "bits": self.bits,
            "layout": self.index.layout.description,
            "bands": [
                {
                    "band": p.band,
                    "offset": p.offset,
                    "width": p.width,
                    "value": _hex(p),
                    "bits": format(p.value, f"0{p.width}b"),
                    "key": p.key,
                    "size": p.size,
                    "member": p.member,
                }
                for p in self.postings
            ],
            "max_distance": self.index.layout.max_distance,
            "group": self.group.label if self.group else None,
            "group_size": self.group.size if self.group else None,
            "matches": self.matches,
            # the former name of `matches`, kept for one release (--help says so)
            DEPRECATED_KEY: self.matches,
        }


def _hex(posting: Posting) -> str:
    return f"{posting.value:0{-(-posting.width // 4)}x}"


def inspect_incident(client: RedisClient, settings: Settings, incident_id: str) -> Inspection:
    """Read what the index holds for the incident; CommandError when it is not indexed."""
    index, _ = stored_index(client, settings)
    stored = index.stored_values([incident_id])[incident_id] if index is not None else None
    if isinstance(stored, str) and not (len(stored) == 16 and all(c in string.hexdigits for c in stored)):
        raise CommandError(
            f"incident {shown(incident_id)!r} is stored in {settings.keys.fingerprints} as {shown(stored[:40])!r}, "
            "which is not a fingerprint (16 hex digits); `incident-worker verify --repair` removes it, then send "
            "its event again"
        )
    fp = int(stored, 16) if isinstance(stored, str) else stored  # hex digits in upper case: the same number
    if index is None or fp is None:
        raise CommandError(
            f"incident {shown(incident_id)!r} is not indexed in namespace {settings.namespace!r} "
            f"(no field in {settings.keys.fingerprints}); if it was published, see `incident-worker dead` "
            "for why it may not have been processed"
        )
    try:
        postings = index.postings(incident_id, fp)
        rows = match_rows(index, [m for m in index.matches_of(fp) if m[0] != incident_id])
        group = index.group_of(incident_id)
    except ResponseError as error:
        if not is_wrong_type(error):
            raise
        raise wrong_type_error(client, settings, [*incident_keys(index, fp), *search_keys(index, fp)]) from None
    return Inspection(settings.namespace, incident_id, fp, index, postings, rows, group)


def print_inspection(found: Inspection, settings: Settings) -> None:
    layout = found.index.layout
    print(f"incident {shown(found.incident_id)} in {settings.keys.tag}")
    print(f"  fingerprint  {format_fingerprint(found.fingerprint)}")
    if found.group is not None:
        print(f"  group        {shown(found.group.label)} ({plural(found.group.size, 'incident')})")
    print(f"  bits         {found.bits}")
    print(f"               (band {layout.bands - 1} .. band 0, most significant bit first)")
    print(f"  layout       {layout.description}")
    print()
    print_table(
        [
            (
                p.band,
                f"{p.offset}..{p.offset + p.width - 1}",
                _hex(p),
                p.key,
                p.size,
                "yes" if p.member else "NO (index inconsistent)",
            )
            for p in found.postings
        ],
        ("BAND", "BITS", "VALUE", "POSTING KEY", "SIZE", "MEMBER"),
        "  ",
        right=(0, 4),
    )
    print()
    if found.matches:
        print(f"{plural(len(found.matches), 'match', 'matches')} within {layout.max_distance}:")
        print_matches(found.matches, "  ")
    else:
        print(f"no other incident within {layout.max_distance}")


@with_settings("inspect")
def _inspect(args: argparse.Namespace, settings: Settings) -> int:
    found = inspect_incident(command_client(settings, "inspect"), settings, args.incident_id)
    if args.json:
        print(json_line(found.as_json()))
        return EXIT_OK
    print_inspection(found, settings)
    if found.missing:
        say("inspect", f"the incident is missing from {len(found.missing)} of its posting sets; queries may miss it")
        return EXIT_FAILURE
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Show what the index holds for one incident: its fingerprint (hex, and the 64 bits grouped by "
        "band), each band's value with its posting key and that set's size, and its current matches. In --json, "
        f"the key `{DEPRECATED_KEY}` repeats `matches` under its former name: it is deprecated and goes in the next "
        "release; read `matches`.",
        examples="""
  incident-worker inspect 47
  incident-worker inspect --namespace staging INC-2024-0042 --json | jq .matches
""",
        exits="""
  0  shown
  1  the incident is not indexed (or is missing from a posting set of its own), or Redis failed
  2  bad usage
""",
    )
    parser.add_argument("incident_id", metavar="ID", help="the incident ID, as in the events")
    json_flag(parser, "the fingerprint, bands and matches as one JSON object")
    add_settings_flags(parser, only=CONNECTION)
    parser.set_defaults(handler=_inspect)
