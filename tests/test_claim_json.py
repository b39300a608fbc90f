"""A snapshot claim whose listing travels as its alert's JSON (one argument, worker/lua/claim_json.lua; written by the
copy's compiled loop, `copywritten.WrittenListing.as_json`) against the oracle and against the same claim as two
arguments a match: a send of stream events validated against one stale copy whose window adds matches (spliced into
the alert's JSON), deletes and moves listed ones (the listing then read in full), with every cap, reply length and the
alert's byte cap, on a real Redis and on fakeredis."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import Oracle, assert_postings_match, flip
from worker.copywritten import WrittenListing
from worker.index import FingerprintIndex
from worker.library import SnapshotClaim, StreamTarget, apply_batch, parse_apply
from worker.readpath import ChangeFollower
from worker.transport import execute

STREAM = StreamTarget("{v}:events", "{v}:alerts", "{v}:dead", "g")
MAX_MATCHES_BYTES = 8192  # (alert_json.lua's)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _alert_head(matches: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The longest head of `matches` whose JSON fits the alert's byte cap (at least one), as alert_json.lua counts."""
    size = 2
    for k, (incident_id, d) in enumerate(matches):
        size += len(json.dumps(incident_id)) + len(str(d)) + 27
        if size > MAX_MATCHES_BYTES and k:
            return matches[:k]
    return matches


def _changes(max_size: int):
    """(operation, incident number, fingerprint number) changes."""
    change = st.tuples(st.sampled_from(["add", "add", "upsert", "delete"]), st.integers(0, 60), st.integers(0, 11))
    return st.lists(change, max_size=max_size)


pytestmark = pytest.mark.usefixtures("compiled_loops")  # (the copy's listings written by its compiled loop)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32),
    before=_changes(60),
    after=_changes(20),
    sent=st.lists(st.tuples(st.integers(61, 90), st.integers(0, 11)), min_size=1, max_size=8, unique_by=lambda e: e[0]),
    cap=st.sampled_from([1, 2, 5, 40]),
    extra=st.sampled_from([0, 2, 16]),
    replied=st.sampled_from([None, 0, 1, 5]),
    long_ids=st.booleans(),
    as_json=st.booleans(),
)
def test_a_claim_of_json_validates_and_alerts_as_the_oracle_and_as_its_pairs(
    redis_client, seed, before, after, sent, cap, extra, replied, long_ids, as_json
) -> None:
    """Each event of the send gets the oracle's count and closest `cap` in its reply (its first `replied`) and in its
    alert (within the byte cap: IDs of 253 characters pass it at 40), whether the claims travel as JSON or as pairs."""
    redis_client.flushall()
    rng = random.Random(seed)
    center = rng.getrandbits(64)
    pool = [center] + [flip(center, rng.randint(1, 5), rng) for _ in range(10)] + [rng.getrandbits(64)]
    pad = "x" * 250 if long_ids else ""
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    oracle = Oracle(7)

    def run(changes) -> None:
        for kind, n, which in changes:
            incident_id, fp = f"{pad}i{n}", pool[which]
            if kind == "add" and incident_id not in oracle.fps:
                index.add_fingerprint(incident_id, fp)
                oracle.add(incident_id, fp)
            elif kind == "upsert":
                index.upsert_fingerprint(incident_id, fp)
                oracle.upsert(incident_id, fp)
            elif kind == "delete":
                index.delete(incident_id)
                oracle.delete(incident_id)

    run(before)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    run(after)
    redis_client.xgroup_create(STREAM.events_stream, "g", id="0", mkstream=True)
    commands, events = [], []
    claimed: dict[str, list[str]] = {}  # the IDs each claim listed
    touched = {f"{pad}i{n}" for _, n, _ in after}  # changed after the copy's position
    for n, which in sent:
        incident_id, fp = f"{pad}i{n}", flip(pool[which], rng.randint(0, 2), rng)
        redis_client.xadd(STREAM.events_stream, {"n": str(n)})
        [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {STREAM.events_stream: ">"}, count=1)
        copy = follower.index
        result = copy.search(fp, exclude=incident_id, limit=cap + extra, shown=cap)
        listed = result.matches
        claimed[incident_id] = [pair[0] for pair in list(listed)]
        if result.match_count:
            assert isinstance(listed, WrittenListing) and listed.as_json
        if not as_json:
            listed = list(listed)
        claim = SnapshotClaim(
            copy.position,
            result.match_count,
            listed,
            len(listed) == result.match_count,
            holder=copy.holder(fp, incident_id),
        )
        commands.append(
            index.apply_command(
                "add",
                incident_id,
                fp,
                stream=STREAM,
                entry_id=_text(entry_id),
                max_matches=cap,
                snapshot=claim,
                max_replied=replied,
            )
        )
        events.append((incident_id, fp))
    [replies] = execute(redis_client, [apply_batch(commands)])
    alerts = iter(redis_client.xrange(STREAM.alerts_stream))
    fallback = False
    for (incident_id, fp), reply in zip(events, replies, strict=True):
        result = parse_apply(reply)
        if fallback:  # the calls after a fallback change nothing: the worker applies them after it, in order
            assert result.status == "deferred"
            continue
        expected = oracle.matches(fp)
        if result.status == "unvalidated":
            # only when changes after the copy's position left its listing short of what the alert lists (the
            # copy listed the closest `cap`; one of them gone, the next is one the claim does not name)
            untouched = [i for i in claimed[incident_id] if i not in touched]
            assert len(untouched) < min(cap, len(expected))
            fallback = True
            continue
        assert result.status == "indexed"
        oracle.fps[incident_id] = fp
        assert result.match_count == len(expected)
        closest = expected[:cap]
        assert result.matches == (closest if replied is None else closest[:replied])
        if expected:
            _, alert = next(alerts)
            fields = {_text(k): _text(v) for k, v in alert.items()}
            assert fields["incident_id"] == incident_id and int(fields["match_count"]) == len(expected)
            listed = [(m["incident_id"], m["distance"]) for m in json.loads(fields["matches"])]
            assert listed == _alert_head(closest)
    assert_postings_match(redis_client, "v", 4, oracle.fps)


def test_a_claim_of_json_is_read_in_full_when_a_change_touched_a_listed_match(redis_client) -> None:
    """A listed match moved away after the copy's position: the claim's JSON cannot be cut as it is (the alert must
    leave it out and list the next one instead); the listing is read in full and validated the usual way."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    query = 0x0F0F_0000_FFFF_1234
    for k in range(8):
        index.add_fingerprint(f"n{k}", query ^ (1 << k))
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    index.upsert_fingerprint("n0", query ^ 0xFFFF_FFFF_FFFF_0000)  # listed by the copy, now far away
    redis_client.xgroup_create(STREAM.events_stream, "g", id="0", mkstream=True)
    redis_client.xadd(STREAM.events_stream, {"n": "1"})
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {STREAM.events_stream: ">"}, count=1)
    result = follower.index.search(query, exclude="new", limit=3 + 2, shown=3)
    assert isinstance(result.matches, WrittenListing) and result.matches.as_json
    assert result.matches[0] == ("n0", 1)
    claim = SnapshotClaim(follower.index.position, result.match_count, result.matches, False)
    command = index.apply_command(
        "add", "new", query, stream=STREAM, entry_id=_text(entry_id), max_matches=3, snapshot=claim
    )
    reply = parse_apply(redis_client.execute_command(*command))
    assert (reply.status, reply.match_count, reply.matches) == ("indexed", 7, [("n1", 1), ("n2", 1), ("n3", 1)])
    [(_, alert)] = redis_client.xrange(STREAM.alerts_stream)
    matches = json.loads(_text(alert[b"matches" if b"matches" in alert else "matches"]))
    assert [m["incident_id"] for m in matches] == ["n1", "n2", "n3"]
    # a listing of JSON that is not one (a worker's bug): not validated, nothing written
    entry = '{"incident_id":"n1","distance":1}'
    for payload in (
        "9/9:zzz",
        "1/1:0000z00040[{}",
        "1/1:0000000040[" + "x" * 40,
        "2/2:000000000100002[",
        f"1/1:0000000022{entry}]",  # (no '[')
        f"1:0000000022[{entry}]",  # (no m)
        f"1/2:0000000022[{entry}]",  # (m past n)
        f"1/1:0000000022[{entry},",  # (no ']' after the m-th)
    ):
        malformed = replace(claim, listed=WrittenListing(f"${len(payload)}\r\n{payload}\r\n", 1, True))
        command = index.apply_command("add", "other", query ^ 1, max_matches=3, snapshot=malformed)
        assert parse_apply(redis_client.execute_command(*command)).status == "unvalidated"
    assert index.get("other") is None


def _ten_at_distance_two(redis_client) -> tuple[FingerprintIndex, Oracle, ChangeFollower, int]:
    """An index of n0 .. n9, each at distance 2 of the query, and a copy of it loaded."""
    redis_client.flushall()
    index = FingerprintIndex(redis_client, "v", bands=4, max_distance=7)
    index.open()
    query = 0x0F0F_0000_FFFF_1234
    oracle = Oracle(7)
    for k in range(10):
        fp = query ^ (0b11 << (2 * k))  # each at distance 2
        index.add_fingerprint(f"n{k}", fp)
        oracle.add(f"n{k}", fp)
    follower = ChangeFollower(redis_client, index.keys, index.layout)
    follower.load()
    return index, oracle, follower, query


@pytest.mark.parametrize("as_json", [True, False])
def test_a_window_match_at_the_last_listed_distance_comes_in_by_its_id(redis_client, as_json: bool) -> None:
    """A claim lists up to its last listed match (not every match): a change of its window at that match's distance
    comes into the listing by its ID (before it: listed; after it: the copy may have more there, so not), one past
    that distance is counted and never listed (validate_snapshot does not make it an addition). Both forms of the
    claim, against the oracle."""
    index, oracle, follower, query = _ten_at_distance_two(redis_client)
    # after the copy's position: two at the listing's last distance (one before its last listed ID, "n5", one after
    # every listed one) and one past it
    for incident_id, fp in (("n25", query ^ (0b11 << 50)), ("n55", query ^ (0b11 << 54)), ("a", query ^ 0b111 << 40)):
        index.add_fingerprint(incident_id, fp)
        oracle.add(incident_id, fp)
    redis_client.xgroup_create(STREAM.events_stream, "g", id="0", mkstream=True)
    redis_client.xadd(STREAM.events_stream, {"n": "1"})
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {STREAM.events_stream: ">"}, count=1)
    result = follower.index.search(query, exclude="new", limit=4 + 2, shown=4)
    assert [m for m, _ in result.matches] == ["n0", "n1", "n2", "n3", "n4", "n5"]
    listed = result.matches if as_json else list(result.matches)
    claim = SnapshotClaim(follower.index.position, result.match_count, listed, False)
    command = index.apply_command(
        "add", "new", query, stream=STREAM, entry_id=_text(entry_id), max_matches=4, snapshot=claim
    )
    reply = parse_apply(redis_client.execute_command(*command))
    expected = oracle.matches(query)
    assert [m for m, _ in expected[:4]] == ["n0", "n1", "n2", "n25"]
    assert (reply.status, reply.match_count, reply.matches) == ("indexed", 13, expected[:4])
    [(_, alert)] = redis_client.xrange(STREAM.alerts_stream)
    matches = json.loads(_text(alert[b"matches" if b"matches" in alert else "matches"]))
    assert [(m["incident_id"], m["distance"]) for m in matches] == expected[:4]


@pytest.mark.parametrize("as_json", [True, False])
@pytest.mark.parametrize("added", [("n35", "n45"), ("n15", "n45")])
def test_window_matches_between_the_alerts_last_and_the_claims_last_leave_the_alert_as_claimed(
    redis_client, as_json: bool, added: tuple[str, str]
) -> None:
    """Additions that come after the alert's last listed match (the claim's m-th, n3) but before the claim's last
    (n5): the alert is the claim's own head (taken whole), the count has them, the reply's pairs are the head's; with
    one before the cut as well, it is spliced in. Both forms of the claim, against the oracle."""
    index, oracle, follower, query = _ten_at_distance_two(redis_client)
    for incident_id, bits in zip(added, (0b11 << 50, 0b11 << 54), strict=True):
        index.add_fingerprint(incident_id, query ^ bits)
        oracle.add(incident_id, query ^ bits)
    redis_client.xgroup_create(STREAM.events_stream, "g", id="0", mkstream=True)
    redis_client.xadd(STREAM.events_stream, {"n": "1"})
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {STREAM.events_stream: ">"}, count=1)
    result = follower.index.search(query, exclude="new", limit=4 + 2, shown=4)
    listed = result.matches if as_json else list(result.matches)
    claim = SnapshotClaim(follower.index.position, result.match_count, listed, False)
    command = index.apply_command(
        "add", "new", query, stream=STREAM, entry_id=_text(entry_id), max_matches=4, snapshot=claim, max_replied=2
    )
    reply = parse_apply(redis_client.execute_command(*command))
    expected = oracle.matches(query)
    assert [m for m, _ in expected[:4]] == (
        ["n0", "n1", "n2", "n3"] if added[0] == "n35" else ["n0", "n1", "n15", "n2"]
    )
    assert (reply.status, reply.match_count, reply.matches) == ("indexed", 12, expected[:2])
    [(_, alert)] = redis_client.xrange(STREAM.alerts_stream)
    matches = json.loads(_text(alert[b"matches" if b"matches" in alert else "matches"]))
    assert [(m["incident_id"], m["distance"]) for m in matches] == expected[:4]


@pytest.mark.parametrize("shown", [4, 0, 2])
@pytest.mark.parametrize("window", ["none", "after_the_cut", "before_the_cut"])
def test_a_claim_over_the_cap_is_cut_where_the_worker_closed_it(redis_client, window: str, shown: int) -> None:
    """A storm's usual claim: more listed than the alert's cap, closed with ']' after the cap's last (`shown`). With
    no change of the window among the alert's matches its alert is the claim's own JSON up to there; an addition
    before the cut is spliced in; a claim closed elsewhere (written for another cap: after its last, or before the
    alert's) is cut around its ']'. Each alert is the oracle's."""
    index, oracle, follower, query = _ten_at_distance_two(redis_client)
    if window != "none":
        # a new match after the copy's position: at distance 3 after the alert's 4 (all at 2), or 1 before them
        fp = query ^ (0b111 << 40) if window == "after_the_cut" else query ^ (1 << 63)
        index.add_fingerprint("w", fp)
        oracle.add("w", fp)
    redis_client.xgroup_create(STREAM.events_stream, "g", id="0", mkstream=True)
    redis_client.xadd(STREAM.events_stream, {"n": "1"})
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup("g", "w", {STREAM.events_stream: ">"}, count=1)
    result = follower.index.search(query, exclude="new", limit=4 + 2, shown=shown)
    assert isinstance(result.matches, WrittenListing) and result.matches.as_json and len(result.matches) == 6
    claim = SnapshotClaim(follower.index.position, result.match_count, result.matches, False)
    command = index.apply_command(
        "add", "new", query, stream=STREAM, entry_id=_text(entry_id), max_matches=4, snapshot=claim, max_replied=3
    )
    reply = parse_apply(redis_client.execute_command(*command))
    expected = oracle.matches(query)
    assert (reply.status, reply.match_count, reply.matches) == ("indexed", len(expected), expected[:3])
    [(_, alert)] = redis_client.xrange(STREAM.alerts_stream)
    fields = {_text(k): _text(v) for k, v in alert.items()}
    assert int(fields["match_count"]) == len(expected) == 10 + (window != "none")
    assert fields["matches"] == json.dumps(
        [{"incident_id": i, "distance": d} for i, d in expected[:4]], separators=(",", ":")
    )
