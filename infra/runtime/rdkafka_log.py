"""librdkafka's log lines through Python logging, rate-limited.

Left alone, librdkafka prints every connection failure straight to stderr: ~20 lines a second
while a broker is down, 300-600 before a command gives up. Every client ldpipe makes logs to
:data:`RDKAFKA_LOGGER` instead (``KafkaSettings`` sets librdkafka's ``logger``), whose filter
lets one line of each kind (facility and client) through per :data:`INTERVAL_SECONDS` and says
how many it held back.

>>> limiter = RateLimit(interval=60.0, clock=iter([0.0, 1.0, 61.0]).__next__)
>>> def record(msg):
...     args = ("FAIL", "c-1", msg)
...     return logging.LogRecord("x", logging.ERROR, "", 0, "%s [%s] %s", args, None)
>>> [limiter.filter(record(m)) for m in ("a", "b", "c")]
[True, False, True]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["INTERVAL_SECONDS", "RDKAFKA_LOGGER", "RateLimit"]

INTERVAL_SECONDS = 30.0


class RateLimit(logging.Filter):
    """Pass one record per ``interval`` seconds for each (facility, client); count the rest."""

    def __init__(
        self, interval: float = INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = args[:2] if len(args) >= 2 else record.msg
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self.interval:g} s)"
        return True


RDKAFKA_LOGGER = logging.getLogger("ldpipe.rdkafka")
RDKAFKA_LOGGER.addFilter(RateLimit())
