"""Endpoints added to and removed from a running collector (``add_endpoints`` /
``remove_endpoints``), against a simulated fleet over real HTTP.

The fleet is stepped by hand between polls (frozen steps), so its ground truth at each poll is
known exactly: window totals must equal the truth summed over the stretch each endpoint was
watched, and coverage must stay complete (an added endpoint is expected from its first scrape,
a removed one up to its last).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

GEN = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"


@asynccontextmanager
async def rig(n: int = 3) -> AsyncIterator[tuple[SimFleet, dict[str, str]]]:
    fleet = SimFleet(seed=5)
    for _ in range(n):
        fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    with FleetServer(fleet) as server:
        yield fleet, {ep.name: server.url(ep.name) for ep in fleet.endpoints}


def collector(endpoints: Sequence[str | Endpoint]) -> Collector:
    return Collector(endpoints, interval=3600, timeout=2.0, fetch_model_info=False, verify=False)


def truth(fleet: SimFleet, name: str, family: str = GEN) -> float:
    return fleet.endpoint(name).truth_total(family)


async def step_poll(fleet: SimFleet, c: Collector) -> FleetView:
    fleet.step(2.0)
    return await c.poll()


def endpoints_of(view: FleetView) -> set[str]:
    return {e.endpoint for e in view.engines.values()}


async def test_window_totals_stay_exact_as_endpoints_come_and_go() -> None:
    async with rig() as (fleet, urls):
        c = collector([Endpoint(urls["server0"], "server0")])
        try:
            train = c.window("train")
            await train.astart()
            start0 = {f: truth(fleet, "server0", f) for f in (GEN, PROMPT)}
            await step_poll(fleet, c)

            [added] = c.add_endpoints(urls["server1"])
            assert added.name == "server1" and added.url == urls["server1"]
            # pending until the next poll: the fleet does not change under a running poll
            assert [e.name for e in c.endpoints] == ["server0"]
            before0 = truth(fleet, "server0")
            v = await step_poll(fleet, c)  # server1's first scrape: its baseline
            first1 = {f: truth(fleet, "server1", f) for f in (GEN, PROMPT)}
            assert v.endpoints_expected == v.endpoints_reporting == 2
            assert endpoints_of(v) == {"server0", "server1"}
            # a baseline-only first scrape adds nothing: the poll's delta is server0's alone
            assert v.keys["inference/agg/generation_tokens_total/delta"] == (
                truth(fleet, "server0") - before0
            )

            await step_poll(fleet, c)
            assert c.remove_endpoints("server0") == ["server0"]
            last0 = {f: truth(fleet, "server0", f) for f in (GEN, PROMPT)}
            v = await step_poll(fleet, c)
            assert v.endpoints_expected == 1
            assert endpoints_of(v) == {"server1"}  # its engines are not listed as silent
            assert not any(k.startswith("inference/server0.") for k in v.keys)

            keys = await train.astop()
            end1 = {f: truth(fleet, "server1", f) for f in (GEN, PROMPT)}
        finally:
            await c.stop()

    for fam, metric in ((GEN, "generation_tokens_total"), (PROMPT, "prompt_tokens_total")):
        want = (last0[fam] - start0[fam]) + (end1[fam] - first1[fam])
        assert want > 0
        assert keys[f"inference/train/agg/{metric}/delta"] == want
    # an added endpoint is expected from its first scrape, a removed one to its last
    assert keys["inference/train/coverage"] == pytest.approx(1.0, abs=1e-12)
    assert keys["inference/train/failed_scrapes"] == 0.0


async def test_a_removed_server_added_again_starts_afresh_under_a_new_name() -> None:
    async with rig(2) as (fleet, urls):
        c = collector(list(urls.values()))
        try:
            await c.poll()
            await step_poll(fleet, c)
            assert c.remove_endpoints(urls["server0"]) == ["server0"]  # by URL
            await step_poll(fleet, c)
            regular1 = truth(fleet, "server1")  # at the last regular poll
            fleet.step(30.0)  # tokens generated while nobody watched server0
            ev = c.window("eval")
            await ev.astart()
            start1 = truth(fleet, "server1")
            [again] = c.add_endpoints(urls["server0"])
            assert again.name == "server2"  # names are never reused within a collector
            before1 = truth(fleet, "server1")
            v = await step_poll(fleet, c)  # server2's first scrape: a fresh baseline
            base0 = truth(fleet, "server0")
            # the unwatched gap is not dumped into this poll; the row shows the increase since
            # the last regular poll (the window's boundary scrape in between shows no sliver)
            assert before1 >= regular1
            assert v.keys["inference/agg/generation_tokens_total/delta"] == (
                truth(fleet, "server1") - regular1
            )
            assert set(v.engines) == {"server1.0", "server1.1", "server2.0", "server2.1"}
            await step_poll(fleet, c)
            await step_poll(fleet, c)
            keys = await ev.astop()
            end0, end1 = truth(fleet, "server0"), truth(fleet, "server1")
        finally:
            await c.stop()
    want = (end1 - start1) + (end0 - base0)
    assert end0 - base0 > 0
    assert keys["inference/eval/agg/generation_tokens_total/delta"] == want
    assert keys["inference/eval/coverage"] == pytest.approx(1.0, abs=1e-12)


async def test_fleet_changes_are_checked() -> None:
    async with rig(2) as (_fleet, urls):
        c = collector([Endpoint(urls["server0"], "server0")])
        try:
            with pytest.raises(ValueError, match="already watched"):
                c.add_endpoints(urls["server0"])
            with pytest.raises(ValueError, match="already in use"):
                c.add_endpoints(Endpoint(urls["server1"], "server0"))
            with pytest.raises(ValueError, match="already watched"):
                c.add_endpoints(urls["server1"], urls["server1"])
            assert c.remove_endpoints("nope") == []
            # added then removed before any poll: never scraped
            [ep] = c.add_endpoints(urls["server1"])
            assert c.remove_endpoints(ep.name) == [ep.name]
            v = await c.poll()
            assert endpoints_of(v) == {"server0"}
        finally:
            await c.stop()


async def test_an_empty_collector_can_be_filled_from_another_thread() -> None:
    """A trainer may create the collector before its servers exist, run it in the background,
    and add servers as they come up, from its own thread."""
    async with rig(1) as (_fleet, urls):
        c = collector([]).start_background()
        try:
            view = await asyncio.to_thread(c.poll_blocking)
            assert view is not None and view.endpoints_expected == 0 and not view.engines
            await asyncio.to_thread(c.add_endpoints, urls["server0"])
            view = await asyncio.to_thread(c.poll_blocking)
            assert view is not None and set(view.engines) == {"server0.0", "server0.1"}
            assert view.endpoints_reporting == 1
        finally:
            await asyncio.to_thread(c.stop_background)


# --------------------------------------------------------------------------- the CLI


def _engines_in(poll: dict[str, Any]) -> set[str]:
    """Engine ids with per-engine keys in one JSONL poll."""
    out = set()
    for k in poll["metrics"]:
        scope = k.split("/")[1]
        if "." in scope:
            out.add(scope)
    return out


def test_watch_follows_an_endpoints_file(tmp_path: Path) -> None:
    """``fleetscope watch --endpoints-file``: the file is re-read when it changes; servers
    added and removed there are watched and dropped; a broken file keeps the fleet as it was,
    with a warning naming the file."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fleetscope.sinks.jsonl import read_jsonl

    # this checkout's src first, as an absolute path (PYTHONPATH=src is relative)
    env = dict(os.environ)
    src = ROOT / "src"
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(src), *extra])

    fleet = SimFleet(seed=3)
    fleet.add_endpoint(dp=1)
    fleet.add_endpoint(role="decode", dp=2)
    fleet.step(3.0)
    listing = tmp_path / "endpoints.txt"
    out = tmp_path / "polls.jsonl"
    both = {"server0.0", "decode0.0", "decode0.1"}

    def polls_now() -> list[set[str]]:
        return [_engines_in(p) for p in read_jsonl(out)[0]] if out.exists() else []

    def wait_for(engines: set[str], after: int) -> int:
        """Until two polls after the first ``after`` show exactly ``engines``; returns the
        poll count then. Waits on what fleetscope wrote, not on the clock."""
        deadline = time.monotonic() + 180  # a bound for a loaded machine, not a pace
        while time.monotonic() < deadline:
            seen = polls_now()
            if sum(1 for s in seen[after:] if s == engines) >= 2:
                return len(seen)
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.2)
        raise AssertionError(f"never saw {engines}: {polls_now()}")

    with FleetServer(fleet, step_interval=0.25) as server:
        a, b = server.url("server0"), server.url("decode0")
        listing.write_text(f"# the fleet\n{a}\n")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetscope.cli",
                "watch",
                "--endpoints-file",
                str(listing),
                "--no-tui",
                "--jsonl",
                str(out),
                "--interval",
                "0.5",
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            n = wait_for({"server0.0"}, 0)
            listing.write_text(f"{a}\ndecode={b}  # a decode server joins\n")
            n = wait_for(both, n)
            listing.write_text(f"decode=ftp://{b[7:]}\nbogus=line\n")  # broken: ignored
            n = wait_for(both, n + 2)  # several polls later, the fleet is unchanged
            listing.write_text(f"decode={b}\n")  # server0 leaves
            wait_for({"decode0.0", "decode0.1"}, n)
            proc.send_signal(signal.SIGINT)
            # the stop is done when the run summary is written: wait on that, then the exit
            deadline = time.monotonic() + 180
            while not read_jsonl(out)[1] and time.monotonic() < deadline:
                assert proc.poll() is None or read_jsonl(out)[1], proc.communicate()[1]
                time.sleep(0.1)
            _, err = proc.communicate(timeout=180)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    polls, _ = read_jsonl(out)
    seen = [_engines_in(p) for p in polls]
    phases = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]
    assert phases == [{"server0.0"}, both, {"decode0.0", "decode0.1"}], seen
    expected = [p["metrics"]["inference/agg/endpoints_expected"] for p in polls]
    assert sorted(set(expected)) == [1.0, 2.0]
    assert f"+decode0={b}" in err and "-server0" in err
    assert f"endpoints file {listing}: line 1: 'ftp://{b[7:]}' is not an http(s) URL" in err, err
    assert err.count("fleet unchanged") == 1, err  # warned once, not every interval


# --------------------------------------------------------------------------- coverage rules


def test_a_new_process_is_expected_only_from_its_start() -> None:
    """An engine first seen counting from 0 (its process started inside the interval: a
    scale-up, a restarted Ray actor's new worker) did not exist before: a window expects it
    from the start of that interval, not from the window's start. One that leaves for good is
    expected up to its last scrape. Both covered throughout: coverage 1."""
    from fleetscope.exposition import Parser
    from fleetscope.identity import EngineId
    from fleetscope.stats.baselines import Baselines
    from fleetscope.stats.reduce import EngineInput
    from fleetscope.stats.windows import WindowSet
    from support.bodies import set_values
    from support.paths import fixture_text

    body = fixture_text("single_after.prom")
    parser, base = Parser(), Baselines()
    windows = WindowSet()

    def poll(t: float, engines: dict[str, float | None]) -> dict[str, float]:
        inputs = []
        for eid, new_interval in engines.items():
            snap = parser.parse(set_values(body, r"^vllm:generation_tokens_total\{", t), time=t)
            delta = base.advance(eid, snap["0"], new_engine_interval=new_interval)
            inputs.append(EngineInput(eid, delta))
        windows.attribute(inputs, now=t)
        return {i.engine_id: t for i in inputs}

    times = poll(100.0, {"a.0": None, "old.0": None})
    windows.start("w", 100.0, times)
    poll(110.0, {"a.0": None, "old.0": None})
    windows.engine_leaves(EngineId("old", "0"), 110.0)  # gone for good after its scrape at 110
    poll(120.0, {"a.0": None, "new.0": 4.0})  # started after 116: counted from 0
    w = windows.stop("w", 130.0, poll(130.0, {"a.0": None, "new.0": None}))
    assert w.acc.expected == {"a.0": 30.0, "old.0": 10.0, "new.0": 14.0}
    assert w.acc.coverage() == 1.0
    # everything the new process counted is in the window: its whole value at 130
    gen = w.acc.engines["new.0"]
    assert gen.delta[gen.layout.index["vllm:generation_tokens_total"]] == 130.0
