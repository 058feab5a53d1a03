"""Logging set-up for the command line (plain text or one JSON object per line), and a
throttle for lines that clients cause.

What a client does wrong (a request that does not parse, a stream refused a
slot) is worth one line, never a traceback, and never a line per request: a
client that repeats it thousands of times must not flood the log. A
:class:`ThrottledLog` lets a burst of lines through, then one every few
seconds, and counts the rest; the next line that gets through says how many
were suppressed since the last. (The metrics count every one.)
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

from agent.settings import LogFormat

THROTTLE_BURST = 10  # lines let through at once
THROTTLE_REFILL_S = 6.0  # then one line per this many seconds (10 a minute)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"))


def configure_logging(level: str, fmt: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The kubernetes client and urllib3 are chatty at INFO.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class ThrottledLog:
    """Warnings through ``logger``, at most ``burst`` at once and one per ``refill_s`` after
    (a token bucket); the rest are counted and reported with the next line let through."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = THROTTLE_BURST,
        refill_s: float = THROTTLE_REFILL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._refill_s = refill_s
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self.suppressed = 0  # since the last line let through

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._refill_s)
        self._last = now
        if self._tokens < 1:
            self.suppressed += 1
            return
        self._tokens -= 1
        if self.suppressed:
            message += " (%d similar lines suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._logger.warning(message, *args)
