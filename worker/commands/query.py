"""`incident-worker query`: the indexed incidents near a bag or a text, without indexing anything."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..connection import RedisClient
from ..errors import InvalidFeaturesError, TokenizerMismatchError
from ..fingerprint import fingerprint, format_fingerprint
from ..keytypes import is_wrong_type, search_keys
from ..settings import Settings
from ._format import json_line, plural
from ._index import match_rows, print_matches, stored_index
from ._shared import (
    CONNECTION,
    EXIT_OK,
    UsageError,
    add_settings_flags,
    command_client,
    describe,
    distance_arg,
    json_flag,
    with_settings,
    wrong_type_error,
)

__all__ = ["QueryResult", "configure", "run_query"]


@dataclass
class QueryResult:
    """A bag looked up in a namespace: its fingerprint, the limit used, and the matches, closest first."""

    namespace: str
    bag: dict[str, int]
    fingerprint: int
    max_distance: int
    indexed: int
    has_layout: bool
    matches: list[dict[str, Any]]

    @property
    def group(self) -> str | None:
        """The group an incident with this bag would join now: its closest match's (None: it would open one)."""
        return self.matches[0].get("group") if self.matches else None

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "fingerprint": format_fingerprint(self.fingerprint),
            "features": self.bag,
            "max_distance": self.max_distance,
            "indexed": self.indexed,
            "match_count": len(self.matches),
            "group": self.group,
            "matches": self.matches,
        }


def run_query(
    client: RedisClient, settings: Settings, bag: dict[str, int], limit: int | None, *, text: bool = False
) -> QueryResult:
    """Look the bag up within `limit` (default: the index's max distance), reading only.

    `text`: the bag came from this version's tokenizer, so an index whose text incidents came from another
    version is refused (their fingerprints are not comparable).
    """
    fp = fingerprint(bag)
    index, _ = stored_index(client, settings)
    if index is not None and text:
        try:
            index.check_tokenizer()
        except TokenizerMismatchError as error:
            raise UsageError(str(error)) from None
    if index is None:
        limit = settings.max_distance if limit is None else limit
        return QueryResult(settings.namespace, bag, fp, limit, 0, False, [])
    if limit is None:
        limit = index.layout.max_distance
    elif limit > index.layout.max_distance:
        raise UsageError(
            f"--max-distance {limit} is beyond this index's max distance {index.layout.max_distance}: its bands "
            f"only guarantee finding matches up to {index.layout.max_distance}; use 0 to "
            f"{index.layout.max_distance}"
        )
    try:
        rows = match_rows(index, index.matches_of(fp, limit))
    except ResponseError as error:
        if not is_wrong_type(error):
            raise
        raise wrong_type_error(client, settings, search_keys(index, fp, limit)) from None
    return QueryResult(settings.namespace, bag, fp, limit, len(index), True, rows)


def print_query(result: QueryResult, settings: Settings) -> None:
    print(
        f"bag of {plural(len(result.bag), 'token')}, fingerprint {format_fingerprint(result.fingerprint)}; "
        f"index {settings.keys.tag} holds {plural(result.indexed, 'incident')}"
    )
    if not result.has_layout:
        print(
            f"no match within {result.max_distance}: the index has no layout yet ({settings.keys.meta} is missing; "
            "the first worker writes it)"
        )
    elif not result.matches:
        print(f"no match within {result.max_distance}")
    else:
        print_matches(result.matches)
        print(f"{plural(len(result.matches), 'match', 'matches')} within {result.max_distance}")
        if result.group is not None:
            print(f"an incident with this bag would join group {result.group} (its closest match's)")


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():
        raise UsageError(
            f"no {what} given: pass --features '{{\"disk\": 2, \"full\": 1}}' or --text 'disk full on web-3', "
            "or pipe the bag (JSON) into standard input"
        )
    return sys.stdin.read()


def _bag_of(args: argparse.Namespace) -> dict[str, int]:
    """The bag to look up, from --features (JSON), --text, or standard input (JSON)."""
    if args.text is not None:
        from ..text import features_from_text

        line = _read_stdin("text") if args.text == "-" else args.text
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:  # undecodable bytes of the argument or of stdin (surrogate escapes)
            raise UsageError(
                f"--text: the text is not valid UTF-8 (at character {error.start}); convert it first, e.g. with "
                "iconv -f LATIN1 -t UTF-8 (a worker dead-letters such an event as not_utf8)"
            ) from None
        try:
            return features_from_text(line)
        except ValueError as error:
            raise UsageError(f"--text: the text has nothing to fingerprint: {error}") from None
    raw = args.features if args.features not in (None, "-") else _read_stdin("bag")
    try:
        bag = json.loads(raw)
    except ValueError as error:
        raise UsageError(
            f"the bag is not valid JSON ({error}); give an object of token -> weight, "
            'e.g. --features \'{"disk": 2, "full": 1}\''
        ) from None
    try:
        fingerprint(bag)
    except InvalidFeaturesError as error:
        raise UsageError(f"invalid bag: {error}") from None
    return bag


@with_settings("query")
def _query(args: argparse.Namespace, settings: Settings) -> int:
    bag = _bag_of(args)
    result = run_query(command_client(settings, "query"), settings, bag, args.limit, text=args.text is not None)
    if args.json:
        print(json_line(result.as_json()))
    else:
        print_query(result, settings)
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Print every indexed incident within the max distance of a bag of features (or of a text's bag "
        "of words), closest first, without indexing anything. The bag is JSON: --features, or standard input. "
        "Uses the layout the index was built with ({N}:meta).",
        examples="""
  incident-worker query --features '{"dock": 3, "scanner": 2, "timeout": 1}'
  incident-worker query --text 'Disk full on /var/log at web-3' --max-distance 3
  jq -c .features incident.json | incident-worker query --json
""",
        exits="""
  0  the query ran, whether or not anything matched ("no match within N")
  1  Redis failed
  2  bad usage: invalid bag or text, --max-distance beyond the index's
""",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--features", metavar="JSON", help="the bag: a JSON object token -> weight (- = stdin)")
    source.add_argument(
        "--text", metavar="TEXT", help="a text (log line, title) whose bag of words is looked up (- = stdin)"
    )
    parser.add_argument(
        "--max-distance",
        dest="limit",
        type=distance_arg,
        metavar="N",
        help="report matches within N only (at most the index's max distance, which is the default)",
    )
    json_flag(parser, "the fingerprint, the bag and the matches as one JSON object")
    add_settings_flags(parser, only=CONNECTION)
    parser.set_defaults(handler=_query)
