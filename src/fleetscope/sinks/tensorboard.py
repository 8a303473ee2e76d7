"""TensorBoard sink: every poll as one event of scalars, the run summary at the final step.

``tensorboard`` is imported only when a :class:`TensorBoardSink` is built (``pip install
'fleetscope[tensorboard]'``); it writes event files with TensorBoard's own framework-free writer
(``tensorboard.summary.writer.event_file_writer.EventFileWriter``), no TensorFlow or PyTorch.

What is written (read it back with ``tensorboard --logdir LOGDIR`` or
``tensorboard.backend.event_processing.event_accumulator.EventAccumulator``):

* each poll: one ``Event(step=step, wall_time=wall_time)`` holding one scalar
  (``simple_value``, float32) per numeric key, tagged with the key verbatim
  (``inference/agg/kv_cache_usage_perc/mean``; TensorBoard allows any tag text, labels such as
  ``{finished_reason=length}`` included). Strings are skipped: charts need numbers.
* the run summary: numeric values as scalars tagged ``summary/{key}`` and string values (such
  as ``run_status``) as text (the Text tab) tagged ``summary/{key}``, all at the step of the last
  poll logged (0 if none). Summaries published again (``log_summary`` twice) add points at that
  same step; the one written last is the current value.

Values are float32 in the event file (TensorBoard's scalar type): compare with a relative
tolerance of about 1e-7, or to ``numpy.float32(value)`` exactly. Every poll is flushed to disk
so a running TensorBoard sees it. Tracker trouble (disk full, a closed sink) never raises: it is
a rate-limited warning and the data is dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetscope.sinks.base import SinkBase, Value, numeric
from fleetscope.util.warn import RateLimitedWarner

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = "summary/"


class TensorBoardSink(SinkBase):
    """Writes fleet keys as TensorBoard scalars into an event file in ``logdir``.

    ``logdir`` is the run directory (created if missing); point ``tensorboard --logdir`` at it
    or at its parent. Construction errors (tensorboard missing, ``logdir`` not writable) raise;
    after that nothing does. It gets the full key set (the complete pass-through).
    """

    extra = "tensorboard"
    key_set = "full"

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        filename_suffix: str = "",
        max_queue_size: int = 64,
    ) -> None:
        event_pb2, text_pb, EventFileWriter = self._import_extra(
            "tensorboard.compat.proto.event_pb2",
            "tensorboard.plugins.text.summary_v2:text_pb",
            "tensorboard.summary.writer.event_file_writer:EventFileWriter",
        )
        self._event_pb2 = event_pb2
        self._text_pb = text_pb
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._warner = RateLimitedWarner(logger, prefix=f"TensorBoardSink({self.logdir}): ")
        self._writer: Any = EventFileWriter(
            os.fspath(self.logdir),
            max_queue_size=max_queue_size,
            flush_secs=30,
            filename_suffix=filename_suffix,
        )
        self.last_step = 0

    @property
    def event_file(self) -> str | None:
        """Path of the event file being written (None once closed)."""
        return getattr(self._writer, "_file_name", None)

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        try:
            event = self._event_pb2.Event(wall_time=float(wall_time), step=int(step))
            values = event.summary.value
            for key, v in metrics.items():
                f = numeric(v)
                if f is not None:
                    values.add(tag=str(key), simple_value=f)
        except Exception as e:  # a value protobuf will not take: drop the poll, never raise
            self._warner.warn("encode", f"dropped poll {step}: {type(e).__name__}: {e}")
            return
        if self._write(event, kind="log", what=f"poll {step}"):
            self.last_step = max(self.last_step, int(step))

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        try:
            event = self._event_pb2.Event(wall_time=time.time(), step=self.last_step)
            values = event.summary.value
            for key, v in summary.items():
                tag = SUMMARY_PREFIX + str(key)
                f = numeric(v)
                if f is not None:
                    values.add(tag=tag, simple_value=f)
                elif v is not None:
                    values.extend(self._text_pb(tag, str(v)).value)
        except Exception as e:
            self._warner.warn("encode-summary", f"dropped the summary: {type(e).__name__}: {e}")
            return
        self._write(event, kind="summary", what="the summary")

    def _write(self, event: Any, *, kind: str, what: str) -> bool:
        with self._lock:
            if self._writer is None:
                self._warner.warn(f"closed-{kind}", f"dropped {what}: sink is closed")
                return False
            try:
                self._writer.add_event(event)
                self._writer.flush()
            except Exception as e:
                self._warner.warn(f"write-{kind}", f"dropped {what}: {type(e).__name__}: {e}")
                return False
        return True

    def close(self) -> None:
        """Flush and close the event file. Idempotent."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as e:
                self._warner.warn("close", f"error closing the event file: {e!r}")
