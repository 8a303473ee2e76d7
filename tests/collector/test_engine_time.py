"""Where the engines' time went (docs/rules.md §3.13), against the simulator's truth.

A mixed fleet (two vLLM servers, one SGLang server) goes through six phases, each in its own
window: idle (no request), overloaded (20x the arrivals the engines can serve), busy (the
default load), light (a short request a second per engine: most fall between two scrapes),
paused (``/pause``, sleep level 1 on vLLM, sleep on SGLang) and a weight sync
(``collector.weight_sync`` around a pause and a weight transfer). The simulator counts each
engine's seconds per phase as its load model runs (``engine.truth.phases``, per engine step);
the collector sees only the scrapes, one per simulated second (``support.simsource``: scrape
times are simulated seconds). Each window's shares agree with the truth within the documented
tolerance: one poll interval per engine at each end of the window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from fleetscope.collector.core import Collector
from fleetscope.stats.breakdown import PHASES
from fleetscope_sim import SimFleet
from support.simsource import SimSource

INTERVAL = 1.0  # simulated seconds between polls
WINDOW_POLLS = 20
DP = {"server0": 2, "server1": 1, "server2": 2}
KIND = {"server0": "vllm", "server1": "vllm", "server2": "sglang"}
ENGINES = sum(DP.values())
# the documented tolerance (docs/rules.md §3.13): one poll interval per engine at each end
TOLERANCE = 2 * INTERVAL / (WINDOW_POLLS * INTERVAL)


def truth(fleet: SimFleet) -> dict[str, float]:
    """The fleet's seconds per phase so far (every engine's)."""
    out = dict.fromkeys(PHASES, 0.0)
    for e in fleet.engines():
        for phase, s in e.truth.phases.seconds.items():
            out[phase] += s
    return out


def truth_shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    spent = {p: after[p] - before[p] for p in PHASES}
    total = math.fsum(spent.values())
    return {p: v / total for p, v in spent.items()}


class Rig:
    def __init__(self) -> None:
        self.fleet = SimFleet(seed=11)
        for name, dp in DP.items():
            self.fleet.add_endpoint(name=name, dp=dp, engine_kind=KIND[name])
        self.fleet.step(3.0)
        # the RL probes' answers, as the servers would give them (the source has no HTTP)
        self.c = Collector(
            source=SimSource(self.fleet, on_scrape=self.answer_probes),
            interval=3600,
            fetch_model_info=False,
        )
        self.agreement: dict[str, dict[str, tuple[float, float]]] = {}
        self.run_truth: dict[str, float] = {}

    def answer_probes(self) -> None:
        st = self.c.pipeline.states
        for ep in self.fleet.endpoints:
            st.paused.answers[ep.name] = ep.rl.paused
            st.sleeping.answers[ep.name] = any(e.is_sleeping for e in ep.engines)

    def set_rate(self, rate: float) -> None:
        with self.fleet.lock:
            for e in self.fleet.engines():
                e.set_arrival_rate(rate)

    async def polls(self, n: int) -> None:
        for _ in range(n):
            self.fleet.step(INTERVAL)
            await self.c.poll()

    async def drain(self) -> None:
        """Outside any window: polls until no engine has anything to do."""
        for _ in range(300):
            if not any(e.num_running or e.num_waiting for e in self.fleet.engines()):
                return
            await self.polls(1)
        raise AssertionError("the fleet did not drain")

    @asynccontextmanager
    async def window(self, label: str) -> AsyncIterator[None]:
        w = self.c.window(label)
        self.fleet.step(INTERVAL)
        await w.astart()
        before = truth(self.fleet)
        yield
        self.fleet.step(INTERVAL)
        keys = await w.astop()
        want = truth_shares(before, truth(self.fleet))
        got = {p: keys[f"inference/{label}/agg/engine_time/{p}_share"] for p in PHASES}
        self.agreement[label] = {p: (got[p], want[p]) for p in PHASES}
        assert math.fsum(got.values()) == pytest.approx(1.0, abs=1e-12)


PhaseBody = Callable[[Rig], Awaitable[None]]


async def quiet(rig: Rig) -> None:
    await rig.polls(WINDOW_POLLS - 1)


async def overload(rig: Rig) -> None:
    rig.set_rate(80.0)
    await rig.polls(WINDOW_POLLS - 1)


async def light(rig: Rig) -> None:
    """One short request (a few tokens, ~0.1 s) a second per engine: most start and finish
    between two scrapes that find nothing running."""
    originals = {e: e.load for e in rig.fleet.engines()}
    with rig.fleet.lock:
        for e, load in originals.items():
            e.load = dataclasses.replace(load, output_tokens_median=3.0, max_tokens_choices=(4,))
    rig.set_rate(1.0)
    await rig.polls(WINDOW_POLLS - 1)
    rig.set_rate(0.0)
    with rig.fleet.lock:
        for e, load in originals.items():
            e.load = load


async def hold(rig: Rig) -> None:
    f = rig.fleet
    f.endpoint("server0").rl.call("POST", "/pause")  # a keep-pause
    f.endpoint("server1").rl.call("POST", "/sleep", query="level=1")  # the gauge says asleep
    with f.lock:
        for e in f.endpoint("server2").engines:  # SGLang: only /is_sleeping says it
            e.sleep(1)
    await rig.polls(WINDOW_POLLS - 1)
    f.endpoint("server0").rl.call("POST", "/resume")
    f.endpoint("server1").rl.call("POST", "/wake_up")
    with f.lock:
        for e in f.endpoint("server2").engines:
            e.wake_up()


async def sync(rig: Rig) -> None:
    f, c = rig.fleet, rig.c
    await rig.polls(1)
    f.step(INTERVAL)
    async with c.weight_sync("v1"):
        for ep in f.endpoints:
            ep.rl.pause()
            if KIND[ep.name] == "vllm":
                assert ep.rl.call("POST", "/start_weight_update")[0] == 200
            else:  # SGLang's weight update is not simulated: its transfer is marked active
                ep.rl.transfer.active = True
        await rig.polls(WINDOW_POLLS - 4)
        for ep in f.endpoints:
            if KIND[ep.name] == "vllm":
                body = {"weight_version": "v1"}
                assert ep.rl.call("POST", "/finish_weight_update", body)[0] == 200
            else:
                ep.rl.transfer.active = False
            ep.rl.resume()
        f.step(INTERVAL)  # the exit poll comes a poll after the engines resumed


PHASE_WINDOWS: dict[str, tuple[PhaseBody, str]] = {
    "quiet": (quiet, "idle"),
    "overload": (overload, "saturated"),
    "hold": (hold, "paused"),
    "sync": (sync, "syncing"),
}


async def run_scenario() -> tuple[Rig, dict[str, Any]]:
    rig = Rig()
    c = rig.c
    await c.poll()  # the baseline: the run's intervals start here
    rig.run_truth = truth(rig.fleet)
    rig.set_rate(0.0)
    await rig.drain()
    async with rig.window("quiet"):
        await quiet(rig)
    async with rig.window("overload"):
        await overload(rig)
    rig.set_rate(0.0)
    await rig.drain()
    rig.set_rate(4.0)
    await rig.polls(5)
    async with rig.window("steady"):
        await rig.polls(WINDOW_POLLS - 1)
    rig.set_rate(0.0)
    await rig.drain()
    async with rig.window("light"):
        await light(rig)
    rig.set_rate(4.0)
    await rig.polls(3)
    async with rig.window("hold"):
        await hold(rig)
    await rig.polls(3)
    async with rig.window("sync"):
        await sync(rig)
    await c.stop()
    rig.run_truth = truth_shares(rig.run_truth, truth(rig.fleet))
    return rig, c.summary()


@pytest.fixture(scope="module")
def scenario() -> tuple[Rig, dict[str, Any]]:
    import asyncio

    return asyncio.run(run_scenario())


def test_each_phase_agrees_with_the_simulators_truth(scenario: tuple[Rig, dict[str, Any]]) -> None:
    rig, _ = scenario
    lines = [f"{'window':<9}" + "".join(f"{p:>22}" for p in PHASES)]
    for label, per in rig.agreement.items():
        cells = "".join(f"{g:>10.3f} vs {w:<8.3f}" for g, w in per.values())
        lines.append(f"{label:<9}{cells}")
    print("\nengine-time shares, fleetscope vs the simulator's truth\n" + "\n".join(lines))
    for label, per in rig.agreement.items():
        for phase, (got, want) in per.items():
            assert abs(got - want) <= TOLERANCE, (label, phase, got, want)
    for label, (_, phase) in PHASE_WINDOWS.items():  # each window is its phase, mostly
        got, want = rig.agreement[label][phase]
        assert want > 0.75 and got > 0.75, (label, phase, got, want)


def test_verdicts_name_each_phase(scenario: tuple[Rig, dict[str, Any]]) -> None:
    _, s = scenario
    base = "inference_summary"
    assert s[f"{base}/quiet/agg/engine_time/idle_share"] >= 0.9
    assert s[f"{base}/quiet/bottleneck"] == "engines_idle"
    assert s[f"{base}/overload/agg/engine_time/saturated_share"] >= 0.5
    assert s[f"{base}/overload/bottleneck"] == "engines_saturated"
    assert s[f"{base}/hold/bottleneck"] == "paused"
    assert s[f"{base}/sync/bottleneck"] == "weight_sync"
    assert s[f"{base}/steady/bottleneck"] == "balanced"


def test_shares_sum_to_one_in_every_scope_window_and_label(
    scenario: tuple[Rig, dict[str, Any]],
) -> None:
    _, s = scenario
    bases = {k.rsplit("/engine_time/", 1)[0] for k in s if "/engine_time/" in k}
    labels = {b.split("/")[1] for b in bases}
    assert {"quiet", "overload", "steady", "hold", "sync", "idle", "combined"} <= labels
    for b in bases:
        total = math.fsum(s[f"{b}/engine_time/{p}_share"] for p in PHASES)
        assert total == pytest.approx(1.0, abs=1e-12), b
    # every engine is keyed (a small fleet), and the engine-seconds are the fleet's
    engines = {b.split("/")[2] for b in bases if "." in b.split("/")[2]}
    assert len(engines) == ENGINES
    secs = s["inference_summary/overload/agg/engine_time/engine_seconds"]
    assert secs == pytest.approx(ENGINES * WINDOW_POLLS * INTERVAL)


def test_the_cost_of_idle_time(scenario: tuple[Rig, dict[str, Any]]) -> None:
    """Tokens per busy engine-second beside the window's tokens per second; the idle time's
    cost at that rate."""
    _, s = scenario
    b = "inference_summary/combined/agg"
    per_busy = s[f"{b}/engine_time/tokens_per_busy_engine_second"]
    tokens = s[f"{b}/generation_tokens_total/delta"]
    busy = s[f"{b}/engine_time/engine_seconds"] * (
        s[f"{b}/engine_time/busy_share"] + s[f"{b}/engine_time/saturated_share"]
    )
    assert per_busy == pytest.approx(tokens / busy)
    idle = s[f"{b}/engine_time/engine_seconds"] * s[f"{b}/engine_time/idle_share"]
    assert s[f"{b}/engine_time/idle_cost_tokens"] == pytest.approx(per_busy * idle)
    # the quiet window made no token: no busy engine-second to rate
    assert "inference_summary/quiet/agg/engine_time/tokens_per_busy_engine_second" not in s


def test_the_whole_run_agrees_with_the_truth(scenario: tuple[Rig, dict[str, Any]]) -> None:
    """The run's ``combined`` label: every phase change costs at most one poll interval per
    engine (13 changes here, in and out of each phase and of the drains)."""
    rig, s = scenario
    b = "inference_summary/combined/agg/engine_time"
    seconds = s[f"{b}/engine_seconds"]
    tolerance = 13 * INTERVAL * ENGINES / seconds
    for p in PHASES:
        got, want = s[f"{b}/{p}_share"], rig.run_truth[p]
        print(f"combined {p:>10}: {got:.4f} vs {want:.4f} (tolerance {tolerance:.4f})")
        assert abs(got - want) <= tolerance, (p, got, want)


async def test_a_slow_engine_is_named_as_the_holder_of_the_latency_tail() -> None:
    """One engine of four runs every step 4x slower: it holds the fleet's e2e and TTFT tails
    (its p99 above the fleet's), named in the summary; the others are not."""
    fleet = SimFleet(seed=5)
    fleet.add_endpoint(name="server0", dp=2)
    fleet.add_endpoint(name="server1", dp=2)
    fleet.endpoint("server1").set_slowdown(4.0, engine=1)
    fleet.step(3.0)
    c = Collector(source=SimSource(fleet), interval=3600, fetch_model_info=False)
    await c.poll()
    w = c.window("train")
    fleet.step(1.0)
    await w.astart()
    for _ in range(30):
        fleet.step(1.0)
        await c.poll()
    fleet.step(1.0)
    keys = await w.astop()
    await c.stop()
    s = c.summary()
    for metric in ("e2e_request_latency_seconds", "time_to_first_token_seconds"):
        assert keys[f"inference/train/agg/{metric}/tail_engines"] == 1.0
        assert s[f"inference_summary/train/agg/{metric}/tail_held_by"] == "server1.1"
        fleet_p99 = keys[f"inference/train/agg/{metric}/p99"]
        assert keys[f"inference/train/server1.1/{metric}/p99"] > fleet_p99
        assert keys[f"inference/train/server1.1/{metric}/tail_share"] > 0.5
        assert not [k for k in keys if k.startswith("inference/train/server0.") and metric in k]
