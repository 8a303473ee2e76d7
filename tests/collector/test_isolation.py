"""isolation="process": what only the child-process mode has (supervision, lifetime, light views).

Everything both modes share (windows, summaries, state_dict, membership, health, on_poll, RL) is
tested in both modes by the modules that use the ``isolation`` fixture.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from fleetscope import Collector
from fleetscope.collector.inline import InlineBackend
from fleetscope.collector.process import ProcessBackend
from fleetscope_sim import FleetServer, SimFleet

GEN = "generation_tokens_total"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait(predicate: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_isolation_modes_are_chosen_by_option_and_fleet_size() -> None:
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(300)]
    inline = Collector(urls[:2])
    assert isinstance(inline.backend, InlineBackend)
    auto_small = Collector(urls[:2], isolation="auto")
    assert isinstance(auto_small.backend, InlineBackend)
    with pytest.raises(ValueError):
        Collector(urls[:2], isolation="thread")
    big = Collector(urls, isolation="auto")
    try:
        assert isinstance(big, Collector) and isinstance(big.backend, ProcessBackend)
    finally:
        cast(ProcessBackend, big.backend).link.close()  # asserted above


async def test_a_killed_child_is_restarted_with_its_state_and_the_window_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = SimFleet.build(2, dp=2, seed=3)
    fleet.step(5.0)

    def generated() -> float:
        return sum(e.truth.counter("vllm:generation_tokens_total") for e in fleet.engines())

    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, isolation="process")
        assert isinstance(c.backend, ProcessBackend)
        await c.wait_ready()
        first = c.backend.link._child
        assert first is not None
        await c.poll()
        async with c.window("train") as w:  # boundary poll: counted from g0
            g0 = generated()
            fleet.step(1.0)
            await c.poll()
            g1 = generated()
            c.backend.link.kill()  # the child dies between two polls
            _wait(lambda: not first.alive, "the child to die")
            fleet.step(1.0)
            g2 = generated()  # the restarted child's fresh baseline: g1..g2 is unseen
            with caplog.at_level(logging.WARNING, logger="fleetscope"):
                view = await c.poll()
            fleet.step(1.0)
            await c.poll()
            fleet.step(1.0)
            g4 = generated()  # the stop boundary's poll
        keys = w.keys
        await c.stop()
    assert c.backend.link._child is None and not first.alive
    assert view.keys["inference/collector/child_restarts_total"] == 1.0
    assert any("child process died; restarted" in r.getMessage() for r in caplog.records)
    assert g1 > g0 and g2 > g1 and g4 > g2
    # the last state the trainer holds is the start boundary's (a regular poll carries it only
    # every 30 s): g0..g1, counted by the dead child, is lost with it, and g1..g2 was never
    # seen; from the new child's baseline on, the window is exact
    assert keys["inference/train/agg/generation_tokens_total/delta"] == g4 - g2
    assert keys["inference/train/coverage"] < 1.0  # the unseen step is not hidden


def test_the_child_never_outlives_the_trainer(tmp_path: Path) -> None:
    """SIGKILL the trainer: the kernel kills the child (PR_SET_PDEATHSIG)."""
    fleet = SimFleet.build(1, seed=1)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        script = textwrap.dedent(
            f"""
            import asyncio, sys
            from fleetscope import Collector
            async def main():
                c = Collector([{server.urls[0]!r}], interval=3600, isolation="process")
                await c.wait_ready()
                await c.poll()
                print(c.backend.link._child.proc.pid, flush=True)
                await asyncio.sleep(3600)
            asyncio.run(main())
            """
        )
        trainer = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path
        )
        try:
            assert trainer.stdout is not None
            child = int(trainer.stdout.readline())
            assert _alive(child)
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait(30)
            _wait(lambda: not _alive(child), "the orphaned child to die")
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait(30)
            assert trainer.stdout is not None
            trainer.stdout.close()


def test_sigint_to_the_process_group_still_gives_the_run_summary(tmp_path: Path) -> None:
    """Ctrl-C reaches every process of the terminal's group: the child ignores it, so the
    trainer's own shutdown still takes its last poll and summary through the child."""
    fleet = SimFleet.build(1, seed=2)
    fleet.step(2.0)
    out = tmp_path / "polls.jsonl"
    with FleetServer(fleet) as server:
        script = textwrap.dedent(
            f"""
            import asyncio, signal
            from fleetscope import Collector
            from fleetscope.sinks.jsonl import JsonlSink
            async def main():
                c = Collector([{server.urls[0]!r}], interval=3600, isolation="process",
                              sinks=[JsonlSink({str(out)!r})])
                await c.wait_ready()
                await c.poll()
                stop = asyncio.Event()
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
                print("ready", flush=True)
                await stop.wait()
                await c.stop()
                print("stopped", flush=True)
            asyncio.run(main())
            """
        )
        trainer = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            start_new_session=True,
        )
        try:
            assert trainer.stdout is not None
            assert trainer.stdout.readline().strip() == "ready"
            os.killpg(trainer.pid, signal.SIGINT)  # the whole group, as a terminal does
            assert trainer.stdout.readline().strip() == "stopped"
            assert trainer.wait(60) == 0
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait(30)
            assert trainer.stdout is not None
            trainer.stdout.close()
    text = out.read_text()
    assert "run_status" in text and "success" in text  # the summary reached the sink


async def test_views_are_light_but_complete_for_the_trainer() -> None:
    fleet = SimFleet.build(2, dp=2, seed=4)
    fleet.step(5.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, isolation="process")
        await c.poll()
        fleet.step(1.0)
        view = await c.poll()
        await c.stop()
    assert len(view.engines) == 4 and view.endpoints_reporting == 2
    assert view.result.deltas == {} and view.result.inputs == []
    assert all(sc.ok for sc in view.result.scrapes)
    assert view.keys is view.result.keys
    assert view.keys["inference/agg/generation_tokens_total:rate/sum"] > 0
    assert sorted(view.result.stats.engine_ids)[:1] == ["server0"]


def test_background_collector_in_process_mode() -> None:
    fleet = SimFleet.build(1, dp=2, seed=5)
    fleet.step(5.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, isolation="process").start_background()
        try:
            c.poll_blocking()
            with c.window("train") as w:
                fleet.step(1.0)
                c.poll_blocking()
                fleet.step(1.0)
            assert w.keys["inference/train/agg/generation_tokens_total/delta"] > 0
            summary = c.summary()
            assert (
                summary["inference_summary/train/agg/generation_tokens_total/delta"]
                == (w.keys["inference/train/agg/generation_tokens_total/delta"])
            )
        finally:
            c.stop_background()
    asyncio.set_event_loop(None)
