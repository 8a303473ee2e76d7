"""Simulated time, and the API server process it dates (shared by endpoints and engines)."""

from __future__ import annotations

import time
from dataclasses import dataclass


class SimClock:
    """Simulated time shared by a fleet: ``sim_time`` seconds since start, and a wall clock.

    ``wall()`` is ``wall_start + sim_time``: the unix time the simulated servers believe it is
    (used for ``_created`` and ``process_start_time_seconds``). When the fleet is stepped by real
    elapsed time (``serve_forever``), it tracks the real clock.
    """

    def __init__(self, wall_start: float | None = None) -> None:
        self.wall_start = time.time() if wall_start is None else float(wall_start)
        self.sim_time = 0.0

    def wall(self) -> float:
        """Simulated unix time now."""
        return self.wall_start + self.sim_time

    def advance(self, dt: float) -> None:
        """Move simulated time forward by ``dt`` seconds."""
        if dt < 0:
            raise ValueError("time only moves forward")
        self.sim_time += dt


@dataclass
class ProcessState:
    """The API server process: when it started (unix and simulated time), its CPU seconds."""

    start_wall: float
    start_sim: float
    cpu_seconds: float = 0.0
