"""Incident fingerprint worker: near-duplicate incidents from a Redis stream.

The names below are imported on first use, so that `import worker.fingerprint` (pure: no Redis, no pydantic)
stays cheap and a subcommand imports only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "BandLayout": "bands",
    "DuplicateIncidentError": "errors",
    "FingerprintIndex": "index",
    "InvalidFeaturesError": "errors",
    "LayoutError": "errors",
    "LayoutMismatchError": "errors",
    "fingerprint": "fingerprint",
    "fingerprint_many": "fingerprint",
}

__all__ = [
    "BandLayout",
    "DuplicateIncidentError",
    "FingerprintIndex",
    "InvalidFeaturesError",
    "LayoutError",
    "LayoutMismatchError",
    "__version__",
    "fingerprint",
    "fingerprint_many",
]

if TYPE_CHECKING:
    from .bands import BandLayout
    from .errors import DuplicateIncidentError, InvalidFeaturesError, LayoutError, LayoutMismatchError
    from .fingerprint import fingerprint, fingerprint_many
    from .index import FingerprintIndex


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
