"""The size limits on incoming events, apart from the formats that enforce them.

`settings.py` builds them from its flags and `formats.py` checks events against them. They import nothing of the
package so that the settings need not import the formats: connection -> settings -> formats -> replies -> connection
was a circle.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["EventLimits"]


class EventLimits(BaseModel):
    """Size limits on incoming events (from the settings); bigger input is dead-lettered, never processed."""

    max_tokens: int = 10_000
    max_token_length: int = 1024
    max_entry_bytes: int = 1_048_576
