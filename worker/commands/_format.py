"""How the subcommands print: text for people (safe on any terminal), one line of JSON for scripts, tables, counts,
sizes and durations, and the one way an alert's matches are written (`alerts` and `demo` alike)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..formats import Match
from ..logs import printable

__all__ = ["SHOWN_MATCHES", "duration", "json_line", "matches_text", "plural", "print_table", "shown", "size"]

SHOWN_MATCHES = 5
"""Matches of an alert written out on its line; the rest are counted ("and 12 more")."""


def shown(text: str) -> str:
    """Text safe to print on any terminal: every character a terminal would act on rather than show (control
    characters such as ESC, newline or BEL; invisible format characters such as a right-to-left override) as its
    Python escape (`\\x1b`, `\\n`, `\\u202e`), and so bytes that were not UTF-8 (surrogate escapes) as `\\udcXX`.

    Incident IDs, texts and dead letters come from producers: printed as they are, one could clear an operator's
    screen, set the terminal's title, or make a line read as another."""
    return printable(text)


def json_line(value: Any) -> str:
    """One line of JSON; Unicode kept readable unless the value holds undecodable bytes (then escaped)."""
    line = json.dumps(value, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(value)
    return line


def plural(count: int, word: str, plural_form: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural_form or word + 's'}"


def size(count: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1024
    return f"{count:,.1f} TB"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def matches_text(
    matches: Sequence[Match], match_count: int, limit: int = SHOWN_MATCHES, *, at_least: bool = False
) -> str:
    """`47 (distance 0), 90 (distance 2) and 3 more`: the closest `limit` matches of an alert, the rest counted
    (`at_least`: an incomplete alert's count, a lower bound)."""
    text = ", ".join(f"{shown(m.incident_id)} (distance {m.distance})" for m in matches[:limit])
    more = match_count - min(limit, len(matches))
    return text + (f" and {'at least ' if at_least else ''}{more:,} more" if more > 0 else "")


def print_table(
    rows: Sequence[Sequence[Any]], header: Sequence[str], indent: str = "", right: Sequence[int] = ()
) -> None:
    """Columns padded to their widest cell; the columns numbered in `right` (numbers) aligned right."""
    cells = [[shown(str(cell)) for cell in row] for row in rows]
    widths = [max(len(header[i]), *(len(row[i]) for row in cells)) for i in range(len(header))]
    for line in [list(header), *cells]:
        padded = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        print(indent + "  ".join(padded).rstrip())
