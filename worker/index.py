"""The index API (docs/contract.md): add, upsert, delete, matches, get, postings, stats of one namespace.

`FingerprintIndex` keeps fingerprints in `{N}:fp` and band postings in `{N}:band:<b>:<v>` sets. Each change is one
call of a Redis Function (worker/library.py, worker/lua/apply.lua) that finds the matches, indexes, and in stream
mode publishes the alert and acknowledges the entry, all in one atomic step on the server. Batches of calls travel
through worker/transport.py; key names come from worker/keys.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from redis.exceptions import ResponseError

from . import library
from .bands import DEFAULT_BANDS, DEFAULT_MAX_DISTANCE, BandLayout
from .bulkload import batched, bulk_load
from .connection import RedisClient
from .errors import (
    DuplicateIncidentError,
    FunctionsMissingError,
    LayoutMismatchError,
    StaleRetriesExhaustedError,
    TokenizerMismatchError,
)
from .fingerprint import fingerprint, format_fingerprint, parse_fingerprint, stored_fingerprint
from .formats import incident_id_problem
from .groups import Group, GroupReads, Matches
from .keys import DEFAULT_NAMESPACE, IndexKeys
from .library import ApplyResult, SnapshotClaim, StreamTarget, parse_apply, stored_value
from .limits import DEFAULT_MAX_CANDIDATES
from .metafields import (
    FORMAT_VERSION,
    SCHEME,
    base_tag,
    building_damaged,
    is_layout_tag,
    layout_damaged,
    layout_tag,
    parse_layout_tag,
)
from .replies import pairs, text
from .snapshotadds import SnapshotAdd, pack_adds
from .text import TOKENIZER_VERSION
from .transport import Command, Packed, Transport, execute, open_transport

__all__ = [
    "FORMAT_VERSION",
    "SCHEME",
    "STALE_RETRIES",
    "FingerprintIndex",
    "Group",
    "Matches",
    "Posting",
    "SnapshotAdd",
    "batched",
    "retry_while_stale",
]

STALE_RETRIES = 32
"""Upsert and delete retry when another client changed the incident between their read and their write."""

ANY: Literal["*"] = "*"
"""`expected` of a call that does not check what is stored (an add)."""

_Reply = TypeVar("_Reply")


@dataclass(frozen=True)
class LayoutTarget:
    """The layout a migration is building, which every change writes too until the switch."""

    tag: str
    layout: BandLayout
    generation: int
    band_keys: list[Any]

    def posting_keys(self, fp: int) -> list[str]:
        return [band.key(value) for band, value in zip(self.band_keys, self.layout.values(fp), strict=True)]


def retry_while_stale(attempt: Callable[[], _Reply], status: Callable[[_Reply], str]) -> _Reply | None:
    """Run `attempt` (read what is stored, then apply) until its `status` is not `stale`; None if it always was.

    An upsert or delete carries the fingerprint it read; another client changing the incident in between makes the
    server refuse it as stale, and reading again settles it unless someone rewrites the incident in a loop.
    """
    for _ in range(STALE_RETRIES):
        reply = attempt()
        if status(reply) != "stale":
            return reply
    return None


@dataclass(frozen=True, slots=True)
class Posting:
    """One band of a fingerprint: where its bits are, its value, its posting set and whether that holds the
    incident's fingerprint (through the incident itself or, for a twin, its group's representative)."""

    band: int
    offset: int
    width: int
    value: int
    key: str
    size: int
    member: bool


def _matches(result: ApplyResult) -> Matches:  # an apply step's matches, with the group it put the incident in
    return Matches(result.matches, Group(result.group_id, result.group_size) if result.group_id is not None else None)


class FingerprintIndex(GroupReads):
    """A near-duplicate index of incidents in one Redis namespace.

    `redis` is any redis-py client, standalone or cluster, decoding responses or not. The namespace's layout
    (`bands`, `max_distance`) is written to `{N}:meta` on first use; opening the namespace later with another
    layout raises `LayoutMismatchError`, unless the index was moved from that layout to its current one
    (`incident-worker migrate`) or is being moved to it: then the index uses the meta's layout (`adopted` says so),
    and follows a migration's switch while it runs.
    """

    def __init__(
        self,
        redis: RedisClient,
        namespace: str = DEFAULT_NAMESPACE,
        bands: int = DEFAULT_BANDS,
        max_distance: int = DEFAULT_MAX_DISTANCE,
        generation: int = 0,
        *,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
    ) -> None:
        self.redis = redis
        self.max_candidates = max_candidates
        """The per-event budget of this index's searches (0: none): `apply_command`'s and `search`'s default."""
        self.keys = IndexKeys(namespace)
        self.configured_tag = layout_tag(bands, max_distance)
        self.building: LayoutTarget | None = None
        """The layout a migration is building, as last read from `{N}:meta` (every change writes it too)."""
        self.adopted: str | None = None
        """When the meta's layout differs from the configured one (a migrated index): the meta's tag."""
        self._use(BandLayout(bands, max_distance), generation)
        self._opened = False

    def _use(self, layout: BandLayout, generation: int) -> None:
        self.layout = layout
        self.generation = generation
        self.layout_tag = layout_tag(layout.bands, layout.max_distance, generation)
        self._band_keys = self.keys.band_keys(layout, generation)
        # each band's key builder beside its bits, for posting_keys (the apply call of every event asks for them)
        self._band_bits = [
            (band, offset, (1 << width) - 1)
            for band, offset, width in zip(self._band_keys, layout.offsets, layout.widths, strict=True)
        ]

    @classmethod
    def stored(cls, redis: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> FingerprintIndex | None:
        """The namespace's index with the layout recorded in `{N}:meta`, or None before any worker opened it.

        Writes nothing: read-only tools use it, so that a query cannot fix a namespace's layout by accident.
        """
        meta = cls.read_meta(redis, namespace)
        if not meta:
            return None
        keys = IndexKeys(namespace)
        # the layout tag, which every call checks, is the layout; the fields beside it (bands, max_distance,
        # generation) are for people, and `verify --repair` rewrites them from it
        tag = meta.get("layout", "")
        if not tag:
            raise LayoutMismatchError(f"{keys.meta} holds no band layout, so it is not the meta of an incident index")
        if not is_layout_tag(tag):
            raise layout_damaged(keys, tag, meta)
        parts = parse_layout_tag(tag)
        bands, max_distance, generation = int(parts["bands"]), int(parts["max_distance"]), int(parts["generation"])
        index = cls(redis, namespace, bands, max_distance, generation)
        index._follow(meta)
        return index

    @staticmethod
    def read_meta(redis: RedisClient, namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
        """`{N}:meta` as text; {} when no worker has opened the namespace yet."""
        return {text(k): text(v) for k, v in (redis.hgetall(IndexKeys(namespace).meta) or {}).items()}

    # -- setting up -------------------------------------------------------------------------------------------

    def meta_fields(self) -> dict[str, str]:
        """What `{N}:meta` records about this layout, readable with `HGETALL`."""
        return {
            "layout": self.layout_tag,
            "scheme": SCHEME,
            "format_version": str(FORMAT_VERSION),
            "bands": str(self.layout.bands),
            "band_widths": ",".join(str(w) for w in self.layout.widths),
            "max_distance": str(self.layout.max_distance),
            "probe_radius": ",".join(str(p) for p in self.layout.radii),
            **({"generation": str(self.generation)} if self.generation else {}),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def open(self) -> None:
        """Check `{N}:meta` (writing it on first use). Called by the first operation.

        The functions must be loaded already (`incident-worker load-functions`, an administrator's step, or
        `library.load` in tests): without them this raises `FunctionsMissingError`, saying what to run.
        """
        fields = self.meta_fields()
        layout = fields.pop("layout")
        args: list[str] = [layout]
        for name, value in fields.items():
            args += [name, value]
        try:
            stored = text(self.redis.fcall(library.FN_ENSURE_META, 1, self.keys.meta, *args))
        except ResponseError as error:
            if library.is_missing_function(error):
                raise FunctionsMissingError(library.missing_message()) from None
            raise
        self.reload_layout(stored)  # a migrated index's layout, or a migration under way
        self._opened = True

    def reload_layout(self, stored: str | None = None) -> bool:
        """Take the layout from `{N}:meta` again (after a migration started, switched or was aborted); returns
        whether anything changed. Raises `LayoutMismatchError` when the meta's layout is not one this index may use:
        its configured one, or one the index moved to from it or is moving to from it."""
        meta = self.read_meta(self.redis, self.keys.namespace)
        tag = meta.get("layout", stored or "")
        if tag and not is_layout_tag(tag):
            raise layout_damaged(self.keys, tag, meta)
        if base_tag(tag) != self.configured_tag:
            history = {base_tag(t) for t in meta.get("previous_layouts", "").split()}
            history.add(base_tag(meta.get("building", "")))
            if self.configured_tag not in history or "bands" not in meta:
                raise LayoutMismatchError(self._mismatch_message(tag))
        return self._follow(meta)

    def _follow(self, meta: Mapping[str, str]) -> bool:
        """Use the layout and the migration target `meta` records; returns whether either changed."""
        before = (self.layout_tag, self.building.tag if self.building else "")
        tag = meta.get("layout", "")
        if tag and tag != self.layout_tag:
            if not is_layout_tag(tag):
                raise layout_damaged(self.keys, tag, meta)
            parts = parse_layout_tag(tag)
            self._use(BandLayout(int(parts["bands"]), int(parts["max_distance"])), int(parts["generation"]))
        self.adopted = self.layout_tag if base_tag(self.layout_tag) != self.configured_tag else None
        building = meta.get("building", "")
        if building != (self.building.tag if self.building else ""):
            self.building = None
            if building:
                if not is_layout_tag(building):
                    raise building_damaged(self.redis, self.keys, building)
                parts = parse_layout_tag(building)
                target = BandLayout(int(parts["bands"]), int(parts["max_distance"]))
                generation = int(parts["generation"])
                self.building = LayoutTarget(building, target, generation, self.keys.band_keys(target, generation))
        return before != (self.layout_tag, self.building.tag if self.building else "")

    LATER_META_FIELDS = (
        "tokenizer",
        "group_seq",
        "group_merges",
        "changes_trimmed_to",
        "retention_ms",
        "retention_since",
        "retention_backfill",
        "retention_backfill_run",
        "building",
        "generation",
        "previous_layouts",
        "last_migration",
        "posting_bound",
    )
    """Meta fields written after the namespace's first use: `tokenizer`, by the call that indexes the first text
    incident; `changes_trimmed_to`, by the first trim of the change log (worker/readpath.py's CHANGES_FLOOR_FIELD);
    `retention_*`, by a worker whose retention window differs from the recorded one (worker/retention.py);
    `building`, `generation`, `previous_layouts` and `last_migration` by a migration (worker/migrate.py);
    `posting_bound` by the functions themselves (worker/lua/meta.lua: `ensure_meta` writes it beside the fields
    here when the namespace holds no incident yet)."""

    def check_tokenizer(self) -> None:
        """Raise `TokenizerMismatchError` if `{N}:meta` records text incidents made by another tokenizer version.

        The worker calls it at start (it may receive text events); bags alone need no tokenizer, so the library's
        own calls do not. Each text event's call checks the version again on the server, atomically.
        """
        recorded = self.redis.hget(self.keys.meta, "tokenizer")
        if recorded is not None and text(recorded) != str(TOKENIZER_VERSION):
            raise TokenizerMismatchError(
                f"the text incidents of namespace {self.keys.namespace!r} were fingerprinted by tokenizer version "
                f"{text(recorded)}, and this worker's is version {TOKENIZER_VERSION}: their fingerprints would not "
                "be comparable. Run the version that made them, or use a new namespace (and send the texts again)"
            )

    def _mismatch_message(self, stored: str) -> str:
        if not stored:
            return (
                f"{self.keys.meta} exists but is not the meta of an incident index; "
                f"choose another namespace or delete the key"
            )
        built, _, old_format = base_tag(stored).rpartition("/format=")
        if old_format != str(FORMAT_VERSION) and built == self.configured_tag.rpartition("/format=")[0]:
            return (
                f"namespace {self.keys.namespace!r} was built in index format {old_format}, and this worker reads "
                f"and writes format {FORMAT_VERSION} (exact twins grouped under {self.keys.twin_prefix}<fingerprint>); "
                f"run the worker version that built it, or rebuild the index into a new namespace from "
                f"{self.keys.fingerprints}"
            )
        return (
            f"namespace {self.keys.namespace!r} was built as {stored!r}, but this index is configured as "
            f"{self.configured_tag!r}; use the stored layout (bands and max distance), or another namespace"
        )

    def _ensure_open(self) -> None:
        if not self._opened:
            self.open()

    def call(
        self,
        function: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        rebuild: Callable[[], tuple[Sequence[str], Sequence[Any]]] | None = None,
    ) -> Any:
        """Call one of the library's functions (FN_*), opening the index first and restoring lost functions.

        A call whose keys depend on the layout passes `rebuild`, to be built again after a migration's switch."""
        return self._fcall(function, keys, args, rebuild=rebuild)

    def _fcall(
        self,
        function: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        readonly: bool = False,
        rebuild: Callable[[], tuple[Sequence[str], Sequence[Any]]] | None = None,
    ) -> Any:
        """Call a function; when its error is recovered (see handle_error), call it again, its keys and arguments
        built anew by `rebuild` when the layout may have changed meanwhile (a migration's start, switch or abort)."""
        self._ensure_open()
        call = self.redis.fcall_ro if readonly else self.redis.fcall
        for _ in range(3):
            try:
                return call(function, len(keys), *keys, *args)
            except ResponseError as error:
                if not self.handle_error(error):
                    raise
                if rebuild is not None:
                    keys, args = rebuild()
        return call(function, len(keys), *keys, *args)

    def handle_error(self, error: ResponseError) -> bool:
        """Recover from an error reply of a call if it can be recovered: True means retry the call.

        A lost `{N}:meta` (a server that restarted without persistence) is written again. Lost functions raise
        `FunctionsMissingError`: only an administrator may load them. A layout mismatch raises
        `LayoutMismatchError`.
        """
        message = str(error)
        if library.is_missing_function(error):
            raise FunctionsMissingError(library.missing_message()) from None
        if message.startswith("NOMETA"):
            self.open()
            return True
        if message.startswith("LAYOUT"):
            # A migration switched the layout: follow it (reload_layout raises LayoutMismatchError when the meta's
            # layout is not one this index may use). Once it returns, this index writes the meta's layout, so the
            # refused call was built for an older one: build it again. (Not only when this reload changed
            # something: of a pipelined batch built before the switch, every call is refused, the first one's
            # reload follows the switch, and the others' find nothing left to change.)
            self.reload_layout()
            return True
        if message.startswith("MIGRATION"):
            self.reload_layout()  # a migration started, switched or was aborted: write what the meta says now
            return True
        if message.startswith("TOKENIZER"):
            raise TokenizerMismatchError(message.removeprefix("TOKENIZER ")) from None
        return False

    # -- key building (hot path) ------------------------------------------------------------------------------

    def posting_keys(self, fp: int) -> list[str]:
        """The posting keys of a fingerprint, band 0 first."""
        return [band.key((fp >> offset) & mask) for band, offset, mask in self._band_bits]

    def probe_keys(self, fp: int, max_distance: int | None = None) -> tuple[list[str], int, list[str]]:
        """The fingerprint's posting keys, how many of them (band 0 first) a query probes, and its other probe keys.

        A query within `max_distance` (default: the layout's) probes the bands of `BandLayout.masks`: a prefix of
        them, each at its own radius.
        """
        own: list[str] = []
        others: list[str] = []
        probed = 0
        values = self.layout.values(fp)
        if max_distance is None or max_distance >= self.layout.max_distance:
            for band, value in zip(self._band_keys, values, strict=True):
                own.append(band.key(value))
                others.extend(band.probes(value))
            return own, self.layout.probed_bands, others
        for band, value, masks in zip(self._band_keys, values, self.layout.masks(max_distance), strict=True):
            own.append(band.key(value))
            if masks:
                probed += 1
                others.extend(band.keys(value, masks[1:]))
        return own, probed, others

    def apply_command(
        self,
        op: str,
        incident_id: str,
        fp: int | None,
        *,
        expected: int | str | None = ANY,
        stream: StreamTarget | None = None,
        entry_id: str = "",
        max_matches: int = 0,
        alert_text: str = "",
        tokenizer: str = "",
        snapshot: SnapshotClaim | None = None,
        max_candidates: int | None = None,
        open_alerts: bool = False,
        alert_fields: Sequence[tuple[str, str]] = (),
        max_replied: int | None = None,
    ) -> Command:
        """One apply call (worker/lua/apply.lua) as a command for `execute` or a transport; parse its reply with
        `parse_apply`. Its keys and arguments are `library.ApplyKeys` and `library.ApplyArgs`, filled here.

        `expected` is the fingerprint the caller believes is stored (None: not indexed; ANY, "*": don't check; any
        other text: the stored value as it is when that is not a fingerprint, see `library.stored_value`).
        Without a `stream` the call runs in library mode: no acknowledgement and no alert. `max_matches` caps the
        matches listed (0: all); `match_count` counts them all, unless the search verified `max_candidates` (default:
        the index's) and stopped: then the result says `incomplete` and its count is a lower bound. `alert_text`
        goes into the alert's `text` field (when not ''); `tokenizer` is the tokenizer version of a text incident
        ('' for a bag, or a delete).
        With `snapshot`, the call validates what a search of a copy of the index found instead of searching the
        postings (no probe keys are sent; see worker/readpath.py). While a migration builds another layout
        (`building`), the call writes the fingerprint's postings in it too. With `open_alerts` an incident that
        opens a group gets an alert too; `alert_fields` (name, value) are copied into the alert. `max_replied`: the
        reply's `matches` hold at most that many of the listed ones (the alert lists `max_matches` all the same).
        """
        own: list[str] = []
        others: list[str] = []
        probed = 0
        if fp is not None and snapshot is not None:
            own = self.posting_keys(fp)
        elif fp is not None:
            own, probed, others = self.probe_keys(fp)
        replaced: int | None = None  # the fingerprint whose postings and group the call takes the incident out of
        mangled = isinstance(expected, str) and expected != ANY
        if isinstance(expected, int):
            replaced, expected_hex = expected, format_fingerprint(expected)
        elif isinstance(expected, str) and mangled:
            # named as stored, for the call compares it byte for byte; hex digits in upper case still name the
            # postings and group of their value (the server's search reads them as that fingerprint), other text none
            expected_hex = expected
            replaced = stored_fingerprint(expected)
        else:
            expected_hex = "-" if expected is None else ANY
        old = [] if op == "add" or replaced is None else self.posting_keys(replaced)
        hex_fp = "" if fp is None else format_fingerprint(fp)
        if replaced is not None:
            old_group = self.keys.twins(format_fingerprint(replaced))
        elif fp is not None and not mangled:
            old_group = self.keys.twins(hex_fp)  # nothing replaced: the same key as the new group
        else:
            old_group = self.keys.twins("-")  # names no group
        new_group = self.keys.twins(hex_fp) if fp is not None else old_group
        target = self.building  # a migration under way: the change goes into its layout too
        target_new: list[str] = []
        target_old: list[str] = []
        if target is not None:
            target_new = target.posting_keys(fp) if fp is not None else []
            target_old = target.posting_keys(replaced) if replaced is not None and old else []
        packed, listed = library.pack_snapshot(snapshot)
        keys = library.ApplyKeys(
            meta=self.keys.meta,
            fingerprints=self.keys.fingerprints,
            changes=self.keys.changes,
            events=stream.events_stream if stream else self.keys.events_stream,
            alerts=stream.alerts_stream if stream else self.keys.alerts_stream,
            new_group=new_group,
            old_group=old_group,
            expiry=self.keys.expiry,
            new_postings=own,
            old_postings=old,
            probes=others,
            target_new=target_new,
            target_old=target_old,
        )
        args = library.ApplyArgs(
            op=op,
            incident_id=incident_id,
            fingerprint=hex_fp,
            expected=expected_hex,
            layout_tag=self.layout_tag,
            max_distance=self.layout.max_distance,
            n_new=len(own),
            n_old=len(old),
            group=stream.group if stream else "",
            entry_id=entry_id,
            alerts_maxlen=stream.alerts_maxlen if stream else 0,
            limits=library.pack_limits(
                max_matches, self.max_candidates if max_candidates is None else max_candidates, max_replied
            ),
            probed=probed,
            alert_text=alert_text,
            tokenizer=tokenizer,
            snapshot=packed,
            migration=library.pack_migration(target.tag, target.layout.bands) if target is not None else "",
            alert_extra=library.pack_alert_extra(open_alerts, alert_fields),
            listed=listed,
        )
        return library.apply_command(keys, args)

    def snapshot_adds(
        self,
        adds: Sequence[SnapshotAdd],
        *,
        stream: StreamTarget,
        max_matches: int = 0,
        max_candidates: int | None = None,
        alert_extra: str = "",
        max_replied: int | None = None,
    ) -> Packed | None:
        """The apply_batch call of these adds on the snapshot path, packed (`snapshotadds.pack_adds`); None when
        they cannot be written so (build the calls one by one then)."""
        return pack_adds(
            self,
            adds,
            stream=stream,
            max_matches=max_matches,
            max_candidates=max_candidates,
            alert_extra=alert_extra,
            max_replied=max_replied,
        )

    def execute(self, commands: Sequence[Command | Packed]) -> list[Any]:
        """Send commands in one round trip, in order; returns each reply, or the ResponseError it got."""
        return execute(self.redis, commands)

    def transport(self) -> Transport:
        """A transport of this index's client, for batches pipelined ahead of their replies (close it when done)."""
        return open_transport(self.redis)

    def forget_consumer(self, stream: StreamTarget, consumer: str) -> bool:
        """Remove a consumer from the group if, at that moment, it has nothing pending."""
        return bool(self._fcall(library.FN_FORGET_CONSUMER, [stream.events_stream], [stream.group, consumer]))

    def fingerprints_of(self, incident_ids: Sequence[str]) -> dict[str, int | None]:
        """The stored fingerprint of each ID (None when not indexed), in one round trip."""
        if not incident_ids:
            return {}
        stored = self.redis.hmget(self.keys.fingerprints, list(incident_ids))
        return {i: None if v is None else parse_fingerprint(v) for i, v in zip(incident_ids, stored, strict=True)}

    def stored_values(self, incident_ids: Sequence[str]) -> dict[str, int | str | None]:
        """What `{N}:fp` holds for each ID, as an upsert or delete of it names what it replaces: the fingerprint,
        None when not indexed, or the text itself when that is not a fingerprint (`library.stored_value`)."""
        if not incident_ids:
            return {}
        stored = self.redis.hmget(self.keys.fingerprints, list(incident_ids))
        return {i: stored_value(v) for i, v in zip(incident_ids, stored, strict=True)}

    def bulk_load(self, items: Iterable[tuple[str, int]], *, chunk: int = 5000) -> int:
        """Index many (incident ID, fingerprint) pairs without looking for matches; returns how many.

        For loading a new index (a benchmark's pre-load, a migration, a rebuild from another store): pipelined
        writes, not atomic per incident, and blind to IDs already indexed with another fingerprint, so use it only
        for IDs the index does not hold yet and while no worker writes to the namespace. Exact twins go to their
        fingerprint's group, as `add` would put them; with a retention window on, each one's window starts now.
        """
        return bulk_load(self, items, chunk)

    # -- the library API --------------------------------------------------------------------------------------

    def _apply(self, op: str, incident_id: str, fp: int | None, **kwargs: Any) -> ApplyResult:
        def build() -> tuple[Sequence[str], Sequence[Any]]:
            command = self.apply_command(op, incident_id, fp, **kwargs)
            first = 3 + command[2]
            return command[3:first], command[first:]

        self._ensure_open()  # it may take another layout from the meta
        keys, args = build()
        return parse_apply(self._fcall(library.FN_APPLY, keys, args, rebuild=build))

    @staticmethod
    def _check_id(incident_id: Any) -> str:
        problem = incident_id_problem(incident_id)
        if problem:
            raise ValueError(f"{problem}: {incident_id!r:.80}")
        return incident_id

    @staticmethod
    def _check_fp(fp: Any) -> int:
        if type(fp) is not int or not 0 <= fp < 1 << 64:
            raise ValueError(f"a fingerprint is an integer from 0 to 2**64 - 1, got {fp!r:.80}")
        return fp

    def add(self, incident_id: str, features: Mapping[str, int]) -> Matches:
        """Find every indexed incident within max_distance, then index this one, in one atomic step.

        Returns the matches sorted by (distance, ID), a list whose `group` is the incident's group after the step
        (`Group`: label and size, as the alert carries them). Adding an ID again with the same fingerprint changes
        nothing and returns [] (with its group); with another fingerprint it raises `DuplicateIncidentError` and
        changes nothing.
        """
        return self.add_fingerprint(incident_id, fingerprint(features))

    def add_fingerprint(self, incident_id: str, fp: int, *, max_matches: int = 0) -> Matches:
        """`add` for a fingerprint computed elsewhere; `max_matches` lists only that many of the closest (0: all)."""
        self._check_id(incident_id)
        result = self._apply("add", incident_id, self._check_fp(fp), max_matches=max_matches)
        if result.status == "duplicate":
            assert result.stored is not None
            raise DuplicateIncidentError(incident_id, result.stored, fp)
        return _matches(result)

    def upsert(self, incident_id: str, features: Mapping[str, int]) -> Matches:
        """Replace the incident's fingerprint and postings (its old self never matches), returning the matches and,
        as `group`, the group decided again for it (as `add` does).

        Upserting the fingerprint already stored changes nothing and returns [] (with its group).
        """
        return self.upsert_fingerprint(incident_id, fingerprint(features))

    def upsert_fingerprint(self, incident_id: str, fp: int, *, max_matches: int = 0) -> Matches:
        """`upsert` for a fingerprint computed elsewhere; `max_matches` lists only that many of the closest."""
        self._check_id(incident_id)
        return _matches(self._retrying("upsert", incident_id, self._check_fp(fp), max_matches=max_matches))

    def delete(self, incident_id: str) -> bool:
        """Remove the incident's fingerprint and postings; False when it was not indexed."""
        self._check_id(incident_id)
        return self._retrying("delete", incident_id, None).status == "deleted"

    def _retrying(self, op: str, incident_id: str, fp: int | None, max_matches: int = 0) -> ApplyResult:
        result = retry_while_stale(
            lambda: self._apply(
                op, incident_id, fp, expected=self.stored_values([incident_id])[incident_id], max_matches=max_matches
            ),
            lambda r: r.status,
        )
        if result is None:
            raise StaleRetriesExhaustedError(
                f"incident {incident_id!r} changed under {op} {STALE_RETRIES} times in a row; "
                "another client is rewriting it in a loop"
            )
        return result

    def matches(
        self, features: Mapping[str, int], max_distance: int | None = None, *, max_matches: int = 0
    ) -> list[tuple[str, int]]:
        """Every indexed incident within `max_distance` (at most the configured one) of a bag, without indexing it.

        The matches are sorted by (distance, ID), as `add` and the alerts list them; with `max_matches`, only that
        many of the closest.
        """
        return self.matches_of(fingerprint(features), max_distance, max_matches=max_matches)

    def matches_of(self, fp: int, max_distance: int | None = None, *, max_matches: int = 0) -> list[tuple[str, int]]:
        """`matches` for a fingerprint."""
        return self.search(fp, max_distance, max_matches=max_matches).matches

    def search(self, fp: int, max_distance: int | None = None, *, max_matches: int = 0) -> ApplyResult:
        """The matches of a fingerprint with their exact `match_count` and the candidates verified (status `found`);
        past the index's `max_candidates`, `incomplete`: some of them, the count a lower bound.

        `matches` lists the closest `max_matches` (0: all), sorted by (distance, ID).
        """
        limit = self.layout.max_distance if max_distance is None else max_distance
        if type(limit) is not int or not 0 <= limit <= self.layout.max_distance:
            raise ValueError(
                f"max_distance={max_distance!r}: this index finds matches up to {self.layout.max_distance}"
            )
        if type(max_matches) is not int or max_matches < 0:
            raise ValueError(f"max_matches={max_matches!r}: give how many matches to list, or 0 for all")
        hex_fp = format_fingerprint(fp)

        def build() -> tuple[list[str], list[Any]]:
            own, probed, others = self.probe_keys(fp, min(limit, self.layout.max_distance))
            keys = [self.keys.meta, self.keys.fingerprints, self.keys.twins(hex_fp), *own[:probed], *others]
            limits = [max_matches, self.max_candidates]
            return keys, [hex_fp, min(limit, self.layout.max_distance), self.layout_tag, *limits]

        self._ensure_open()
        keys, args = build()
        reply = self._fcall(library.FN_MATCHES, keys, args, readonly=True, rebuild=build)
        count, incomplete = library.parse_count(reply[0])
        return ApplyResult(
            "found", match_count=count, candidates=int(reply[1]), matches=pairs(reply[2:]), incomplete=incomplete
        )

    def neighbours(self, features: Mapping[str, int], max_distance: int | None = None) -> list[tuple[str, int]]:
        """Deprecated name of `matches`."""
        warnings.warn("FingerprintIndex.neighbours is now called matches", DeprecationWarning, stacklevel=2)
        return self.matches(features, max_distance)

    def neighbours_of(self, fp: int, max_distance: int | None = None) -> list[tuple[str, int]]:
        """Deprecated name of `matches_of`."""
        warnings.warn("FingerprintIndex.neighbours_of is now called matches_of", DeprecationWarning, stacklevel=2)
        return self.matches_of(fp, max_distance)

    def twin_group(self, fp: int) -> tuple[int, str | None]:
        """How many incidents share this exact fingerprint, and which of them the posting sets hold (None: none).

        The representative is the incident with this fingerprint found in every posting set of it.
        """
        keys = self.posting_keys(fp)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.twins(format_fingerprint(fp)))
        pipe.sinter(keys)
        size, holders = pipe.execute()
        holders = sorted(text(h) for h in holders)
        stored = self.stored_values(holders)  # a value mangled by hand holds no fingerprint (and must not raise)
        representative = next((h for h in holders if stored[h] == fp), None)
        if not size:
            size = 0 if representative is None else 1
        return int(size), representative

    def postings(self, incident_id: str, fp: int) -> list[Posting]:
        """Each band's posting set of a fingerprint, its size, and whether it holds the incident's fingerprint
        (the incident, or its twin group's representative)."""
        keys = self.posting_keys(fp)
        size, representative = self.twin_group(fp)
        holder = incident_id if size <= 1 or representative is None else representative
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.scard(key)
            pipe.sismember(key, holder)
        replies = pipe.execute()
        layout = self.layout
        return [
            Posting(
                band,
                layout.offsets[band],
                layout.widths[band],
                value,
                key,
                int(replies[2 * band]),
                bool(replies[2 * band + 1]),
            )
            for band, (key, value) in enumerate(zip(keys, layout.values(fp), strict=True))
        ]

    def get(self, incident_id: str) -> int | None:
        """The incident's fingerprint, or None when it is not indexed."""
        stored = self.redis.hget(self.keys.fingerprints, incident_id)
        return None if stored is None else parse_fingerprint(stored)

    def __len__(self) -> int:
        return int(self.redis.hlen(self.keys.fingerprints))

    def _info_memory(self) -> dict[str, Any]:
        """INFO memory of the server holding this index (on a cluster: the node that owns its hash tag)."""
        nodes = getattr(self.redis, "get_node_from_key", None)
        if nodes is not None:
            info = self.redis.info("memory", target_nodes=nodes(self.keys.meta))
        else:
            info = self.redis.info("memory")
        if isinstance(info, dict) and "used_memory" not in info and len(info) == 1:
            info = next(iter(info.values()))  # some cluster clients answer {node: info}
        return info if isinstance(info, dict) else {}

    def stats(self) -> dict[str, Any]:
        """Incidents indexed, the layout, and Redis memory where the server reports it."""
        count = len(self)
        stats: dict[str, Any] = {
            "namespace": self.keys.namespace,
            "incidents": count,
            "layout": self.layout.description,
            "bands": self.layout.bands,
            "band_widths": list(self.layout.widths),
            "max_distance": self.layout.max_distance,
            "probe_radius": list(self.layout.radii),
            "probes_per_query": self.layout.probes,
            "meta": {text(k): text(v) for k, v in (self.redis.hgetall(self.keys.meta) or {}).items()},
        }
        # Each figure on its own: a server, proxy or ACL user may allow one of MEMORY USAGE and INFO and not the other.
        try:
            fp_bytes = self.redis.memory_usage(self.keys.fingerprints)
        except ResponseError:
            fp_bytes = None
        if fp_bytes is not None:
            stats["fingerprint_hash_bytes"] = int(fp_bytes)
        try:
            info = self._info_memory()
        except ResponseError:
            info = {}
        if "used_memory" in info:
            stats["used_memory"] = int(info["used_memory"])
            if count:
                stats["used_memory_per_incident"] = round(int(info["used_memory"]) / count, 1)
        return stats
