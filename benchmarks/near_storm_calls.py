"""Redis time per event of a near-duplicate storm on one read path, command by command and call by call.

The storm of `incident-worker bench --near-storm` (one alert reworded by a token of its own each: thousands of
distinct fingerprints within r of one another) into an empty index of a redis-server of its own: one
`StreamWorker` (the code of `incident-worker run`) in this process indexes its first WARM events, then the next
EVENTS are measured: events/s, the worker's CPU and the server's CPU per event (used_cpu_user + sys, the steadier
figure on a loaded machine), each command's share (INFO commandstats) and FCALL by function (SLOWLOG at 0 us).
Run it on two commits, alternately, to compare what a change saves (benchmarks/journal/near-storms.md).

Usage: python benchmarks/near_storm_calls.py [WARM] [EVENTS] [snapshot|primary]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import redis  # noqa: E402
from snapshot_calls import function_calls  # noqa: E402

from worker.connection import connect  # noqa: E402
from worker.devtools.near_storm import near_storm_bags  # noqa: E402
from worker.devtools.redis_server import scratch_server  # noqa: E402
from worker.formats import IncidentEvent  # noqa: E402
from worker.index import FingerprintIndex  # noqa: E402
from worker.logs import configure_logging  # noqa: E402
from worker.settings import Settings  # noqa: E402
from worker.stream import StreamWorker  # noqa: E402


def _cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def main() -> None:
    warm = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    path = sys.argv[3] if len(sys.argv) > 3 else "snapshot"
    configure_logging("json", "error")
    bags = near_storm_bags(warm + events)
    with scratch_server() as server:
        client = redis.Redis.from_url(server.url)
        FingerprintIndex(client, "bench", bands=4).open()
        settings = Settings(
            redis_url=server.url, namespace="bench", read_path=path, batch_size=100, alerts_maxlen=10_000
        )
        worker = StreamWorker(connect(settings), settings)
        worker.setup()

        def publish(first: int, end: int) -> None:
            pipe = client.pipeline(transaction=False)
            for k in range(first, end):
                event = IncidentEvent(incident_id=f"near-{k}", features=bags[k])
                pipe.xadd(settings.events_stream, event.to_fields())
            pipe.execute()

        publish(0, warm)
        worker.run(until_idle=True)
        publish(warm, warm + events)
        client.config_set("slowlog-max-len", 1_000_000)
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        client.config_resetstat()
        server_cpu, started, cpu = _cpu(client), time.perf_counter(), time.process_time()
        worker.run(until_idle=True)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        server_cpu = _cpu(client) - server_cpu
        stats = client.info("commandstats")
        client.config_set("slowlog-log-slower-than", 10_000)
        calls = function_calls(client.slowlog_get(1_000_000))
        print(
            f"{path}, near storm after {warm:,}, {events:,} events: {events / elapsed:,.0f} events/s (one worker, "
            f"in process), worker CPU {cpu * 1e6 / events:,.0f} us/event, Redis CPU "
            f"{server_cpu * 1e6 / events:,.0f} us/event"
        )
        for name, row in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:10]:
            print(
                f"  {name.removeprefix('cmdstat_'):>12}: {row['calls'] / events:6.2f} calls/event, "
                f"{row['usec'] / events:7.1f} us/event"
            )
        print("  FCALL by function (SLOWLOG):")
        for name, durations in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:4]:
            print(
                f"  {name:>12}: {len(durations) / events:6.2f} calls/event, "
                f"{sum(durations) / events:7.1f} us/event, median call {statistics.median(durations):,.0f} us"
            )


if __name__ == "__main__":
    main()
