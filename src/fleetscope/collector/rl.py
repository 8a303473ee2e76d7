"""An in-process collector's RL side (docs/rl-lifecycle.md): policy versions, ``/weight_info``,
``/is_paused`` and ``/is_sleeping`` probes, weight-sync bookkeeping. Held by
:class:`~fleetscope.collector.inline.InlineBackend`; the state lives in
:mod:`fleetscope.rl.versions`, :mod:`fleetscope.rl.states` and :mod:`fleetscope.rl.weight_sync`
(the poll pipeline's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.pipeline import PollPipeline
from fleetscope.rl.versions import WEIGHT_INFO_DEADLINE
from fleetscope.sources.base import Endpoint


class InlineRL:
    """Policy versions, version skew, engine states and weight syncs of one pipeline."""

    def __init__(self, pipeline: PollPipeline, config: CollectorConfig):
        self.versions = pipeline.versions
        self.syncs = pipeline.syncs
        self.states = pipeline.states
        self.config = config
        self._client: Any = None  # the probes' HTTP client, built at the first probe

    async def aclose(self) -> None:
        self.versions.cancel_probes()
        self.states.cancel_probes()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.aclose(), timeout=5)
            self._client = None

    def announce(self, version: str) -> None:
        """The trainer's policy is now ``version``: from the next poll on, each endpoint's
        ``/weight_info`` is compared with it."""
        self.versions.announce(version)
        self.states.in_use = True

    @property
    def policy_version(self) -> str | None:
        return self.versions.policy_version

    def before_sync(self, action: str, version: str, ok: bool) -> None:
        """Ahead of a sync boundary's poll: a clean exit announces the version first, so that
        poll already judges the engines against it."""
        self.states.in_use = True
        if action == "exit" and ok:
            self.versions.announce(version)

    def sync_exit(self, token: int, now: float, prefix: str, ok: bool) -> dict[str, float]:
        return self.syncs.exit(token, now, prefix, ok=ok)

    def window_keys(self, label: str, prefix: str) -> dict[str, float]:
        """A stopped window's RL keys: stale token share, paused / asleep engine-seconds."""
        out = self.versions.window_keys(label, prefix)
        out.update(self.states.window_keys(label, prefix))
        return out

    async def probes(self, endpoints: Sequence[Endpoint]) -> list[asyncio.Task[None]]:
        """This poll's ``/weight_info`` (once a policy version is set), ``/is_paused`` and
        ``/is_sleeping`` requests (see ``CollectorConfig.rl_probes``)."""
        if not (self.versions.active or self.states.probing) or not endpoints:
            return []
        cfg = self.config
        if self._client is None:
            from fleetscope.sources.http.client import new_client

            # off the loop: with TLS verification httpx loads the CA bundle synchronously
            self._client = await asyncio.get_running_loop().run_in_executor(
                None, new_client, dict(cfg.headers), cfg.verify, cfg.timeout
            )
        deadline = min(cfg.timeout, WEIGHT_INFO_DEADLINE)
        return [
            *self.versions.probe(self._client, endpoints, deadline=deadline),
            *self.states.probe(self._client, endpoints, deadline=deadline),
        ]
