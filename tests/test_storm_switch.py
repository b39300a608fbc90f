"""READ_PATH=auto and a storm met on the primary: a batch whose searches verified SNAPSHOT_STORM_CANDIDATES an event
on average (or a tenth of that, half of it matched), or cut one at the budget, has the worker search its own copy from
then on, whatever the index's size;
the answers stay exact (every pair within r reported once, against a linear scan), and nothing else switches."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.streams import FP, alerts, assert_pairs_reported_once, fingerprints, pending_count, publish
from worker.devtools.near_storm import near_storm_bags
from worker.devtools.workload import Workload
from worker.settings import Settings
from worker.stream import StreamWorker

pytestmark = pytest.mark.usefixtures("no_worker_env")


@pytest.fixture
def fake_decodes() -> bool:
    return False  # the worker refuses a client that decodes replies


class _Log:
    """The worker's log, its warnings and info lines kept too."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.warnings: list[tuple[str, dict[str, Any]]] = []
        self.infos: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))
        self.inner.warning(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self.infos.append((event, fields))
        self.inner.info(event, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _worker(client: redis.Redis, **overrides: Any) -> tuple[StreamWorker, _Log]:
    values: dict[str, Any] = {
        "consumer": "w1",
        "block_ms": 50,
        "batch_size": 32,
        "summary_interval_s": 60,
        "max_matches": 0,  # every match listed: the pairs are checked whole
        "read_path": "auto",
        "snapshot_storm_candidates": 40,
    }
    values.update(overrides)
    worker = StreamWorker(client, Settings(**values))
    log = _Log(worker.processor.log)
    worker.processor.log = log
    return worker, log


def _storm(count: int) -> list[dict[str, Any]]:
    return [{"incident_id": f"near-{n:04d}", "features": bag} for n, bag in enumerate(near_storm_bags(count))]


def test_a_near_storm_on_the_primary_moves_the_search_to_the_workers_copy(redis_client: redis.Redis) -> None:
    events = _storm(300)  # (at most about 180 matches an event: every one fits in the alert's 8 KB)
    publish(redis_client, events)
    worker, log = _worker(redis_client)
    worker.setup()
    assert worker.processor.snapshot is None  # 0 incidents: far below SNAPSHOT_MIN_INCIDENTS
    worker.run(until_idle=True)
    assert worker.processor.storm.seen and worker.processor.snapshot is not None
    [(_, fields)] = [w for w in log.warnings if w[0].startswith("storm on the primary")]
    # (at this threshold its first batch is a storm by its matches: 4 candidates an event or more, half matched)
    assert fields["candidates_per_event"] >= 4 and 2 * fields["matches_per_event"] >= fields["candidates_per_event"]
    assert not fields["cut_at_the_budget"]
    # the first batches were indexed on the primary, the rest through the copy: every pair exactly once all the same
    [(_, loaded)] = [i for i in log.infos if i[0] == "snapshot loaded"]
    # the batch that met it (its first) and the one in flight then went to the primary; the one read ahead did not
    assert 32 <= loaded["incidents"] <= 64
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert redis_client.hlen(FP) == 300
    assert pending_count(redis_client) == 0


def test_a_near_storm_is_known_by_its_matches_before_its_candidates_reach_the_threshold(
    redis_client: redis.Redis,
) -> None:
    """At the default threshold (500), no batch of this storm of 300 verifies 500 candidates an event; but its
    events match most of what they verify, so a batch of a tenth of that (50) is a storm: the copy takes over within
    its first few batches, and every pair is still reported once."""
    events = _storm(300)
    publish(redis_client, events)
    worker, log = _worker(redis_client, snapshot_storm_candidates=500)
    worker.run(until_idle=True)
    assert worker.processor.snapshot is not None
    [(_, fields)] = [w for w in log.warnings if w[0].startswith("storm on the primary")]
    assert (
        50 <= fields["candidates_per_event"] < 500 and 2 * fields["matches_per_event"] >= fields["candidates_per_event"]
    )
    [(_, loaded)] = [i for i in log.infos if i[0] == "snapshot loaded"]
    # (a storm by its second batch: it and the one in flight then on the primary, nothing read ahead after them)
    assert loaded["incidents"] <= 128
    assert_pairs_reported_once(fingerprints(events), alerts(redis_client))
    assert redis_client.hlen(FP) == 300 and pending_count(redis_client) == 0


def test_a_storm_of_exact_twins_stays_on_the_primary(redis_client: redis.Redis) -> None:
    """Exact twins match every earlier twin but verify one candidate an event (their group's representative): cheap
    on the primary, so not a storm to move, at a threshold whose tenth one twin's single candidate falls short of."""
    items = [{"incident_id": f"twin-{n:04d}", "features": {"dock": 3, "scanner": 2, "timeout": 1}} for n in range(200)]
    publish(redis_client, items)
    worker, log = _worker(redis_client, snapshot_storm_candidates=40)
    worker.run(until_idle=True)
    assert worker.processor.snapshot is None and not worker.processor.storm.seen
    assert not [w for w in log.warnings if w[0].startswith("storm on the primary")]
    assert redis_client.hlen(FP) == 200 and pending_count(redis_client) == 0


def test_an_event_cut_at_the_budget_is_a_storm_whatever_the_mean(redis_client: redis.Redis) -> None:
    publish(redis_client, _storm(200))
    worker, log = _worker(redis_client, max_candidates=20, snapshot_storm_candidates=10**6)
    worker.run(until_idle=True)
    assert worker.processor.snapshot is not None
    [(_, fields)] = [w for w in log.warnings if w[0].startswith("storm on the primary")]
    assert fields["cut_at_the_budget"] and fields["candidates_per_event"] < 10**6
    assert redis_client.hlen(FP) == 200 and pending_count(redis_client) == 0


def test_a_workers_cut_searches_are_in_its_heartbeat_and_stats_says_how_many(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the primary, a budget smaller than the storm cuts its later searches: the worker's beat counts them, and
    `incident-worker stats` prints the count beside what it processed (an operator without Prometheus sees it)."""
    from worker.commands.stats import _print_workers, collect_stats
    from worker.formats import Heartbeat

    publish(redis_client, _storm(200))
    worker, _ = _worker(redis_client, read_path="primary", max_candidates=20)
    worker.run(until_idle=True)
    cut = worker.processor.outcomes.stats.budget_exceeded
    assert cut > 0
    worker.heartbeat()  # (as a running worker beats; run() took its beat away as it stopped)
    settings = worker.settings
    beat = Heartbeat.from_value("k", "w1", redis_client.get(settings.keys.heartbeat("w1")))
    assert beat.cut == cut and beat.read_path == "primary"
    _print_workers(collect_stats(redis_client, settings))
    assert (
        f"processed 200, {cut:,} searches cut at the per-event budget, searches on the primary"
        in capsys.readouterr().out
    )
    log = _Log(worker.presence.log)  # (the summary's lines kept, as the processor's are)
    worker.presence.log = log
    worker.presence.summary(None)
    [(_, line)] = [info for info in log.infos if info[0] == "summary"]
    assert line["searches_cut"] == cut and line["processed"] == 200


@pytest.mark.parametrize(
    "events, overrides",
    [
        ("distinct", {}),  # the synthetic workload: a few candidates an event
        ("storm", {"snapshot_storm_candidates": 0}),  # switched off
    ],
)
def test_nothing_else_moves_the_search(redis_client: redis.Redis, events: str, overrides: dict[str, Any]) -> None:
    items = (
        _storm(200)
        if events == "storm"
        else [{"incident_id": i, "features": bag} for i, bag in Workload(seed=3).take(200)]
    )
    publish(redis_client, items)
    worker, log = _worker(redis_client, **overrides)
    worker.run(until_idle=True)
    assert worker.processor.snapshot is None and not worker.processor.storm.seen
    assert not [w for w in log.warnings if w[0].startswith("storm on the primary")]
    assert_pairs_reported_once(fingerprints(items), alerts(redis_client))


def test_a_worker_told_to_search_the_primary_stays_there_and_says_once_what_auto_would_do(
    redis_client: redis.Redis,
) -> None:
    items = _storm(300)
    publish(redis_client, items)
    worker, log = _worker(redis_client, read_path="primary")
    worker.run(until_idle=True)
    assert worker.processor.snapshot is None and worker.processor.storm.seen
    assert not [w for w in log.warnings if w[0].startswith("storm on the primary:")]  # (it did not move)
    [(event, fields)] = [w for w in log.warnings if w[0].startswith("storm on the primary")]
    assert "READ_PATH=primary keeps its searches there" in event and "READ_PATH=auto" in fields["hint"]
    assert 2 * fields["matches_per_event"] >= fields["candidates_per_event"] >= 4
    assert_pairs_reported_once(fingerprints(items), alerts(redis_client))
    assert redis_client.hlen(FP) == 300 and pending_count(redis_client) == 0
    # and goes on as before the storm: batches read ahead and sent one ahead, many in a round (a first version took
    # the storm it had met as a move to make, for good: a batch a round, each waiting for the one before)
    publish(redis_client, [{"incident_id": i, "features": bag} for i, bag in Workload(seed=5).take(640)])
    assert worker.read_and_process() > 4 * 32


@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
@pytest.mark.parametrize("level", ["info", "warning"])
def test_the_replies_repeat_the_matches_an_alerts_log_line_names_only_when_it_is_written(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, read_path: str, level: str
) -> None:
    """A reply repeats the closest matches for the alert's INFO line; with that line not written, none (a near storm's
    reply made and parsed them event after event for nobody), and the alerts and groups are the same."""
    import io
    import json

    from worker.index import FingerprintIndex
    from worker.logs import configure_logging
    from worker.outcomes import CLOSEST_LOGGED

    asked: list[int | None] = []
    for name in ("apply_command", "snapshot_adds"):
        inner = getattr(FingerprintIndex, name)

        def spy(self: Any, *args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            asked.append(kwargs.get("max_replied"))
            return _inner(self, *args, **kwargs)

        monkeypatch.setattr(FingerprintIndex, name, spy)
    items = _storm(120)
    publish(redis_client, items)
    out = io.StringIO()
    configure_logging("json", level, stream=out)
    worker, _ = _worker(redis_client, read_path=read_path, max_matches=100)
    worker.run(until_idle=True)
    assert asked and set(asked) == {CLOSEST_LOGGED if level == "info" else 0}
    lines = [json.loads(line) for line in out.getvalue().splitlines() if '"event": "alert"' in line]
    kept = alerts(redis_client)
    assert len(lines) == (len(kept) if level == "info" else 0)
    by_id = {alert.incident_id: alert for alert in kept}
    for line in lines:  # (the closest the alert lists, as the line names them)
        listed = by_id[line["incident_id"]].matches[:CLOSEST_LOGGED]
        assert line["closest"] == [f"{m.incident_id}@{m.distance}" for m in listed]
    assert_pairs_reported_once(fingerprints(items), kept)
    assert redis_client.hlen(FP) == 120 and pending_count(redis_client) == 0
