"""The size limits on incoming events, apart from the formats that enforce them.

`settings.py` builds them from its flags and `formats.py` checks events against them. They import nothing of the
package so that the settings need not import the formats: connection -> settings -> formats -> replies -> connection
was a circle.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["DEFAULT_MAX_CANDIDATES", "EventLimits"]

DEFAULT_MAX_CANDIDATES = 5000
"""The per-event budget's default: most candidates one event's search verifies (docs/contract.md: about 10 ms of
Redis time an event). Chosen by measurement on Redis 7.0 (docs/contract.md, "The per-event budget"): a candidate
costs the primary's thread about 2 us, so 5,000 of them about 10 ms."""


class EventLimits(BaseModel):
    """Size limits on incoming events (from the settings); bigger input is dead-lettered, never processed."""

    max_tokens: int = 10_000
    max_token_length: int = 1024
    max_entry_bytes: int = 1_048_576
