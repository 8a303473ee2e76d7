"""``fleetscope demo``: a simulated fleet on loopback, watched end to end for ~30 s.

Starts two plain servers with two data-parallel engines each and a prefill/decode pair, watches
them with the live view, logs to W&B (offline unless an API key is set) and JSONL, runs a
``train`` and an ``eval`` window, stalls one decode engine half way, and ends by printing where
the results are and a short summary. ``engines="mixed"``: the second plain server is a
simulated SGLang 0.5.23 server (two DP replicas), so ``agg`` pools vLLM and SGLang engines
(quantiles on their shared bucket bounds, ``.../pooled_bounds``); ``engines="sglang"``: every
server is SGLang.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleetscope.collector.core import Collector
from fleetscope.health import HealthThresholds
from fleetscope.identity import Role
from fleetscope.sinks.base import Sink
from fleetscope.sinks.jsonl import JsonlSink
from fleetscope.sinks.terminal import TerminalSink
from fleetscope.sources.http.source import Endpoint

log = logging.getLogger("fleetscope")


@dataclass
class DemoResult:
    out_dir: Path
    jsonl: Path
    wandb_dir: Path | None
    summary: dict[str, float | str]
    polls: int


async def run_demo(
    *,
    duration: float = 30.0,
    interval: float = 2.0,
    out_dir: Path = Path("fleetscope-demo"),
    use_wandb: bool = True,
    live: bool | None = None,
    seed: int = 0,
    engines: str = "vllm",
) -> DemoResult:
    from fleetscope_sim.fleet import SimFleet
    from fleetscope_sim.server import FleetServer

    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl_path = out_dir / "polls.jsonl"
    sinks: list[Sink] = [TerminalSink(live=live, title="fleetscope demo"), JsonlSink(jsonl_path)]
    wandb_dir = None
    if use_wandb:
        os.environ.setdefault("WANDB_SILENT", "true")  # the demo prints its own report
        try:
            from fleetscope.sinks.wandb import WandbSink

            # W&B keeps its files in a `wandb` folder of the dir it is given: OUT/wandb/
            sinks.append(WandbSink(project="fleetscope-demo", dir=str(out_dir), name="demo"))
            wandb_dir = out_dir / "wandb"
        except ImportError as e:
            print(f"W&B not installed ({e}); logging to JSONL only")
            wandb_dir = None

    fleet = SimFleet(seed=seed)
    roles: list[Role | None] = [None, None, "prefill", "decode"]
    for role, kind in zip(roles, demo_kinds(engines), strict=True):
        fleet.add_endpoint(role=role, dp=2, engine_kind=kind)
    fleet.step(3.0)  # engines already busy when we attach
    with FleetServer(fleet, step_interval=0.5) as server:
        endpoints = [
            Endpoint(url, role=ep.role)
            for url, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        # the demo compresses a run into seconds: judge a stall over 3 s, not a real fleet's 30
        health = HealthThresholds(stall_seconds=3.0, outlier_seconds=3.0)
        collector = Collector(endpoints, interval=interval, sinks=sinks, health_thresholds=health)
        t0 = time.monotonic()
        async with collector:
            train = collector.window("train")
            await train.astart()
            await asyncio.sleep(duration * 0.45)
            await _until_tokens(collector)  # each part of the run saw tokens
            await train.astop()
            # the fault: one decode engine stops generating while its requests stay running
            fleet.endpoint("decode0").stall(engine=0)
            # the gap between the windows holds a poll that saw tokens, whatever the machine's
            # load (counted under `idle`); bounded, so a fleet that makes no tokens cannot
            # hang the demo
            await _until_tokens(collector)
            ev = collector.window("eval")
            await ev.astart()
            # at least 4 s, however late a loaded machine got here: the stall (judged over 3 s)
            # must show in the eval window
            await asyncio.sleep(max(4.0, duration - (time.monotonic() - t0) - 1))
            await _until_tokens(collector)
            await ev.astop()
        summary = collector.summary()
        # the summary's count: the final poll at stop included (the collector's step is not)
        polls = int(summary.get("inference_summary/combined/polls", collector.state.step))
    return DemoResult(out_dir, jsonl_path, wandb_dir, summary, polls)


def demo_kinds(engines: str) -> list[str]:
    """Engine kind of the demo's four servers (server0, server1, prefill0, decode0)."""
    if engines == "mixed":
        return ["vllm", "sglang", "vllm", "vllm"]
    if engines in ("vllm", "sglang"):
        return [engines] * 4
    raise ValueError(f"engines must be vllm, sglang or mixed, not {engines!r}")


async def _until_tokens(collector: Collector, *, polls: int = 40) -> None:
    """Wait for a row of the collector's own loop that shows generated tokens (at most
    ``polls`` rows, and a bound in time). The loop's rows, not explicit polls: a poll moments
    after another would be held (docs/rules.md §3 item 12) and add a row for nothing."""
    key = "inference/agg/generation_tokens_total/delta"
    seen = collector.last.step if collector.last is not None else -1
    end = time.monotonic() + polls * collector.interval + 30.0
    while polls > 0 and time.monotonic() < end:
        await asyncio.sleep(0.05)
        view = collector.last
        if view is None or view.step == seen:
            continue
        seen, polls = view.step, polls - 1
        if (view.keys.get(key) or 0) > 0:
            return


def print_report(result: DemoResult) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fleetscope.sinks.terminal import engine_time_table

    c = Console()
    s = result.summary
    c.rule("[bold]fleetscope demo: done")
    t = Table(show_header=True, header_style="bold")
    t.add_column("run label")
    t.add_column("gen tokens", justify="right")
    t.add_column("gen tok/s", justify="right")
    t.add_column("prefix hit", justify="right")
    t.add_column("TTFT p90 (s)", justify="right")
    t.add_column("TTFT bounds", justify="right")
    t.add_column("coverage", justify="right")
    for label in ("train", "eval", "idle", "combined"):
        b = f"inference_summary/{label}"
        gen = s.get(f"{b}/agg/generation_tokens_total/delta")
        if gen is None:
            continue
        rate = s.get(f"{b}/agg/generation_tokens_total:rate/sum")
        hit = s.get(f"{b}/agg/prefix_cache_hit_rate/pooled")
        p90 = s.get(f"{b}/agg/time_to_first_token_seconds/p90")
        nb = s.get(f"{b}/agg/time_to_first_token_seconds/pooled_bounds")
        cov = s.get(f"{b}/coverage")
        t.add_row(
            label,
            f"{gen:,.0f}",
            "—" if rate is None else f"{rate:,.1f}",
            "—" if hit is None else f"{hit:.1%}",
            "—" if p90 is None else f"{p90:.3f}",
            "—" if nb is None else f"{nb:.0f}",
            "—" if cov is None else f"{cov:.0%}",
        )
    c.print(t)
    breakdown = engine_time_table(s)  # where the engines' time went, and the verdict
    if breakdown is not None:
        c.print(breakdown)
    c.print(f"polls: {result.polls}   run_status: {s.get('run_status')}")
    kinds = {k.rsplit("/", 2)[-2]: v for k, v in s.items() if k.endswith("/engine_version") and v}
    if kinds:
        c.print("servers: " + ", ".join(f"{n} {v}" for n, v in sorted(kinds.items())))
    # soft_wrap: a path longer than the console is never broken across lines (copy-paste)
    c.print(f"JSONL (every poll + summary): [bold]{escape(str(result.jsonl))}[/]", soft_wrap=True)
    if result.wandb_dir is not None:
        runs = sorted(result.wandb_dir.glob("*run-*"))
        where = escape(str(runs[-1] if runs else result.wandb_dir))
        c.print(f"W&B run files: [bold]{where}[/]", soft_wrap=True)
        c.print(f"upload later with: wandb sync {where}", soft_wrap=True)
    c.print(
        "The injected fault: decode0.0 stalled during the eval window; see "
        "inference/health/generation_stalled and "
        "inference/decode/generation_tokens_total:rate/min in the JSONL."
    )
