"""`incident-worker groups`: the largest and the most recently joined groups, the members of one, and merging two."""

from __future__ import annotations

import argparse
import time
from typing import Any

from redis.exceptions import ResponseError

from ..errors import CommandError
from ..index import FingerprintIndex
from ..settings import Settings
from ._format import json_line, plural, print_table, shown
from ._index import stored_index
from ._shared import (
    CONNECTION,
    EXIT_OK,
    add_settings_flags,
    command_client,
    count_arg,
    describe,
    json_flag,
    with_settings,
)

__all__ = ["configure"]


def _index(settings: Settings, command: str) -> FingerprintIndex:
    index, _ = stored_index(command_client(settings, command), settings)
    if index is None:
        raise CommandError(
            f"namespace {settings.namespace!r} has no index yet ({settings.keys.meta} is missing; the first worker "
            "writes it)"
        )
    return index


@with_settings("groups")
def _list(args: argparse.Namespace, settings: Settings) -> int:
    index = _index(settings, "groups")
    largest = index.largest_groups(args.count)
    active = index.active_groups(args.count)
    if args.json:
        print(
            json_line(
                {
                    "namespace": settings.namespace,
                    "largest": [{"group": g.label, "size": g.size} for g in largest],
                    "recent": [{"group": g.label, "size": g.size, "joined_ms": ms} for g, ms in active],
                }
            )
        )
        return EXIT_OK
    if not largest:
        print(f"no group of more than one incident in {settings.keys.tag}")
        return EXIT_OK
    print(f"largest groups in {settings.keys.tag}:")
    print_table([(g.label, g.size) for g in largest], ("GROUP", "SIZE"), "  ", right=(1,))
    now = time.time() * 1000
    print("most recently joined:")
    print_table(
        [(g.label, g.size, f"{max(0.0, (now - ms) / 1000):.0f}s ago") for g, ms in active],
        ("GROUP", "SIZE", "JOINED"),
        "  ",
        right=(1,),
    )
    return EXIT_OK


@with_settings("groups show")
def _show(args: argparse.Namespace, settings: Settings) -> int:
    index = _index(settings, "groups show")
    members = index.group_members(args.group)
    if not members:
        raise CommandError(
            f"{shown(args.group)!r} names no group of {settings.keys.tag}; `incident-worker groups` lists them"
        )
    label = index.group_of(members[0])
    assert label is not None
    if args.json:
        print(json_line({"group": label.label, "size": len(members), "members": members}))
        return EXIT_OK
    print(f"group {shown(label.label)}: {plural(len(members), 'incident')}")
    for member in members:
        print(f"  {shown(member)}")
    return EXIT_OK


@with_settings("groups merge")
def _merge(args: argparse.Namespace, settings: Settings) -> int:
    index = _index(settings, "groups merge")
    try:
        into, other = index.merge_groups(args.into, args.other)
    except ResponseError as error:
        if str(error).startswith("NOGROUP"):
            raise CommandError(str(error).removeprefix("NOGROUP ")) from None
        raise
    result: dict[str, Any] = {"group": into.label, "size": into.size, "merged": other.label}
    if args.json:
        print(json_line(result))
    elif into.label == other.label:
        print(f"{shown(args.other)} is in group {shown(into.label)} already ({plural(into.size, 'incident')})")
    else:
        print(
            f"merged group {shown(other.label)} ({plural(other.size, 'incident')}) into {shown(into.label)}: "
            f"{plural(into.size, 'incident')}"
        )
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "The index's groups (docs/contract.md#groups): the largest and the most recently joined, each with its "
        "size; `groups show G` lists a group's incidents, `groups merge A B` folds group B into group A for good "
        "(B's incidents, and incidents that later join them, are in A). Listing reads every group's size and "
        "`show` every group entry: their cost follows the number of incidents in groups of more than one.",
        examples="""
  incident-worker groups
  incident-worker groups --count 5 --json
  incident-worker groups show INC-4
  incident-worker groups merge INC-4 INC-9
""",
        exits="""
  0  listed, shown or merged
  1  no such group, no index yet, or Redis failed
""",
    )
    parser.add_argument("--count", type=count_arg, default=20, metavar="N", help="N groups of each list (default 20)")
    json_flag(parser, "the lists as one JSON object")
    add_settings_flags(parser, only=CONNECTION)
    parser.set_defaults(handler=_list)

    actions = parser.add_subparsers(dest="groups_action", metavar="ACTION")
    show = actions.add_parser("show", help="the incidents of one group")
    describe(
        show,
        "The incidents of a group, in byte order (a group merged away shows the group it was merged into).",
        examples="""
  incident-worker groups show INC-4 --json
""",
        exits="""
  0  shown
  1  no such group, or Redis failed
""",
    )
    show.add_argument("group", metavar="GROUP", help="a group ID, as alerts and `groups` show it")
    json_flag(show, "the group and its members as one JSON object")
    add_settings_flags(show, only=CONNECTION)
    show.set_defaults(handler=_show)

    merge = actions.add_parser("merge", help="fold group B into group A, atomically")
    describe(
        merge,
        "Fold group B into group A in one atomic step: B's incidents belong to A, B's ID resolves to A from now on, "
        "and an incident whose closest match is in B joins A. It cannot be undone (groups never split).",
        examples="""
  incident-worker groups merge INC-4 INC-9
""",
        exits="""
  0  merged (or B was in A already)
  1  A or B names no group, or Redis failed
""",
    )
    merge.add_argument("into", metavar="A", help="the group that stays")
    merge.add_argument("other", metavar="B", help="the group folded into A")
    json_flag(merge, "the merged group as one JSON object")
    add_settings_flags(merge, only=CONNECTION)
    merge.set_defaults(handler=_merge)
