"""JSONL sink: one JSON object per line, flushed as written, readable with :func:`read_jsonl`.

Line formats::

    {"step": 0, "wall_time": 1700000000.25, "metrics": {"inference/x": 1.5, ...}}
    {"summary": {"inference/total": 12, ...}}

Whole lines or nothing: each line is built in full and written with one ``write`` of
line + newline; a short or failed write (disk full) is truncated back to the end of the last
whole line, and ``append=True`` first cuts a torn last line left by a crash, so a torn line
never sits mid-file. :func:`read_jsonl` still skips (and reports) any torn or malformed line.

Non-finite floats (NaN, +inf, -inf) are written as ``null``, keeping the key, so every line is
strict JSON (RFC 8259) that any parser reads. Reading back, such values are ``None``; which of
NaN/inf it was is not kept. Values that are neither numbers nor strings are written as ``str()``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import numbers
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetscope.sinks.base import SinkBase, Value
from fleetscope.util.warn import RateLimitedWarner

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


class JsonlSink(SinkBase):
    """Writes each poll and each summary as one JSON line, flushing after every line.

    ``append=False`` (the default) truncates an existing file; ``append=True`` adds to it (a
    later read then sees the polls of every run written to it). Write errors are warned about
    (at most once a minute per kind) and the line is dropped; they never raise into the caller.
    It gets the full key set (the complete pass-through), never the compact one.
    """

    key_set = "full"

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._warner = RateLimitedWarner(logger, prefix=f"JsonlSink({self.path}): ")
        # unbuffered: each line is one os.write of the whole line (see _write_whole); the
        # offset just after the last whole line is kept to cut a torn write back to
        flags = os.O_WRONLY | os.O_CREAT | (0 if append else os.O_TRUNC)
        self._fd: int | None = os.open(self.path, flags, 0o644)
        self._good = os.lseek(self._fd, 0, os.SEEK_END)
        if append and self._good:
            self._good = self._cut_torn_tail()

    def _cut_torn_tail(self) -> int:
        """Appending to a file whose last line was torn (a crash mid-write): cut it off, so the
        new lines start on a line of their own. Returns the new end."""
        assert self._fd is not None
        end = self._good
        with open(self.path, "rb") as f:
            f.seek(max(0, end - 1))
            if f.read(1) == b"\n":
                return end
            pos = end
            while pos > 0:  # back to the last newline, 64 KiB at a time
                lo = max(0, pos - 65536)
                f.seek(lo)
                chunk = f.read(pos - lo)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    pos = lo + nl + 1
                    break
                pos = lo
        self._warner.warn("torn-tail", f"cut a torn last line ({end - pos} bytes) before appending")
        os.ftruncate(self._fd, pos)
        os.lseek(self._fd, pos, os.SEEK_SET)
        return pos

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
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                self._warner.warn(f"closed-{kind}", f"dropped a {kind} line: sink is closed")
                return
            try:
                self._write_whole(data)
            except OSError as e:
                self._warner.warn(f"write-{kind}", f"dropped a {kind} line: {e!r}")

    def _write_whole(self, data: bytes) -> None:
        """Append ``data`` (one line) whole, or leave the file as it was: a short or failed
        write (disk full, quota) is truncated back to the end of the last whole line, so the
        next line never lands after a torn one."""
        assert self._fd is not None
        start = self._good
        written = 0
        try:
            while written < len(data):
                n = os.write(self._fd, data[written:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                written += n
        except OSError:
            if written:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                    os.lseek(self._fd, start, os.SEEK_SET)
            raise
        self._good = start + written

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as e:
                self._warner.warn("close", f"error closing file: {e!r}")


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    errors: list[tuple[int, str]] | None = None,
    strict: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, JsonValue]]:
    """Read a file written by :class:`JsonlSink`.

    Returns ``(polls, summary)``: ``polls`` is the list of ``{"step", "wall_time", "metrics"}``
    dicts in file order; ``summary`` merges every ``{"summary": ...}`` line in order, so for
    each key the last value written wins (like W&B's ``run.summary.update``).

    Torn or malformed lines (a crash or a full disk mid-write, a file edited by hand) are
    skipped, wherever they are: each is appended to ``errors`` (if a list is given) as
    ``(line number, reason)``, and one warning gives their count. A final line without its
    newline (the sink was killed mid-write) is skipped the same way. ``strict=True`` raises
    ``ValueError`` for the first malformed line instead (except a torn final line).
    """
    polls: list[dict[str, Any]] = []
    summary: dict[str, JsonValue] = {}
    bad: list[tuple[int, str]] = []
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        problem = None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            obj = None
            problem = f"not JSON: {e}"
            if lineno == len(lines):  # last line without its newline: a torn write
                bad.append((lineno, "torn last line (no newline)"))
                break
        if problem is None and not isinstance(obj, dict):
            problem = "expected a JSON object"
        if problem is None:
            assert isinstance(obj, dict)
            if "summary" in obj and isinstance(obj["summary"], dict):
                summary.update(obj["summary"])
                continue
            if "metrics" in obj and isinstance(obj["metrics"], dict):
                polls.append(obj)
                continue
            problem = "neither a poll nor a summary line"
        if strict:
            raise ValueError(f"{path}:{lineno}: {problem}")
        bad.append((lineno, problem))
    mid = [b for b in bad if b[0] != len(lines)]  # a torn last line may be a write under way
    if mid:
        logger.warning(
            "read_jsonl(%s): skipped %d torn or malformed line(s) (first: line %d: %s)",
            path,
            len(mid),
            mid[0][0],
            mid[0][1][:200],
        )
    if errors is not None:
        errors.extend(bad)
    return polls, summary
