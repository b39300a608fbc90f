"""`incident-worker demo`: the whole pipeline on an embedded Redis, with no Redis to install.

It starts fakeredis's TCP server in-process on a local port, runs a real `StreamWorker` on it, publishes the built-in
sample (SPEC section 4's example, then a few dozen incident texts with near duplicates among them), prints each
alert as a subscriber receives it, and prints the `redis-cli` commands that show what is inside.
"""

from __future__ import annotations

import json
import threading
import time
from importlib import resources
from typing import Any

import redis

from .fingerprint import format_fingerprint
from .formats import Alert, IncidentEvent
from .index import FingerprintIndex
from .logs import configure_logging
from .settings import Settings
from .stream import StreamWorker
from .text import features_from_text

__all__ = ["register", "run_demo", "sample_events"]


def sample_events() -> list[tuple[dict[str, str], str]]:
    """The built-in sample as (stream fields, a one-line description) pairs, in publishing order."""
    events = []
    source = resources.files(__package__).joinpath("data/sample_incidents.jsonl").read_text(encoding="utf-8")
    for line in source.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "text" in item:
            features = features_from_text(item["text"])
            shown = item["text"]
        else:
            features = item["features"]
            shown = " ".join(f"{token}x{weight}" for token, weight in features.items())
        event = IncidentEvent(incident_id=item["incident_id"], features=features)
        events.append((event.to_fields(), shown))
    return events


def _start_server(port: int) -> Any:
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", port), server_version=(7, 0))
    threading.Thread(target=server.serve_forever, name="embedded-redis", daemon=True).start()
    return server


def _clip(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def run_demo(port: int = 0, keep: bool = False, out: Any = None) -> int:
    """Run the demo; returns the exit code. `out` is where it prints (stdout by default)."""
    import sys

    out = out or sys.stdout

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    server = _start_server(port)
    port = server.server_address[1]
    url = f"redis://127.0.0.1:{port}/0"
    configure_logging("console", "warning")
    settings = Settings(redis_url=url, consumer="demo", block_ms=200, claim_interval_ms=1000)
    client = redis.Redis(port=port)
    worker = StreamWorker(client, settings)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)

    say(f"Embedded Redis (fakeredis, in this process) on 127.0.0.1:{port}")
    say(f"Worker {settings.consumer!r} in group {settings.group!r}: {worker.index.layout.description}")
    samples = sample_events()
    described = {fields["incident_id"]: shown for fields, shown in samples}
    thread.start()
    say(f"Publishing {len(samples)} sample incidents to {settings.events} ...")
    say()
    pipe = client.pipeline(transaction=False)
    for fields, _ in samples:
        pipe.xadd(settings.events, fields)  # type: ignore[arg-type]
    pipe.execute()

    shown_alerts = 0
    last_id = "0-0"

    def print_new_alerts(block_ms: int) -> int:
        nonlocal last_id
        reply: Any = client.xread({settings.alerts: last_id}, block=block_ms or None)  # BLOCK 0 waits forever
        count = 0
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last_id = entry_id.decode()
                alert = Alert.from_fields(fields)
                closest = ", ".join(f"{m.incident_id} (distance {m.distance})" for m in alert.matches[:3])
                more = f" and {alert.match_count - 3} more" if alert.match_count > 3 else ""
                say(f"ALERT  {alert.incident_id} matches {closest}{more}")
                say(f"       {alert.incident_id}: {_clip(described.get(alert.incident_id, ''))}")
                for match in alert.matches[:3]:
                    say(f"       {match.incident_id}: {_clip(described.get(match.incident_id, ''))}")
                count += 1
        return count

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown_alerts += print_new_alerts(200)
        if worker.stats.processed >= len(samples):
            shown_alerts += print_new_alerts(0)
            break
    index = FingerprintIndex(client)
    dead = client.xlen(settings.dead)
    say()
    say(f"Done: {len(index)} incidents indexed, {shown_alerts} alerts, {dead} dead letters.")
    fp47 = index.get("47")
    band_key = index.posting_keys(fp47)[3] if fp47 is not None else f"{settings.keys.tag}:band:3:0000"
    say()
    say("Look inside with redis-cli" + (" (Ctrl-C stops the demo):" if keep else " (add --keep to keep it running):"))
    for command in (
        f"HGET '{settings.keys.fingerprints}' 47" + (f"        # {format_fingerprint(fp47)}" if fp47 else ""),
        f"SMEMBERS '{band_key}'",
        f"XRANGE '{settings.alerts}' - +",
        f"HGETALL '{settings.keys.meta}'",
        f"XADD '{settings.events}' '*' incident_id 91 features '{{\"dock\":3,\"scanner\":2,\"timeout\":1}}'",
    ):
        say(f"  redis-cli -p {port} {command}")
    if keep:
        say()
        say("Waiting for more events; new alerts print here.")
        try:
            while True:
                print_new_alerts(1000)
        except KeyboardInterrupt:
            say()
    worker.stop()
    thread.join(timeout=10)
    client.close()
    server.shutdown()
    server.server_close()
    return 0


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="run the worker on an embedded Redis with sample incidents (nothing to install)",
        description="Start an in-process Redis (fakeredis's TCP server) on a local port, run a worker on it, "
        "publish the built-in sample incidents (SPEC section 4's example and a few dozen incident texts with "
        "near duplicates), print each alert as it arrives and the redis-cli commands to look inside.",
    )
    demo.add_argument("--port", type=int, default=0, help="port of the embedded Redis (default: a free one)")
    demo.add_argument("--keep", action="store_true", help="stay up after the sample, printing new alerts")
    demo.set_defaults(handler=lambda args: run_demo(args.port, args.keep))
