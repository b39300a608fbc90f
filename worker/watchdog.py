"""Noticing, within seconds, a Redis that stopped answering (SIGSTOP, a hung host, a network that drops packets).

The worker's own calls cannot tell a hung server from a long batch: one pipelined batch may legitimately take the
server many seconds, so their socket timeout (`socket_timeout_s`) is long. The watchdog is a thread with its own
connection that sends PING every second with a timeout of `ANSWER_WITHIN_S`: a server that lets it go unanswered is
logged as not answering at once, and again when it answers. It only watches and logs; the worker's loop still waits
out the outage, and a stop request is honoured regardless (see commands/run.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis as redis_lib

from .connection import RedisClient
from .logs import error_message

__all__ = ["ANSWER_WITHIN_S", "Watchdog"]

_EVERY_S = 1.0
"""How often the watchdog pings."""

ANSWER_WITHIN_S = 2.0
"""A PING unanswered this long means the server is not answering (a healthy one answers in well under a ms; a
server busy with a long script or batch is also reported, which is true: it is not answering)."""

_REPEAT_S = 30.0
"""While the server stays silent, the warning is repeated this often."""


class Watchdog:
    """A daemon thread pinging Redis through `client` (a client of its own, with short timeouts) and logging changes."""

    def __init__(self, client: RedisClient, log: Any) -> None:
        self.client = client
        self.log = log
        self.answering = True
        self._silent_since = 0.0
        self._last_warning = 0.0
        self._stop = threading.Event()

    def start(self) -> None:
        self._stop.clear()
        threading.Thread(target=self._loop, name="watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """One PING; logs when the server stops or starts answering. Returns whether it answered."""
        started = time.monotonic()
        try:
            self.client.ping()
        except redis_lib.TimeoutError as error:
            self._silent(started, f"no answer within {ANSWER_WITHIN_S:g} s ({type(error).__name__})")
            return False
        except redis_lib.RedisError as error:
            # refused, reset, LOADING, BUSY...: the worker's loop logs and waits these out itself
            self._reset()
            self.log.debug("watchdog ping failed", error=error_message(error))
            return False
        if not self.answering:
            self.log.warning("redis answers again", silent_s=round(time.monotonic() - self._silent_since, 1))
            self.answering = True
        return True

    def _silent(self, started: float, why: str) -> None:
        now = time.monotonic()
        if self.answering:
            self.answering = False
            self._silent_since = started
            self._last_warning = now
            self.log.warning(
                "redis is not answering",
                why=why,
                hint="the server is stopped, hung, or busy with a long command; the worker waits",
            )
        elif now - self._last_warning >= _REPEAT_S:
            self._last_warning = now
            self.log.warning("redis is still not answering", silent_s=round(now - self._silent_since, 1))
        self._reset()

    def _reset(self) -> None:
        # a connection whose PING timed out may still receive that PONG later: never reuse it
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None:
            pool.disconnect()

    def _loop(self) -> None:
        while not self._stop.wait(_EVERY_S):
            try:
                self.check()
            except Exception as error:  # never let the watchdog take the worker down
                self.log.debug("watchdog error", error=error_message(error))
