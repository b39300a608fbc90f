"""The stream formats, each defined once: the incoming event, the alert, the dead letter; and the worker's heartbeat
value. The contract: docs/contract.md#events-in, #alerts-out, #dead-letters.

The worker, the CLI and the tests all read and write entries through these models. An event that fails validation
becomes a dead letter whose `reason` is the machine code of the first error and whose `detail` is its message.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .errors import InvalidFeaturesError, TextTooLargeError
from .fingerprint import MAX_WEIGHT, fingerprint, format_fingerprint, parse_fingerprint
from .limits import ALERT_FIELDS, EventLimits
from .replies import text as _text
from .text import features_from_text

__all__ = [
    "ALERT_FIELDS",
    "DEAD_LETTER_FIELDS",
    "MAX_INCIDENT_ID_LENGTH",
    "Alert",
    "DeadLetter",
    "EventLimits",
    "Heartbeat",
    "IncidentEvent",
    "Match",
    "decode_fields",
    "event_error",
    "incident_id_problem",
]

Op = Literal["add", "upsert", "delete"]

DEAD_LETTER_FIELDS = (
    "reason",
    "detail",
    "source_entry",
    "source_stream",
    "consumer",
    "deliveries",
    "original_fields_dropped",
    "original_bytes",
    "original_sizes",
)
"""The dead letter's own fields; an original field of the same name is kept as `original_<name>`."""

MAX_INCIDENT_ID_LENGTH = 256
"""Longest incident ID, in characters: an ID is repeated in every posting set, alert and dead letter."""


def incident_id_problem(value: object) -> str | None:
    """What is wrong with an incident ID (a string of 1 to 256 characters), or None when it is a good one."""
    if not isinstance(value, str):
        return f"incident_id must be a string, got {type(value).__name__}"
    if not 1 <= len(value) <= MAX_INCIDENT_ID_LENGTH:
        return f"incident_id must be 1 to {MAX_INCIDENT_ID_LENGTH} characters, got {len(value)}"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate: no stream field, key or reply can hold it
            return f"incident_id holds a lone surrogate at character {error.start} and has no UTF-8 form"
    return None


MAX_ORIGINAL_FIELDS = 1000
"""A dead letter keeps at most this many of the entry's fields (a server-side call takes ~8,000 arguments)."""

REASONS = {
    "missing_field": "incident_id is missing, or an add or upsert carries neither features nor text",
    "features_and_text": "the entry carries both features and text (send exactly one of them)",
    "bad_type": "a field has the wrong type",
    "bad_text": "text is not valid Unicode (a lone surrogate), or grows more than 4 times over in NFKC form, or holds "
    "a run of more than 4,096 characters NFKC cannot be cut between",
    "bad_incident_id": "incident_id is empty, longer than 256 characters, or holds a lone surrogate (no UTF-8 form)",
    "bad_op": "op is not add, upsert or delete",
    "not_utf8": "a field is not valid UTF-8",
    "bad_json": "features is not valid JSON",
    "bad_features": "features is JSON but not an object",
    "not_a_mapping": "features is not a mapping of token -> weight",
    "empty_bag": "features has no token, or text yields none (empty, or punctuation only)",
    "bad_token": "a token is not a string, or not valid Unicode",
    "bad_weight": "a weight is not an integer from 1 to 2**53 - 1 (bools, floats and strings are not)",
    "too_large": "the entry is over max_entry_bytes (its dead letter keeps a prefix of each field, and the sizes)",
    "bad_inbox_entry": "an element of the inbox ({N}:inbox) is not an event in the inbox's encoding",
    "too_many_tokens": "the bag has more than max_tokens tokens",
    "token_too_long": "a token is longer than max_token_length characters",
    "duplicate_id": "add of an incident ID already indexed with another fingerprint (use op upsert to replace)",
    "poison": "the entry was delivered more than max_deliveries times without being processed",
    "missing_entry": "the entry was deleted from the events stream (XDEL, trimming) while it was pending",
    "invalid": "any other validation failure (see detail)",
}
"""Every dead letter `reason`, with what it means: the codes a dashboard or a replay script can rely on."""


_DEFAULT_LIMITS = EventLimits()


def _error(kind: str, message: str) -> PydanticCustomError:
    """A validation error with a machine code; the message is passed as data, so braces in it stay literal."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def decode_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A stream entry's fields as text; bytes that are not UTF-8 keep their value through surrogate escapes."""
    return {_text(k): _text(v) for k, v in raw.items()}


_OPS = ("add", "upsert", "delete")
_FIELDS = ("incident_id", "op", "features", "text")


class IncidentEvent(BaseModel):
    """One entry of the events stream: `incident_id`, `features` (a JSON object token -> weight) or `text`, `op`.

    An add or upsert carries exactly one of `features` and `text`; a text is turned into a bag by the product's
    tokenizer (`worker.text.features_from_text`). Validate raw stream fields with
    `IncidentEvent.from_fields(fields, limits)`; the validated event carries its SimHash fingerprint (computed
    once, while validating).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    incident_id: str = Field(description="1 to 256 characters")
    op: Op = "add"
    features: dict[str, int] | None = Field(None, description="token -> weight; add and upsert need it or text")
    text: str | None = Field(
        None, description="plain text, tokenized by the worker; add and upsert need it or features"
    )
    _fingerprint: int | None = PrivateAttr(None)

    @property
    def fingerprint(self) -> int | None:
        """The SimHash of `features`, computed while validating (None for a delete)."""
        # read where pydantic keeps private attributes: `self._fingerprint` goes through BaseModel.__getattr__,
        # ~5 us an access against ~0.1 (measured), and a worker reads it several times an event
        return self.__pydantic_private__["_fingerprint"]  # type: ignore[index]

    @field_validator("incident_id", mode="before")
    @classmethod
    def _check_id(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        problem = incident_id_problem(value)
        if problem:
            raise _error("bad_incident_id", problem)
        return value

    @field_validator("op", mode="before")
    @classmethod
    def _check_op(cls, value: Any) -> Any:
        if value not in ("add", "upsert", "delete"):
            raise _error("bad_op", f"op {str(value)[:40]!r} is not one of add, upsert, delete")
        return value

    @field_validator("features", mode="before")
    @classmethod
    def _parse_features(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value, parse_int=_json_int)
            except PydanticCustomError:
                raise
            except ValueError as error:
                raise _error("bad_json", f"features is not valid JSON: {error}") from None
            except RecursionError:
                raise _error("bad_json", "features is JSON nested too deeply to read") from None
        if value is not None and not isinstance(value, dict):
            raise _error(
                "bad_features", f"features must be a JSON object of token -> weight, got {type(value).__name__}"
            )
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _validate_bag(cls, data: Any, handler: Any, info: Any) -> IncidentEvent:
        # The bag is checked by the contract's own rules (docs/contract.md#the-fingerprint: bools, floats and numeric
        # strings are not weights) and fingerprinted in the same pass, before pydantic's own int handling sees it.
        limits: EventLimits = (info.context or {}).get("limits", _DEFAULT_LIMITS)
        fp = None
        bag = None
        if isinstance(data, dict) and data.get("features") is not None and data.get("text") is not None:
            raise _error("features_and_text", "the entry carries both features and text; send one of them")
        if isinstance(data, dict) and data.get("features") is not None:
            bag = cls._parse_features(data["features"])
        elif isinstance(data, dict) and data.get("text") is not None:
            bag = _bag_of_text(data["text"])
        if bag is not None:
            _check_limits(bag, limits)
            try:
                fp = fingerprint(bag)
            except InvalidFeaturesError as error:
                raise _error(error.reason, str(error)) from None
            if data.get("features") is not None:
                data = {**data, "features": bag}
        event: IncidentEvent = handler(data)
        if event.op != "delete" and event.features is None and event.text is None:
            raise _error("missing_field", f"op {event.op} needs features (a bag) or text; the entry has neither")
        event.__pydantic_private__["_fingerprint"] = fp  # type: ignore[index]  # as the property reads it
        return event

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any], limits: EventLimits = _DEFAULT_LIMITS) -> IncidentEvent:
        """Validate a raw stream entry (bytes or text). Raises `ValidationError`; see `event_error`."""
        as_read = _as_read_text(fields, limits)
        if as_read is not None:  # the usual entry: the data the loop below makes of it, with fewer checks
            event = cls._valid_as_read(as_read, limits)
            return event if event is not None else cls.model_validate(as_read, context={"limits": limits})
        size = sum(_byte_size(k) + _byte_size(v) for k, v in fields.items())  # in bytes, as the worker reads them
        if size > limits.max_entry_bytes:
            raise ValidationError.from_exception_data(
                cls.__name__,
                [_custom("too_large", f"the entry is {size} bytes, over the limit of {limits.max_entry_bytes}")],
            )
        data: dict[str, Any] = {}
        for key, value in fields.items():
            name = _text(key)
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValidationError.from_exception_data(
                        cls.__name__, [_custom("not_utf8", f"field {name!r} is not UTF-8: {error}")]
                    ) from None
            data[name] = value
        for required in ("incident_id",):
            if required not in data:
                raise ValidationError.from_exception_data(
                    cls.__name__, [_custom("missing_field", f"{required} is required")]
                )
        event = cls._valid_as_read(data, limits)
        if event is not None:
            return event
        return cls.model_validate(data, context={"limits": limits})

    @classmethod
    def _valid_as_read(cls, data: dict[str, Any], limits: EventLimits) -> IncidentEvent | None:
        """The event of `data` when it is a valid entry as the stream gives it (every value a str), checked by the
        rules `model_validate` applies, without pydantic's second pass over the bag; None for anything else (which
        `model_validate` then reports as ever: an entry this returns None for is validated in full).

        Equal to `model_validate`'s event, fields set and fingerprint included (tests/test_stream.py compares them on
        valid and hostile entries). About 10 us an event of pydantic's own work saved.
        """
        incident_id = data["incident_id"]
        op = data.get("op", "add")
        features = data.get("features")
        text = data.get("text")
        if type(incident_id) is not str or not 1 <= len(incident_id) <= MAX_INCIDENT_ID_LENGTH:
            return None
        if not incident_id.isascii() and incident_id_problem(incident_id) is not None:
            return None
        if type(op) is not str or op not in _OPS:
            return None
        bag: Any = None
        try:
            if features is not None:
                if type(features) is not str or text is not None:
                    return None
                bag = _read_json(features)
                if type(bag) is not dict:
                    return None
            elif text is not None:
                if type(text) is not str:
                    return None
                bag = features_from_text(text)
            elif op != "delete":
                return None
            fp = None
            if bag is not None:
                # every token is a str here (JSON object keys, the tokenizer's tokens): `_check_limits`' checks,
                # without its loop; an entry over a limit is reported in full
                if len(bag) > limits.max_tokens or (bag and max(map(len, bag)) > limits.max_token_length):
                    return None
                fp = fingerprint(bag)  # every token a str and every weight an int in range, or it raises
        except (ValueError, RecursionError, PydanticCustomError):  # JSON, text, limits, bag: reported in full
            return None
        # what `model_construct` makes of these values (every field given), without its loop over the fields' aliases
        # and defaults: tests/test_formats_fast.py compares the two
        event = _new_event(cls)
        _set(
            event,
            "__dict__",
            {"incident_id": incident_id, "op": op, "features": bag if features is not None else None, "text": text},
        )
        _set(event, "__pydantic_fields_set__", {name for name in _FIELDS if name in data})
        _set(event, "__pydantic_extra__", None)
        _set(event, "__pydantic_private__", {"_fingerprint": fp})
        return event

    def to_fields(self) -> dict[str, str]:
        """The stream entry a producer appends for this event."""
        fields = {"incident_id": self.incident_id}
        if self.features is not None:
            fields["features"] = json.dumps(self.features, ensure_ascii=False, separators=(",", ":"))
        if self.text is not None:
            fields["text"] = self.text
        if self.op != "add":
            fields["op"] = self.op
        return fields


_set = object.__setattr__
_new_event = object.__new__
_JSON_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the scanner json.loads runs


def _read_json(value: str) -> Any:
    """`json.loads(value)`, ValueError included, without its checks and whitespace skipping: any text that is not
    one JSON value from its first character to its last (blank space around it, a BOM, extra data, nothing) is left
    to `json.loads`, which reads it, or raises its own error, as ever."""
    try:
        result, end = _JSON_SCAN(value, 0)
    except StopIteration:
        return json.loads(value)
    return result if end == len(value) else json.loads(value)


def _as_read_text(fields: Mapping[Any, Any], limits: EventLimits) -> dict[str, str] | None:
    """The entry's fields as text when every name and value is UTF-8 bytes (as the stream gives them), the entry is
    within max_entry_bytes and has an incident_id: what `from_fields`' loop makes of such an entry. None for
    anything else, which that loop then reads and reports as ever."""
    data: dict[str, str] = {}
    size = 0
    try:
        for key, value in fields.items():
            if type(key) is not bytes or type(value) is not bytes:
                return None
            size += len(key) + len(value)
            data[key.decode()] = value.decode()
    except UnicodeDecodeError:
        return None
    if size > limits.max_entry_bytes or "incident_id" not in data:
        return None
    return data


def _json_int(digits: str) -> int:
    """An integer of a features JSON; one too long for Python to read (over 4,300 digits) is a weight out of range,
    not bad JSON."""
    try:
        return int(digits)
    except ValueError:
        raise _error(
            "bad_weight",
            f"a weight of {len(digits.lstrip('-'))} digits is out of range; weights must be integers from 1 to "
            f"2**53 - 1 ({MAX_WEIGHT})",
        ) from None


def _byte_size(value: Any) -> int:
    """The size of a field name or value in the stream: its UTF-8 bytes (a str's characters may take up to 4)."""
    if isinstance(value, str) and not value.isascii():
        return len(value.encode("utf-8", "surrogatepass"))
    return len(value)


def _bag_of_text(value: Any) -> dict[str, int]:
    if not isinstance(value, str):
        raise _error("bad_type", f"text must be a string, got {type(value).__name__}")
    try:
        return features_from_text(value)
    except TextTooLargeError as error:
        raise _error("bad_text", str(error)) from None
    except ValueError as error:
        reason = "bad_text" if "surrogate" in str(error) else "empty_bag"
        raise _error(reason, str(error)) from None


def _custom(kind: str, message: str) -> Any:
    return {"type": _error(kind, message), "loc": (), "input": None}


def _check_limits(bag: dict[str, Any], limits: EventLimits) -> None:
    if len(bag) > limits.max_tokens:
        raise _error("too_many_tokens", f"the bag has {len(bag)} tokens, over the limit of {limits.max_tokens}")
    for token in bag:
        if isinstance(token, str) and len(token) > limits.max_token_length:
            raise _error(
                "token_too_long",
                f"token {token[:30]!r}... is {len(token)} characters, over the limit of {limits.max_token_length}",
            )


_PYDANTIC_TYPES = {"missing": "missing_field", "string_type": "bad_type", "dict_type": "bad_type"}


def event_error(error: ValidationError) -> tuple[str, str]:
    """The dead letter's `reason` (a code of `REASONS`) and `detail` (for people) of a failed event validation."""
    first = error.errors(include_url=False)[0]
    kind = first["type"]
    reason = kind if kind in REASONS else _PYDANTIC_TYPES.get(kind, "invalid")
    location = ".".join(str(part) for part in first.get("loc", ()))
    message = "is required" if kind == "missing" else first["msg"]
    detail = f"{location} {message}" if kind == "missing" else message
    if location and kind not in REASONS and kind != "missing":
        detail = f"{location}: {message}"
    extra = len(error.errors()) - 1
    if extra:
        detail += f" (and {extra} more problem{'s' if extra > 1 else ''})"
    return reason, detail


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    incident_id: str
    distance: int = Field(ge=0, le=64)


_HEX_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")


class Alert(BaseModel):
    """One entry of the alerts stream: an incident, every indexed incident within max_distance of it, and its group
    (with GROUP_OPEN_ALERTS, also an incident that opens a group: no matches, `opens_group`).

    `fingerprint` is an int here, as everywhere in the Python API; in the stream and in JSON (`model_dump`,
    `to_fields`) it is 16 lowercase hex digits, as the server side stores it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    incident_id: str
    fingerprint: int = Field(ge=0, lt=1 << 64, description="16 lowercase hex digits in the stream and in JSON")
    matches: list[Match]
    match_count: int = Field(ge=0)
    max_distance: int = Field(ge=0, le=64)
    source_entry: str
    op: Op
    text: str | None = Field(
        None, description="the start of a text incident's text, when the worker's alert_text_chars asks for it"
    )
    incomplete: bool = Field(
        False,
        description="the search stopped at the per-event budget (max_candidates): `matches` are real matches but not "
        'necessarily the closest, and match_count is a lower bound; "1" in the stream, absent otherwise',
    )
    group_id: str | None = Field(None, description="the incident's group (absent in alerts of workers before groups)")
    group_size: int | None = Field(None, ge=1, description="the incidents in its group, this one included")
    opens_group: bool = Field(False, description="the incident opened its group (GROUP_OPEN_ALERTS): no matches")
    event_fields: dict[str, str] = Field(
        default_factory=dict, description="the event's own fields named by ALERT_EVENT_FIELDS, copied as they came"
    )

    @field_validator("matches", mode="before")
    @classmethod
    def _parse_matches(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value

    @field_validator("fingerprint", mode="before")
    @classmethod
    def _parse_fingerprint(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not _HEX_FINGERPRINT.match(value):
                raise ValueError(f"a fingerprint is 16 lowercase hex digits, got {value[:40]!r}")
            return parse_fingerprint(value)
        return value

    @field_serializer("fingerprint")
    def _fingerprint_hex(self, fp: int) -> str:
        return format_fingerprint(fp)

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> Alert:
        """Parse an alerts-stream entry as a subscriber reads it: the fields the alert defines, and the event fields
        copied into it (any other name) in `event_fields`."""
        decoded = decode_fields(fields)
        own = {k: v for k, v in decoded.items() if k in ALERT_FIELDS}
        copied = {k: v for k, v in decoded.items() if k not in ALERT_FIELDS}
        return cls.model_validate({**own, "event_fields": copied} if copied else own)

    def to_fields(self) -> dict[str, str]:
        """The stream entry (the worker's server-side function writes exactly these fields)."""
        return {
            "incident_id": self.incident_id,
            "fingerprint": format_fingerprint(self.fingerprint),
            "matches": json.dumps([m.model_dump() for m in self.matches], separators=(",", ":"), ensure_ascii=False),
            "match_count": str(self.match_count),
            "max_distance": str(self.max_distance),
            "source_entry": self.source_entry,
            "op": self.op,
            **({"text": self.text} if self.text is not None else {}),
            **({"incomplete": "1"} if self.incomplete else {}),
            **({"group_id": self.group_id} if self.group_id is not None else {}),
            **({"group_size": str(self.group_size)} if self.group_size is not None else {}),
            **({"opens_group": "1"} if self.opens_group else {}),
            **self.event_fields,
        }


if frozenset(Alert.model_fields) - {"event_fields"} != ALERT_FIELDS:  # one list for settings.py, checked here
    raise RuntimeError("limits.ALERT_FIELDS is not the list of Alert's fields: add the new field there")


class DeadLetter(BaseModel):
    """One entry of the dead-letter stream: why an entry was not processed, and the entry's original fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(description="machine-readable code, e.g. bad_json, bad_weight, duplicate_id, poison")
    detail: str = Field(description="what was wrong, for people")
    source_entry: str = Field(description="the entry ID in the events stream")
    source_stream: str
    consumer: str
    deliveries: int = Field(1, ge=1)
    original_fields_dropped: int = Field(0, ge=0, description="fields of the entry past the first 1,000, not kept")
    original_bytes: int | None = Field(
        None, ge=0, description="for an entry over max_entry_bytes: its size; only a prefix of each field is kept"
    )
    original_sizes: list[tuple[int, int]] | None = Field(
        None, description="for an entry over max_entry_bytes: [name bytes, value bytes] of each kept field"
    )
    original: dict[str, str] = Field(default_factory=dict, description="the entry's own fields, unchanged")

    @field_validator("original_sizes", mode="before")
    @classmethod
    def _parse_sizes(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value

    def to_fields(self, original: Mapping[Any, Any] | None = None) -> dict[Any, Any]:
        """`to_pairs` as a mapping (a repeated original field name keeps only its last value here)."""
        return dict(self.to_pairs(original))

    def to_pairs(
        self, original: Mapping[Any, Any] | Sequence[tuple[Any, Any]] | None = None, *, dropped: int = 0
    ) -> list[tuple[Any, Any]]:
        """Flat stream fields, in order: ours first, then the original ones (renamed `original_<name>` on a clash).

        `original` gives the entry's raw fields, as a mapping or as (name, value) pairs in stream order with
        repeated names kept (bytes kept as they came, even when not UTF-8); by default the model's own `original`.
        `dropped` counts fields the caller never had (an oversized entry's fields past the first 1,000).
        """
        fields: list[tuple[Any, Any]] = [
            ("reason", self.reason),
            ("detail", self.detail),
            ("source_entry", self.source_entry),
            ("source_stream", self.source_stream),
            ("consumer", self.consumer),
            ("deliveries", str(self.deliveries)),
        ]
        source = self.original if original is None else original
        kept = list(source.items()) if isinstance(source, Mapping) else list(source)
        dropped += max(0, len(kept) - MAX_ORIGINAL_FIELDS)
        kept = kept[:MAX_ORIGINAL_FIELDS]
        if dropped:
            fields.append(("original_fields_dropped", str(dropped)))
        if self.original_bytes is not None:
            fields.append(("original_bytes", str(self.original_bytes)))
        if self.original_sizes is not None:
            fields.append(("original_sizes", json.dumps([list(s) for s in self.original_sizes[:MAX_ORIGINAL_FIELDS]])))
        for name, value in kept:
            text = _text(name)
            if text in DEAD_LETTER_FIELDS or text.startswith("original_"):
                name = "original_" + text
            fields.append((name, value))
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> DeadLetter:
        """Parse a dead-letter entry, separating the original fields again."""
        text = decode_fields(fields)
        own = {name: text[name] for name in DEAD_LETTER_FIELDS if name in text}
        original = {}
        for name, value in text.items():
            if name in DEAD_LETTER_FIELDS:
                continue
            original[name.removeprefix("original_")] = value
        return cls.model_validate({**own, "original": original})


class Heartbeat(BaseModel):
    """The value of a worker's heartbeat key `{N}:heartbeat:<consumer>` (JSON, with a TTL of heartbeat_ttl_ms).

    The worker writes it with `to_value`; `check` and `stats` read it with `from_value`, which never fails: a key
    whose value is not a heartbeat still proves that something beats under that name.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    consumer: str = Field(description="the worker's consumer name")
    at: float | None = Field(None, description="Unix time of the beat, in seconds")
    started: float | None = Field(None, description="Unix time the worker started, in seconds")
    processed: int | None = Field(
        None, description="entries the worker processed since it started, as of its last round of batches"
    )
    cut: int | None = Field(
        None,
        description="events whose search stopped at the per-event budget since it started (their alerts incomplete)",
    )
    read_path: str | None = Field(None, description="where its searches run: primary, or snapshot (its own copy)")
    snapshot_position: str | None = Field(None, description="the change-log entry its copy reflects (snapshot)")
    host: str | None = Field(
        default_factory=socket.gethostname,
        description="the host name of the worker's machine, so that `check` finds a named consumer by host "
        "(None when read from a worker that did not write it)",
    )
    key: str | None = Field(None, description="the key it was read from (not written)")

    def to_value(self) -> str:
        """The JSON the worker stores."""
        return self.model_dump_json(exclude={"key"}, exclude_none=True)

    @classmethod
    def from_value(cls, key: str, consumer: str, value: bytes | str) -> Heartbeat:
        """The heartbeat stored under `key` for `consumer` (the name in the key wins over a missing one)."""
        try:
            data = json.loads(value)
        except ValueError:
            data = None
        if isinstance(data, dict):
            data.setdefault("consumer", consumer)
            data.setdefault("host", None)  # not the reader's own host name
            data["key"] = key
            try:
                return cls.model_validate(data)
            except ValidationError:
                pass
        return cls(consumer=consumer, key=key, host=None)
