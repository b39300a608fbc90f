"""The integrity check of an index (`incident-worker verify`): is every posting, twin group and meta field what the
fingerprints in `{N}:fp` call for, and, with repair, make it so (docs/contract.md, "Verifying and repairing").

`Verifier.run` walks the index online, in bounded batches, while workers keep processing: HSCAN of `{N}:fp`, then
SCAN for the posting sets (`{N}:band:*`) and the twin groups (`{N}:twins:*`) with SSCAN/ZSCAN of each, then
`{N}:expiry` when retention keeps one. What the walk reads is only a lead: each subject (an incident, a posting, a
group) is judged by the library's `verify_check` function, which reads the incident's fingerprint and the sets
involved in one atomic step, so a state explained by a change a worker made meanwhile is never reported. A repair is
`verify_repair` on the same subject: it judges again, atomically, and fixes only what is wrong at that moment, from
`{N}:fp` (the source of truth), so it cannot undo what a worker did. Findings the repair no longer saw are counted
as `dropped`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError, WatchError

from . import library
from .bands import BandLayout
from .connection import RedisClient
from .errors import CommandError
from .groupcheck import GROUP_KINDS, GROUP_REPAIRS, GroupStateChecks
from .index import FORMAT_VERSION, SCHEME, FingerprintIndex, base_tag
from .keys import IndexKeys
from .keytypes import diagnose, is_wrong_type
from .replies import text
from .transport import scan_slot

__all__ = ["DEFAULT_BATCH", "KINDS", "Finding", "Verifier", "VerifyReport", "parse_layout_tag"]

DEFAULT_BATCH = 500
"""Keys or members read per SCAN/HSCAN/SSCAN/ZSCAN step: each step, and each check call, holds Redis for ~1 ms."""

CALL_SUBJECTS = 25
"""Subjects judged per call of the check function (~12 commands each): about 1 ms of Redis a call on a quiet server,
so a worker's call waits at most that long behind one."""

POSTING_KEYS_PER_CALL = 100
"""Posting sets read per call of verify_postings (SCARD, SMEMBERS and HMGET of each): about 1 ms of Redis a call."""

KINDS: dict[str, str] = {
    "missing_postings": "incident whose fingerprint is missing from some or all of its posting sets",
    "group_without_representative": "twin group none of whose members is in the fingerprint's posting sets",
    "orphan_posting": "posting set member without an incident in {N}:fp",
    "wrong_posting": "posting set member whose stored fingerprint has another value in that band",
    "foreign_band_key": "posting key of a band or value width the layout in {N}:meta does not have",
    "two_representatives": "second incident of one fingerprint in all of its posting sets",
    "extra_posting": "twin in some posting sets of its fingerprint besides the representative",
    "twin_not_grouped": "incident that shares its fingerprint with others but is not in its twin group",
    "twin_stray": "twin group member whose stored fingerprint is another one (or none)",
    "twin_score": "twin group member with a score other than 0 (groups list in byte order only at score 0)",
    "small_group": "twin group with fewer than two incidents",
    "bad_twin_key": "twin group key whose name does not end in a fingerprint",
    "bad_fingerprint": "value in {N}:fp that is not 16 lowercase hex digits",
    "expiry_orphan": "{N}:expiry entry without an incident",
    "expiry_missing": "incident without its {N}:expiry entry while retention is on",
    **GROUP_KINDS,
    "meta_missing": "{N}:meta is missing while {N}:fp holds incidents",
    "meta_field": "{N}:meta field that disagrees with the layout the index is built with",
    "meta_settings": "the configured layout differs from {N}:meta's: workers with this configuration refuse to start",
}
"""Every kind of finding, with what it means for people (the order in which reports list them)."""

REPAIRS: dict[str, str] = {
    "missing_postings": "added to its posting sets",
    "group_without_representative": "a member put in the posting sets",
    "orphan_posting": "removed from the set",
    "wrong_posting": "removed from the set",
    "foreign_band_key": "emptied",
    "two_representatives": "removed from the posting sets",
    "extra_posting": "removed from the posting sets",
    "twin_not_grouped": "added to the group",
    "twin_stray": "removed from the group",
    "twin_score": "score set to 0",
    "small_group": "group deleted",
    "bad_twin_key": "key deleted",
    "bad_fingerprint": "lowercased when it is hex, else the incident removed (value in the report)",
    "expiry_orphan": "entry removed",
    "expiry_missing": "entered with the time of the repair",
    **GROUP_REPAIRS,
    "meta_missing": "written from the configured layout",
    "meta_field": "rewritten from the layout tag",
    "meta_settings": "not repaired: fix the configuration",
}

UNREPAIRABLE = frozenset({"meta_settings", "group_sizes_unchecked"})


def parse_layout_tag(tag: str) -> tuple[str, int, int, int, int] | None:
    """`simhash64-blake2b8le/bands=4/max_distance=7/format=2[/generation=1]` as (scheme, bands, max distance, format,
    generation: 0 unless the index was moved to another layout), or None when it is not a layout tag."""
    parts = tag.split("/")
    if len(parts) not in (4, 5):
        return None
    values: dict[str, int] = {"generation": 0}
    for part in parts[1:]:
        name, _, value = part.partition("=")
        if not value.isdigit():
            return None
        values[name] = int(value)
    if set(values) != {"bands", "max_distance", "format", "generation"}:
        return None
    return parts[0], values["bands"], values["max_distance"], values["format"], values["generation"]


def _glob(text_: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text_)


def _number(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _is_fingerprint(value: bytes | str | None) -> bool:
    """16 lowercase hex digits, the only spelling the index's functions compare correctly."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return value is not None and len(value) == 16 and all(c in b"0123456789abcdef" for c in value)


@dataclass
class Finding:
    """One confirmed problem: its kind (a key of KINDS), what it is about, and a detail; whether it was repaired."""

    kind: str
    subject: str
    detail: str = ""
    repaired: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail, "repaired": self.repaired}


@dataclass
class VerifyReport:
    """What one walk found (and repaired), and what it read."""

    namespace: str
    layout: str
    repair: bool
    findings: list[Finding] = field(default_factory=list)
    scanned: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    elapsed_s: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(f.kind for f in self.findings)
        return {kind: found[kind] for kind in KINDS if found[kind]}

    @property
    def unrepaired(self) -> list[Finding]:
        return [f for f in self.findings if not f.repaired]

    @property
    def clean(self) -> bool:
        """No finding left: none found, or (with repair) every one repaired."""
        return not self.unrepaired

    def examples(self, kind: str, limit: int = 5) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind][:limit]

    def as_json(self, examples: int = 20) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "layout": self.layout,
            "repair": self.repair,
            "clean": self.clean,
            "counts": self.counts,
            "repaired": sum(1 for f in self.findings if f.repaired),
            "unrepaired": len(self.unrepaired),
            "dropped": self.dropped,
            "scanned": dict(self.scanned),
            "elapsed_s": round(self.elapsed_s, 3),
            "examples": {kind: [f.as_json() for f in self.examples(kind, examples)] for kind in self.counts},
        }


class Verifier(GroupStateChecks):
    """Walks one namespace's index and checks (or repairs) it; see the module's docstring.

    `configured` is the layout (bands, max distance) the caller chose explicitly, if any: one that differs from the
    stored layout is a finding. `batch` bounds every read; `max_rate` (items read per second, 0 = no limit) paces
    the walk so that it leaves the primary to the workers.
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str,
        *,
        repair: bool = False,
        batch: int = DEFAULT_BATCH,
        max_rate: float = 0,
        configured: tuple[int, int] | None = None,
        default_layout: tuple[int, int] = (4, 7),
    ) -> None:
        self.client = client
        self.keys = IndexKeys(namespace)
        self.repair = repair
        self.batch = batch
        self.max_rate = max_rate
        self.configured = configured
        self.default_layout = configured or default_layout
        self.expiry_key = self.keys.expiry
        self.migration_key = f"{self.keys.tag}:migration"
        self._items = 0
        self._started = 0.0
        self.index: FingerprintIndex | None = None
        self.report = VerifyReport(namespace, "", repair)
        self._seen: set[tuple[str, str]] = set()

    # -- pacing ---------------------------------------------------------------------------------------------------

    def _pace(self, items: int) -> None:
        self._items += items
        self.report.scanned["items"] += items
        if self.max_rate > 0:
            ahead = self._items / self.max_rate - (time.monotonic() - self._started)
            if ahead > 0:
                time.sleep(ahead)

    # -- the walk -------------------------------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        """Check (or repair) everything; raises CommandError when the index cannot be verified at all."""
        self._started = time.monotonic()
        if self.client.exists(self.migration_key):
            raise CommandError(
                f"{self.migration_key} says the index is moving to another layout: verify cannot tell the layout "
                "being built from stray keys. Run it after the move has finished or been aborted"
            )
        meta = {text(k): text(v) for k, v in (self.client.hgetall(self.keys.meta) or {}).items()}
        if meta.get("building"):
            raise CommandError(
                f"{self.keys.meta} says a layout is being built ({meta['building']}): verify cannot tell its keys from "
                "stray ones. Run it after the move has finished or been aborted"
            )
        run = self._server_run()
        self.index = self._layout(meta)
        self.report.layout = self.index.layout_tag
        # every call checks that the meta's layout tag is still the one read here (after any repair of it): a
        # meta that changes under the walk (a migration's switch) stops it
        self._tag = text(self.client.hget(self.keys.meta, "layout") or b"")
        if meta or self.client.hlen(self.keys.fingerprints):
            retention = _number(meta.get("retention_ms")) > 0 and "retention_backfill" not in meta
            self._expiry_on = "1" if retention else "0"
            self._walk_incidents()
            self._walk_postings()
            self._walk_groups()
            self._walk_group_state()
            if self.client.exists(self.expiry_key):
                self._walk_expiry()
        if self._server_run() != run:
            raise CommandError(
                "Redis restarted (or failed over) while verify walked the index: a scan cursor of one server process "
                "skips keys in another, so part of the index may not have been checked (the repairs made are right). "
                "Run verify again"
            )
        self.report.elapsed_s = time.monotonic() - self._started
        return self.report

    def _server_run(self) -> str:
        """Which run of the server answers (worker/lua/base.lua, server_run)."""
        try:
            return text(self.client.fcall_ro(library.FN_SERVER_RUN, 1, self.keys.meta))
        except ResponseError as error:
            if library.is_missing_function(error):
                raise CommandError(library.missing_message()) from None
            raise

    def _layout(self, meta: dict[str, str]) -> FingerprintIndex:
        """The layout to verify against, from `{N}:meta` (checking its fields), with findings about the meta."""
        ns = self.keys.namespace
        if not meta:
            index = FingerprintIndex(self.client, ns, *self.default_layout)
            if self.client.hlen(self.keys.fingerprints):
                finding = Finding("meta_missing", self.keys.meta, f"verified as {index.layout_tag}")
                if self.repair:
                    index.open()  # what the next worker to start would write
                    finding.repaired = True
                self.report.findings.append(finding)
            return index
        tag = meta.get("layout", "")
        # a migrated index's tag ends in /generation=<g>: its postings are under {N}:band:g<g>: (worker/migrate.py)
        generation_text = tag.split("/generation=", 1)[1] if "/generation=" in tag else "0"
        generation = int(generation_text) if generation_text.isdigit() else 0
        parsed = parse_layout_tag(base_tag(tag))
        if parsed is None or parsed[0] != SCHEME or parsed[3] != FORMAT_VERSION:
            raise CommandError(
                f"{self.keys.meta} has layout {tag!r}, not one of this version ({SCHEME}, format "
                f"{FORMAT_VERSION}); check --namespace, or run the version that built it"
            )
        tagged = (parsed[1], parsed[2])
        try:
            fielded: tuple[int, int] | None = (int(meta["bands"]), int(meta["max_distance"]))
        except (KeyError, ValueError):
            fielded = None
        chosen = tagged
        if fielded is not None and fielded != tagged:
            # one of the two was edited, and verifying against the wrong one would judge every posting wrong (and a
            # repair would rebuild them all): only the layout the user names settles it
            if self.configured == fielded and generation == 0:
                chosen = fielded
            elif self.configured != tagged:
                raise CommandError(
                    f"{self.keys.meta} is self-contradictory: its layout tag says bands={tagged[0]}, "
                    f"max_distance={tagged[1]}, its fields bands={fielded[0]}, max_distance={fielded[1]}. Give "
                    "--bands and --max-distance of the layout the index was built with (the one its workers are "
                    "configured with), and verify will check against it and rewrite the meta to match"
                )
        try:
            index = FingerprintIndex(self.client, ns, *chosen, generation=generation)
        except ValueError as error:
            raise CommandError(f"{self.keys.meta} holds a layout this version refuses: {error}") from None
        expected = index.meta_fields()
        del expected["created_at"]
        wrong = {name: value for name, value in expected.items() if meta.get(name) != value}
        for name, value in wrong.items():
            self.report.findings.append(
                Finding("meta_field", f"{self.keys.meta} {name}", f"{meta.get(name)!r}, expected {value!r}")
            )
        if wrong and self.repair:
            self._repair_meta(meta, wrong)
        # a worker configured with a layout the index was moved from follows the meta (incident-worker migrate)
        moved_from = {
            (found[1], found[2])
            for previous in meta.get("previous_layouts", "").split()
            if (found := parse_layout_tag(previous)) is not None
        }
        if self.configured is not None and self.configured != chosen and self.configured not in moved_from:
            self.report.findings.append(
                Finding(
                    "meta_settings",
                    self.keys.meta,
                    f"configured bands={self.configured[0]}, max_distance={self.configured[1]}; stored "
                    f"bands={chosen[0]}, max_distance={chosen[1]}",
                )
            )
        return index

    def _repair_meta(self, seen: dict[str, str], wrong: dict[str, str]) -> None:
        """Rewrite the wrong fields, unless the meta changed since it was read (WATCH)."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.watch(self.keys.meta)
            now = {text(k): text(v) for k, v in (pipe.hgetall(self.keys.meta) or {}).items()}
            if now != seen:
                pipe.unwatch()
                return
            pipe.multi()
            fields: dict[Any, Any] = dict(wrong)
            pipe.hset(self.keys.meta, mapping=fields)
            try:
                pipe.execute()
            except WatchError:  # someone changed it meanwhile: the findings stay unrepaired
                return
        for finding in self.report.findings:
            if finding.kind == "meta_field":
                finding.repaired = True

    # -- subjects -------------------------------------------------------------------------------------------------

    def _fp_keys(self, group: str, fp_hex: str) -> list[Any]:
        """The keys of a fingerprint's group and postings, for subjects that reconcile it."""
        assert self.index is not None
        return [group, *self.index.posting_keys(int(fp_hex, 16))]

    def _judge(self, subjects: Sequence[tuple[str, list[Any], tuple[Any, Any, Any]]]) -> None:
        """Check the subjects (code, keys, three fields) atomically, in calls of CALL_SUBJECTS; with repair, repair
        those with findings (judged again in the repair call)."""
        for start in range(0, len(subjects), CALL_SUBJECTS):
            part = subjects[start : start + CALL_SUBJECTS]
            found = self._call(library.FN_VERIFY_CHECK, part)
            # what the walk's reads made suspect (a posting, a group member, an expiry entry) but the atomic check
            # did not confirm: a change made between the walk's read and the check explains it
            suspects = {n for n, (code, _, _) in enumerate(part) if code in "pge"}
            self.report.scanned["unconfirmed"] += len(suspects - {number for number, *_ in found})
            if not found:
                continue
            if not self.repair:
                self._record(found, repaired=False)
                continue
            numbers = sorted({number for number, *_ in found})
            fixed = self._call(library.FN_VERIFY_REPAIR, [part[n] for n in numbers])
            confirmed = {(kind, subject) for _, kind, subject, _ in fixed}
            self.report.dropped += sum(1 for _, kind, subject, _ in found if (kind, subject) not in confirmed)
            self._record(fixed, repaired=True)

    def _call(self, function: str, subjects: Sequence[tuple[str, list[Any], tuple[Any, Any, Any]]]) -> list[Any]:
        assert self.index is not None
        keys: list[Any] = [self.keys.meta, self.keys.fingerprints, self.migration_key, self.expiry_key]
        keys.append(self.keys.changes)
        args: list[Any] = [self._tag, self._expiry_on]
        for code, subject_keys, fields in subjects:
            keys.extend(subject_keys)
            args += [code, len(subject_keys), *fields]
        call = self.client.fcall_ro if function == library.FN_VERIFY_CHECK else self.client.fcall
        try:
            reply = call(function, len(keys), *keys, *args)
        except Exception as error:
            message = str(error)
            if "MIGRATING" in message or message.startswith("LAYOUT") or message.startswith("NOMETA"):
                raise CommandError(
                    f"the index changed under verify: {message.split(' ', 1)[-1]}; run verify again"
                ) from None
            if library.is_missing_function(error):  # type: ignore[arg-type]
                raise CommandError(library.missing_message()) from None
            if is_wrong_type(error):  # a key of the subjects (or of the index) holds another type: name it
                raise diagnose(self.client, self.keys, only=[text(key) for key in keys]) from None
            raise
        return [
            (int(reply[i]) - 1, text(reply[i + 1]), text(reply[i + 2]), text(reply[i + 3]))
            for i in range(0, len(reply), 4)
        ]

    def _record(self, found: Iterable[tuple[int, str, str, str]], *, repaired: bool) -> None:
        for _, kind, subject, detail in found:
            self._add(Finding(kind, subject, detail, repaired))

    def _found(self, kind: str, subject: str, detail: str, repaired: bool) -> None:
        self._add(Finding(kind, subject, detail, repaired))

    def _scanned(self) -> Counter[str]:
        return self.report.scanned

    def _add(self, finding: Finding) -> None:
        """Report a finding once (several subjects can meet one problem: a group through each of its members)."""
        if (finding.kind, finding.subject) not in self._seen:
            self._seen.add((finding.kind, finding.subject))
            self.report.findings.append(finding)

    # -- the walks ------------------------------------------------------------------------------------------------

    def _walk_incidents(self) -> None:
        assert self.index is not None
        cursor: Any = 0
        while True:
            reply: Any = self.client.hscan(self.keys.fingerprints, cursor, count=self.batch)
            cursor, chunk = reply
            subjects: list[tuple[str, list[Any], tuple[Any, Any, Any]]] = []
            for incident_id, value in chunk.items():
                if _is_fingerprint(value):
                    hex_fp = text(value)
                    subjects.append(("i", self._fp_keys(self.keys.twins(hex_fp), hex_fp), (incident_id, value, "")))
                    continue
                lower = value.lower() if isinstance(value, bytes) else str(value).lower().encode()
                fp_keys = self._fp_keys(self.keys.twins(text(lower)), text(lower)) if _is_fingerprint(lower) else []
                subjects.append(("b", fp_keys, (incident_id, value, "")))
            self.report.scanned["incidents"] += len(chunk)
            self._judge(subjects)
            self._pace(len(chunk))
            if int(cursor) == 0:
                break

    def _band_key(self, key: str) -> tuple[int, int] | None:
        """(band, value) of a posting key of the layout, or None for a key the layout does not have."""
        assert self.index is not None
        layout: BandLayout = self.index.layout
        # the postings of the layout in use: a migrated index keeps them under its generation ({N}:band:g<g>:)
        rest = key[len(self.keys.postings_prefix(self.index.generation)) :]
        band_text, _, value_text = rest.partition(":")
        if not band_text.isdigit() or str(int(band_text)) != band_text or int(band_text) >= layout.bands:
            return None
        band = int(band_text)
        digits = layout.hex_digits[band]
        if len(value_text) != digits or any(c not in "0123456789abcdef" for c in value_text):
            return None
        value = int(value_text, 16)
        if value >> layout.widths[band]:
            return None
        return band, value

    def _scan_keys(self, pattern: str) -> Iterable[list[Any]]:
        """The keys matching `pattern`, a SCAN page at a time."""
        cursor = 0
        while True:
            cursor, keys = scan_slot(self.client, self.keys.meta, cursor, pattern, self.batch)
            if keys:
                yield keys
            if cursor == 0:
                return

    def _members(self, keys: list[Any], command: str) -> Iterable[tuple[list[tuple[Any, Any, Any]], list[Any]]]:
        """The members of a page of sets (SSCAN) or sorted sets (ZSCAN, with scores) and their stored fingerprints,
        in steps of at most `batch` members a key, each step's scans in one round trip: ([(key, member, score)],
        [fingerprint or None, ...]). A key that is not of the type is reported (foreign_band_key) and skipped."""
        cursors: dict[Any, Any] = dict.fromkeys(keys, 0)
        while cursors:
            pipe = self.client.pipeline(transaction=False)
            for key, cursor in cursors.items():
                getattr(pipe, command)(key, cursor, count=self.batch)
            rows: list[tuple[Any, Any, Any]] = []
            following: dict[Any, Any] = {}
            for key, reply in zip(cursors, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(reply, Exception):
                    if "WRONGTYPE" not in str(reply):
                        raise reply
                    self._add(Finding("foreign_band_key", text(key), "not a set"))
                    continue
                cursor, members = reply
                for member in members:
                    rows.append((key, *member) if command == "zscan" else (key, member, 0))
                if int(cursor) != 0:
                    following[key] = cursor
            cursors = following
            names = list({member for _, member, _ in rows})
            stored = dict(zip(names, self.client.hmget(self.keys.fingerprints, names), strict=True)) if names else {}
            yield rows, [stored[member] for _, member, _ in rows]

    def _band_specs(self) -> list[str]:
        """Per band, how verify_postings finds its value in a stored fingerprint: the hex digits that spell it when
        the band is whole hex digits ('a:<first>:<last>'), else 'l' (the walk compares it itself)."""
        assert self.index is not None
        layout = self.index.layout
        specs = []
        for offset, width in zip(layout.offsets, layout.widths, strict=True):
            if offset % 4 or width % 4:
                specs.append("l")
            else:
                specs.append(f"a:{16 - (offset + width) // 4 + 1}:{16 - offset // 4}")
        return specs

    def _walk_postings(self) -> None:
        """Each SCAN page of posting keys is read in one read-only call (verify_postings), which returns only the
        members whose stored fingerprint does not spell the key's band value; a set larger than `batch` is read
        with SSCAN instead. The suspects go to verify_check."""
        assert self.index is not None
        layout = self.index.layout
        specs = self._band_specs()
        # only the generation in use: another one's keys are a migration's, which removes them itself
        for page in self._scan_keys(self.keys.postings_pattern(self.index.generation)):
            self.report.scanned["posting_keys"] += len(page)
            places = {key: self._band_key(text(key)) for key in page}
            rows: list[tuple[Any, Any, Any]] = []
            large: list[Any] = []
            for start in range(0, len(page), POSTING_KEYS_PER_CALL):
                part = page[start : start + POSTING_KEYS_PER_CALL]
                args: list[Any] = [self.batch]
                for key in part:
                    place = places[key]
                    args.append("f" if place is None else specs[place[0]])
                try:
                    reply = self.client.fcall_ro(
                        library.FN_VERIFY_POSTINGS, 1 + len(part), self.keys.fingerprints, *part, *args
                    )
                except ResponseError as error:
                    if "WRONGTYPE" not in str(error):
                        raise
                    reply = []
                    large += part  # a key of another type: SSCAN each, which reports it
                for i in range(0, len(reply), 3):
                    key = part[int(reply[i]) - 1]
                    if not reply[i + 1] and text(reply[i + 2]) == "-1":
                        large.append(key)
                    else:
                        rows.append((key, reply[i + 1], reply[i + 2] or None))
            for chunk, stored in self._members(large, "sscan"):
                rows += [(key, member, value) for (key, member, _), value in zip(chunk, stored, strict=True)]
            self._judge(self._posting_subjects(rows, places, layout))
            self._pace(len(page))
            foreign = [key for key, place in places.items() if place is None]
            if foreign:
                pipe = self.client.pipeline(transaction=False)
                for key in foreign:
                    pipe.exists(key)
                for key, exists in zip(foreign, pipe.execute(), strict=True):
                    # repaired once its members are: an emptied set no longer exists
                    if exists or self.repair:
                        detail = f"not a posting key of {layout.description}"
                        self._add(Finding("foreign_band_key", text(key), detail, self.repair and not exists))

    def _posting_subjects(
        self, rows: list[tuple[Any, Any, Any]], places: dict[Any, tuple[int, int] | None], layout: BandLayout
    ) -> list[tuple[str, list[Any], tuple[Any, Any, Any]]]:
        """The posting subjects for verify_check: each member whose stored value (None: no incident) does not spell
        the key's band value."""
        subjects: list[tuple[str, list[Any], tuple[Any, Any, Any]]] = []
        for key, member, value in rows:
            if value is None:
                subjects.append(("p", [key], (b"", member, b"")))
                continue
            place = places[key]
            lower = value.lower()
            if place is not None and _is_fingerprint(lower):
                band, band_value = place
                if layout.values(int(lower, 16))[band] == band_value:
                    continue  # its own posting; whether it should be the representative is judged per incident
            subjects.append(("p", [key], (b"", member, value)))
        self.report.scanned["posting_suspects"] += len(subjects)
        return subjects

    def _walk_groups(self) -> None:
        prefix = self.keys.twin_prefix
        for page in self._scan_keys(_glob(prefix) + "*"):
            self.report.scanned["groups"] += len(page)
            subjects: list[tuple[str, list[Any], tuple[Any, Any, Any]]] = []
            groups: dict[Any, tuple[str, list[Any]]] = {}
            for key in page:
                hex_fp = text(key)[len(prefix) :]
                if not _is_fingerprint(hex_fp):
                    subjects.append(("x", [key], ("", "", "")))
                    continue
                groups[key] = (hex_fp, self._fp_keys(text(key), hex_fp))
                subjects.append(("s", groups[key][1], (hex_fp, "", "")))
            self._judge(subjects)
            for rows, stored in self._members(list(groups), "zscan"):
                subjects = []
                for (key, member, score), value in zip(rows, stored, strict=True):
                    hex_fp, fp_keys = groups[key]
                    if value is None or text(value) != hex_fp or float(score) != 0:
                        subjects.append(("g", fp_keys, (member, hex_fp, "")))
                self.report.scanned["group_members"] += len(rows)
                self._judge(subjects)
                self._pace(len(rows))

    def _walk_expiry(self) -> None:
        cursor: Any = 0
        while True:
            cursor, members = self.client.zscan(self.expiry_key, cursor, count=self.batch)
            names = [member for member, _ in members]
            stored = self.client.hmget(self.keys.fingerprints, names) if names else []
            self._judge([("e", [], (m, "", "")) for m, v in zip(names, stored, strict=True) if v is None])
            self.report.scanned["expiry_entries"] += len(names)
            self._pace(len(names))
            if int(cursor) == 0:
                break
