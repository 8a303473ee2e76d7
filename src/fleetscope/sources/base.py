"""The source contract: what every source (HTTP, Ray agents, a Prometheus server, shards) gives
the collector each poll.

A :class:`Source` scrapes one poll's worth of endpoints and returns one :class:`ScrapeResult`
per endpoint, failed or not. It also reports what left the fleet since the last poll
(:meth:`Source.take_departures`): endpoints removed by the user and engines gone for good (a
restarted Ray actor's old worker), so open windows stop expecting them. Sources whose fleet can
be changed by the user also implement :class:`MembershipSource`, whose members are
:class:`Endpoint` (a base URL with its name and role: the HTTP source's, and the Ray source's
per-node ones).

Clocks, one per field:

* ``ScrapeResult.time``: **this process' monotonic clock** (``time.monotonic()``) at the moment
  the values were taken: the response's arrival for HTTP; for a Prometheus server, the target's
  own scrape time translated to this clock. Deltas, rates, windows and coverage use only it.
* ``ScrapeResult.wall_time``: Unix seconds of the same moment, for trackers' x axes and for
  comparing with engines' own start times (``process_start_time_seconds``, ``_created``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fleetscope.identity import Role, validate_endpoint_name

if TYPE_CHECKING:
    from fleetscope.exposition import Exposition
    from fleetscope.identity import EngineId


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One base URL serving ``/metrics`` (a vLLM API server), with its name and role."""

    url: str
    name: str = ""
    role: Role | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name:
            validate_endpoint_name(self.name)
        if self.role not in (None, "prefill", "decode"):
            raise ValueError(f"role must be 'prefill', 'decode' or None, not {self.role!r}")

    @property
    def metrics_url(self) -> str:
        u = self.url.rstrip("/")
        return u if u.endswith("/metrics") else u + "/metrics"

    @property
    def base_url(self) -> str:
        u = self.url.rstrip("/")
        return u[: -len("/metrics")] if u.endswith("/metrics") else u


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One endpoint's outcome in one poll."""

    endpoint: str
    exposition: Exposition | None  # None when the scrape failed
    time: float  # this process' monotonic seconds when the values were taken (see module doc)
    wall_time: float  # Unix seconds at the same moment
    latency: float = 0.0
    error: str | None = None
    role: Role | None = None
    groups: tuple[str, ...] = ()
    engine_roles: Mapping[str, Role] = field(default_factory=dict)  # per engine label
    # the first scrape since the endpoint joined the fleet (open windows expect it from here)
    joined: bool = False
    # why the source cannot vouch that the endpoint's process lived on since its last success
    # (a failed scrape, a connection closed early: sources/http/continuity.py); "" when it can.
    # Its engines without a start time of their own then count that interval as not observed.
    continuity_doubt: str = ""
    # the server's engine kind (``vllm`` / ``sglang``, from its body) and version (``GET
    # /version``, SGLang's ``/server_info``), once the HTTP source has learnt them
    engine_kind: str | None = None
    server_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.exposition is not None


@dataclass(frozen=True, slots=True)
class Departure:
    """Something that left the fleet: an endpoint (all its engines) or one engine.

    ``time``: its last scrape (this process' monotonic clock); None = the engine's last
    successful scrape, as the statistics know it.
    """

    endpoint: str | None = None
    engine: EngineId | None = None
    time: float | None = None


@runtime_checkable
class Source(Protocol):
    """Anything that yields one poll's scrapes."""

    async def scrape(self) -> list[ScrapeResult]:
        """Scrape every endpoint once. Never raises: failures are failed results."""
        ...

    def take_departures(self) -> list[Departure]:
        """What left the fleet since the last call (each reported once)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class MembershipSource(Source, Protocol):
    """A source whose endpoints the user can change while it runs (thread-safe)."""

    @property
    def endpoints(self) -> Sequence[Endpoint]: ...

    def add_endpoints(self, *endpoints: str | Endpoint) -> list[Endpoint]: ...

    def remove_endpoints(self, *endpoints: str | Endpoint) -> list[str]: ...

    def set_endpoints(
        self, endpoints: Sequence[str | Endpoint]
    ) -> tuple[list[Endpoint], list[str]]: ...


@runtime_checkable
class ModelInfoSource(Protocol):
    """A source that knows each endpoint's ``max_model_len`` (from ``/v1/models``)."""

    max_model_len: Mapping[str, int | None]
