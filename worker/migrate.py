"""Moving a live index to another band layout (or maximum distance) while workers keep processing.

`incident-worker migrate --bands M [--max-distance R]` drives it; docs/contract.md ("Moving to another layout") says
what it guarantees. The state lives in Redis, in `{N}:migration` and `{N}:meta`, and every step is one atomic call
of the index's functions (worker/lua/migrate.lua, `migrate_*`), so a migrator killed at any moment is resumed by
running the same command again:

1. start: `{N}:migration` records the source and target layouts and the target's generation (its posting keys are
   `{N}:band:g<g>:<b>:<v>`, so they never share a key with the source's), and `{N}:meta`'s `building` names the
   target. From that step on, every apply call writes both layouts; a worker that does not know of the migration
   yet is refused and reads the meta again.
2. build: one pass of HSCAN over `{N}:fp`, a bounded batch per call; each incident still holding the fingerprint
   read, and representing it in the source's postings, is added to the target's postings. The cursor is stored by
   the same call, so a resumed pass goes on where the last batch ended.
3. switch: `{N}:meta` takes the target layout in one step (the source joins `previous_layouts`); calls of the
   source layout are refused from then on, and the workers take the new layout from the meta.
4. remove: SCAN for the source's posting keys and UNLINK them in bounded batches; the last batch deletes
   `{N}:migration` and records the move in `{N}:meta`'s `last_migration`.

Before the switch, `--abort` stops the move instead: `building` leaves the meta in one step, then the target's
posting keys are removed the same way, leaving the index exactly as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import library
from .bands import BandLayout
from .connection import RedisClient
from .errors import CommandError
from .fingerprint import parse_fingerprint
from .index import FingerprintIndex, LayoutTarget, base_tag, layout_tag
from .keys import IndexKeys, glob_escape
from .replies import text
from .transport import scan_slot

__all__ = ["DEFAULT_BATCH", "MigrationStatus", "Migrator", "migration_status"]

DEFAULT_BATCH = 1000
"""Incidents per build call and keys per removal call: each call holds Redis's one thread for a few milliseconds."""


@dataclass(frozen=True)
class MigrationStatus:
    """`{N}:migration` as read: what is moving where and how far it got (None fields when no move is under way)."""

    state: str
    source: str
    target: str
    total: int
    visited: int
    written: int
    removed: int
    started_at_ms: int
    fields: dict[str, str]

    @property
    def progress(self) -> str:
        """One line for people: the state and its progress."""
        if self.state == "building":
            share = f" ({min(100.0, 100.0 * self.visited / self.total):.0f}%)" if self.total else ""
            return f"building: {self.visited:,} of about {self.total:,} incidents visited{share}"
        if self.state == "built":
            return f"built ({self.visited:,} incidents visited); switching"
        if self.state == "cleaning":
            return f"switched; removing the old postings ({self.removed:,} keys removed)"
        return f"aborting; removing the new postings ({self.removed:,} keys removed)"

    def as_json(self) -> dict[str, Any]:
        return {**self.fields, "progress": self.progress}


def migration_status(client: RedisClient, keys: IndexKeys) -> MigrationStatus | None:
    """The move under way in the namespace, or None."""
    fields = {text(k): text(v) for k, v in (client.hgetall(keys.migration) or {}).items()}
    if not fields:
        return None

    def number(name: str) -> int:
        try:
            return int(fields.get(name, "0"))
        except ValueError:
            return 0

    return MigrationStatus(
        state=fields.get("state", "?"),
        source=fields.get("source", ""),
        target=fields.get("target", ""),
        total=number("total"),
        visited=number("visited"),
        written=number("written"),
        removed=number("removed"),
        started_at_ms=number("started_at"),
        fields=fields,
    )


def _layout_of(tag: str) -> tuple[BandLayout, int]:
    from .index import parse_layout_tag

    parts = parse_layout_tag(tag)
    return BandLayout(int(parts["bands"]), int(parts["max_distance"])), int(parts["generation"])


class Migrator:
    """Moves one namespace's index to `bands` / `max_distance`, or aborts the move under way.

    `batch` bounds each call; `pause_s` waits between calls (to leave the server to the workers); `report` gets a
    `MigrationStatus` now and then.
    """

    def __init__(
        self,
        client: RedisClient,
        namespace: str,
        *,
        batch: int = DEFAULT_BATCH,
        pause_s: float = 0.0,
        report: Callable[[MigrationStatus], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = IndexKeys(namespace)
        self.batch = batch
        self.pause_s = pause_s
        self.report = report
        self._last_report = 0.0
        self._layouts_of: tuple[str, FingerprintIndex, LayoutTarget] | None = None

    # -- reading ----------------------------------------------------------------------------------------------

    def status(self) -> MigrationStatus | None:
        return migration_status(self.client, self.keys)

    def _index(self) -> FingerprintIndex:
        index = FingerprintIndex.stored(self.client, self.keys.namespace)
        if index is None:
            raise CommandError(
                f"namespace {self.keys.namespace!r} has no index yet ({self.keys.meta} is missing): nothing to migrate"
            )
        return index

    def _fcall(self, function: str, keys: list[str], args: list[Any]) -> Any:
        return self.client.fcall(function, len(keys), *keys, *args)

    def _tick(self, force: bool = False) -> None:
        if self.report is None:
            return
        now = time.monotonic()
        if force or now - self._last_report >= 1.0:
            self._last_report = now
            status = self.status()
            if status is not None:
                self.report(status)

    # -- the move ---------------------------------------------------------------------------------------------

    def migrate(self, bands: int, max_distance: int | None = None) -> str:
        """Move to `bands` (and `max_distance`, default: the current one), or resume the same move; returns the
        meta's `last_migration` line once done."""
        index = self._index()
        status = self.status()
        if status is None:
            target_layout = BandLayout(bands, index.layout.max_distance if max_distance is None else max_distance)
            if layout_tag(target_layout.bands, target_layout.max_distance) == base_tag(index.layout_tag):
                # Success, not an error: a migrator killed after its last step but before it exited is run again
                # (as the docs say to), and a retried job must not fail for a move that is done.
                return f"the index already uses {target_layout.description}: nothing to do"
            status = self._start(index, target_layout)
        else:
            distance = max_distance if max_distance is not None else _layout_of(status.target)[0].max_distance
            wanted = layout_tag(bands, distance)
            if status.state == "aborting":
                raise CommandError(
                    "an aborted migration is still removing its postings; run `incident-worker migrate --abort` to "
                    "finish it, then start again"
                )
            if base_tag(status.target) != wanted:
                raise CommandError(
                    f"a migration to {status.target!r} is under way ({status.progress}); run migrate with that "
                    "layout to resume it, or `incident-worker migrate --abort` (before its switch) to stop it"
                )
        return self._drive()

    def abort(self) -> str:
        """Abort the move under way (before its switch) and remove what it built; returns what happened."""
        reply = self._fcall(library.FN_MIGRATE_ABORT, [self.keys.meta, self.keys.migration], [])
        if text(reply) == "":
            return "no migration under way"
        return self._drive()

    def _start(self, index: FingerprintIndex, target: BandLayout) -> MigrationStatus:
        generation = index.generation + 1
        tag = layout_tag(target.bands, target.max_distance, generation)
        fields = {
            "generation": generation,
            "source_prefix": self.keys.postings_prefix(index.generation),
            "target_prefix": self.keys.postings_prefix(generation),
            "batch": self.batch,
        }
        args: list[Any] = [index.layout_tag, tag]
        for name, value in fields.items():
            args += [name, value]
        self._fcall(library.FN_MIGRATE_START, [self.keys.meta, self.keys.migration, self.keys.fingerprints], args)
        status = self.status()
        assert status is not None
        return status

    def _drive(self) -> str:
        """Run the move from its stored state to its end."""
        while not self.step():
            pass
        meta = FingerprintIndex.read_meta(self.client, self.keys.namespace)
        return meta.get("last_migration", "done")

    def step(self) -> bool:
        """One bounded call of the move under way, from its stored state; True once no move is under way."""
        status = self.status()
        if status is None:
            return True
        if status.state == "building":
            self._build_batch(status)
        elif status.state == "built":
            self._switch(status)
        elif status.state in ("cleaning", "aborting"):
            self._remove_batch(status)
        else:
            raise CommandError(f"{self.keys.migration} is in an unknown state {status.state!r}; inspect it")
        self._tick(force=status.state == "built")
        self._pause()
        return False

    def _layouts(self, status: MigrationStatus) -> tuple[FingerprintIndex, LayoutTarget]:
        if self._layouts_of is None or self._layouts_of[0] != status.target:
            source = self._index()
            layout, generation = _layout_of(status.target)
            target = LayoutTarget(status.target, layout, generation, self.keys.band_keys(layout, generation))
            self._layouts_of = (status.target, source, target)
        return self._layouts_of[1], self._layouts_of[2]

    def _build_batch(self, status: MigrationStatus) -> None:
        source, target = self._layouts(status)
        cursor = status.fields.get("cursor", "0")
        next_cursor, chunk = self.client.hscan(self.keys.fingerprints, int(cursor), count=self.batch)
        keys = [self.keys.meta, self.keys.migration, self.keys.fingerprints]
        args: list[Any] = [status.target, target.layout.bands, cursor, str(next_cursor)]
        for raw_id, raw_fp in dict(chunk).items():  # type: ignore[arg-type]
            try:
                hex_fp = text(raw_fp)
                fp = parse_fingerprint(hex_fp)
            except ValueError:  # UnicodeDecodeError included
                continue  # not a fingerprint (a hand edit): it is in no posting either
            keys.append(source.posting_keys(fp)[0])
            keys += target.posting_keys(fp)
            args += [raw_id, hex_fp]  # the ID as stored (bytes from a real server), whatever its encoding
        self._fcall(library.FN_MIGRATE_BUILD, keys, args)

    def _switch(self, status: MigrationStatus) -> None:
        layout, generation = _layout_of(status.target)
        fields = {
            "bands": layout.bands,
            "band_widths": ",".join(str(w) for w in layout.widths),
            "max_distance": layout.max_distance,
            "probe_radius": ",".join(str(p) for p in layout.radii),
            "generation": generation,
        }
        args: list[Any] = [status.target]
        for name, value in fields.items():
            args += [name, value]
        self._fcall(library.FN_MIGRATE_SWITCH, [self.keys.meta, self.keys.migration], args)

    def _remove_batch(self, status: MigrationStatus) -> None:
        prefix = status.fields.get("removing", "")
        if not prefix.startswith(self.keys.tag + ":band:"):
            raise CommandError(f"{self.keys.migration} names no posting keys to remove ({prefix!r}); inspect it")
        cursor = status.fields.get("cursor", "0")
        pattern = glob_escape(prefix) + "[0-9]*"
        next_cursor, found = scan_slot(self.client, self.keys.meta, int(cursor), pattern, self.batch)
        keys = [self.keys.meta, self.keys.migration, *(text(k) for k in found)]
        self._fcall(library.FN_MIGRATE_REMOVE, keys, [status.state, cursor, str(next_cursor)])

    def _pause(self) -> None:
        if self.pause_s > 0:
            time.sleep(self.pause_s)
