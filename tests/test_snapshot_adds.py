"""The snapshot path's apply_batch call written at once (`FingerprintIndex.snapshot_adds`, `Processor._snapshot_adds`):
byte for byte the call the worker builds one argument at a time (`apply_command`, `apply_batch`, hiredis's packing),
or None where it cannot be written so."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from hiredis import pack_command
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle import claim_arguments
from worker.bands import BandLayout
from worker.copywritten import WrittenListing
from worker.index import FingerprintIndex, LayoutTarget, SnapshotAdd
from worker.library import SnapshotClaim, StreamTarget, apply_batch
from worker.settings import Settings
from worker.stream import StreamWorker

TARGET = StreamTarget("{w}:events", "{w}:alerts", "{w}:dead", "workers", alerts_maxlen=10_000, dead_maxlen=77)

ascii_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
plain_text = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), max_size=12)
any_text = st.text(max_size=8)  # not ASCII at times (and lone surrogates): those sends are left to apply_command
ids = st.one_of(ascii_text.filter(bool), any_text.filter(bool))
claims = st.builds(
    SnapshotClaim,
    position=st.sampled_from(["0-0", "1733000000000-5", "18446744073709551615-18446744073709551615"]),
    count=st.integers(0, 10**6),
    listed=st.one_of(
        st.lists(st.tuples(ids, st.integers(0, 64)), max_size=5),
        # a copy's listing written by its compiled loop (ASCII IDs): its arguments as they are (two a match, or one of
        # JSON when no ID needs an escape), or read back as pairs
        st.lists(st.tuples(ascii_text, st.integers(0, 64)), max_size=5).map(
            lambda pairs: WrittenListing(claim_arguments(pairs), len(pairs))
        ),
        st.lists(
            st.tuples(ascii_text.filter(lambda i: '"' not in i and "\\" not in i), st.integers(0, 64)), max_size=5
        ).map(lambda pairs: WrittenListing(claim_arguments(pairs, True), len(pairs), True)),
    ),
    complete=st.booleans(),
    cut=st.booleans(),
    holder=st.one_of(st.just(True), st.none(), st.just(False), ids),
)
fingerprints = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**16), st.integers(2**64, 2**70))
adds = st.builds(
    SnapshotAdd,
    incident_id=ids,
    fp=fingerprints,
    entry_id=st.sampled_from(["1-0", "1733000000123-17"]),
    claim=claims,
    alert_text=st.one_of(st.just(""), any_text, ascii_text),
    tokenizer=st.sampled_from(["", "3"]),
    alert_extra=st.one_of(st.none(), st.just(""), st.just("1"), st.just("02:ab3:xyz")),
)


def one_by_one(
    index: FingerprintIndex, sent: list[SnapshotAdd], extra: str, cap: int, budget: int | None, replied: int | None
) -> bytes:
    """The call as the general path builds and packs it."""
    commands = [
        index.apply_command(
            "add",
            add.incident_id,
            add.fp,
            expected="*",
            stream=TARGET,
            entry_id=add.entry_id,
            max_matches=cap,
            max_candidates=budget,
            alert_text=add.alert_text,
            tokenizer=add.tokenizer,
            snapshot=add.claim,
            max_replied=replied,
        )
        for add in sent
    ]
    # apply_command packs the alert's extra from its own arguments: set it as snapshot_adds is told to
    extras = [extra if add.alert_extra is None else add.alert_extra for add in sent]
    patched = []
    for command, value in zip(commands, extras, strict=True):
        parts = list(command)
        first = 3 + parts[2]
        parts[first + 17] = value  # ApplyArgs.alert_extra
        patched.append(tuple(parts))
    return pack_command(apply_batch(patched))


# posting keys of whole hex digits (2, 4 and 8 bands) and not (3, 5)
@pytest.mark.parametrize(("bands", "max_distance"), [(2, 3), (3, 7), (4, 7), (5, 7), (8, 7)])
@settings(max_examples=100, deadline=None)
@given(
    sent=st.lists(adds, min_size=1, max_size=17),
    extra=st.sampled_from(["", "1", "05:a_b_c4:xyzw"]),
    cap=st.integers(0, 100),
    budget=st.one_of(st.none(), st.integers(0, 50_000)),
    replied=st.one_of(st.none(), st.integers(0, 10)),
)
def test_the_written_call_is_the_packed_call_or_none(
    bands: int,
    max_distance: int,
    sent: list[SnapshotAdd],
    extra: str,
    cap: int,
    budget: int | None,
    replied: int | None,
) -> None:
    """(IDs and (ID, distance) pairs listed again, by later adds and examples, and by the same send written a second
    time, are written from the pair cache, `_PAIRS`.)"""
    index = FingerprintIndex(redis.Redis(), "w", bands=bands, max_distance=max_distance)  # never connects
    expected = one_by_one(index, sent, extra, cap, budget, replied)
    for _ in range(2):
        written = index.snapshot_adds(
            sent, stream=TARGET, max_matches=cap, max_candidates=budget, alert_extra=extra, max_replied=replied
        )
        if written is None:
            # only text that is not ASCII, or a value that is no fingerprint of 64 bits, is left to the general path
            assert not expected.isascii() or any(add.fp >= 2**64 for add in sent)
        else:
            assert written == expected


def test_no_call_is_written_during_a_migration_or_for_a_cluster_client() -> None:
    add = SnapshotAdd("a", 5, "1-0", SnapshotClaim("1-0", 0, [], True), "", "", None)
    index = FingerprintIndex(redis.Redis(), "w", bands=4)
    assert index.snapshot_adds([add], stream=TARGET) == one_by_one(index, [add], "", 0, None, None)
    target = BandLayout(3, 7)
    index.building = LayoutTarget("v3", target, 1, index.keys.band_keys(target, 1))
    assert index.snapshot_adds([add], stream=TARGET) is None  # its postings in the layout being built, too
    not_standalone: Any = object()  # a RedisCluster's pipelines take arguments, not packed calls
    assert FingerprintIndex(not_standalone, "w", bands=4).snapshot_adds([add], stream=TARGET) is None


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


@pytest.mark.usefixtures("no_worker_env")
@pytest.mark.parametrize(
    "overrides",
    [{}, {"alert_event_fields": "service,region", "group_open_alerts": True, "alert_text_chars": 5}],
)
def test_the_worker_writes_the_call_its_commands_would_make(redis_client: redis.Redis, overrides: Any) -> None:
    """Processor._snapshot_adds against Processor._command for the same items and claims: bags and texts, event
    fields copied into alerts; a send with anything but adds with claims is not written."""
    worker = StreamWorker(redis_client, Settings(consumer="c", read_path="snapshot", max_matches=3, **overrides))
    worker.setup()
    processor = worker.processor
    entries: list[tuple[str, dict[bytes, bytes]]] = []
    for n in range(12):
        fields = {b"incident_id": f"inc-{n}".encode()}
        if n % 3 == 0:
            fields[b"text"] = f"disk full on host-{n} at /var/log".encode()
        else:
            fields[b"features"] = b'{"disk": 3, "full": %d}' % (n + 1)
        if n % 2:
            fields[b"service"] = b"payments"
        entries.append((f"1-{n}", fields))
    items = processor.prepare(entries)
    assert all(item.event is not None for item in items)
    claims: list[SnapshotClaim | None] = [
        SnapshotClaim("1-0", n, [(f"inc-{k}", k) for k in range(n % 4)], n % 2 == 0, holder=None if n % 5 else "x")
        for n in range(len(items))
    ]
    written = processor._snapshot_adds(items, claims)
    assert written is not None
    assert written == pack_command(
        apply_batch([processor._command(i, {}, c) for i, c in zip(items, claims, strict=True)])
    )
    claims[4] = None  # a full search
    assert processor._snapshot_adds(items, claims) is None
