"""A simulated vLLM 0.32 / SGLang 0.5.23 fleet: real expositions, a load model, faults.

Quick use::

    from fleetscope_sim import SimFleet, FleetServer

    fleet = SimFleet.build(3, dp=2, roles=["prefill", "decode", "decode"], seed=1)
    fleet.step(1.0)                                   # state changes only here
    body = fleet.endpoints[0].render()                # bytes, as vLLM would serve them
    with FleetServer(fleet) as server:                # 127.0.0.1, one port per endpoint
        httpx.get(server.metrics_urls[1])
        fleet.endpoint("decode1").set_http_error(500) # faults, see SimEndpoint
    fleet.endpoint("decode0").engines[0].truth.counter("vllm:generation_tokens_total")
    mixed = SimFleet.build(4, dp=2, engine_kind="mixed")  # server0, server2 vLLM; 1, 3 SGLang
    mixed.endpoint("server1").truth_total("sglang:generation_tokens_total")

Pieces: ``vllm_families`` (the catalogue, plain data: ``FamilySpec`` in ``family_spec``, the
``python_*`` / ``process_*`` / ``http_*`` families in ``vllm_server_families``),
``engine.SimEngine`` (one engine core: its load in ``engine_load``, its load model in
``engine_scheduler``, what it records in ``engine_metrics``), ``endpoint.SimEndpoint`` (one API
server: its exposition in ``endpoint_exposition``, HTTP answers in ``endpoint_http``, faults in
``endpoint_faults``), ``fleet.SimFleet`` (endpoints on one clock and lock),
``fleet_server.FleetServer`` (asyncio HTTP), ``server`` (``serve_forever``, the command line),
``rl.SimRL`` (``endpoint.rl``: vLLM's RL routes -- pause, weight version, sleep mode in
``rl_sleep``, weight transfer in ``rl_transfer``, their timed families in ``rl_metrics`` --
with a call ledger and ground truth). Below them: ``clock`` (``SimClock``, the server process's
start), ``hosts`` (the Protocols through which engines and ``SimRL`` see their endpoint) and
``exposition_rows`` (the sample rows both writers share).
SGLang mode: ``sglang_families`` (SGLang 0.5.23's families), ``sglang_engine.SglangEngine`` (the
same load model recording SGLang's metrics), ``sglang_endpoint.SglangEndpoint`` (a tokenizer and
one scheduler per DP replica, multiprocess body, SGLang's side routes).

Command-line entry (for ``fleetscope simulate``)::

    cli_main(argv: Sequence[str] | None = None) -> int
        --endpoints N --dp K --roles none,prefill,decode | --prefill P --decode D
        --port-base PORT --step-interval S --mode single|multiprocess --seed N
        --model-name NAME --max-model-len L --arrival-rate R --duration S
        --engines vllm|sglang|mixed

    serve_forever(endpoints=4, dp=1, roles=None, port_base=None, step_interval=1.0, *,
                  mode=None, seed=0, model_name="tinymodel", max_model_len=512,
                  arrival_rate=None, duration=None, stop_event=None, log=print,
                  engine_kind="vllm") -> None
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
from .fleet import SimFleet, endpoint_kinds
from .fleet_server import FleetServer
from .ledger import HistogramCounts, Ledger, Truth
from .server import cli_main, serve_forever
from .sglang_endpoint import SglangEndpoint
from .sglang_engine import SglangEngine

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
    "SglangEndpoint",
    "SglangEngine",
    "SimClock",
    "SimEndpoint",
    "SimEngine",
    "SimFleet",
    "Truth",
    "cli_main",
    "endpoint_kinds",
    "serve_forever",
]
