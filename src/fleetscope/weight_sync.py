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
from types import TracebackType
from typing import TYPE_CHECKING

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
