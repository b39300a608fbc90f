"""Moving a live index to another layout (worker/migrate.py, the migrate_* functions and the apply step's dual write).

Library-level tests here interleave changes of the index with each bounded step of a migration, on a real Redis and
on fakeredis, and compare every reply and the end state with the brute-force oracle; tests/test_migrate_stream.py
runs worker processes and kills them and the migrator.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis

from tests.oracle import Oracle, assert_postings_match, clustered, flip
from tests.redis_server import RedisServer
from worker import library
from worker.bands import BandLayout
from worker.errors import CommandError, LayoutMismatchError
from worker.index import FingerprintIndex
from worker.keys import IndexKeys
from worker.migrate import Migrator, migration_status
from worker.replies import text

NS = "mig"


def _dump(client: Any) -> dict[str, Any]:
    """Every key of the namespace but the change log, with its value (sets and hashes as Python values)."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match="{" + NS + "}:*", count=1000):
        key = text(raw)
        kind = text(client.type(key))
        if key.endswith(":changes"):
            continue
        if kind == "set":
            out[key] = {text(m) for m in client.smembers(key)}
        elif kind == "hash":
            out[key] = {text(k): text(v) for k, v in client.hgetall(key).items()}
        elif kind == "zset":
            out[key] = [(text(m), s) for m, s in client.zrange(key, 0, -1, withscores=True)]
        else:
            out[key] = kind
    return out


def _scan_in_batches(client: Any, request: pytest.FixtureRequest) -> None:
    """A hash this small is one listpack, which HSCAN returns whole: make it a table, scanned in batches."""
    was = client.config_get("hash-max-listpack-entries")["hash-max-listpack-entries"]
    request.addfinalizer(lambda: client.config_set("hash-max-listpack-entries", was))
    client.config_set("hash-max-listpack-entries", 16)


def _random_ops(index: FingerprintIndex, oracle: Oracle, rng: random.Random, count: int, centers: list[int]) -> None:
    """Adds (some exact twins of indexed incidents), upserts and deletes, each checked against the oracle."""
    for _ in range(count):
        roll = rng.random()
        ids = list(oracle.fps)
        if roll < 0.55 or not ids:
            incident_id = f"n{rng.randrange(10**9)}"
            if ids and rng.random() < 0.3:
                fp = oracle.fps[rng.choice(ids)]  # an exact twin: a storm's member
            else:
                fp = flip(rng.choice(centers), rng.randint(0, 6), rng)
            assert index.add_fingerprint(incident_id, fp) == oracle.add(incident_id, fp)
        elif roll < 0.8:
            incident_id = rng.choice(ids)
            fp = flip(rng.choice(centers), rng.randint(0, 6), rng)
            assert index.upsert_fingerprint(incident_id, fp) == oracle.upsert(incident_id, fp)
        else:
            incident_id = rng.choice(ids)
            assert index.delete(incident_id) is oracle.delete(incident_id)


def _seed(client: Any, rng: random.Random, count: int, bands: int = 4, r: int = 7) -> tuple[FingerprintIndex, Oracle]:
    index = FingerprintIndex(client, NS, bands, r)
    oracle = Oracle(r)
    fps = clustered(rng, count, r, centers=6)
    for i, fp in enumerate(fps):
        incident_id = f"s{i}"
        if i % 7 == 3:
            fp = fps[i - 1]  # twins from the start
        assert index.add_fingerprint(incident_id, fp) == oracle.add(incident_id, fp)
    return index, oracle


@pytest.mark.parametrize(("bands", "r", "to_bands", "to_r"), [(4, 7, 3, 7), (4, 7, 8, 7), (3, 7, 4, 9)])
def test_migration_interleaved_with_changes_equals_the_oracle(
    redis_client: Any, bands: int, r: int, to_bands: int, to_r: int, request: pytest.FixtureRequest
) -> None:
    """Changes between every bounded step of a migration: each reply is the oracle's, the postings of both layouts
    stay exact while it builds, and after it only the new layout's postings exist and every query equals a scan."""
    rng = random.Random(bands * 100 + to_bands * 10 + to_r)
    fake = "fake" in type(redis_client).__module__  # fakeredis runs the Lua ~10x slower: a smaller index there
    index, oracle = _seed(redis_client, rng, 120 if fake else 600, bands, r)
    centers = list({fp for fp in oracle.fps.values()})[:6]
    migrator = Migrator(redis_client, NS, batch=40)
    if not fake:
        _scan_in_batches(redis_client, request)
    migrator._start(index, BandLayout(to_bands, to_r))
    assert text(redis_client.hget(IndexKeys(NS).meta, "building")).endswith("/generation=1")
    steps = 0
    switched = False
    while True:
        status = migration_status(redis_client, IndexKeys(NS))
        if status is None:
            break
        if status.state == "cleaning" and not switched:
            switched = True
            oracle.max_distance = to_r  # from the switch on, the index finds matches within the new distance
        _random_ops(index, oracle, rng, 3, centers)
        if status.state == "built":  # the target is complete and both layouts agree before the switch
            assert_postings_match(redis_client, NS, bands, also=(to_bands, 1))
        migrator.step()
        steps += 1
        assert steps < 500
    assert switched
    assert index.layout.bands == to_bands and index.layout.max_distance == to_r and index.generation == 1
    assert_postings_match(redis_client, NS, to_bands, generation=1)
    for fp in set(oracle.fps.values()) | {flip(c, 3, rng) for c in centers}:
        assert index.matches_of(fp) == oracle.matches(fp)
    meta = FingerprintIndex.read_meta(redis_client, NS)
    assert meta["bands"] == str(to_bands) and meta["generation"] == "1" and "building" not in meta
    assert meta["previous_layouts"].startswith(f"simhash64-blake2b8le/bands={bands}/max_distance={r}/")
    assert meta["last_migration"].startswith("moved from")
    assert not redis_client.exists(IndexKeys(NS).migration)


def test_a_migration_built_before_any_change_switches_to_equal_postings(redis_client: Any) -> None:
    rng = random.Random(5)
    _, oracle = _seed(redis_client, rng, 300)
    result = Migrator(redis_client, NS, batch=25).migrate(3)
    assert result.startswith("moved from")
    assert_postings_match(redis_client, NS, 3, generation=1)
    stale = FingerprintIndex(redis_client, NS, 4, 7)  # configured with the layout the index moved from
    for fp in list(oracle.fps.values())[:50]:
        assert stale.matches_of(fp) == oracle.matches(fp)
    assert stale.adopted is not None and stale.layout.bands == 3
    # and on again: generation 2, its keys apart from generation 1's, which leave
    Migrator(redis_client, NS, batch=25).migrate(4)
    assert_postings_match(redis_client, NS, 4, generation=2)
    again = FingerprintIndex(redis_client, NS, 4, 7)
    again.open()
    assert again.layout_tag.endswith("/generation=2") and again.adopted is None


def test_abort_before_the_switch_leaves_the_index_as_it_was(redis_client: Any) -> None:
    rng = random.Random(11)
    _seed(redis_client, rng, 300)
    before = _dump(redis_client)
    migrator = Migrator(redis_client, NS, batch=30)
    index = FingerprintIndex.stored(redis_client, NS)
    assert index is not None
    migrator._start(index, BandLayout(3, 7))
    migrator.step()  # the build (a small hash is scanned in one batch): built, not switched
    assert any(k.startswith("{mig}:band:g1:") for k in _dump(redis_client))
    assert migrator.abort().startswith("aborted, stayed at")
    after = _dump(redis_client)
    meta_after = after["{mig}:meta"]
    assert meta_after.pop("last_migration").startswith("aborted")
    assert after == before


def test_abort_with_changes_during_it_leaves_no_stray_keys(redis_client: Any) -> None:
    rng = random.Random(12)
    index, oracle = _seed(redis_client, rng, 200)
    centers = list(set(oracle.fps.values()))[:5]
    migrator = Migrator(redis_client, NS, batch=20)
    migrator._start(index, BandLayout(3, 7))
    for _ in range(5):
        _random_ops(index, oracle, rng, 4, centers)
        if migration_status(redis_client, IndexKeys(NS)).state == "building":  # type: ignore[union-attr]
            migrator.step()  # (never the switch)
    redis_client.fcall(library.FN_MIGRATE_ABORT, 2, IndexKeys(NS).meta, IndexKeys(NS).migration)
    _random_ops(index, oracle, rng, 10, centers)  # the index learns of the abort from the refusal
    assert index.building is None
    migrator.abort()
    assert_postings_match(redis_client, NS, 4)
    for fp in centers:
        assert index.matches_of(fp) == oracle.matches(fp)


def test_no_abort_after_the_switch_and_no_second_target(redis_client: Any) -> None:
    rng = random.Random(13)
    index, _ = _seed(redis_client, rng, 50)
    migrator = Migrator(redis_client, NS, batch=1000)
    migrator._start(index, BandLayout(3, 7))
    with pytest.raises(CommandError, match="under way"):
        Migrator(redis_client, NS).migrate(5)
    while migration_status(redis_client, IndexKeys(NS)).state != "cleaning":  # type: ignore[union-attr]
        migrator.step()
    with pytest.raises(redis.ResponseError, match="can no longer be aborted"):
        migrator.abort()
    assert migrator.migrate(3).startswith("moved from")
    # run again once done (a migrator killed after its last step): success, and nothing changes
    meta = FingerprintIndex.read_meta(redis_client, NS)
    assert migrator.migrate(3) == f"the index already uses {BandLayout(3, 7).description}: nothing to do"
    assert FingerprintIndex.read_meta(redis_client, NS) == meta


def test_a_second_migrator_is_refused_while_the_first_moves_on(real_redis: Any, request: pytest.FixtureRequest) -> None:
    redis_client = real_redis
    _scan_in_batches(redis_client, request)
    rng = random.Random(14)
    index, _ = _seed(redis_client, rng, 300)
    first, second = Migrator(redis_client, NS, batch=20), Migrator(redis_client, NS, batch=20)
    first._start(index, BandLayout(3, 7))
    status = migration_status(redis_client, IndexKeys(NS))
    first.step()
    assert status is not None
    with pytest.raises(redis.ResponseError, match="another migrator"):
        second._build_batch(status)  # started from the cursor the first has moved past


def test_an_unrelated_layout_is_still_refused(redis_client: Any) -> None:
    rng = random.Random(15)
    _seed(redis_client, rng, 20)
    Migrator(redis_client, NS).migrate(3)
    with pytest.raises(LayoutMismatchError):
        FingerprintIndex(redis_client, NS, 5, 7).matches_of(0)


def test_the_removal_never_touches_keys_outside_its_generation(redis_client: Any) -> None:
    """The removal step is given a key of the layout in use (a migrator bug, a hand-made call): it leaves it."""
    rng = random.Random(16)
    _seed(redis_client, rng, 30)
    redis_client.set("{mig}:band:g1x", "not a posting")
    Migrator(redis_client, NS).migrate(3)
    index = FingerprintIndex.stored(redis_client, NS)
    assert index is not None
    key = index.posting_keys(next(iter(index.fingerprints_of(["s1"]).values())) or 0)[0]
    keys = IndexKeys(NS)
    redis_client.hset(keys.migration, mapping={"state": "cleaning", "cursor": "0", "removing": "{mig}:band:"})
    redis_client.fcall(library.FN_MIGRATE_REMOVE, 3, keys.meta, keys.migration, key, "cleaning", "0", "5")
    assert redis_client.exists(key) and redis_client.exists("{mig}:band:g1x")


def test_verify_finds_a_migrated_index_clean_and_its_repair_changes_nothing(redis_client: Any) -> None:
    """`verify` reads the postings of the generation in use (`{N}:band:g1:...` after a move), not the layout's first."""
    from worker.integrity import Verifier

    rng = random.Random(17)
    _seed(redis_client, rng, 150)
    Migrator(redis_client, NS).migrate(3)
    before = _dump(redis_client)
    report = Verifier(redis_client, NS, repair=True, configured=(3, 7), default_layout=(3, 7)).run()
    assert report.counts == {}, report.counts
    assert _dump(redis_client) == before


def test_stats_shows_the_progress_of_a_move(real_redis: Any, request: pytest.FixtureRequest) -> None:
    from worker.commands.stats import collect_stats
    from worker.settings import Settings

    _scan_in_batches(real_redis, request)
    rng = random.Random(18)
    index, _ = _seed(real_redis, rng, 200)
    migrator = Migrator(real_redis, NS, batch=20)
    migrator._start(index, BandLayout(3, 7))
    migrator.step()
    stats = collect_stats(real_redis, Settings(namespace=NS))
    assert stats.migration is not None and stats.migration.state == "building"
    assert 0 < stats.migration.visited < 200 and stats.migration.total == 200
    shown = stats.as_json()["migration"]
    assert shown["progress"].startswith("building: ") and "of about 200 incidents visited" in shown["progress"]
    assert shown["target"].endswith("/generation=1")
    migrator.migrate(3)
    assert collect_stats(real_redis, Settings(namespace=NS)).migration is None


def test_every_call_of_a_batch_built_before_the_switch_is_sent_again(redis_client: Any) -> None:
    """A worker pipelines calls built for the old layout; all are refused at the switch, and each refusal (not only
    the first, whose reload follows the switch) is one the index recovers from by building the call again."""
    rng = random.Random(19)
    index, _ = _seed(redis_client, rng, 40)
    commands = [index.apply_command("add", f"late{i}", rng.getrandbits(64)) for i in range(3)]
    Migrator(FingerprintIndex(redis_client, NS, 4, 7).redis, NS).migrate(3)
    replies = index.execute(commands)
    assert all(isinstance(reply, redis.ResponseError) for reply in replies)
    assert all(index.handle_error(reply) for reply in replies)
    assert index.layout.bands == 3
    rebuilt = [index.apply_command("add", f"late{i}", rng.getrandbits(64)) for i in range(3)]
    assert [text(reply[0]) for reply in index.execute(rebuilt)] == ["indexed"] * 3


@pytest.mark.parametrize("restart_when", ["building", "cleaning", "aborting"])
def test_a_redis_restart_during_a_pass_does_not_skip_keys(aof_server: RedisServer, restart_when: str) -> None:
    """Redis seeds its hash function at random when it starts, so a SCAN or HSCAN cursor stored before a restart walks
    another order after it: the pass resumed from it must not skip incidents (they would be in no posting of the new
    layout, never found again) or old posting keys (left behind)."""

    client = aof_server.client()
    client.config_set("hash-max-listpack-entries", 16)
    rng = random.Random(11)
    _, oracle = _seed(client, rng, 1500)
    keys = IndexKeys(NS)
    migrator = Migrator(client, NS, batch=50)
    index = FingerprintIndex.stored(client, NS)
    assert index is not None
    migrator._start(index, BandLayout(3, 7))
    if restart_when != "building":
        while (migration_status(client, keys) or Any).state == "building":
            migrator.step()
        if restart_when == "aborting":
            client.fcall(library.FN_MIGRATE_ABORT, 2, keys.meta, keys.migration)
        else:
            migrator.step()  # the switch
    for _ in range(8):
        migrator.step()
    status = migration_status(client, keys)
    assert status is not None and status.state == restart_when and status.fields["cursor"] != "0"
    aof_server.kill()
    aof_server.start()
    client = aof_server.client()
    client.config_set("hash-max-listpack-entries", 16)
    migrator = Migrator(client, NS, batch=50)
    if restart_when == "aborting":
        assert migrator.abort().startswith("aborted")
        assert_postings_match(client, NS, 4)
    else:
        assert migrator.migrate(3).startswith("moved from")
        assert_postings_match(client, NS, 3, generation=1)
    leftovers = [text(k) for k in client.scan_iter(match="{" + NS + "}:band:*", count=1000)]
    prefix = "{" + NS + "}:band:" + ("g1:" if restart_when == "aborting" else "")
    stale = [k for k in leftovers if k.startswith(prefix) and k[len(prefix)].isdigit()]
    assert stale == [], f"{len(stale)} posting keys of the layout left behind"
    stored = FingerprintIndex.stored(client, NS)
    assert stored is not None
    for fp in list(oracle.fps.values())[:100]:
        assert stored.matches_of(fp) == oracle.matches(fp)


def test_a_mangled_fingerprint_does_not_stop_the_move(redis_client: Any) -> None:
    """A value in {N}:fp that is not a fingerprint (a hand edit: 16 characters that are not hex, bytes that are not
    UTF-8) is in no posting set; the build passes it by instead of failing at the same batch at every resume."""
    rng = random.Random(8)
    _, oracle = _seed(redis_client, rng, 120)
    redis_client.hset(IndexKeys(NS).fingerprints, "hand", "zzzzzzzzzzzzzzzz")
    if not redis_client.connection_pool.connection_kwargs.get("decode_responses"):  # a client that can read it
        redis_client.hset(IndexKeys(NS).fingerprints, "raw", b"\xff" * 16)
    assert Migrator(redis_client, NS, batch=10).migrate(3).startswith("moved from")
    assert_postings_match(redis_client, NS, 3, dict(oracle.fps), generation=1)
