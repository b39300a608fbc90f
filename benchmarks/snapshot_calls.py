"""Redis time per event of the snapshot read path, command by command (INFO commandstats), in one worker.

Pre-loads N incidents of the benchmark's seeded Zipf workload into a redis-server of its own, publishes M events,
runs one `StreamWorker` (the code of `incident-worker run`) in this process until the stream is idle, and prints
FCALL's time per event (every function call: reading entries and applying them; it includes the commands the
functions run) and each command's share, then FCALL's time split by function (SLOWLOG at 0 us during the run: each
call's own time; the median call is the steadier figure on a busy machine). Run it on two commits to compare what a
change saves on the primary.

Usage: python benchmarks/snapshot_calls.py [N] [M] [snapshot|primary]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

import redis  # noqa: E402

from worker import library  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.devtools.redis_server import RedisServer  # noqa: E402
from worker.devtools.workload import Workload  # noqa: E402
from worker.fingerprint import fingerprint  # noqa: E402
from worker.formats import IncidentEvent  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402
from worker.logs import configure_logging  # noqa: E402
from worker.settings import Settings  # noqa: E402
from worker.stream import StreamWorker  # noqa: E402


def loaded_worker(server: RedisServer, size: int, path: str) -> tuple[redis.Redis, Workload, Settings, StreamWorker]:
    """`server` with the library and `size` incidents of the seeded Zipf workload bulk-loaded into namespace
    "bench", and a `StreamWorker` on `path`, set up; the workload goes on with the events that follow."""
    client = redis.Redis.from_url(server.url)
    library.load(client)
    workload = Workload(seed=1)
    index = FingerprintIndex(client, "bench", bands=4)
    index.open()
    index.bulk_load([(i, fingerprint(bag)) for i, bag in workload.take(size)])
    settings = Settings(redis_url=server.url, namespace="bench", read_path=path, batch_size=100, alerts_maxlen=10_000)
    worker = StreamWorker(connect(settings), settings)
    worker.setup()
    return client, workload, settings, worker


def publish(client: redis.Redis, settings: Settings, workload: Workload, events: int) -> None:
    """XADD the workload's next `events` events to the worker's stream."""
    pipe = client.pipeline(transaction=False)
    for incident_id, bag in workload.take(events):
        pipe.xadd(settings.events_stream, IncidentEvent(incident_id=incident_id, features=bag).to_fields())
    pipe.execute()


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    path = sys.argv[3] if len(sys.argv) > 3 else "snapshot"
    configure_logging("json", "error")
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            client, workload, settings, worker = loaded_worker(server, size, path)
            publish(client, settings, workload, events)
            client.config_set("slowlog-max-len", 1_000_000)
            client.config_set("slowlog-log-slower-than", 0)
            client.slowlog_reset()
            client.config_resetstat()
            started, cpu = time.perf_counter(), time.process_time()
            worker.run(until_idle=True)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            stats = client.info("commandstats")
            client.config_set("slowlog-log-slower-than", 10_000)
            calls = function_calls(client.slowlog_get(1_000_000))
            print(
                f"{path}, N = {size:,}, {events:,} events: {events / elapsed:,.0f} events/s (one worker, in process), "
                f"worker CPU {cpu * 1e6 / events:,.0f} us/event"
            )
            for name, row in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:12]:
                print(
                    f"  {name.removeprefix('cmdstat_'):>12}: {row['calls'] / events:6.2f} calls/event, "
                    f"{row['usec'] / events:7.1f} us/event"
                )
            print("  FCALL by function (SLOWLOG):")
            for name, durations in sorted(calls.items(), key=lambda kv: -sum(kv[1])):
                print(
                    f"  {name:>12}: {len(durations) / events:6.2f} calls/event, "
                    f"{sum(durations) / events:7.1f} us/event, median call {statistics.median(durations):,.0f} us"
                )
        finally:
            server.stop()


def function_calls(log: list[dict[str, object]]) -> dict[str, list[int]]:
    """The duration of each FCALL in a SLOWLOG reply, by function (the library's versioned prefix left out)."""
    calls: dict[str, list[int]] = {}
    for row in log:
        words = row["command"].split() if isinstance(row["command"], (bytes, str)) else []
        if len(words) > 1 and words[0].upper() in (b"FCALL", "FCALL"):
            name = words[1].decode() if isinstance(words[1], bytes) else words[1]
            calls.setdefault(name.removeprefix(library.LIBRARY_NAME + "_"), []).append(int(row["duration"]))  # type: ignore[call-overload]
    return calls


if __name__ == "__main__":
    main()
