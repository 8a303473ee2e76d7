"""A simulated fleet scraped in-process at its simulated time: a collector's ``source``.

Scrape times are the fleet's simulated seconds (plus a fixed offset), so every interval a
collector sees is exactly the simulated time between two scrapes, however slowly the test
runs: statistics can be compared with the simulator's truth, which counts simulated seconds.
``on_scrape`` runs at every scrape, before the bodies are rendered (a test answers the RL
probes there: the collector's probes go over HTTP, which this source has none of).
"""

from __future__ import annotations

from collections.abc import Callable

from fleetscope.exposition import Parser
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope_sim import SimFleet

#: added to the simulated seconds: this source's "monotonic" clock
T0 = 1000.0


class SimSource:
    """Every endpoint of ``fleet``, scraped at the fleet's simulated time."""

    def __init__(self, fleet: SimFleet, on_scrape: Callable[[], None] | None = None) -> None:
        self.fleet = fleet
        self.on_scrape = on_scrape
        self._parsers: dict[str, Parser] = {}

    async def scrape(self) -> list[ScrapeResult]:
        if self.on_scrape is not None:
            self.on_scrape()
        fleet = self.fleet
        with fleet.lock:
            t = fleet.clock.sim_time
            wall = fleet.clock.wall_start + t
            out = []
            for ep in fleet.endpoints:
                parser = self._parsers.setdefault(ep.name, Parser())
                expo = parser.parse(ep.render(), time=T0 + t, wall_time=wall)
                roles = expo.engine_roles if ep.role is None else {}
                out.append(
                    ScrapeResult(ep.name, expo, T0 + t, wall, role=ep.role, engine_roles=roles)
                )
        return out

    def take_departures(self) -> list[Departure]:
        return []

    async def aclose(self) -> None:
        return None
