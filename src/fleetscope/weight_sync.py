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
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fleetscope.stats.reduce import EngineInput
from fleetscope.versions import RL, generation_delta, operation_deltas

if TYPE_CHECKING:
    from fleetscope.collector import Collector

_TOKENS = itertools.count(1)


class WeightSyncHandle:
    """One weight sync. ``keys`` holds the exit poll's sync keys once it is done."""

    def __init__(self, collector: Collector, version: str):
        if not isinstance(version, str):
            raise TypeError(f"a policy version is a string, not {type(version).__name__}")
        self.collector = collector
        self.version = version
        self.token = next(_TOKENS)
        self.keys: dict[str, float] = {}
        self._entered = False

    async def __aenter__(self) -> WeightSyncHandle:
        self._enter()
        await self.collector._sync_boundary("enter", self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.keys = await self.collector._sync_boundary("exit", self, ok=exc_type is None)

    def __enter__(self) -> WeightSyncHandle:
        self._enter()
        c = self.collector
        c._run_sync(c._sync_boundary("enter", self), c.config.boundary_wait)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        c = self.collector
        keys = c._run_sync(
            c._sync_boundary("exit", self, ok=exc_type is None), c.config.boundary_wait
        )
        self.keys = keys or {}

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
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def poll(self, inputs: Iterable[EngineInput]) -> None:
        """A poll's fleet-wide generated tokens and engine update seconds go to every open
        sync (the entry poll's own interval is before the sync and is not counted)."""
        with self._lock:
            if not self._open:
                return
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
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the run's sync totals (open syncs are not saved)."""
        with self._lock:
            return {
                "count": self.count,
                "failed": self.failed,
                "seconds_total": self.seconds_total,
                "tokens_total": self.tokens_total,
                "operations_total": {k: list(v) for k, v in self.operations_total.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self.count = int(state.get("count", 0))
            self.failed = int(state.get("failed", 0))
            self.seconds_total = float(state.get("seconds_total", 0.0))
            self.tokens_total = float(state.get("tokens_total", 0.0))
            ops = state.get("operations_total", {})
            self.operations_total = {k: [float(v[0]), float(v[1])] for k, v in ops.items()}

    def summary_keys(self, prefix: str) -> dict[str, float]:
        with self._lock:
            if not (self.count or self.failed):
                return {}
            p = f"{prefix}/{RL}/sync/"
            out = self._totals(p)
            for op, (s, n) in sorted(self.operations_total.items()):
                out[f"{p}engine_update_seconds{{operation={op}}}"] = s
                out[f"{p}engine_update_count{{operation={op}}}"] = n
            return out
