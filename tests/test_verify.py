"""`incident-worker verify`: every kind of damage an operator with redis-cli could do is found, confirmed, and repaired
into exactly the index the fingerprints call for (compared with the brute-force oracle); a clean index under a
running worker gives no finding and is left as the worker makes it."""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.oracle import Oracle, assert_postings_match, clustered, flip
from tests.redis_server import RedisServer
from tests.streams import FAST, alerts, clean_env, publish, run_in_process, start_worker
from worker import retention
from worker.commands.verify import print_verify
from worker.fingerprint import fingerprint, format_fingerprint
from worker.index import FingerprintIndex
from worker.integrity import KINDS, Verifier, VerifyReport
from worker.replies import text

NS = "incidents"
META = "{incidents}:meta"
FP = "{incidents}:fp"
EXPIRY = "{incidents}:expiry"
R = 7


def _twins(fp: int) -> str:
    return "{incidents}:twins:" + format_fingerprint(fp)


class Built:
    """An index of clustered incidents with two storms of exact twins, and the fingerprints it was built from."""

    def __init__(self, client: Any, seed: int = 7, bands: int = 4) -> None:
        rng = random.Random(seed)
        self.client = client
        self.index = FingerprintIndex(client, NS, bands=bands)
        self.fps: dict[str, int] = {}
        for i, fp in enumerate(clustered(rng, 60, R, centers=3)):
            self.fps[f"c{i}"] = fp
        self.storm = self.fps["c0"]  # c0 and s0..s4: one group of six
        for i in range(5):
            self.fps[f"s{i}"] = self.storm
        self.pair = self.fps["c1"]  # c1 and p0: a group of two
        self.fps["p0"] = self.pair
        self.index.bulk_load(self.fps.items())
        self.lone = next(i for i, fp in self.fps.items() if list(self.fps.values()).count(fp) == 1)

    def representative(self, fp: int) -> str:
        _size, rep = self.index.twin_group(fp)
        assert rep is not None
        return rep

    def a_twin(self, fp: int) -> str:
        rep = self.representative(fp)
        return next(i for i, f in sorted(self.fps.items()) if f == fp and i != rep)


def _verify(client: Any, **kwargs: Any) -> VerifyReport:
    return Verifier(client, NS, **kwargs).run()


def _state(client: Any) -> dict[str, Any]:
    """Every key of the namespace and its content, to show that a check writes nothing."""
    state: dict[str, Any] = {}
    for key in client.scan_iter(match="{incidents}:*"):
        kind = text(client.type(key))
        if kind == "hash":
            state[text(key)] = client.hgetall(key)
        elif kind == "set":
            state[text(key)] = client.smembers(key)
        elif kind == "zset":
            state[text(key)] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            state[text(key)] = client.xlen(key)
    return state


def _assert_equals_oracle(client: Any, rng: random.Random, bands: int = 4) -> None:
    """The index is exactly what its stored fingerprints call for, and every query answers the linear scan."""
    assert_postings_match(client, NS, bands)
    stored = {text(k): int(text(v), 16) for k, v in client.hgetall(FP).items()}
    oracle = Oracle(R)
    oracle.fps = stored
    index = FingerprintIndex.stored(client, NS)
    assert index is not None
    queries = list(stored.values())[:40] + [flip(fp, rng.randint(1, R + 1), rng) for fp in list(stored.values())[:20]]
    for fp in queries:
        assert index.matches_of(fp) == oracle.matches(fp)


# -- one corruption each, as an operator with redis-cli could make it -------------------------------------------

Corruption = Callable[[Built], None]


def _srem_posting(b: Built) -> None:
    b.client.srem(b.index.posting_keys(b.fps[b.lone])[-1], b.lone)


def _sadd_stray(b: Built) -> None:
    b.client.sadd(b.index.posting_keys(0xBEEF_0000_BEEF_0000)[1], "ghost")


def _hset_other_fp(b: Built) -> None:
    b.client.hset(FP, b.lone, format_fingerprint(b.fps[b.lone] ^ 0xFFFF_0000_FFFF_0000))


def _hset_other_fp_of_representative(b: Built) -> None:
    b.client.hset(FP, b.representative(b.storm), format_fingerprint(b.storm ^ 0xFF))


def _non_hex_fp(b: Built) -> None:
    b.client.hset(FP, b.lone, "not-a-fingerprint")


def _uppercase_fp(b: Built) -> None:
    b.client.hset(FP, b.lone, format_fingerprint(b.fps[b.lone]).upper())


def _delete_group(b: Built) -> None:
    b.client.delete(_twins(b.storm))


def _second_representative(b: Built) -> None:
    twin = b.a_twin(b.storm)
    for key in b.index.posting_keys(b.storm):
        b.client.sadd(key, twin)


def _extra_posting(b: Built) -> None:
    b.client.sadd(b.index.posting_keys(b.storm)[-1], b.a_twin(b.storm))


def _representative_out_of_postings(b: Built) -> None:
    rep = b.representative(b.storm)
    for key in b.index.posting_keys(b.storm):
        b.client.srem(key, rep)


def _one_member_group(b: Built) -> None:
    b.client.zadd(_twins(b.fps[b.lone]), {b.lone: 0})


def _pair_loses_a_member(b: Built) -> None:
    b.client.zrem(_twins(b.pair), "p0")


def _stray_in_group(b: Built) -> None:
    b.client.zadd(_twins(b.storm), {b.lone: 0})


def _score(b: Built) -> None:
    b.client.zadd(_twins(b.storm), {b.a_twin(b.storm): 5})


def _bad_twin_key(b: Built) -> None:
    b.client.zadd("{incidents}:twins:NOT-HEX", {"c3": 0})


def _foreign_band_key(b: Built) -> None:
    b.client.sadd("{incidents}:band:9:00", b.lone)


def _meta_field(b: Built) -> None:
    b.client.hset(META, mapping={"bands": "8", "band_widths": "8,8"})


def _meta_layout_tag(b: Built) -> None:
    b.client.hset(META, "layout", "simhash64-blake2b8le/bands=8/max_distance=7/format=2")


def _meta_deleted(b: Built) -> None:
    b.client.delete(META)


CORRUPTIONS: dict[str, tuple[Corruption, set[str]]] = {
    "srem_posting": (_srem_posting, {"missing_postings"}),
    "sadd_stray_id": (_sadd_stray, {"orphan_posting"}),
    "hset_other_fp": (_hset_other_fp, {"missing_postings", "wrong_posting"}),
    "hset_other_fp_of_representative": (
        _hset_other_fp_of_representative,
        {"missing_postings", "wrong_posting", "twin_stray", "group_without_representative"},
    ),
    "non_hex_fp": (_non_hex_fp, {"bad_fingerprint", "wrong_posting"}),
    "uppercase_fp": (_uppercase_fp, {"bad_fingerprint"}),
    "delete_group": (_delete_group, {"twin_not_grouped"}),
    "second_representative": (_second_representative, {"two_representatives"}),
    "extra_posting": (_extra_posting, {"extra_posting"}),
    "representative_out_of_postings": (_representative_out_of_postings, {"group_without_representative"}),
    "one_member_group": (_one_member_group, {"small_group"}),
    "pair_loses_a_member": (_pair_loses_a_member, {"twin_not_grouped"}),
    "stray_in_group": (_stray_in_group, {"twin_stray"}),
    "score": (_score, {"twin_score"}),
    "bad_twin_key": (_bad_twin_key, {"bad_twin_key"}),
    "foreign_band_key": (_foreign_band_key, {"foreign_band_key", "wrong_posting"}),
    "meta_field": (_meta_field, {"meta_field"}),
    "meta_layout_tag": (_meta_layout_tag, {"meta_field"}),
    "meta_deleted": (_meta_deleted, {"meta_missing"}),
}


AMBIGUOUS = {"meta_field", "meta_layout_tag"}
"""Edits that leave the meta's layout tag and fields disagreeing: verify needs the layout named to settle them."""


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_corruption_is_found_and_repaired_into_the_oracles_index(redis_client: redis.Redis, name: str) -> None:
    built = Built(redis_client)
    assert _verify(redis_client).counts == {}
    corrupt, kinds = CORRUPTIONS[name]
    corrupt(built)
    before = _state(redis_client)
    named: dict[str, Any] = {}
    if name in AMBIGUOUS:
        from worker.errors import CommandError

        with pytest.raises(CommandError, match="Give --bands and --max-distance"):
            _verify(redis_client, repair=True)
        named = {"configured": (4, R), "default_layout": (4, R)}

    found = _verify(redis_client, **named)
    assert set(found.counts) == kinds, found.as_json()
    assert not found.clean
    assert _state(redis_client) == before, "a check wrote to the index"

    repaired = _verify(redis_client, repair=True, **named)
    assert repaired.clean, repaired.as_json()
    assert repaired.findings and all(f.repaired for f in repaired.findings)
    assert _verify(redis_client).counts == {}
    _assert_equals_oracle(redis_client, random.Random(name))


def test_every_corruption_at_once_is_repaired_in_one_pass(redis_client: redis.Redis) -> None:
    built = Built(redis_client)
    # those that touch different incidents, so that each one's damage stays its own
    for corrupt in (_sadd_stray, _non_hex_fp, _delete_group, _one_member_group, _bad_twin_key, _score, _meta_field):
        corrupt(built)
    redis_client.srem(built.index.posting_keys(built.fps["c5"])[0], "c5")
    redis_client.hset(FP, "c6", format_fingerprint(built.fps["c6"] ^ (1 << 40)))
    named = {"configured": (4, R), "default_layout": (4, R)}  # the meta edit needs the layout named
    found = _verify(redis_client, **named)
    assert len(found.counts) >= 8
    assert _verify(redis_client, repair=True, **named).clean
    assert _verify(redis_client).counts == {}
    _assert_equals_oracle(redis_client, random.Random(1))


@pytest.mark.parametrize("bands", [3, 8])
def test_other_layouts_bands_not_whole_hex_digits_and_narrow_ones(redis_client: redis.Redis, bands: int) -> None:
    built = Built(redis_client, bands=bands)
    assert _verify(redis_client, default_layout=(bands, R)).counts == {}
    for corrupt in (_srem_posting, _sadd_stray, _hset_other_fp, _extra_posting):
        corrupt(built)
    found = _verify(redis_client, default_layout=(bands, R))
    assert set(found.counts) == {"missing_postings", "orphan_posting", "wrong_posting", "extra_posting"}
    assert _verify(redis_client, repair=True, default_layout=(bands, R)).clean
    _assert_equals_oracle(redis_client, random.Random(bands), bands)


def test_a_large_stray_set_is_read_in_steps_and_a_key_of_another_type_is_left_to_a_person(
    redis_client: redis.Redis,
) -> None:
    Built(redis_client)
    redis_client.sadd("{incidents}:band:0:abcd", *[f"ghost{i}" for i in range(25)])
    redis_client.set("{incidents}:band:1:0000", "not a set")
    found = _verify(redis_client, batch=4)
    assert found.counts == {"orphan_posting": 25, "foreign_band_key": 1}
    repaired = _verify(redis_client, repair=True, batch=4)
    assert [f.subject for f in repaired.unrepaired] == ["{incidents}:band:1:0000"]
    assert not redis_client.exists("{incidents}:band:0:abcd")


def test_a_non_hex_fingerprint_is_removed_and_logged_as_a_delete(redis_client: redis.Redis) -> None:
    built = Built(redis_client)
    _non_hex_fp(built)
    report = _verify(redis_client, repair=True)
    assert [f.detail for f in report.findings if f.kind == "bad_fingerprint"] == ["not-a-fingerprint"]
    assert redis_client.hget(FP, built.lone) is None
    last = redis_client.xrevrange("{incidents}:changes", count=1)[0][1]
    assert {text(k): text(v) for k, v in last.items()} == {"delete": built.lone, "fp": "", "prev": ""}


def test_an_uppercase_fingerprint_is_lowercased_not_removed(redis_client: redis.Redis) -> None:
    built = Built(redis_client)
    _uppercase_fp(built)
    assert _verify(redis_client, repair=True).clean
    assert text(redis_client.hget(FP, built.lone)) == format_fingerprint(built.fps[built.lone])


def test_expiry_entries_are_checked_while_retention_is_on(redis_client: redis.Redis) -> None:
    built = Built(redis_client)
    redis_client.hset(META, "retention_ms", "60000")
    redis_client.zadd(EXPIRY, {incident_id: 1000 for incident_id in built.fps})
    assert _verify(redis_client).counts == {}
    redis_client.zadd(EXPIRY, {"ghost": 5})
    redis_client.zrem(EXPIRY, "c9")
    assert set(_verify(redis_client).counts) == {"expiry_orphan", "expiry_missing"}
    assert _verify(redis_client, repair=True).clean
    assert redis_client.zscore(EXPIRY, "ghost") is None
    assert redis_client.zscore(EXPIRY, "c9") is not None
    # while retention is entering older incidents (backfill), one without an entry is not a finding
    redis_client.zrem(EXPIRY, "c9")
    redis_client.hset(META, "retention_backfill", "0")
    assert _verify(redis_client).counts == {}


def test_a_configured_layout_other_than_the_stored_one_is_a_finding_repair_cannot_fix(
    redis_client: redis.Redis,
) -> None:
    Built(redis_client)
    report = _verify(redis_client, repair=True, configured=(8, 7), default_layout=(8, 7))
    assert set(report.counts) == {"meta_settings"}
    assert not report.clean


def test_a_migration_under_way_stops_verify_with_a_message(redis_client: redis.Redis) -> None:
    Built(redis_client)
    redis_client.hset("{incidents}:migration", "state", "build")
    from worker.errors import CommandError

    with pytest.raises(CommandError, match="moving to another layout"):
        _verify(redis_client, repair=True)


def test_an_empty_namespace_is_clean(redis_client: redis.Redis) -> None:
    assert _verify(redis_client).clean


def test_every_kind_is_described() -> None:
    from worker.integrity import REPAIRS

    assert set(KINDS) == set(REPAIRS)
    covered = set().union(*(kinds for _, kinds in CORRUPTIONS.values()))
    covered |= {"expiry_orphan", "expiry_missing", "meta_settings"}
    # group state: tests/test_groups_verify.py damages it in each way (and overtakes a count with changes)
    from tests.test_groups_verify import DAMAGES

    covered |= {*DAMAGES, "group_sizes_unchecked"}
    assert covered == set(KINDS), f"kinds no test corrupts: {set(KINDS) - covered}"


# -- the command --------------------------------------------------------------------------------------------------


def _cli(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`incident-worker verify ARGS`, by its entry point in this process (tests/streams.py's `run_in_process`)."""
    done = run_in_process(["verify", *args], clean_env(redis_url=server.url))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_command_exit_codes_summary_and_json(server: RedisServer) -> None:
    client = server.client()
    built = Built(client)
    _srem_posting(built)
    _sadd_stray(built)
    found = _cli(server)
    assert found.returncode == 1, found.stderr
    assert "missing_postings: 1" in found.stdout and "orphan_posting: 1" in found.stdout
    assert "ghost" in found.stdout and "verify --repair" in found.stdout
    as_json = json.loads(_cli(server, "--json").stdout)
    assert as_json["counts"] == {"missing_postings": 1, "orphan_posting": 1} and not as_json["clean"]
    repaired = _cli(server, "--repair", "--batch", "7", "--max-rate", "100000")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "repaired all 2" in repaired.stdout
    assert _verify(client).clean
    client.hset("{incidents}:migration", "state", "build")
    refused = _cli(server)
    assert refused.returncode == 1
    assert "moving to another layout" in refused.stderr and "Traceback" not in refused.stderr


def test_summary_of_a_clean_index(redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]) -> None:
    Built(redis_client)
    print_verify(_verify(redis_client))
    out = capsys.readouterr().out
    assert "66 incidents" in out and "no findings" in out


def test_max_rate_paces_the_walk(redis_client: redis.Redis) -> None:
    Built(redis_client)
    started = time.monotonic()
    report = _verify(redis_client, batch=50, max_rate=1000)
    assert time.monotonic() - started >= report.scanned["items"] / 1000 * 0.9


# -- a running worker ---------------------------------------------------------------------------------------------


def _events(rng: random.Random, count: int, added: list[str]) -> list[dict[str, Any]]:
    """Adds (a third of them exact twins of earlier ones), upserts and deletes of incidents already added."""
    events: list[dict[str, Any]] = []
    bags: list[dict[str, int]] = []
    for n in range(count):
        roll = rng.random()
        if added and roll < 0.1:
            events.append({"incident_id": rng.choice(added), "op": "delete"})
        elif added and roll < 0.25:
            bag = rng.choice(bags) if bags and rng.random() < 0.5 else {f"t{rng.randrange(40)}": 1 + rng.randrange(3)}
            events.append({"incident_id": rng.choice(added), "op": "upsert", "features": bag})
        else:
            if bags and rng.random() < 0.35:
                bag = rng.choice(bags)
            else:
                bag = {f"t{rng.randrange(40)}": rng.randrange(1, 4), f"u{rng.randrange(9)}": 2}
            bags.append(bag)
            added.append(f"i{n}")
            events.append({"incident_id": f"i{n}", "features": bag})
    return events


@pytest.mark.slow
def test_repair_during_a_running_worker_finds_nothing_and_changes_nothing_it_should_not(server: RedisServer) -> None:
    """verify --repair in a loop while a worker adds, upserts and deletes: the only findings are the damage done
    before (orphan postings of IDs never indexed, one-member groups of incidents the stream then changes, both
    harmless to matching), every alert is the oracle's, and the index ends as the fingerprints call for."""
    client = server.client()
    rng = random.Random(11)
    index = FingerprintIndex(client, NS)
    base = {f"b{i}": rng.getrandbits(64) for i in range(100)}
    index.bulk_load(base.items())
    for i in range(20):
        client.sadd(f"{{incidents}}:band:{i % 4}:{rng.getrandbits(16):04x}", f"ghost{i}")
        client.zadd(_twins(base[f"b{i}"]), {f"b{i}": 0})
    events = _events(rng, 3000, list(base))
    ids = publish(client, events[:1000])
    worker = start_worker(server.url, "--until-idle", **FAST, max_matches=0)
    reports: list[VerifyReport] = []
    try:
        for start in range(1000, len(events), 500):
            ids += publish(client, events[start : start + 500])
            reports.append(_verify(client, repair=True, batch=50))
        while worker.poll() is None:
            reports.append(_verify(client, repair=True, batch=50))
            time.sleep(0.01)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.wait(timeout=60) == 0
    assert len(reports) >= 3
    found = [f for report in reports for f in report.findings]
    # (group sizes are judged only from a count no change overtook: under the worker's changes verify may say it
    # could not check them, never that one is wrong)
    assert {f.kind for f in found} <= {"orphan_posting", "small_group", "group_sizes_unchecked"}, found[:5]
    assert {f.subject for f in found if f.kind == "orphan_posting"} == {f"ghost{i}" for i in range(20)}
    assert {f.subject for f in found if f.kind == "small_group"} <= {_twins(base[f"b{i}"]) for i in range(20)}
    assert _verify(client).counts == {}

    # the stream's invariants: each entry did what the oracle does in stream order, alerts included
    oracle = Oracle(R)
    oracle.fps = dict(base)
    by_entry = {a.source_entry: a for a in alerts(client)}
    for entry_id, event in zip(ids, events, strict=True):
        op = event.get("op", "add")
        if op == "delete":
            oracle.delete(event["incident_id"])
            assert entry_id not in by_entry
            continue
        fp = fingerprint(event["features"])
        expected = oracle.add(event["incident_id"], fp) if op == "add" else oracle.upsert(event["incident_id"], fp)
        assert expected != "duplicate"
        alert = by_entry.get(entry_id)
        got = [] if alert is None else [(m.incident_id, m.distance) for m in alert.matches]
        assert got == expected, (entry_id, event)
    stored = {text(k): int(text(v), 16) for k, v in client.hgetall(FP).items()}
    assert stored == oracle.fps
    assert_postings_match(client, NS, 4)


def test_the_contract_documents_every_kind() -> None:
    from tests.test_docs import first_column

    assert first_column("verify-kinds") == set(KINDS)


def test_a_representative_that_lost_one_posting_is_completed_not_replaced_by_a_twin(redis_client: redis.Redis) -> None:
    built = Built(redis_client)
    rep = built.representative(built.storm)
    redis_client.srem(built.index.posting_keys(built.storm)[0], rep)
    found = _verify(redis_client)
    assert [(f.kind, f.subject) for f in found.findings] == [("missing_postings", rep)]
    assert _verify(redis_client, repair=True).clean
    assert built.representative(built.storm) == rep


@pytest.mark.parametrize("repair", [False, True])
def test_retention_turned_off_or_restarted_during_the_walk_is_no_finding(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, repair: bool
) -> None:
    """Whether every incident needs an `{N}:expiry` entry is judged at the check, as everything else: a worker that
    turns retention off (or off and on again: a backfill) while the walk runs makes no finding, and a repair writes no
    `{N}:expiry` for an index without retention."""
    built = Built(redis_client)
    retention.set_window(built.index, 60_000)
    while retention.backfill_step(built.index)[0]:
        pass
    assert _verify(redis_client).counts == {}
    walk = Verifier._walk_incidents

    def turned_off_meanwhile(self: Verifier) -> None:
        retention.set_window(built.index, 0)  # a worker started with RETENTION=off
        walk(self)

    monkeypatch.setattr(Verifier, "_walk_incidents", turned_off_meanwhile)
    report = _verify(redis_client, repair=repair)
    assert report.counts == {}, report.counts
    assert not redis_client.exists(EXPIRY), "a repair wrote the bookkeeping of a retention that is off"

    def restarted_meanwhile(self: Verifier) -> None:
        retention.set_window(built.index, 0)
        retention.set_window(built.index, 60_000)  # on again: its backfill has not entered anybody yet
        walk(self)

    retention.set_window(built.index, 60_000)
    while retention.backfill_step(built.index)[0]:
        pass
    monkeypatch.setattr(Verifier, "_walk_incidents", restarted_meanwhile)
    assert _verify(redis_client, repair=repair).counts == {}


def test_a_redis_restart_during_the_walk_is_not_reported_clean(
    aof_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk's SCAN and HSCAN cursors are only good in one server process (Redis seeds its hash function at random
    when it starts): a walk that went on across a restart may have skipped keys, so it says so instead of 'clean'."""
    from worker.errors import CommandError

    client = aof_server.client()
    Built(client)
    assert _verify(client).clean
    walk = Verifier._walk_postings

    def restarted_meanwhile(self: Verifier) -> None:
        aof_server.kill()
        aof_server.start()
        self.client.connection_pool.disconnect()
        walk(self)

    monkeypatch.setattr(Verifier, "_walk_postings", restarted_meanwhile)
    with pytest.raises(CommandError, match=r"restarted.*Run verify again"):
        Verifier(client, NS).run()
