"""`incident-worker demo`: the whole pipeline on an embedded Redis, with no Redis to install.

It starts fakeredis's TCP server in-process on a local port, runs a real `StreamWorker` on it, publishes the built-in
sample (the contract's example, then a few dozen incident texts with near duplicates among them), prints each
alert as a subscriber receives it, and prints the `redis-cli` commands that show what is inside.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import redis

from .. import library
from ..connection import RedisClient
from ..fingerprint import format_fingerprint
from ..formats import Alert, IncidentEvent
from ..index import FingerprintIndex
from ..logs import configure_logging
from ..replies import entries, stream_entries, text
from ..settings import Settings
from ..stream import StreamWorker
from ._format import matches_text, shown
from ._shared import EXIT_OK
from .run import install_stop_signals

__all__ = ["configure", "run_demo", "sample_events"]

FROM_OUTSIDE = "(not in the events stream any more)"
"""What the demo says of an incident whose event it cannot read back."""


def sample_events() -> list[tuple[dict[str, str], str]]:
    """The built-in sample as (stream fields, a one-line description) pairs, in publishing order."""
    events = []
    source = resources.files("worker").joinpath("data/sample_incidents.jsonl").read_text(encoding="utf-8")
    for line in source.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "text" in item:  # a text event: the worker tokenizes it
            event = IncidentEvent(incident_id=item["incident_id"], text=item["text"])
            shown = item["text"]
        else:
            event = IncidentEvent(incident_id=item["incident_id"], features=item["features"])
            shown = _bag_text(item["features"])
        events.append((event.to_fields(), shown))
    return events


def _bag_text(features: Mapping[str, int]) -> str:
    return " ".join(f"{token}x{weight}" for token, weight in features.items())


def _start_server(port: int) -> Any:
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", port), server_version=(7, 0))
    threading.Thread(target=server.serve_forever, name="embedded-redis", daemon=True).start()
    return server


def alert_lines(alert: Alert, describe: Callable[[str], str]) -> list[str]:
    """How the demo prints an alert: the alert, then what the incident and its closest matches are."""
    said = f' "{shown(alert.text)}"' if alert.text else ""  # text incidents' alerts carry the text's start
    lines = [f"ALERT  {shown(alert.incident_id)}{said} matches {matches_text(alert.matches, alert.match_count)}"]
    for incident_id in [alert.incident_id, *(m.incident_id for m in alert.matches[:5])]:
        lines.append(f"       {shown(incident_id)}: {_clip(shown(describe(incident_id)))}")
    return lines


def _clip(line: str, width: int = 70) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


class _Descriptions:
    """What each incident is, for the alert lines: the sample's texts, and the bag of any event published from
    outside (redis-cli, `incident-worker publish`), read back from the events stream."""

    def __init__(self, client: RedisClient, stream: str, samples: list[tuple[dict[str, str], str]]) -> None:
        self.client = client
        self.stream = stream
        self.known = {fields["incident_id"]: shown for fields, shown in samples}
        self.last = "0-0"

    def of(self, incident_id: str) -> str:
        if incident_id not in self.known:
            self._read_new_events()
        return self.known.get(incident_id, FROM_OUTSIDE)

    def _read_new_events(self) -> None:
        for entry_id, fields in entries(self.client, self.stream, f"({self.last}"):
            self.last = entry_id
            found = {text(name): text(value) for name, value in fields.items()}
            incident_id = found.get("incident_id")
            if incident_id is None or incident_id in self.known:
                continue
            if "text" in found:
                self.known[incident_id] = found["text"]
                continue
            try:
                bag = json.loads(found.get("features", ""))
                self.known[incident_id] = _bag_text(bag) if isinstance(bag, dict) else FROM_OUTSIDE
            except ValueError:
                continue


def run_demo(port: int = 0, keep: bool = False, out: Any = None) -> int:
    """Run the demo; returns the exit code. `out` is where it prints (stdout by default).

    Ctrl-C (or SIGTERM) stops it, also when a shell started it in the background; a second one exits at once."""
    out = out or sys.stdout

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    stopping = threading.Event()
    install_stop_signals(stopping.set)
    server = _start_server(port)
    port = server.server_address[1]
    url = f"redis://127.0.0.1:{port}/0"
    configure_logging("console", "warning")
    settings = Settings(
        redis_url=url,
        consumer="demo",
        block_ms=200,
        claim_interval_ms=1000,
        alert_text_chars=60,
        # fakeredis has no MEMORY USAGE to measure the streams with; their length caps apply
        alerts_max_memory="off",
        dead_max_memory="off",
    )
    client = redis.Redis(port=port)
    library.load(client)  # the deployment's administrator step (load-functions), done here for the demo
    worker = StreamWorker(client, settings)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)

    say(f"Embedded Redis (fakeredis, in this process) on 127.0.0.1:{port}")
    say(f"Worker {settings.consumer!r} in group {settings.group!r}: {worker.index.layout.description}")
    samples = sample_events()
    described = _Descriptions(client, settings.events_stream, samples)
    thread.start()
    say(f"Publishing {len(samples)} sample incidents to {settings.events_stream} ...")
    say()
    pipe = client.pipeline(transaction=False)
    for fields, _ in samples:
        pipe.xadd(settings.events_stream, fields)  # type: ignore[arg-type]
    pipe.execute()

    shown_alerts = 0
    last_id = "0-0"

    def print_new_alerts(block_ms: int | None) -> int:
        nonlocal last_id
        count = 0
        found = stream_entries(client.xread({settings.alerts_stream: last_id}, block=block_ms))
        for entry_id, fields in found:
            last_id = entry_id
            for line in alert_lines(Alert.from_fields(fields), described.of):
                say(line)
            count += 1
        return count

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stopping.is_set():
        shown_alerts += print_new_alerts(200)
        if worker.stats.processed >= len(samples):
            shown_alerts += print_new_alerts(None)
            break
    index = FingerprintIndex(client)
    dead = client.xlen(settings.dead_stream)
    say()
    say(f"Done: {len(index)} incidents indexed, {shown_alerts} alerts, {dead} dead letters.")
    fp47 = index.get("47")
    band_key = index.posting_keys(fp47)[3] if fp47 is not None else f"{settings.keys.tag}:band:3:0000"
    say()
    say("Look inside with redis-cli" + (" (Ctrl-C stops the demo):" if keep else " (add --keep to keep it running):"))
    for command in (
        f"HGET '{settings.keys.fingerprints}' 47" + (f"        # {format_fingerprint(fp47)}" if fp47 else ""),
        f"SMEMBERS '{band_key}'",
        f"XRANGE '{settings.alerts_stream}' - +",
        f"HGETALL '{settings.keys.meta}'",
        f"XADD '{settings.events_stream}' '*' incident_id 91 features '{{\"dock\":3,\"scanner\":2,\"timeout\":1}}'",
        f"XADD '{settings.events_stream}' '*' incident_id 92 text 'Disk full on db-7: writes failing since 04:10 UTC'",
    ):
        say(f"  redis-cli -p {port} {command}")
    if keep and not stopping.is_set():
        say()
        say("Waiting for more events; new alerts print here (Ctrl-C stops).")
        while not stopping.is_set():
            print_new_alerts(500)
        say()
    worker.stop()
    thread.join(timeout=10)
    client.close()
    server.shutdown()
    server.server_close()
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    return run_demo(args.port, args.keep)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start an in-process Redis (fakeredis's TCP server) on a local port, run a worker on it, publish the "
        "built-in sample incidents (the contract's example and a few dozen incident texts with near duplicates), "
        "print each alert as it arrives and the redis-cli commands to look inside. Ctrl-C or SIGTERM stops it "
        "(exit 0), also when started in the background; a second one exits at once (130 after Ctrl-C)."
    )
    parser.add_argument("--port", type=int, default=0, help="port of the embedded Redis (default: a free one)")
    parser.add_argument("--keep", action="store_true", help="stay up after the sample, printing new alerts")
    parser.set_defaults(handler=_demo)
