"""The group-state part of `incident-worker verify` (docs/contract.md, "Verifying and repairing the index"): are the
group keys (`{N}:group`, `{N}:groupsize`, `{N}:groupmerged`, `{N}:groupactive`) what the incidents in `{N}:fp` and
the merges call for, and, with repair, make them so without changing the group of any incident.

`GroupStateChecks` is a part of `worker.integrity.Verifier`. Its walk, in bounded steps like the rest of verify:

1. `{N}:groupmerged` (HSCAN): a merged label must name a label that is not merged itself (chains and loops);
2. `{N}:group` (HSCAN, with HMGET of `{N}:fp`): an entry of an incident that is not indexed, or naming the
   incident's own ID; meanwhile each group's members are counted (an incident's group is its entry, else its own
   ID, then one hop of `{N}:groupmerged`, as the library reads it), then those without an entry (HMGET of the
   labels and the labels merged into them);
3. `{N}:groupsize` against the count: a difference is confirmed only while no change has happened since the count
   began (the library compares the last `{N}:changes` entry and `{N}:meta`'s `group_merges`); a count that a change
   overtook is made again, at most COUNT_TRIES times;
4. `{N}:groupactive` (ZSCAN): an entry must name a group of more than one.

Each subject is judged, and repaired, atomically by the library's `verify_groups_check`/`verify_groups_repair`. The
walk holds the merged labels and one count a group of more than one in memory: its size follows the number of such
groups (about one in ten incidents on the benchmark's workload), not the index's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import library
from .replies import text

if TYPE_CHECKING:
    from .connection import RedisClient
    from .keys import IndexKeys

__all__ = ["COUNT_TRIES", "GROUP_KINDS", "GROUP_REPAIRS", "GROUP_SUBJECTS", "GroupStateChecks"]

COUNT_TRIES = 3
"""How many times the members are counted when changes overtake the count, before the sizes are left unchecked."""

GROUP_KINDS: dict[str, str] = {
    "group_entry_orphan": "{N}:group entry of an incident that is not indexed",
    "group_entry_self": "{N}:group entry naming the incident's own ID (no entry means the same)",
    "group_merge_chain": "{N}:groupmerged entry naming a label merged further (more than one hop)",
    "group_merge_loop": "{N}:groupmerged entries that lead into a loop (A -> B -> A, or A -> A)",
    "group_size": "{N}:groupsize entry other than the group's members counted (or missing, or left by an ended group)",
    "group_active_stale": "{N}:groupactive entry naming no group of more than one",
    "group_sizes_unchecked": "group sizes not checked: incidents changed during every count",
}
"""The kinds of group-state findings, in the order reports list them."""

GROUP_REPAIRS: dict[str, str] = {
    "group_entry_orphan": "entry removed",
    "group_entry_self": "entry removed (its group unchanged)",
    "group_merge_chain": "pointed at the end of the chain",
    "group_merge_loop": "the loop's smallest label made the group, the others pointed at it",
    "group_size": "rewritten from the count (removed for an ended group or an opener alone)",
    "group_active_stale": "entry removed",
    "group_sizes_unchecked": "not repaired: run verify again when fewer events arrive",
}

GROUP_SUBJECTS = 100
"""Subjects judged per call of verify_groups_check/_repair (one to three commands each; a merge chain's hops more)."""

Subject = tuple[str, Any, Any]


def _raw(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


class GroupStateChecks:
    """The group-state walk of a `Verifier` (whose client, keys, report and helpers it uses)."""

    client: RedisClient
    keys: IndexKeys
    repair: bool
    batch: int
    _tag: str

    def _found(self, kind: str, subject: str, detail: str, repaired: bool) -> None:  # pragma: no cover
        """Report a finding once (the Verifier's)."""
        raise NotImplementedError

    def _pace(self, items: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _scanned(self) -> Counter[str]:  # pragma: no cover
        """The report's counts of what the walk read (the Verifier's)."""
        raise NotImplementedError

    def _walk_group_state(self) -> None:
        self._walk_merged()
        for _ in range(COUNT_TRIES):
            marker = self._group_call([], "")
            # the merged labels the count uses are read after the marker: a merge landing before this read is in
            # it, one landing after moves the marker (read before it, a merge in between went unnoticed)
            merged = self._read_merged()
            counted, own_entries = self._count_members(merged)
            sizes = self._read_sizes()
            # judged only when no change overtook the count, up to the step that judges each size (a call that
            # found the marker moved judged none of its sizes: count again)
            if self._group_call([], "") == marker and self._judge_sizes(counted, own_entries, merged, sizes, marker):
                break
        else:
            self._found("group_sizes_unchecked", self.keys.group_sizes, f"{COUNT_TRIES} counts overtaken", False)
        self._walk_active()

    # -- calls ------------------------------------------------------------------------------------------------------

    def _group_call(self, subjects: Sequence[Subject], marker: str) -> str:
        """Judge (with repair, repair) the subjects in calls of GROUP_SUBJECTS; returns the marker of the last call,
        or '' when `marker` was given and some call found another (its sizes were not judged)."""
        function = library.FN_VERIFY_GROUPS_REPAIR if self.repair else library.FN_VERIFY_GROUPS_CHECK
        call = self.client.fcall if self.repair else self.client.fcall_ro
        keys = [self.keys.meta, self.keys.fingerprints, self.keys.changes]
        now = ""
        for start in range(0, max(len(subjects), 1), GROUP_SUBJECTS):
            part = subjects[start : start + GROUP_SUBJECTS]
            args: list[Any] = [self._tag, "1" if self.repair else "0", marker]
            for code, f1, f2 in part:
                args += [code, f1, f2]
            reply = call(function, len(keys), *keys, *args)
            self._record_groups(reply[1:])
            if marker and text(reply[0]) != marker:
                return ""
            now = text(reply[0])
        return now

    def _record_groups(self, flat: Sequence[Any]) -> None:
        for i in range(0, len(flat), 4):
            self._found(text(flat[i + 1]), text(flat[i + 2]), text(flat[i + 3]), self.repair)

    # -- the steps --------------------------------------------------------------------------------------------------

    def _read_merged(self) -> dict[str, str]:
        return {text(k): text(v) for k, v in self.client.hscan_iter(self.keys.group_merged, count=self.batch)}

    def _walk_merged(self) -> None:
        merged = self._read_merged()
        self._scanned()["group_merged"] += len(merged)
        suspects: list[Subject] = [("m", _raw(label), "") for label, into in merged.items() if into in merged]
        if suspects:
            self._group_call(suspects, "")
        self._pace(len(merged))

    def _count_members(self, merged: dict[str, str]) -> tuple[Counter[str], set[str]]:
        """Each group's members with an entry in {N}:group, by the label they read as; judges the entries on the way.
        Also returns the incidents whose entry names their own ID (not counted here: they count as without one)."""
        counted: Counter[str] = Counter()
        own: set[str] = set()
        cursor: Any = 0
        while True:
            reply: Any = self.client.hscan(self.keys.groups, cursor, count=self.batch)
            cursor, chunk = reply
            ids = list(chunk)
            stored = self.client.hmget(self.keys.fingerprints, ids) if ids else []
            subjects: list[Subject] = []
            for (incident_id, raw_label), fp in zip(chunk.items(), stored, strict=True):
                name, label = text(incident_id), text(raw_label)
                if fp is None:
                    subjects.append(("e", incident_id, raw_label))
                    continue
                if label == name:
                    # an entry naming its own ID reads as no entry: counted with those (as once it is removed)
                    subjects.append(("e", incident_id, raw_label))
                    own.add(name)
                    continue
                counted[merged.get(label, label)] += 1
            if subjects:
                self._group_call(subjects, "")
            self._scanned()["group_entries"] += len(ids)
            self._pace(len(ids))
            if int(cursor) == 0:
                return counted, own

    def _read_sizes(self) -> dict[str, str]:
        sizes = {text(k): text(v) for k, v in self.client.hscan_iter(self.keys.group_sizes, count=self.batch)}
        self._scanned()["group_sizes"] += len(sizes)
        self._pace(len(sizes))
        return sizes

    def _judge_sizes(
        self, counted: Counter[str], own: set[str], merged: dict[str, str], sizes: dict[str, str], marker: str
    ) -> bool:
        """Add the members without an entry to each label's count (the label itself, when it is an indexed
        incident's own ID, and the IDs merged into it), and send each label whose stored size differs. False when a
        change overtook the count before its sizes were judged."""
        into: dict[str, list[str]] = {}
        for label, target in merged.items():
            into.setdefault(target, []).append(label)
        labels = sorted(set(counted) | set(sizes) | set(into))
        suspects: list[Subject] = []
        for start in range(0, len(labels), self.batch):
            part = labels[start : start + self.batch]
            candidates = [
                (label, member)
                for label in part
                for member in ([label] if merged.get(label, label) == label else []) + into.get(label, [])
            ]
            names = [_raw(member) for _, member in candidates]
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(self.keys.fingerprints, names or [b""])
            pipe.hmget(self.keys.groups, names or [b""])
            indexed, entries = pipe.execute()
            alone: dict[str, list[str]] = {}
            for (label, member), fp, entry in zip(candidates, indexed, entries, strict=False):
                if fp is not None and (entry is None or member in own) and member not in alone.get(label, []):
                    alone.setdefault(label, []).append(member)
            for label in part:
                without = alone.get(label, [])
                members = counted[label] + len(without)
                opener_alone = members == 1 and without == [label]
                expected = "" if members == 0 or opener_alone else str(members)
                if sizes.get(label, "") != expected:
                    suspects.append(("z", _raw(label), expected))
            self._pace(len(part))
        self._scanned()["group_labels"] += len(labels)
        return not suspects or self._group_call(suspects, marker) == marker

    def _walk_active(self) -> None:
        cursor: Any = 0
        while True:
            cursor, rows = self.client.zscan(self.keys.group_active, cursor, count=self.batch)
            labels = [member for member, _ in rows]
            if labels:
                pipe = self.client.pipeline(transaction=False)
                pipe.hmget(self.keys.group_sizes, labels)
                pipe.hmget(self.keys.group_merged, labels)
                sizes, merged = pipe.execute()
                suspects: list[Subject] = [
                    ("a", label, "")
                    for label, size, into in zip(labels, sizes, merged, strict=True)
                    if size is None or into is not None
                ]
                if suspects:
                    self._group_call(suspects, "")
            self._scanned()["group_active"] += len(labels)
            self._pace(len(labels))
            if int(cursor) == 0:
                return
