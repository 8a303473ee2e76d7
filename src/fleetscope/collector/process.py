"""``isolation="process"``: a :class:`~fleetscope.collector.core.Collector` whose work runs in a
supervised child process (its :class:`ProcessBackend`), so a trainer's event loop and GIL pay
almost nothing for it.

The trainer's process keeps what must live there: the poll schedule, window and weight-sync
handles, the sinks (a ``WandbSink(run=...)`` writes into the trainer's own run) and ``on_poll``.
The child (:mod:`fleetscope.collector.child`, started with :mod:`subprocess` rather than
:mod:`multiprocessing`, whose spawn would re-run the trainer's ``__main__``) scrapes, parses,
and computes deltas, reductions, windows, health and keys. Per poll the trainer receives one
message, the finished row, decoded on a reader thread; views (``last``, ``on_poll``) are light:
``view.result`` has the reduced statistics, keys, events and scrape outcomes, but no raw
bodies, deltas or per-engine inputs.

Supervision: boundary replies, and a poll reply every 30 s, carry the child's state as bytes the
trainer keeps without decoding. If the child dies (or stops answering within
``max(60 s, 4 x timeout)``) it is restarted from that state with the current endpoints and
policy version, the command in flight is sent again once, and the trainer is told: a warning
and ``{prefix}/collector/child_restarts_total``. Open windows continue from the saved poll:
what happened since (counted by the dead child, or before the new one's fresh baselines) is not
in their sums, and their coverage says so. The child lives exactly as long as the trainer's
process, whatever thread started or restarted it: it watches that process and exits when it
dies (:func:`fleetscope.collector.child.exit_with_parent`), and when its connection closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from fleetscope.collector.backend import Publish
from fleetscope.collector.link import ChildLink, ChildUnavailable
from fleetscope.fleet.config import ISOLATION_AUTO_ENDPOINTS, CollectorConfig
from fleetscope.fleet.view import FleetView
from fleetscope.sources.base import Endpoint, Source
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["ChildUnavailable", "ProcessBackend", "wants_process"]


def wants_process(endpoints: Sequence[object], options: Mapping[str, Any]) -> bool:
    """Whether ``Collector(endpoints, **options)`` runs its work in a child process."""
    cfg = options.get("config")
    mode = options.get("isolation") or (cfg or CollectorConfig()).isolation
    return mode == "process" or (mode == "auto" and len(endpoints) >= ISOLATION_AUTO_ENDPOINTS)


class ProcessBackend:
    """A collector's polls and statistics in a child process (module doc); every command
    answered there, every finished row published here. ``sharding``: the child's collector is
    a ``ShardedCollector`` on the trainer's Ray cluster (``sharded.collector.child_collector``)."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        config: CollectorConfig,
        publish: Publish,
        warner: RateLimitedWarner,
        *,
        sharding: Mapping[str, Any] | None = None,
    ):
        self.config = config
        self.link = ChildLink(endpoints, config, sharding=sharding)
        self.source: Source = self.link  # the membership methods; the child scrapes
        self._publish = publish
        self._warner = warner
        self._lock: asyncio.Lock | None = None
        self._last: FleetView | None = None  # the last row published
        self._final: tuple[dict[str, Any], dict[str, Any]] | None = None  # after aclose()
        self.link.call("ping")  # the child imports and builds its collector from now on

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the child process is up (its start-up is otherwise in the first poll)."""
        await asyncio.wait_for(asyncio.wrap_future(self.link.call("ping")), timeout)

    # ------------------------------------------------------------------ commands

    @property
    def _reply_deadline(self) -> float:
        return max(60.0, 4 * self.config.timeout)

    async def _ask(self, kind: str, *args: Any) -> Any:
        """A command's reply; a dead or hung child is restarted and asked once more."""
        for attempt in (0, 1):
            fut = self.link.call(kind, *args)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(fut), self._reply_deadline)
            except TimeoutError:
                self._warner.warn(
                    "child-hung",
                    f"the collector's child process did not answer in {self._reply_deadline:g} "
                    "s: killed it",
                )
                self.link.kill()
            except ChildUnavailable:
                if attempt:
                    raise
        raise ChildUnavailable("the collector's child process did not answer")

    def _ask_blocking(self, kind: str, *args: Any) -> Any:
        """:meth:`_ask` for synchronous callers (any thread: the reply is resolved by the
        link's reader thread, never by an event loop)."""
        for attempt in (0, 1):
            try:
                return self.link.call(kind, *args).result(self._reply_deadline)
            except concurrent.futures.TimeoutError:
                self.link.kill()
            except ChildUnavailable:
                if attempt:
                    raise
        raise ChildUnavailable("the collector's child process did not answer")

    async def _row(self, kind: str, *args: Any) -> tuple[FleetView, dict[str, float]]:
        """A command that takes a poll: publish its row here, as an in-process poll does."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            t0 = time.monotonic()
            view, keys, state, roles = await self._ask(kind, *args)
            self.link.keep_state(state)
            self.link.note_roles(roles)
            self._last = view
            self._publish(view, t0)
            return view, keys or {}

    async def poll(self, *, row_floor: float = 0.0) -> FleetView:
        try:
            view, _ = await self._row("poll", row_floor)
        except ChildUnavailable as e:
            self._warner.warn("child-poll", f"poll skipped: {e}")
            if self._last is None:
                raise
            return self._last
        return view

    async def window(self, action: str, label: str) -> dict[str, float]:
        _, keys = await self._row("window", action, label)
        return keys

    async def sync(self, action: str, token: int, version: str, *, ok: bool) -> dict[str, float]:
        if action == "exit" and ok:
            self.link.policy = version
        _, keys = await self._row("sync", action, token, version, ok)
        return keys

    async def close_windows(self, now: float) -> None:
        self.link.keep_state(await self._ask("close_windows"))

    async def aclose(self, status: str) -> None:
        # what an in-process collector still answers after stop(): kept from the child's last
        # answers before it exits
        with contextlib.suppress(Exception):
            self._final = (await self._ask("summary", status), await self._ask("state_dict"))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.link.aclose(), timeout=15)

    # ------------------------------------------------------------------ RL

    @property
    def policy_version(self) -> str | None:
        return self.link.policy

    def set_policy_version(self, version: str) -> None:
        if not isinstance(version, str):
            raise TypeError(f"a policy version is a string, not {type(version).__name__}")
        self.link.policy = version
        self.link.call("policy", version)

    # ------------------------------------------------------------------ summary and state

    def summary(self, status: str) -> dict[str, float | str]:
        if self._final is not None:
            return {**self._final[0], "run_status": status}
        return cast(dict[str, float | str], self._ask_blocking("summary", status))

    async def asummary(self, status: str) -> dict[str, float | str]:
        if self._final is not None:
            return self.summary(status)
        return cast(dict[str, float | str], await self._ask("summary", status))

    def state_dict(self) -> dict[str, Any]:
        if self._final is not None:
            return copy.deepcopy(self._final[1])
        return cast(dict[str, Any], self._ask_blocking("state_dict"))

    def load_state_dict(self, state: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        active, paused, policy, blob = self._ask_blocking("load_state_dict", dict(state))
        self.link.keep_state(blob)
        self.link.policy = policy
        return list(active), list(paused)

    def collector_keys(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/collector/child_restarts_total": float(self.link.restarts)}
