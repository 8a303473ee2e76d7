"""``fleetscope simulate`` and ``fleetscope demo``: the simulated fleet."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands

from fleetscope.cli._common import positive_float


def cmd_simulate(args: argparse.Namespace) -> int:
    from fleetscope_sim.server import cli_main

    return cli_main(args.rest)


def cmd_demo(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    from pathlib import Path

    from fleetscope.cli.demo import print_report, run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    result = asyncio.run(
        run_demo(
            duration=args.duration,
            interval=args.interval,
            out_dir=Path(args.out),
            use_wandb=not args.no_wandb,
            live=None if not args.no_tui else False,
            engines=args.engines,
        )
    )
    print_report(result)
    return 0


def add_demo_parsers(sub: Subcommands) -> None:
    """``simulate`` and ``demo``."""
    sim = sub.add_parser(
        "simulate",
        help="serve a simulated vLLM (or SGLang, or mixed) fleet on loopback",
        add_help=False,
        description="Serve a simulated vLLM 0.32 / SGLang 0.5.23 fleet (see `fleetscope "
        "simulate --help`).",
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_simulate)

    d = sub.add_parser(
        "demo",
        help="watch a simulated fleet for ~30 s: live view, W&B offline, JSONL, one fault",
        usage="%(prog)s [options]",
    )
    d.add_argument("--duration", type=positive_float, default=30.0, help="seconds (30)")
    d.add_argument("--interval", type=positive_float, default=2.0, help="seconds between polls (2)")
    d.add_argument("--out", default="fleetscope-demo", help="output folder")
    d.add_argument("--no-wandb", action="store_true", help="skip the W&B sink")
    d.add_argument("--no-tui", action="store_true", help="print tables instead of a live view")
    d.add_argument(
        "--engines",
        choices=["vllm", "sglang", "mixed"],
        default="vllm",
        help="vllm (default), sglang, or mixed: server1 is an SGLang 0.5.23 server",
    )
    d.set_defaults(func=cmd_demo)
