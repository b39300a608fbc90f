"""Whether a worker's searches on the primary met a storm (`SNAPSHOT_STORM_CANDIDATES`: see
docs/contract.md, "Snapshot reads"): a batch whose indexed events verified that many candidates each on average, or
a tenth of that of which at least half matched (a near-duplicate storm, known so in its first few hundred events
rather than once each event verifies hundreds), or had one cut at the per-event budget. A near-duplicate storm, or
bags crafted to share band values, would cost the primary's one thread milliseconds an event; on the worker's own
copy the primary only validates them. `Processor` notes each indexed event's search here and, when a batch ends,
moves its search to the copy once this says so (`READ_PATH=auto`; with `READ_PATH=primary` it stays, and says once
that it met one)."""

from __future__ import annotations

from typing import Any

from .library import ApplyResult

__all__ = ["StormWatch", "tell"]


class StormWatch:
    """The searches of a worker's current batch on the primary, and whether one batch of them was a storm."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        """Candidates an indexed event, on average over a batch, that make a storm (0: none does, nor a cut); a
        tenth of them do when at least half of them matched."""
        self.seen = False
        self._candidates, self._matches, self._indexed, self._cut = 0, 0, 0, False

    def note(self, result: ApplyResult) -> None:
        """One call's result on the primary (only `indexed` ones searched)."""
        if result.status == "indexed":
            self._candidates += result.candidates
            self._matches += result.match_count
            self._indexed += 1
            self._cut = self._cut or result.incomplete

    def batch_done(self) -> dict[str, Any] | None:
        """The batch is settled: its figures when it made this the first storm (for the log line), else None.

        Ordinary traffic verifies about 20 candidates an event at 10,000 incidents and 180 at 100,000 (where `auto`
        takes the copy anyway), and matches a few of them at most; a storm of exact twins verifies one candidate an
        event (their group's representative), however many twins it matches. A near storm's events match most of
        what they verify: hundreds each after a few hundred events."""
        indexed, candidates, matches, cut = self._indexed, self._candidates, self._matches, self._cut
        self._candidates, self._matches, self._indexed, self._cut = 0, 0, 0, False
        if self.seen or not indexed or not self.threshold:
            return None
        many = candidates >= self.threshold * indexed
        near = 10 * candidates >= self.threshold * indexed and 2 * matches >= candidates
        if not (cut or many or near):
            return None
        self.seen = True
        return {
            "candidates_per_event": round(candidates / indexed, 1),
            "matches_per_event": round(matches / indexed, 1),
            "cut_at_the_budget": cut,
            "events": indexed,
        }


def tell(log: Any, read_path: str, storm: dict[str, Any]) -> None:
    """Say, once, that a batch on the primary met a storm (`storm`: `StormWatch.batch_done`'s figures): with auto, that
    the worker searches its own copy from now on; told to search on the primary, what that costs and what would not."""
    if read_path == "primary":
        log.warning(
            "storm on the primary, and READ_PATH=primary keeps its searches there: each event may verify up to "
            "MAX_CANDIDATES candidates in Redis's one thread (past them its search is cut, its alert incomplete)",
            **storm,
            hint="READ_PATH=auto would search this worker's copy of the index from now on, exactly",
        )
        return
    log.warning(
        "storm on the primary: searching this worker's copy of the index from now on",
        **storm,
        hint="SNAPSHOT_STORM_CANDIDATES sets the candidates an event that make a storm (0: none does)",
    )
