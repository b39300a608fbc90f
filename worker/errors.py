"""Every exception type of the package, in one place. Pure: importing it imports neither Redis nor pydantic.

Library errors (what a caller of `worker.fingerprint`, `worker.bands` or `worker.index` may catch):

* `InvalidFeaturesError` (a ValueError): a feature bag the fingerprint does not accept; `reason` is the dead-letter
  code (`bad_token`, `bad_weight`, ...).
* `LayoutError` (a ValueError): band settings that cannot be used; the message says what would work.
* `TextTooLargeError` (a ValueError): a text that grows past the tokenizer's bound in Unicode's NFKC form.
* `RedisUrlError` (a ValueError): a Redis URL that is refused; the message says why and never quotes the URL.
* `FingerprintIndexError`: base of the index's own errors.
  * `DuplicateIncidentError`: `add` of an ID already indexed with another fingerprint.
  * `LayoutMismatchError`: the namespace was built with another layout.
  * `FunctionsMissingError`: Redis has no functions library of this code's version; an administrator loads it
    (`incident-worker load-functions`), since a worker may not load code.
  * `StaleRetriesExhaustedError`: an upsert or delete kept racing another client rewriting the same incident.
  * `PreflightError`: the worker's Redis user may not run a command the index's functions send, or one of the
    namespace's keys holds another type; a call would stop midway, keeping what it wrote before.
  * `DamagedMetaError`: a field of `{N}:meta` holds what no version writes there (a hand edit); the message names
    the field and what to run. `worker.metafields` builds it.
  * `KeyTypeError`: a key of the namespace holds another type than the index keeps there (Redis's WRONGTYPE); the
    message names the key, the type it holds and what to do (`worker.keytypes` builds it).

Command-line errors (how a subcommand ends without a traceback):

* `UsageError`: bad flags or settings, exit code 2.
* `CommandError`: the command failed in an expected way (not found, unhealthy), exit code 1.
* `InvalidLineError`: one input line of `publish` that is not an event (`reason` is a dead-letter code).
"""

from __future__ import annotations

__all__ = [
    "CommandError",
    "DamagedMetaError",
    "DuplicateIncidentError",
    "FingerprintIndexError",
    "FunctionsMissingError",
    "InvalidFeaturesError",
    "InvalidLineError",
    "KeyTypeError",
    "LayoutError",
    "LayoutMismatchError",
    "PreflightError",
    "RedisUrlError",
    "StaleRetriesExhaustedError",
    "TextTooLargeError",
    "UsageError",
]


class InvalidFeaturesError(ValueError):
    """A feature bag that the fingerprint does not accept. `reason` is a short machine-readable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LayoutError(ValueError):
    """A band layout that cannot be used; the message says what would work."""


class TextTooLargeError(ValueError):
    """A text that NFKC would make larger than the tokenizer's bound (`worker.text.NFKC_GROWTH`): its work is bounded
    by the size of the text it reads, so such a text is refused before it is normalized whole."""


class RedisUrlError(ValueError):
    """A Redis URL that is refused. The message says why and what to do, and never quotes the URL."""


class FingerprintIndexError(Exception):
    """Base class of the index's errors."""


class DuplicateIncidentError(FingerprintIndexError):
    """`add` of an incident ID that is already indexed with another fingerprint."""

    def __init__(self, incident_id: str, stored: int | str, new: int) -> None:
        if isinstance(stored, str):  # {N}:fp holds something else for it, mangled by hand (verify reports it)
            held = f"a value that is not a fingerprint ({stored[:40]!r}: not 16 lowercase hex digits)"
        else:
            held = f"fingerprint {stored:016x}"
        super().__init__(
            f"incident {incident_id!r} is already indexed with {held}, not {new:016x}; "
            "use upsert to replace it, or another ID"
        )
        self.incident_id = incident_id
        self.stored = stored
        self.new = new


class LayoutMismatchError(FingerprintIndexError):
    """The namespace was built with another layout than this index is configured with."""


class DamagedMetaError(FingerprintIndexError):
    """A field of `{N}:meta` holds a value that no version writes there (a hand edit); `field` is its name."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class TokenizerMismatchError(LayoutMismatchError):
    """The namespace's text incidents were fingerprinted by another version of the tokenizer than this one's.

    A kind of layout mismatch: fingerprints of one index must come from one tokenizer, or near duplicates would
    land far apart.
    """


class FunctionsMissingError(FingerprintIndexError):
    """Redis has no functions library of this code's version: never loaded, lost, or only another version's.

    Workers may not load code (docs/contract.md#who-may-do-what); the message says what an administrator runs."""


class PreflightError(FingerprintIndexError):
    """The worker's Redis user may not run a command the index's functions send, or a key of the namespace holds
    another type: a function stops at the first command refused and keeps what it wrote before it (an incident
    indexed without its change-log entry or its alert), so a worker does not start so. The message says what to do."""


class KeyTypeError(FingerprintIndexError):
    """A key of the namespace holds another type than the index keeps there: an operator's slip with redis-cli, a
    restore into the wrong database, another application's key. `key` is None when Redis said WRONGTYPE but no key the
    command could name was found; the message then says how to find it. Built by `worker.keytypes`."""

    def __init__(self, message: str, key: str | None = None, expected: str | None = None, held: str | None = None):
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.held = held


class CredentialsRefusedError(FingerprintIndexError):
    """Redis refused the worker's user name and password before the worker had ever set up: a configuration
    mistake, not an outage (a later refusal, say while an administrator reloads the ACL, is waited out)."""


class TlsUnverifiedError(FingerprintIndexError):
    """Redis (or a Sentinel) presented a TLS certificate the worker could not verify before the worker had ever set
    up: a wrong or missing CA, a name the certificate does not hold, an expired certificate. A configuration mistake
    (later, say while a certificate is rotated, the failure is waited out as an outage)."""


class StaleRetriesExhaustedError(FingerprintIndexError):
    """An upsert or delete found the incident changed between its read and its write, too many times in a row."""


class UsageError(Exception):
    """Bad flags or settings: printed without a traceback, exit code 2."""


class CommandError(Exception):
    """The command failed in an expected way: printed without a traceback, exit code 1."""


class InvalidLineError(Exception):
    """An input line that is not a valid event: `reason` is a dead-letter code, `detail` says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
