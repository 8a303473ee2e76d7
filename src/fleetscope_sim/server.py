"""Run a simulated fleet in real time: ``serve_forever`` and the ``fleetscope simulate`` CLI.

``serve_forever`` builds a fleet, serves it on loopback with ``FleetServer`` (the HTTP server,
:mod:`~fleetscope_sim.fleet_server`, re-exported here) and steps it by the real elapsed
time until interrupted; ``cli_main`` parses the command line into it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from .endpoint import Mode
from .engine import LoadProfile, Role
from .fleet import SimFleet
from .fleet_server import HOST, FleetServer

__all__ = ["HOST", "FleetServer", "cli_main", "serve_forever"]


def serve_forever(
    endpoints: int = 4,
    dp: int = 1,
    roles: Sequence[Role] | None = None,
    port_base: int | None = None,
    step_interval: float = 1.0,
    *,
    mode: Mode | None = None,
    seed: int = 0,
    model_name: str = "tinymodel",
    max_model_len: int = 512,
    arrival_rate: float | None = None,
    duration: float | None = None,
    stop_event: threading.Event | None = None,
    log: Callable[[str], None] = print,
    engine_kind: str = "vllm",
) -> None:
    """Build a fleet, serve it on loopback and step it in real time until interrupted.

    Args:
        endpoints: number of API servers (ignored if ``roles`` is given: one per role).
        dp: engines per server (``dp > 1`` -> multiprocess exposition unless ``mode`` is set).
        roles: ``None``/``"prefill"``/``"decode"`` per endpoint (names ``prefill0``, ``decode0``).
        port_base: first port (endpoint ``i`` on ``port_base + i``); ``None``: OS-chosen ports.
        step_interval: seconds between fleet steps (each step advances by the real elapsed time).
        mode, seed, model_name, max_model_len: see ``SimFleet.build``.
        arrival_rate: requests/s per engine (default ``LoadProfile().arrival_rate``).
        duration: stop after this many seconds (default: run until Ctrl-C or ``stop_event``).
        stop_event: stop when this event is set.
        log: where the URL list goes.
        engine_kind: ``vllm``, ``sglang`` or ``mixed`` (see ``SimFleet.build``).
    """
    if roles is not None:
        endpoints = len(roles)
    load = LoadProfile() if arrival_rate is None else LoadProfile(arrival_rate=arrival_rate)
    fleet = SimFleet.build(
        endpoints,
        dp=dp,
        roles=roles,
        mode=mode,
        model_name=model_name,
        max_model_len=max_model_len,
        load=load,
        seed=seed,
        record_observations=False,
        engine_kind=engine_kind,
    )
    stop = stop_event or threading.Event()
    if stop_event is None and threading.current_thread() is threading.main_thread():
        # Ctrl-C and SIGTERM stop the fleet cleanly, also when the shell started us with SIGINT
        # ignored (a background job of a non-interactive shell inherits SIG_IGN)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with FleetServer(fleet, port_base=port_base, step_interval=step_interval) as server:
        for endpoint, url in zip(fleet.endpoints, server.urls, strict=True):
            role = endpoint.role or "-"
            log(
                f"{endpoint.name:<10} {endpoint.engine_kind:<6} role={role:<8} "
                f"dp={len(endpoint.engines)} {url}/metrics"
            )
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait(duration)


def _parse_roles(text: str) -> list[Role]:
    roles: list[Role] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item in ("", "none", "-", "server"):
            roles.append(None)
        elif item in ("prefill", "decode"):
            roles.append(item)  # type: ignore[arg-type]
        else:
            raise argparse.ArgumentTypeError(f"unknown role {item!r}")
    return roles


def cli_main(argv: Sequence[str] | None = None) -> int:
    """``fleetscope simulate`` entry point: parse ``argv`` and ``serve_forever``."""
    parser = argparse.ArgumentParser(
        prog="fleetscope simulate",
        description="Serve a simulated vLLM 0.32 / SGLang 0.5.23 fleet on 127.0.0.1 (one port"
        " per endpoint).",
    )
    parser.add_argument(
        "--engines",
        choices=["vllm", "sglang", "mixed"],
        default="vllm",
        help="engine kind of the servers (mixed: vLLM and SGLang alternately)",
    )
    parser.add_argument("--endpoints", type=int, default=4, help="number of API servers")
    parser.add_argument("--dp", type=int, default=1, help="engines per API server")
    parser.add_argument(
        "--roles", type=_parse_roles, default=None, help="comma list: none|prefill|decode"
    )
    parser.add_argument("--prefill", type=int, default=0, help="prefill servers (P/D mode)")
    parser.add_argument("--decode", type=int, default=0, help="decode servers (P/D mode)")
    parser.add_argument("--port-base", type=int, default=None, help="first port (default: any)")
    parser.add_argument("--step-interval", type=float, default=1.0, help="seconds per step")
    parser.add_argument("--mode", choices=["single", "multiprocess"], default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-name", default="tinymodel")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--arrival-rate", type=float, default=None, help="req/s per engine")
    parser.add_argument("--duration", type=float, default=None, help="seconds, then exit")
    args = parser.parse_args(argv)
    roles = args.roles
    if roles is None and (args.prefill or args.decode):
        roles = ["prefill"] * args.prefill + ["decode"] * args.decode
    try:
        _serve(args, roles)
    except OSError as e:
        if e.errno not in _LISTEN_ERRORS:
            raise
        n = len(roles) if roles else args.endpoints
        print(_listen_problem(e, args.port_base, n), file=sys.stderr)
        return 1
    return 0


#: why a port cannot be listened on: taken, not ours to take, not on this machine
_LISTEN_ERRORS = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)


def _listen_problem(e: OSError, port_base: int | None, n: int) -> str:
    """``fleetscope simulate`` could not listen: one line saying what to do."""
    reason = os.strerror(e.errno) if e.errno is not None else str(e)
    if port_base is None:
        return f"fleetscope simulate: cannot listen on {HOST}: {reason}"
    ports = f"port {port_base}" if n == 1 else f"ports {port_base}-{port_base + n - 1}"
    return (
        f"fleetscope simulate: cannot listen on {HOST} {ports}: {reason}; choose another "
        "--port-base, or leave it out to use free ports"
    )


def _serve(args: argparse.Namespace, roles: list[Role] | None) -> None:
    serve_forever(
        endpoints=args.endpoints,
        dp=args.dp,
        roles=roles,
        port_base=args.port_base,
        step_interval=args.step_interval,
        mode=args.mode,
        seed=args.seed,
        model_name=args.model_name,
        max_model_len=args.max_model_len,
        arrival_rate=args.arrival_rate,
        duration=args.duration,
        engine_kind=args.engines,
    )
