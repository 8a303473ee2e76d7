"""Weight-sync handles: the trainer's side of ``with collector.weight_sync(version):``.

A sync is bracketed like a window: its entry and its exit each take a poll, and what the fleet
did between those two polls (generated tokens, the engines' own
``rl_weight_update_operation_duration_seconds`` per operation) is summed exactly from the
polls' per-engine deltas. On a clean exit the version is announced as the policy version just
before the exit poll (so that poll already judges the engines against it); a sync whose body
raised announces nothing and is counted as failed. Synchronous use needs
``start_background()`` (started on demand) and waits for its boundary poll at most
``config.boundary_wait`` seconds, like window handles.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from fleetscope.rl.engine_deltas import generation_delta, operation_deltas
from fleetscope.rl.spans import RL
from fleetscope.stats.reduce import EngineInput

_TOKENS = itertools.count(1)
log = logging.getLogger("fleetscope")


class SyncBoundaries(Protocol):
    """What a weight-sync handle needs of its collector (the collector's
    :class:`~fleetscope.collector.boundaries.Boundaries`)."""

    async def sync(self, action: str, handle: WeightSyncHandle, *, ok: bool) -> dict[str, float]:
        """Apply a sync's ``enter`` or ``exit`` after a poll; the exit's keys."""
        ...

    def run(self, boundary: Coroutine[Any, Any, dict[str, float]]) -> dict[str, float] | None:
        """Run a boundary from synchronous code, waiting at most ``config.boundary_wait``."""
        ...


class WeightSyncHandle:
    """One weight sync. ``keys`` holds the exit poll's sync keys once it is done."""

    def __init__(self, boundaries: SyncBoundaries, version: str):
        if not isinstance(version, str):
            raise TypeError(f"a policy version is a string, not {type(version).__name__}")
        self.boundaries = boundaries
        self.version = version
        self.token = next(_TOKENS)
        self.keys: dict[str, float] = {}
        self._entered = False

    async def __aenter__(self) -> WeightSyncHandle:
        self._enter()
        await self.boundaries.sync("enter", self, ok=True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.keys = await self.boundaries.sync("exit", self, ok=exc_type is None)

    def __enter__(self) -> WeightSyncHandle:
        self._enter()
        b = self.boundaries
        b.run(b.sync("enter", self, ok=True))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        b = self.boundaries
        self.keys = b.run(b.sync("exit", self, ok=exc_type is None)) or {}

    def _enter(self) -> None:
        if self._entered:
            raise RuntimeError("a weight_sync handle is used once")
        self._entered = True


@dataclass
class _OpenSync:
    version: str
    started: float  # the entry poll's time (monotonic)
    tokens: float = 0.0
    operations: dict[str, list[float]] = field(default_factory=dict)  # op -> [sum, count]


@dataclass
class WeightSyncs:
    """Open weight syncs and the run's totals; fed every poll's deltas."""

    _open: dict[int, _OpenSync] = field(default_factory=dict)
    count: int = 0
    failed: int = 0
    seconds_total: float = 0.0
    tokens_total: float = 0.0
    operations_total: dict[str, list[float]] = field(default_factory=dict)
    interrupted: int = 0  # syncs open at a checkpoint this run was restored from
    _restored_open: list[dict[str, Any]] = field(default_factory=list)  # to report, once
    _last_poll: float | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def poll(
        self, inputs: Iterable[EngineInput], now: float | None = None, prefix: str = "inference"
    ) -> dict[str, float]:
        """A poll's fleet-wide generated tokens and engine update seconds go to every open
        sync (the entry poll's own interval is before the sync and is not counted). Returns
        the keys of syncs reported as interrupted (the first poll after a restore)."""
        with self._lock:
            if now is not None:
                self._last_poll = now
            keys = self._interrupted_keys(prefix)
            if not self._open:
                return keys
            inputs = list(inputs)
            tokens = sum(generation_delta(i.delta) for i in inputs if i.is_engine)
            ops: dict[str, list[float]] = {}
            for i in inputs:
                for op, (s, n) in operation_deltas(i.delta).items():
                    acc = ops.setdefault(op, [0.0, 0.0])
                    acc[0] += s
                    acc[1] += n
            for sync in self._open.values():
                sync.tokens += tokens
                for op, (s, n) in ops.items():
                    acc = sync.operations.setdefault(op, [0.0, 0.0])
                    acc[0] += s
                    acc[1] += n
            return keys

    def _interrupted_keys(self, prefix: str) -> dict[str, float]:
        """Syncs open at the restored checkpoint: reported in the first poll's row."""
        if not self._restored_open:
            return {}
        p = f"{prefix}/{RL}/sync/"
        keys = {
            p + "interrupted": float(len(self._restored_open)),
            p + "interrupted_seconds": sum(o["seconds"] for o in self._restored_open),
            p + "interrupted_generation_tokens": sum(o["tokens"] for o in self._restored_open),
        }
        keys.update(self._totals(p))
        self._restored_open = []
        return keys

    @property
    def open_count(self) -> int:
        """Weight syncs entered and not yet exited."""
        return len(self._open)

    def enter(self, token: int, version: str, now: float) -> None:
        with self._lock:
            self._open[token] = _OpenSync(version, now)

    def exit(self, token: int, now: float, prefix: str, *, ok: bool = True) -> dict[str, float]:
        """Close a sync at its exit poll; its keys (and the run's totals so far)."""
        with self._lock:
            sync = self._open.pop(token, None)
            if sync is None:
                return {}
            seconds = max(0.0, now - sync.started)
            p = f"{prefix}/{RL}/sync/"
            keys = {p + "seconds": seconds, p + "generation_tokens": sync.tokens}
            for op, (s, n) in sorted(sync.operations.items()):
                if n > 0 or s > 0:
                    keys[f"{p}engine_update_seconds{{operation={op}}}"] = s
                    keys[f"{p}engine_update_count{{operation={op}}}"] = n
            if ok:
                self.count += 1
                self.seconds_total += seconds
                self.tokens_total += sync.tokens
                for op, (s, n) in sync.operations.items():
                    acc = self.operations_total.setdefault(op, [0.0, 0.0])
                    acc[0] += s
                    acc[1] += n
            else:
                self.failed += 1
                keys[p + "failed"] = 1.0
            keys.update(self._totals(p))
            return keys

    def _totals(self, p: str) -> dict[str, float]:
        return {
            p + "count": float(self.count),
            p + "failed_total": float(self.failed),
            p + "seconds_total": self.seconds_total,
            p + "generation_tokens_total": self.tokens_total,
            p + "interrupted_total": float(self.interrupted),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the run's sync totals and the syncs still open (each with its version,
        its seconds from its entry poll to the last poll, its tokens and engine update sums so
        far). Saving changes nothing here: an open sync continues in this collector."""
        with self._lock:
            last = self._last_poll
            return {
                "open": [
                    {
                        "version": o.version,
                        "seconds": 0.0 if last is None else max(0.0, last - o.started),
                        "tokens": o.tokens,
                        "operations": {k: list(v) for k, v in o.operations.items()},
                    }
                    for o in self._open.values()
                ],
                "interrupted": self.interrupted,
                "count": self.count,
                "failed": self.failed,
                "seconds_total": self.seconds_total,
                "tokens_total": self.tokens_total,
                "operations_total": {k: list(v) for k, v in self.operations_total.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved totals. A sync open at the checkpoint cannot continue (its
        handle lived in the saved process): it is counted in ``interrupted_total``, warned
        about with its version, and reported once in the next poll's row
        (``sync/interrupted``, ``interrupted_seconds``, ``interrupted_generation_tokens``:
        what it covered until the checkpoint's last poll). Its version is not announced."""
        with self._lock:
            opened = [
                {
                    "version": str(o["version"]),
                    "seconds": float(o["seconds"]),
                    "tokens": float(o["tokens"]),
                }
                for o in state.get("open", [])
            ]
            self.interrupted = int(state.get("interrupted", 0)) + len(opened)
            self._restored_open = opened
            for o in opened:
                log.warning(
                    "fleetscope: the weight sync to %r was open at the checkpoint (%.1f s in): "
                    "counted as interrupted",
                    o["version"],
                    o["seconds"],
                )
            self.count = int(state.get("count", 0))
            self.failed = int(state.get("failed", 0))
            self.seconds_total = float(state.get("seconds_total", 0.0))
            self.tokens_total = float(state.get("tokens_total", 0.0))
            ops = state.get("operations_total", {})
            self.operations_total = {k: [float(v[0]), float(v[1])] for k, v in ops.items()}

    def summary_keys(self, prefix: str) -> dict[str, float]:
        with self._lock:
            if not (self.count or self.failed or self.interrupted):
                return {}
            p = f"{prefix}/{RL}/sync/"
            out = self._totals(p)
            for op, (s, n) in sorted(self.operations_total.items()):
                out[f"{p}engine_update_seconds{{operation={op}}}"] = s
                out[f"{p}engine_update_count{{operation={op}}}"] = n
            return out
