"""A simulated vLLM 0.32 fleet: real prometheus_client expositions, a load model, faults.

Quick use::

    from fleetscope.simulate import SimFleet, FleetServer

    fleet = SimFleet.build(3, dp=2, roles=["prefill", "decode", "decode"], seed=1)
    fleet.step(1.0)                                   # state changes only here
    body = fleet.endpoints[0].render()                # bytes, as vLLM would serve them
    with FleetServer(fleet) as server:                # 127.0.0.1, one port per endpoint
        httpx.get(server.metrics_urls[1])
        fleet.endpoint("decode1").set_http_error(500) # faults, see SimEndpoint
    fleet.endpoint("decode0").engines[0].truth.counter("vllm:generation_tokens_total")

Pieces: ``vllm_families`` (the catalogue, plain data), ``engine.SimEngine`` (one engine core and
its load model), ``endpoint.SimEndpoint`` (one API server: registry, modes, faults),
``fleet.SimFleet`` (endpoints on one clock and lock), ``server.FleetServer`` (asyncio HTTP).

Command-line entry (for ``fleetscope simulate``)::

    cli_main(argv: Sequence[str] | None = None) -> int
        --endpoints N --dp K --roles none,prefill,decode | --prefill P --decode D
        --port-base PORT --step-interval S --mode single|multiprocess --seed N
        --model-name NAME --max-model-len L --arrival-rate R --duration S

    serve_forever(endpoints=4, dp=1, roles=None, port_base=None, step_interval=1.0, *,
                  mode=None, seed=0, model_name="tinymodel", max_model_len=512,
                  arrival_rate=None, duration=None, stop_event=None, log=print) -> None
"""

from .endpoint import (
    CONTENT_TYPE_LATEST,
    GARBAGE_BODY,
    EndpointFaults,
    MetricsResponse,
    SimClock,
    SimEndpoint,
)
from .engine import LAZY_SERIES_DONORS, LoadProfile, SimEngine
from .fleet import SimFleet
from .ledger import HistogramCounts, Ledger, Truth
from .server import FleetServer, cli_main, serve_forever

__all__ = [
    "CONTENT_TYPE_LATEST",
    "GARBAGE_BODY",
    "LAZY_SERIES_DONORS",
    "EndpointFaults",
    "FleetServer",
    "HistogramCounts",
    "Ledger",
    "LoadProfile",
    "MetricsResponse",
    "SimClock",
    "SimEndpoint",
    "SimEngine",
    "SimFleet",
    "Truth",
    "cli_main",
    "serve_forever",
]
