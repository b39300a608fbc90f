"""The shortcuts of `IncidentEvent.from_fields` against the code they skip, on valid and hostile input.

`from_fields` reads an entry as the stream gives it (every name and value UTF-8 bytes, within max_entry_bytes, with
an incident_id) through `_as_read_text`, and a well-formed event through `_valid_as_read` (its JSON with
`_read_json`, the event built without `model_construct`). Each must give exactly what the long way gives: the same
event, fields set and fingerprint, or the same dead letter reason, detail and errors. (tests/test_stream.py compares
`_valid_as_read` with pydantic's full validation.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from tests.hostile import LIMITS, corpus
from worker import formats
from worker.devtools.workload import Workload
from worker.fingerprint import fingerprint
from worker.formats import EventLimits, IncidentEvent, event_error
from worker.text import features_from_text


def _outcome(fields: Any, limits: EventLimits) -> Any:
    try:
        event = IncidentEvent.from_fields(fields, limits)
    except ValidationError as error:
        return ("error", event_error(error), error.errors(include_url=False, include_context=False))
    return ("event", event, event.__dict__, event.model_fields_set, event.__pydantic_private__, event.fingerprint)


def _assert_same(fields: Any, limits: EventLimits) -> None:
    fast = _outcome(fields, limits)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(formats, "_as_read_text", lambda fields, limits: None)
        patched.setattr(IncidentEvent, "_valid_as_read", classmethod(_valid_as_read_before))
        slow = _outcome(fields, limits)
    assert fast == slow


def _valid_as_read_before(cls: type[IncidentEvent], data: dict[str, Any], limits: EventLimits) -> Any:
    """`_valid_as_read` as it was before its shortcuts: `json.loads`, `_check_limits`, `model_construct`."""
    incident_id = data["incident_id"]
    op = data.get("op", "add")
    features = data.get("features")
    text = data.get("text")
    if type(incident_id) is not str or not 1 <= len(incident_id) <= formats.MAX_INCIDENT_ID_LENGTH:
        return None
    if not incident_id.isascii() and formats.incident_id_problem(incident_id) is not None:
        return None
    if type(op) is not str or op not in formats._OPS:
        return None
    bag: Any = None
    try:
        if features is not None:
            if type(features) is not str or text is not None:
                return None
            bag = json.loads(features)
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
            formats._check_limits(bag, limits)
            fp = fingerprint(bag)
    except (ValueError, RecursionError, PydanticCustomError):
        return None
    event = cls.model_construct(
        {name for name in formats._FIELDS if name in data},
        incident_id=incident_id,
        op=op,
        features=bag if features is not None else None,
        text=text,
    )
    event.__pydantic_private__["_fingerprint"] = fp  # type: ignore[index]
    return event


def _as_read(fields: dict[str, Any]) -> dict[bytes, bytes]:
    return {
        (k.encode("utf-8", "surrogatepass") if isinstance(k, str) else k): (
            json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else v
        ).encode("utf-8", "surrogatepass")
        if not isinstance(v, bytes)
        else v
        for k, v in fields.items()
    }


def test_workload_events_take_the_shortcut_and_match() -> None:
    limits = EventLimits()
    for incident_id, bag in Workload(seed=3).take(300):
        fields = _as_read(IncidentEvent(incident_id=incident_id, features=bag).to_fields())
        assert formats._as_read_text(fields, limits) is not None
        _assert_same(fields, limits)


def test_the_hostile_corpus_matches() -> None:
    limits = EventLimits(**LIMITS)
    entries = corpus(11, valid=200, hostile_every=1)
    for entry in entries:
        _assert_same(_as_read(entry.fields), limits)
        _assert_same(entry.fields, limits)


_text = st.text(st.characters(codec="utf-8") | st.sampled_from(list(' \t\n\r\ufeff{}[]":,0123456789-.eE')), max_size=16)
_values = st.one_of(
    _text,
    st.sampled_from(["add", "upsert", "delete", "", " {}", "{} ", '{"a": 1} x', '{"a":1}\n', "\ufeff{}", '{"a":-1}']),
    st.dictionaries(
        _text,
        st.one_of(st.integers(-2, 2**54), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3)),
        max_size=4,
    ).map(lambda bag: json.dumps(bag, ensure_ascii=False)),
    st.binary(max_size=8),
    st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")),  # lone surrogates: not UTF-8
)
_fields = st.fixed_dictionaries(
    {"incident_id": st.one_of(st.text(min_size=1, max_size=12), st.text(min_size=250, max_size=260), _values)},
    optional={
        "op": st.one_of(st.sampled_from(["add", "upsert", "delete"]), _values),
        "features": st.one_of(
            st.dictionaries(_text, st.integers(1, 2**53), min_size=1, max_size=5).map(
                lambda bag: json.dumps(bag, ensure_ascii=False, indent=None, separators=(",", ":"))
            ),
            _values,
        ),
        "text": st.one_of(st.text(max_size=30), _values),
        "other": _values,
    },
)


@hypothesis_settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=_fields,
    drop_id=st.booleans(),
    odd_key=st.sampled_from([None, b"\xff", "text-name", b"op"]),
    max_tokens=st.integers(1, 6),
    max_entry_bytes=st.sampled_from([30, 200, 5000]),
)
def test_any_fields_match(
    fields: dict[str, Any],
    drop_id: bool,
    odd_key: Any,
    max_tokens: int,
    max_entry_bytes: int,
) -> None:
    limits = EventLimits(max_tokens=max_tokens, max_token_length=3, max_entry_bytes=max_entry_bytes)
    raw: dict[Any, Any] = _as_read(fields)
    if drop_id:
        raw.pop(b"incident_id")
    if odd_key is not None:
        raw[odd_key] = b"x" if isinstance(odd_key, bytes) else "x"
    _assert_same(raw, limits)
    _assert_same(fields, limits)


@hypothesis_settings(max_examples=800, deadline=None)
@given(value=st.one_of(_text, _values.filter(lambda v: isinstance(v, str))))
def test_read_json_is_json_loads(value: str) -> None:
    try:
        expected: Any = ("ok", json.loads(value))
    except (ValueError, RecursionError) as error:
        expected = ("error", type(error), str(error))
    try:
        got: Any = ("ok", formats._read_json(value))
    except (ValueError, RecursionError) as error:
        got = ("error", type(error), str(error))
    assert got == expected
