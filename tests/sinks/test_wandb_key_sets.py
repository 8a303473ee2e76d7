"""W&B's key sets, read back from offline runs: the compact default and ``keys="full"``.

A real Collector watches the demo's simulated fleet (8 engines: two plain dp2 servers, a dp2
prefill and a dp2 decode server, on loopback) through plain polls and a ``train`` and an
``eval`` window, with a JsonlSink, a ``WandbSink()`` (compact) and a ``WandbSink(keys="full")``
side by side. Both runs are read back with ``wandb leet inspect`` (see test_sinks_jsonl_wandb.py).

* compact: <= 1,500 keys in every row (window-stop rows included), <= 3,000 distinct keys in the
  run, every prime-rl overview panel key and every engine's headline metrics that the JSONL has,
  values equal to the JSONL's; the run summary is the compact subset of the JSONL's.
* full: every row's keys and values equal the JSONL line's, and the summary equals it.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetscope.collector.core import Collector
from fleetscope.dashboards.wandb_workspace import inference_panels, panel_keys
from fleetscope.keys import HEADLINE_METRICS
from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet

NONFINITE = {"NaN", "Infinity", "-Infinity"}
PER_POLL = 1500
PER_RUN = 3000


def leet_records(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def same(a: Any, b: Any) -> bool:
    """W&B writes non-finite floats as strings, JSONL as null; everything else is exact."""
    if isinstance(a, str) and a in NONFINITE:
        return b is None
    return bool(a == b)


@dataclass
class Run:
    rows: list[dict[str, Any]]  # history rows without W&B's own keys and the step axes
    summary: dict[str, Any]


def read_run(root: Path) -> Run:
    files = sorted(root.rglob("*.wandb"))
    assert len(files) == 1, files
    records = leet_records(files[0])
    rows = []
    for r in records:
        if r["type"] == "history":
            item = {k: v for k, v in r["history"]["item"].items() if not k.startswith("_")}
            item.pop("inference/wall_time")
            rows.append(item)
    summary: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    return Run(rows, summary)


@dataclass
class Scenario:
    polls: list[dict[str, Any]]
    summary: dict[str, Any]
    compact: Run
    full: Run


async def _drive(fleet: SimFleet, server: FleetServer, sinks: list[Any]) -> None:
    endpoints = [
        Endpoint(url, role=ep.role) for url, ep in zip(server.urls, fleet.endpoints, strict=True)
    ]
    collector = Collector(endpoints, interval=3600, sinks=sinks)  # every poll explicit
    await collector.poll()
    for label in ("train", "eval"):
        fleet.step(2.0)
        window = collector.window(label)
        await window.astart()
        for _ in range(3):
            fleet.step(2.0)
            await collector.poll()
        fleet.step(2.0)
        await window.astop()
        fleet.step(2.0)
        await collector.poll()
    await collector.stop()  # a last poll, the run summary, sinks closed


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    pytest.importorskip("wandb")
    from fleetscope.sinks.wandb import WandbSink

    tmp = tmp_path_factory.mktemp("wandb_key_sets")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "WANDB_MODE": "offline",
            "WANDB_DIR": str(tmp),
            "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
            "WANDB_DATA_DIR": str(tmp / "wandb-data"),
            "WANDB_SILENT": "true",
            "NETRC": str(tmp / "no-netrc"),
        }.items():
            mp.setenv(name, value)
        mp.delenv("WANDB_API_KEY", raising=False)
        fleet = SimFleet.build(4, dp=2, roles=[None, None, "prefill", "decode"], seed=0)
        fleet.step(3.0)
        (tmp / "compact").mkdir()
        (tmp / "full").mkdir()
        sinks = [
            JsonlSink(tmp / "polls.jsonl"),
            WandbSink(project="fleetscope-test", dir=tmp / "compact", name="compact"),
            WandbSink(project="fleetscope-test", dir=tmp / "full", name="full", keys="full"),
        ]
        with FleetServer(fleet) as server:
            asyncio.run(_drive(fleet, server, sinks))
        polls, summary = read_jsonl(tmp / "polls.jsonl")
        return Scenario(polls, summary, read_run(tmp / "compact"), read_run(tmp / "full"))


def numeric(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not isinstance(v, str)}


def test_full_equals_the_jsonl_sink(scenario: Scenario) -> None:
    rows = scenario.full.rows
    assert [r.pop("inference/step") for r in rows] == [p["step"] for p in scenario.polls]
    for row, poll in zip(rows, scenario.polls, strict=True):
        theirs = numeric(poll["metrics"])
        assert row.keys() == theirs.keys(), poll["step"]
        assert all(same(row[k], theirs[k]) for k in theirs), poll["step"]
    assert max(len(r) for r in rows) > 3000  # the complete pass-through at 8 engines
    for k, v in scenario.summary.items():
        assert same(scenario.full.summary[k], v), k


def test_compact_bounds_and_required_keys(scenario: Scenario) -> None:
    rows = [dict(r) for r in scenario.compact.rows]
    assert [r.pop("inference/step") for r in rows] == [p["step"] for p in scenario.polls]
    sizes = [len(r) for r in rows]
    distinct = {k for r in rows for k in r}
    assert max(sizes) <= PER_POLL, sizes
    assert len(distinct) <= PER_RUN, len(distinct)
    # ... and it is a real reduction of the same polls
    full_distinct = {k for p in scenario.polls for k in numeric(p["metrics"])}
    assert distinct <= full_distinct and len(full_distinct) > 2 * len(distinct)

    panels = panel_keys(inference_panels(False)) | panel_keys(inference_panels(True))
    for row, poll in zip(rows, scenario.polls, strict=True):
        theirs = numeric(poll["metrics"])
        assert row.keys() <= theirs.keys()
        assert all(same(row[k], theirs[k]) for k in row), poll["step"]
        # every overview panel key and every engine's headline metrics the poll has
        wanted = {k for k in theirs if k in panels}
        wanted |= {k for k in theirs if k.split("/", 2)[-1] in HEADLINE_METRICS}
        assert wanted <= row.keys(), (poll["step"], sorted(wanted - row.keys())[:5])
    interval_polls = [set(numeric(p["metrics"])) & panels for p in scenario.polls[2:]]
    assert max(len(s) for s in interval_polls) > 40  # the panels' keys were there to check
    # the windows' keys ride in their stop rows, compact too
    for label in ("train", "eval"):
        stop = [r for r in rows if f"inference/{label}/agg/generation_tokens_total/delta" in r]
        assert len(stop) == 1, label
        assert f"inference/{label}/agg/time_to_first_token_seconds/p90" in stop[0]
        assert f"inference/{label}/agg/time_to_first_token_seconds:mean/pooled" in stop[0]
        assert f"inference/{label}/agg/generation_tokens_total:rate/median" not in stop[0]


def test_compact_summary_is_a_subset_of_the_jsonl_summary(scenario: Scenario) -> None:
    ours = {k: v for k, v in scenario.compact.summary.items() if k.startswith("inference_summary/")}
    theirs = {k: v for k, v in scenario.summary.items() if k.startswith("inference_summary/")}
    assert ours.keys() <= theirs.keys() and len(theirs) > 2 * len(ours)
    assert all(same(ours[k], theirs[k]) for k in ours)
    assert scenario.compact.summary["run_status"] == "success"
    for label in ("train", "eval", "combined"):
        for key in (
            "agg/generation_tokens_total/delta",
            "agg/generation_tokens_total:rate/sum",
            "agg/time_to_first_token_seconds/p90",
            "decode/request_time_per_output_token_seconds:mean/pooled",
            "coverage",
        ):
            assert f"inference_summary/{label}/{key}" in ours, (label, key)
    assert math.isfinite(ours["inference_summary/combined/agg/generation_tokens_total/delta"])
