"""What the lower pieces of the simulator read of the API server they belong to.

An engine (:mod:`~fleetscope_sim.engine`) and the RL state (:mod:`~fleetscope_sim.rl`) hold a
back-reference to their :class:`~fleetscope_sim.endpoint.SimEndpoint`; they see it through
these Protocols, so that they do not import the endpoint that is assembled from them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal, Protocol

from .clock import SimClock
from .ledger import Ledger, SeriesKey, Truth

#: an endpoint's disaggregated-serving role (``None``: neither)
Role = Literal["prefill", "decode"] | None


class EngineHost(Protocol):
    """The API server as its engines see it (``SimEngine.endpoint``)."""

    name: str
    role: Role
    max_model_len: int
    clock: SimClock
    exported: Ledger
    truth: Truth
    _last_step_sim: float

    def _wall_now(self) -> float: ...

    def _add(self, family: str, amount: float, key: SeriesKey) -> None: ...

    def _record_rejection(self, reason: str) -> None: ...

    def _record_http(
        self, handler: int, prompt_tokens: int, gen_tokens: int, e2e: float
    ) -> None: ...


class RLEngine(Protocol):
    """An engine core as the RL routes see it (pause and sleep mode: see ``rl_sleep``)."""

    scheduler_paused: bool
    sleeping_tags: set[str]
    sleep_state: tuple[float, float, float]

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def is_sleeping(self) -> bool: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> bool: ...

    def _update_sleep_gauge(self) -> None: ...


class RLHost(Protocol):
    """The API server as its RL state sees it (``SimRL.endpoint``)."""

    engine_kind: str
    record_observations: bool
    truth: Truth
    _lock: threading.RLock
    _last_step_sim: float

    @property
    def engines(self) -> Sequence[RLEngine]: ...

    def _touch(self) -> None: ...

    def _wall_now(self) -> float: ...
