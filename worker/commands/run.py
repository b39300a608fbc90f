"""`incident-worker run`: the worker itself, consuming the events stream until a signal (or, for batch jobs, idle)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..settings import ENV_PREFIX, Settings
from ._shared import EXIT_OK, EXIT_USAGE, add_settings_flags, with_settings

__all__ = ["configure", "install_stop_signals"]


STOP_WITHIN_S = 5.0
"""After a first signal, how long the worker may take to finish its batch before it exits anyway. Finishing takes
well under a second when Redis answers; when Redis is stopped or hung the batch's calls wait for their socket timeout,
and a stop request must not wait that long (it once took 10 minutes). Nothing is lost by exiting: each entry's call
is atomic on the server, and what was in hand stays pending, finished by the next start or taken over."""


def install_stop_signals(stop: Callable[[], None], stopped: threading.Event | None = None, log: Any = None) -> None:
    """First SIGTERM or SIGINT: call `stop` (finish the batch, exit 0); if `stopped` is not set within STOP_WITHIN_S,
    exit 0 anyway. A second one: exit at once with 128 + the signal's number (130 after Ctrl-C, 143 after SIGTERM);
    entries being processed stay pending for another worker.

    Installed explicitly, so that it also holds when the shell started the process in the background with SIGINT
    ignored (where Python would not raise KeyboardInterrupt)."""
    received: list[int] = []

    def stop_within() -> None:
        stop()
        if stopped is None or stopped.wait(STOP_WITHIN_S):
            return
        if log is not None:
            log.warning(
                "redis has not let the worker finish its batch; exiting without waiting longer",
                waited_s=STOP_WITHIN_S,
                hint="the entries in hand stay pending, for the next start of this consumer or another worker",
            )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def handler(signum: int, _frame: Any) -> None:
        if received:
            os._exit(128 + signum)
        received.append(signum)
        # not stop() itself: it takes a lock the interrupted main thread may hold at this very moment
        threading.Thread(target=stop_within, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@with_settings("run")
def _run(args: argparse.Namespace, settings: Settings) -> int:
    from ..connection import connect, connect_replica
    from ..errors import (
        CredentialsRefusedError,
        FunctionsMissingError,
        KeyTypeError,
        LayoutMismatchError,
        PreflightError,
        TlsUnverifiedError,
        TokenizerMismatchError,
    )
    from ..logs import configure_logging, get_logger
    from ..stream import StreamWorker
    from ..watchdog import ANSWER_WITHIN_S, Watchdog

    configure_logging(settings.log_format, settings.log_level)
    log = get_logger(consumer=settings.consumer)
    probe = connect(
        settings, client_name=f"incident-worker:{settings.consumer}:watchdog", timeout_s=ANSWER_WITHIN_S, retries=0
    )
    worker = StreamWorker(connect(settings), settings, watchdog=Watchdog(probe, log), replica=connect_replica(settings))
    if settings.snapshot_replica_url is not None:
        log.info("snapshot copies read a replica", replica=settings.safe_replica_url)
    # the read path counts its fallbacks itself; /metrics reads that count when scraped
    worker.metrics.follow_snapshot_fallbacks(lambda: worker.snapshot.fallbacks if worker.snapshot is not None else 0)
    worker.metrics.follow_snapshot_replica_lost(
        lambda: worker.snapshot.replica_lost if worker.snapshot is not None else 0
    )
    if settings.metrics_port:
        try:
            worker.metrics.serve(settings.metrics_port, settings.metrics_address)
        except OSError as error:  # in use, or an address this machine does not have
            log.error(
                "cannot serve /metrics; not starting",
                address=f"{settings.metrics_address}:{settings.metrics_port}",
                error=error.strerror or str(error),
                hint=f"choose another {ENV_PREFIX}METRICS_PORT (--metrics-port), or an address of this machine for "
                f"{ENV_PREFIX}METRICS_ADDRESS, or stop what listens there",
            )
            return EXIT_USAGE
        log.info(
            "metrics endpoint listening", address=settings.metrics_address, port=settings.metrics_port, path="/metrics"
        )
    install_stop_signals(worker.stop, worker.stopped, log)
    stops = (  # what stops the worker with exit 2, and its log line (first match: a tokenizer mismatch is a layout's)
        (TokenizerMismatchError, "the index's text incidents come from another tokenizer version; stopping"),
        (LayoutMismatchError, "index layout mismatch; stopping"),
        # the entries in hand stay pending: a worker started once the library is loaded takes them over
        (FunctionsMissingError, "functions library missing; stopping"),
        (CredentialsRefusedError, "redis refused the worker's credentials; not starting"),
        (TlsUnverifiedError, "redis's TLS certificate could not be verified; not starting"),
        (PreflightError, "redis user or keys not fit for the worker; not starting"),
        (KeyTypeError, "a key of the namespace holds another type; stopping"),
    )
    try:
        worker.run(until_idle=args.until_idle)
    except tuple(kind for kind, _ in stops) as error:  # a tokenizer mismatch is met at start or by a text's call
        log.error(next(event for kind, event in stops if isinstance(error, kind)), error=str(error))
        return EXIT_USAGE
    return EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Consume the events stream through the consumer group: fingerprint each incident, find every indexed "
        "incident within max_distance, index it, publish an alert, acknowledge; dead-letter bad input. SIGTERM or "
        "SIGINT (Ctrl-C) finishes the batch and exits 0; a second one exits at once with 130 (Ctrl-C) or 143 "
        "(SIGTERM), leaving the entries in hand pending for another worker to take over."
    )
    parser.epilog = (
        "Exit codes: 0 stopped cleanly (or idle, with --until-idle), 1 Redis refused a command, 2 bad configuration, "
        "a layout mismatch, credentials Redis refused or a TLS certificate not verified at start, the functions "
        "library not loaded (see load-functions), or a key of the namespace holding another type (named, with what to "
        "do), 130 or 143 stopped at once by a second Ctrl-C or SIGTERM."
    )
    parser.add_argument(
        "--until-idle",
        action="store_true",
        help="exit 0 once nothing is left to read or pending (for batch jobs and tests)",
    )
    # every setting but the administrator's URL, which a worker must never be given
    add_settings_flags(parser, only=[name for name in Settings.model_fields if name != "admin_redis_url"])
    parser.set_defaults(handler=_run)
