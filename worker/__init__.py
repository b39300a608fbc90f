"""Incident fingerprint worker: near-duplicate incidents from a Redis stream."""

from .bands import BandLayout, LayoutError
from .fingerprint import InvalidFeaturesError, fingerprint, fingerprint_many
from .index import DuplicateIncidentError, FingerprintIndex, LayoutMismatchError

__version__ = "0.1.0"

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
