"""Rate-limited warnings: trouble is reported, never raised into the caller, never spammed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fleetscope.util.redact import redact

DEFAULT_INTERVAL_S = 60.0
# the attribute of a warning's log record that holds its kind (``record.warn_kind``)
WARN_KIND = "warn_kind"


class RateLimitedWarner:
    """Emits at most one ``logging`` warning per ``interval`` seconds for each *kind*.

    Warnings of a kind that arrive inside the interval are counted, and the next warning of
    that kind that is emitted says how many were suppressed. One instance per sink, so two
    sinks never silence each other. Every message (and prefix) goes through
    :func:`fleetscope.util.redact.redact`: no password, token or API key reaches the log.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "",
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._prefix = prefix
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> bool:
        """Warn about ``message`` unless ``kind`` was warned about recently. Returns if emitted."""
        with self._lock:
            now = self._clock()
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return False
            suppressed = self._suppressed.pop(kind, 0)
            self._last[kind] = now
        if suppressed:
            message = (
                f"{message} ({suppressed} similar warning(s) suppressed in the last "
                f"{self._interval:g} s)"
            )
        # the kind rides with the record, for handlers that relay warnings elsewhere (a Ray
        # shard's go to the driver, which rate-limits them again by kind)
        self._logger.warning(
            "%s%s", redact(self._prefix), redact(message), extra={WARN_KIND: redact(kind)}
        )
        return True

    def suppressed(self, kind: str) -> int:
        """How many warnings of ``kind`` are currently being held back."""
        with self._lock:
            return self._suppressed.get(kind, 0)
