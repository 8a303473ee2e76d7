"""One simulated vLLM engine core: a continuous-batching scheduler with a paged KV cache.

``SimEngine`` is assembled from one module per concern: what it is loaded with
(:mod:`~fleetscope_sim.engine_load`: ``LoadProfile``, ``SimRequest``), its load model
(:mod:`~fleetscope_sim.engine_scheduler`) and what it records
(:mod:`~fleetscope_sim.engine_metrics`). This module holds its lifecycle (start, restart),
its faults and controls (stall, slowdown, sleep, lazy series, bucket changes) and its readings.

All state changes happen in ``step()`` (or in the fault methods); nothing depends on the wall
clock, so a seed and a sequence of steps give identical values.
"""

from __future__ import annotations

import math
import random
from collections import deque

from . import rl_sleep
from .engine_load import LoadProfile, SimRequest
from .engine_metrics import LAZY_SERIES_DONORS
from .engine_scheduler import EngineScheduler
from .hosts import EngineHost, Role
from .ledger import Ledger, SeriesKey, Truth
from .vllm_families import FAMILIES, FAMILIES_BY_NAME, bucket_bounds

__all__ = [
    "FINISHED_REASONS",
    "LAZY_SERIES_DONORS",
    "LoadProfile",
    "Role",
    "SimEngine",
    "SimRequest",
]

FINISHED_REASONS = FAMILIES_BY_NAME["vllm:request_success_total"].label_values


class SimEngine(EngineScheduler):
    """One vLLM engine core behind an API server (``engine="<index>"``).

    Attributes:
        index: the ``engine`` label value, as an int.
        engine_id: ``"{endpoint name}.{index}"``.
        exported: the counters/histograms ``/metrics`` shows (reset by ``restart()``).
        truth: exact totals added since creation, never reset (see ``ledger.Truth``).
        created: ``_created`` timestamp of every exported series: (family, key) -> unix time.
        gauges: gauge values set by the latest step (family -> key -> value).
        has_stepped: whether a step ran since the (re)start (multiprocess gauges need it).
        start_wall: unix time this engine (re)started.
        stalled / slowdown: fault state, see the methods.
        scheduler_paused / sleeping_tags / sleep_state: vLLM's pause and sleep mode (the
            scheduler paused by ``/pause`` or ``/sleep``; the executor's sleeping tags
            ``weights``, ``kv_cache``; the ``engine_sleep_state`` gauge as ``(awake,
            weights_offloaded, discard_all)``): see :mod:`fleetscope_sim.rl_sleep`.
    """

    def __init__(
        self,
        endpoint: EngineHost,
        index: int,
        load: LoadProfile,
        seed: int | str,
        start_wall: float,
        record_observations: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.index = index
        self.label = str(index)
        self.engine_id = f"{endpoint.name}.{index}"
        self.load = load
        self.record_observations = record_observations
        self._rng = random.Random(f"fleetscope-sim/{seed}/{endpoint.name}/{index}")
        self.bounds: dict[str, tuple[float, ...]] = {
            f.name: bucket_bounds(f, endpoint.max_model_len)
            for f in FAMILIES
            if f.kind == "histogram"
        }
        self.total_blocks = load.num_gpu_blocks
        min_blocks = math.ceil((endpoint.max_model_len + 1) / load.block_size) + 1
        if self.total_blocks < min_blocks:
            raise ValueError(
                f"num_gpu_blocks={self.total_blocks} cannot hold one max_model_len request "
                f"(needs >= {min_blocks} blocks of {load.block_size})"
            )
        self.truth = Truth(record_observations)
        self.arrival_rate = load.arrival_rate
        self.stalled = False
        self.slowdown = 1.0
        self.scheduler_paused = False
        self.sleeping_tags: set[str] = set()
        self.sleep_state: tuple[float, float, float] = rl_sleep.AWAKE
        #: lazy series: family -> list of (new label value, share)
        self.lazy_routes: dict[str, list[tuple[str, float]]] = {}
        self._reset_state(start_wall)

    # -- lifecycle ---------------------------------------------------------------------------
    def _reset_state(self, start_wall: float) -> None:
        """Fresh process: empty queues, new exported ledger with new ``_created`` times."""
        self.start_wall = start_wall
        self._created_seq = 0
        self.now = self.endpoint._last_step_sim
        self._pending: deque[SimRequest] = deque()
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self.used_blocks = 0
        self._step_acc = [0.0, 0.0, 0.0, 0.0]
        self._next_arrival = self._draw_next_arrival(self.now)
        self.has_stepped = False
        self.exported = Ledger(self.record_observations)
        self.created: dict[tuple[str, SeriesKey], float] = {}
        self._create_series()
        self.gauges: dict[str, dict[SeriesKey, float]] = {}
        self._update_gauges()

    def restart(self, start_wall: float | None = None) -> None:
        """Restart this engine's process: in-flight requests are lost, every exported series
        starts again from 0 with a new ``_created``; in multiprocess mode the per-step gauges
        vanish until the next step. Truth keeps counting (and records the restart)."""
        if start_wall is None:
            start_wall = max(self.endpoint._wall_now(), self.start_wall + 0.01)
        self.truth.restarts += 1
        self.truth.restart_times.append(self.endpoint._last_step_sim)
        self.truth.lost_at_restart.append({f: dict(s) for f, s in self.exported.counters.items()})
        self.stalled = False
        self.scheduler_paused = False
        self.sleeping_tags = set()
        self.sleep_state = rl_sleep.AWAKE
        self._reset_state(start_wall)

    def set_arrival_rate(self, rate: float) -> None:
        """Change the request rate (requests per second) from now on."""
        self.arrival_rate = max(0.0, float(rate))
        self._next_arrival = self._draw_next_arrival(max(self.now, self.endpoint._last_step_sim))

    # -- faults and controls (call through SimEndpoint, which takes the lock) --------------
    def stall(self, stalled: bool = True) -> None:
        """Stop (or resume) iterating: running requests stay running, no token is generated,
        arrivals pile up in the waiting queue."""
        self.stalled = stalled

    def set_slowdown(self, factor: float) -> None:
        """Make every iteration ``factor`` times longer (a degraded engine)."""
        if factor <= 0:
            raise ValueError("slowdown factor must be > 0")
        self.slowdown = float(factor)

    def sleep(self, level: int = 1) -> None:
        """vLLM's ``/sleep?level=``: the scheduler pauses (level 0: nothing else), level 1
        offloads the weights, level 2 discards them; no iteration runs until a full wake-up."""
        rl_sleep.sleep(self, level)
        self._update_sleep_gauge()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's ``/wake_up`` (``tags`` as its query; ``None``: all): whether fully awake."""
        awake = rl_sleep.wake_up(self, tags)
        self._update_sleep_gauge()
        return awake

    @property
    def is_sleeping(self) -> bool:
        """What ``EngineCore.is_sleeping`` says: scheduler paused or executor asleep."""
        return self.scheduler_paused or bool(self.sleeping_tags)

    def add_lazy_series(self, family: str, value: str, share: float) -> None:
        """From now on ``share`` of the increments of the family's donor child go to a new
        child ``value`` (created, with its ``_created``, at its first increment)."""
        if family not in LAZY_SERIES_DONORS:
            raise ValueError(f"lazy series supported in {sorted(LAZY_SERIES_DONORS)}")
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        self.lazy_routes.setdefault(family, []).append((value, float(share)))

    def change_buckets(self, family: str, bounds: tuple[float, ...]) -> None:
        """Use another bucket layout for histogram ``family``; existing observations are
        re-counted in the new layout (which needs ``record_observations``)."""
        spec = FAMILIES_BY_NAME.get(family)
        if spec is None or spec.kind != "histogram":
            raise ValueError(f"{family!r} is not a vLLM histogram")
        bounds = tuple(float(b) for b in bounds)
        exported = self.exported.histograms[family][()].rebinned(bounds)
        truth = self.truth.histograms[family][()].rebinned(bounds)
        self.exported.histograms[family][()] = exported
        self.truth.histograms[family][()] = truth
        self.bounds[family] = bounds

    # -- reading -----------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        """Requests in the running batch now."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue now."""
        return len(self._waiting)

    def __repr__(self) -> str:
        return (
            f"SimEngine({self.engine_id}, running={len(self._running)}, "
            f"waiting={len(self._waiting)}, kv={self.used_blocks}/{self.total_blocks})"
        )
