"""``fleetscope watch`` says which side is the bottleneck (docs/rules.md §3.13): an idle
simulated fleet is ``engines_idle`` (idle share >= 0.9), an overloaded one
``engines_saturated`` (saturated share >= 0.5); the five shares are in the JSONL summary and sum
to 1 for every label and scope, and the final table on stdout names the verdict.

Every wait is on an event (polls in the JSONL, the process' exit), never a fixed sleep.
"""

from __future__ import annotations

import math
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_cli_watch import DEADLINE_S, base_env, fleetscope_cmd, polls_in, wait_until

from fleetscope.sinks.jsonl import read_jsonl
from fleetscope.stats.breakdown import PHASES
from fleetscope_sim import FleetServer, LoadProfile, SimFleet

pytestmark = pytest.mark.slow


@contextmanager
def fleet_url(arrival_rate: float) -> Iterator[str]:
    fleet = SimFleet(seed=9)
    fleet.add_endpoint(dp=2, load=LoadProfile(arrival_rate=arrival_rate))
    fleet.step(5.0)  # the overloaded fleet's queue is long before the first scrape
    with FleetServer(fleet, step_interval=0.25) as server:
        yield server.url("server0")


def watch(url: str, out: Path, polls: int = 6) -> tuple[dict[str, Any], str]:
    """``watch`` until ``polls`` rows are in the JSONL, then SIGTERM: its summary, its stdout
    (not a terminal: one line per poll, then the final tables)."""
    cmd = [*fleetscope_cmd(), "watch", url, "--interval", "0.4", "--jsonl", str(out)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env()
    )
    try:
        wait_until(lambda: polls_in(out) >= polls, proc, f"{polls} polls in the JSONL")
        proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    _, summary = read_jsonl(out)
    assert summary is not None and summary["run_status"] == "success"
    return summary, " ".join(stdout.split())


def assert_shares_sum_to_one(summary: dict[str, Any]) -> None:
    bases = {k.rsplit("/engine_time/", 1)[0] for k in summary if "/engine_time/" in k}
    assert {"inference_summary/combined/agg", "inference_summary/idle/agg"} <= bases
    for b in bases:
        total = math.fsum(summary[f"{b}/engine_time/{p}_share"] for p in PHASES)
        assert total == pytest.approx(1.0, abs=1e-12), b


def test_an_idle_fleet_is_engines_idle(tmp_path: Path) -> None:
    with fleet_url(0.0) as url:
        summary, stdout = watch(url, tmp_path / "polls.jsonl")
    assert_shares_sum_to_one(summary)
    for label in ("combined", "idle"):  # no window: every poll is the `idle` label's
        assert summary[f"inference_summary/{label}/agg/engine_time/idle_share"] >= 0.9
        assert summary[f"inference_summary/{label}/bottleneck"] == "engines_idle"
    assert "where the engines' time went" in stdout and "engines_idle" in stdout


def test_an_overloaded_fleet_is_engines_saturated(tmp_path: Path) -> None:
    with fleet_url(80.0) as url:
        summary, stdout = watch(url, tmp_path / "polls.jsonl")
    assert_shares_sum_to_one(summary)
    b = "inference_summary/combined"
    assert summary[f"{b}/agg/engine_time/saturated_share"] >= 0.5
    assert summary[f"{b}/bottleneck"] == "engines_saturated"
    assert summary[f"{b}/agg/engine_time/tokens_per_busy_engine_second"] > 0
    assert "engines_saturated" in stdout
    # the run's engine-seconds: two engines over the run's polled seconds
    secs = summary[f"{b}/agg/engine_time/engine_seconds"]
    assert secs == pytest.approx(2 * summary[f"{b}/active_seconds"], rel=0.2)


def test_the_summary_keeps_its_strings_and_numbers_apart(tmp_path: Path) -> None:
    """The verdict is a string in the summary only; every poll row stays numeric."""
    with fleet_url(0.0) as url:
        summary, _ = watch(url, tmp_path / "polls.jsonl", polls=3)
        polls, _ = read_jsonl(tmp_path / "polls.jsonl")
    assert isinstance(summary["inference_summary/combined/bottleneck"], str)
    assert polls
    for row in polls:
        assert not [k for k, v in row["metrics"].items() if isinstance(v, str)], row["step"]
