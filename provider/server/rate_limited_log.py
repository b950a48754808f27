"""A log that says one message per interval at most, so that a flood does not flood the log."""
from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """Logs one message per ``interval_s`` at most, counting those it left out: a flood of
    connections (or of failed accepts) must not flood the log."""

    def __init__(self, logger: logging.Logger, level: int, interval_s: float = 10.0) -> None:
        self._logger, self._level, self._interval_s = logger, level, interval_s
        self._lock = threading.Lock()
        self._next = 0.0
        self._skipped = 0

    def __call__(self, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._skipped += 1
                return
            self._next, skipped, self._skipped = now + self._interval_s, self._skipped, 0
        if skipped:
            msg, args = msg + " (and %d more times since the last such message)", (*args, skipped)
        self._logger.log(self._level, msg, *args)
