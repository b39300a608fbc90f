"""The subcommands of `incident-worker`, one module each, imported only when chosen.

`SUBCOMMANDS` lists them in the order of `incident-worker --help`, each with the one-line summary shown there:
the top-level help needs no module, so that `incident-worker check` (the liveness probe) imports `check.py` and
what it needs, never the benchmark, the demo or the metrics server.

Adding a subcommand `frob`:

1. Write `worker/commands/frob.py` with `configure(parser: argparse.ArgumentParser) -> None`. It gives the parser
   its description (`_shared.describe` adds examples and exit codes), its flags (`_shared.add_settings_flags` for
   the settings it reads), and its handler: `parser.set_defaults(handler=...)`.
2. A handler takes the parsed arguments and returns an exit code: `EXIT_OK` (0), `EXIT_FAILURE` (1: failed, not
   found, unhealthy) or `EXIT_USAGE` (2: bad usage or configuration). A handler that talks to Redis is written as
   `run(args, settings) -> int` under `@with_settings("frob")`, which builds the settings (flag, then environment,
   then default) and turns Redis errors, `CommandError` and `UsageError` into one line on stderr and the exit code.
   Raise `UsageError` for bad input; `CommandError` for an expected failure.
3. Keep what it reads apart from how it prints: a function returning data (a dataclass with `as_json()` for
   `--json`), and printers for people (`_format` has tables, plurals, sizes and the alert match list).
4. Add `Subcommand("frob", "one-line summary")` below, and the command to the README's list of commands.

Modules whose name starts with `_` are shared helpers: `_shared` (exit codes, errors, flags, the Redis client of a
command), `_format` (printing), `_index` (read-only index helpers).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SUBCOMMANDS", "Subcommand"]


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: its name (also its module's, `worker.commands.<name>`) and its line in `--help`."""

    name: str
    summary: str

    @property
    def module(self) -> str:
        return f"{__name__}.{self.name.replace('-', '_')}"


SUBCOMMANDS = (
    Subcommand("run", "consume the events stream: index incidents, publish alerts (the main job)"),
    Subcommand("publish", "append incident events to the events stream from a JSON Lines file or stdin"),
    Subcommand("query", "the indexed incidents near a bag or a text, without indexing it"),
    Subcommand("inspect", "an indexed incident: fingerprint, bands, posting sets, matches"),
    Subcommand("groups", "the largest and most recently joined groups of incidents, one group's members, merging two"),
    Subcommand("stats", "index size, layout, memory, band advice, streams, consumer group, workers, dead letters"),
    Subcommand(
        "alerts", "print the alerts stream as a subscriber sees it (newest, since an ID, following, or as a group)"
    ),
    Subcommand("dead", "list dead letters (entries the worker could not process); `dead replay` re-queues them"),
    Subcommand("expire", "the retention window: what is due and what goes next (--dry-run), or one expiry pass"),
    Subcommand(
        "verify", "check the postings, twin groups and meta against the fingerprints, online; --repair fixes them"
    ),
    Subcommand("migrate", "move a live index to another band layout or maximum distance (resumable, abortable)"),
    Subcommand("check", "health check for Docker HEALTHCHECK and Kubernetes probes"),
    Subcommand("load-functions", "load the index's Redis Functions library with an administrator's credentials"),
    Subcommand("demo", "run the worker on an embedded Redis with sample incidents (nothing to install)"),
    Subcommand("bench", "measure throughput, latency, candidates and memory on a real Redis"),
)
