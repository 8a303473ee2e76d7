"""The collector's RL methods (docs/rl-lifecycle.md): policy versions, ``/weight_info``
probes and weight-sync boundaries. A mixin of :class:`~fleetscope.collector.core.Collector`; the
bookkeeping lives in :mod:`fleetscope.rl.versions` and :mod:`fleetscope.rl.weight_sync`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from fleetscope.rl.states import EngineStates
from fleetscope.rl.versions import WEIGHT_INFO_DEADLINE, PolicyVersions
from fleetscope.rl.weight_sync import WeightSyncHandle, WeightSyncs

if TYPE_CHECKING:
    from fleetscope.collector.core import Collector
    from fleetscope.fleet.pipeline import PollPipeline
    from fleetscope.fleet.view import FleetView


class RLLifecycle:
    """Policy versions, version skew and weight syncs of a collector."""

    versions: PolicyVersions
    syncs: WeightSyncs
    states: EngineStates
    _version_client: Any

    def _init_rl(self, pipeline: PollPipeline) -> None:
        self.versions = pipeline.versions
        self.syncs = pipeline.syncs
        self.states = pipeline.states
        self._version_client = None

    async def _close_rl(self) -> None:
        self.versions.cancel_probes()
        self.states.cancel_probes()
        if self._version_client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._version_client.aclose(), timeout=5)
            self._version_client = None

    def set_policy_version(self, version: str) -> None:
        """The trainer's policy is now ``version`` (any thread): from the next poll on, each
        endpoint's ``/weight_info`` is compared with it (docs/rl-lifecycle.md)."""
        self.versions.announce(version)
        self.states.in_use = True

    @property
    def policy_version(self) -> str | None:
        """The trainer's policy version as last announced (None before the first)."""
        return self.versions.policy_version

    def weight_sync(self, version: str) -> WeightSyncHandle:
        """Bracket a weight sync: ``with`` / ``async with``; a poll at entry and at exit, then
        ``version`` is the policy version (docs/rl-lifecycle.md)."""
        return WeightSyncHandle(cast("Collector", self), version)

    async def _sync_boundary(
        self, action: str, handle: WeightSyncHandle, *, ok: bool = True
    ) -> dict[str, float]:
        c = cast("Collector", self)
        self.states.in_use = True
        if action == "exit" and ok:  # before the exit poll: it already judges the new version
            self.versions.announce(handle.version)
        keys: dict[str, float] = {}

        async def at_boundary(view: FleetView) -> Mapping[str, float]:
            t = view.result.time
            if action == "enter":
                await c._in_stats(self.syncs.enter, handle.token, handle.version, t)
            else:
                keys.update(await c._in_stats(self._sync_exit, handle.token, t, ok))
            return keys

        await c._poll(at_boundary)
        return keys

    def _sync_exit(self, token: int, now: float, ok: bool) -> dict[str, float]:
        return self.syncs.exit(token, now, cast("Collector", self)._prefix, ok=ok)

    def _rl_window_keys(self, label: str) -> dict[str, float]:
        """A stopped window's RL keys: stale token share, paused / asleep engine-seconds."""
        prefix = cast("Collector", self)._prefix
        out = self.versions.window_keys(label, prefix)
        out.update(self.states.window_keys(label, prefix))
        return out

    async def _version_probes(self) -> list[asyncio.Task[None]]:
        """This poll's ``/weight_info`` (once a policy version is set), ``/is_paused`` and
        ``/is_sleeping`` requests (see ``CollectorConfig.rl_probes``)."""
        c = cast("Collector", self)
        if not (self.versions.active or self.states.probing) or not c.endpoints:
            return []
        if self._version_client is None:
            from fleetscope.sources.http.client import new_client

            # off the loop: with TLS verification httpx loads the CA bundle synchronously
            self._version_client = await asyncio.get_running_loop().run_in_executor(
                None, new_client, dict(c.config.headers), c.config.verify, c.timeout
            )
        deadline = min(c.timeout, WEIGHT_INFO_DEADLINE)
        client, endpoints = self._version_client, c.endpoints
        return [
            *self.versions.probe(client, endpoints, deadline=deadline),
            *self.states.probe(client, endpoints, deadline=deadline),
        ]
