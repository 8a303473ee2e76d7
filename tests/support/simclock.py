"""Keep a simulated fleet's wall clock ahead of ours, however slowly the test runs.

A simulated server's ``process_start_time_seconds`` and ``_created`` values are read from its
fleet's clock (``wall_start + sim_time``), while the collector compares them with *its* wall clock
at each scrape: a process (re)started by the test after a scrape is proven late only if its
start time is after that scrape plus the collector's clock-skew margin (1 s). Tests step the
fleet by simulated seconds, which on an idle machine outpace real time; on a loaded one a poll
can take longer than the step and the real clock overtakes the simulated one, so what the test
did after a scrape would look, by its timestamps, as if it happened before it.
"""

from __future__ import annotations

import time
from typing import Any

from fleetscope_sim import SimFleet
from fleetscope_sim.endpoint import SimClock

# well past the collector's clock-skew margin (fleet.DEFAULT_CLOCK_SKEW = 1 s)
AHEAD_S = 5.0


def keep_clock_ahead(fleet: SimFleet, margin: float = AHEAD_S) -> None:
    """Move the fleet's wall clock forward, if needed, to ``margin`` s past ours now: what the
    simulated servers do from here on is dated after every scrape so far. Like a host's clock
    being set forward: nothing is counted, only later timestamps change; never moves back."""
    clock = fleet.clock
    clock.wall_start = max(clock.wall_start, time.time() + margin - clock.sim_time)


class AheadClock(SimClock):
    """A fleet clock kept ahead of ours all the time (:func:`keep_clock_ahead` at every read),
    for rigs whose tests restart simulated servers without a hook of their own."""

    def __init__(self, wall_start: float | None = None, margin: float = AHEAD_S) -> None:
        self.margin = margin
        super().__init__(wall_start)

    @property
    def wall_start(self) -> float:
        return max(self._wall_start, time.time() + self.margin - self.sim_time)

    @wall_start.setter
    def wall_start(self, value: float) -> None:
        self._wall_start = float(value)


def ahead_fleet(**kw: Any) -> SimFleet:
    """A ``SimFleet`` (no endpoints yet) on an :class:`AheadClock`."""
    fleet = SimFleet(**kw)
    fleet.clock = AheadClock(fleet.clock.wall_start)
    return fleet
