"""The size limits on incoming events, and the names of an alert's own fields, apart from the formats that use them.

`settings.py` builds them from its flags and `formats.py` checks events against them. They import nothing of the
package so that the settings need not import the formats: connection -> settings -> formats -> replies -> connection
was a circle.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["ALERT_FIELDS", "DEFAULT_MAX_CANDIDATES", "DEFAULT_SNAPSHOT_MAX_CANDIDATES", "EventLimits"]

ALERT_FIELDS = frozenset(
    {
        "fingerprint",
        "group_id",
        "group_size",
        "incident_id",
        "incomplete",
        "match_count",
        "matches",
        "max_distance",
        "op",
        "opens_group",
        "source_entry",
        "text",
    }
)
"""The fields an alert defines (formats.Alert checks at import that these are its fields); ALERT_EVENT_FIELDS may
name none of them (a copied field would hide one)."""

DEFAULT_MAX_CANDIDATES = 3000
"""The per-event budget's default: most candidates one event's search verifies (docs/contract.md: about 10 ms of
Redis time an event). Chosen by measurement on Redis 7.0 (docs/contract.md, "The per-event budget";
benchmarks/journal/near-storms.md): a candidate costs the primary about 2.3 to 2.4 us of CPU in a near-duplicate
storm of 12,000 (most candidates matches, each adding its twin group's size; 2.8 us before the search was made
cheaper) and about 3.0 to 3.1 us in a crafted flood of 200,000 (a larger hash and set, few matches), so 3,000 of them
stay within about 10 ms. It counts candidates, not matches: a match adds less than a candidate costs (the journal)."""

DEFAULT_SNAPSHOT_MAX_CANDIDATES = 60_000
"""The default budget of a worker's search of its own copy (the snapshot read path; docs/contract.md, "The per-event
budget"). That search costs the worker's CPU, not Redis's one thread (the atomic step validates the changes since
the copy's position, never the candidates), so MAX_CANDIDATES' 10 ms of Redis time does not size it. At ten million
incidents on the benchmark's workload the default 4 bands meet 17,300 candidates a search on average, 43,900 at the
99th percentile and 58,830 at most (of 3,000; 3 bands: 3,244, 9,996 and 17,855; benchmarks/journal/ten-million.md):
60,000 keep the copy's searches exact there with the layout that costs Redis least memory (3 bands take about twice
its memory an incident). A copy reads and compares a candidate in numpy for a few nanoseconds (a crafted flood of
60,000 sharing a band value: well under a millisecond), but lists a match within r in Python for about a
microsecond: the worst event, a near-duplicate storm whose every candidate is a match, takes up to about 60 ms of
one worker's CPU (none of Redis's); lower it where such storms are expected and workers are few."""


class EventLimits(BaseModel):
    """Size limits on incoming events (from the settings); bigger input is dead-lettered, never processed."""

    max_tokens: int = 10_000
    max_token_length: int = 1024
    max_entry_bytes: int = 1_048_576
