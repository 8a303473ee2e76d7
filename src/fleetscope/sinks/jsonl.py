"""JSONL sink: one JSON object per line, flushed as written, readable with :func:`read_jsonl`.

Line formats::

    {"step": 0, "wall_time": 1700000000.25, "metrics": {"inference/x": 1.5, ...}}
    {"summary": {"inference/total": 12, ...}}

Non-finite floats (NaN, +inf, -inf) are written as ``null``, keeping the key, so every line is
strict JSON (RFC 8259) that any parser reads. Reading back, such values are ``None``; which of
NaN/inf it was is not kept. Values that are neither numbers nor strings are written as ``str()``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fleetscope._warn import RateLimitedWarner
from fleetscope.sinks.base import Value

logger = logging.getLogger(__name__)

JsonValue = float | int | str | bool | None


def _clean(value: Any) -> JsonValue:
    """One metric value as strict JSON: non-finite floats become ``None``."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    return str(value)


def _clean_mapping(metrics: Mapping[str, Any]) -> dict[str, JsonValue]:
    return {str(k): _clean(v) for k, v in metrics.items()}


class JsonlSink:
    """Writes each poll and each summary as one JSON line, flushing after every line.

    ``append=False`` (the default) truncates an existing file; ``append=True`` adds to it (a
    later read then sees the polls of every run written to it). Write errors are warned about
    (at most once a minute per kind) and the line is dropped; they never raise into the caller.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._warner = RateLimitedWarner(logger, prefix=f"JsonlSink({self.path}): ")
        self._fh: IO[str] | None = open(  # noqa: SIM115 - held open for the sink's lifetime
            self.path, "a" if append else "w", encoding="utf-8"
        )

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        record = {
            "step": int(step),
            "wall_time": _clean(wall_time),
            "metrics": _clean_mapping(metrics),
        }
        self._write(record, kind="log")

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        self._write({"summary": _clean_mapping(summary)}, kind="summary")

    def _write(self, record: dict[str, Any], *, kind: str) -> None:
        try:
            line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:  # cannot happen after _clean; never raise anyway
            self._warner.warn(f"encode-{kind}", f"dropped a {kind} line: {e!r}")
            return
        with self._lock:
            if self._fh is None:
                self._warner.warn(f"closed-{kind}", f"dropped a {kind} line: sink is closed")
                return
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
            except (OSError, ValueError) as e:
                self._warner.warn(f"write-{kind}", f"dropped a {kind} line: {e!r}")

    def close(self) -> None:
        with self._lock:
            fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError as e:
                self._warner.warn("close", f"error closing file: {e!r}")

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(
    path: str | os.PathLike[str],
) -> tuple[list[dict[str, Any]], dict[str, JsonValue]]:
    """Read a file written by :class:`JsonlSink`.

    Returns ``(polls, summary)``: ``polls`` is the list of ``{"step", "wall_time", "metrics"}``
    dicts in file order; ``summary`` merges every ``{"summary": ...}`` line in order, so for
    each key the last value written wins (like W&B's ``run.summary.update``). A final line cut
    short by a crash mid-write is ignored; any other malformed line raises ``ValueError``.
    """
    polls: list[dict[str, Any]] = []
    summary: dict[str, JsonValue] = {}
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # last line without its newline: a torn write
                break
            raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object")
        if "summary" in obj:
            summary.update(obj["summary"])
        elif "metrics" in obj:
            polls.append(obj)
        else:
            raise ValueError(f"{path}:{lineno}: neither a poll nor a summary line")
    return polls, summary
