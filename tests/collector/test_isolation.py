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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

import fleetscope
from fleetscope import Collector
from fleetscope.collector.inline import InlineBackend
from fleetscope.collector.process import ProcessBackend
from fleetscope_sim import FleetServer, SimFleet

GEN = "generation_tokens_total"
T = TypeVar("T")


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


def _env() -> dict[str, str]:
    """A trainer subprocess's environment: it imports the fleetscope under test (a relative or
    absent PYTHONPATH would find another one from its own working directory)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(fleetscope.__file__)))
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
    }


def _in_a_thread_that_exits(fn: Callable[[], T]) -> T:
    """``fn()`` run in a helper thread, returned once that thread is gone from the kernel too
    (``join()`` returns before the OS thread has exited)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # pragma: no cover - re-raised below
            errors.append(e)

    t = threading.Thread(target=run, name="short-lived")
    t.start()
    t.join(120)
    _wait(lambda: not os.path.exists(f"/proc/self/task/{t.native_id}"), "the thread to exit")
    if errors:
        raise errors[0]
    return out[0]


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


async def test_a_child_spawned_from_a_helper_thread_outlives_that_thread() -> None:
    """A collector built in a helper thread that then exits: its child lives on, and the main
    thread polls through it (PR_SET_PDEATHSIG killed it with the thread that started it)."""
    fleet = SimFleet.build(1, dp=2, seed=7)
    fleet.step(2.0)
    with FleetServer(fleet) as server:

        def build() -> Collector:
            c = Collector(server.urls, interval=3600, isolation="process")
            assert isinstance(c.backend, ProcessBackend)
            c.backend.link.call("ping").result(120)  # the child is up, its lifetime rule set
            return c

        c = _in_a_thread_that_exits(build)
        assert isinstance(c.backend, ProcessBackend)
        child = c.backend.link._child
        assert child is not None
        try:
            for _ in range(2):
                fleet.step(1.0)
                view = await c.poll()
            assert c.backend.link._child is child and _alive(child.proc.pid)
            assert view.keys["inference/collector/child_restarts_total"] == 0.0
            assert view.endpoints_reporting == 1
        finally:
            await c.stop()


async def test_a_child_restarted_from_a_short_lived_thread_outlives_that_thread() -> None:
    """The child dies; a ``summary()`` from a thread that then exits restarts it; the restarted
    child lives on (it died with that thread)."""
    fleet = SimFleet.build(1, dp=2, seed=8)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, isolation="process")
        assert isinstance(c.backend, ProcessBackend)
        link = c.backend.link
        try:
            await c.wait_ready()
            await c.poll()
            first = link._child
            assert first is not None
            link.kill()
            _wait(lambda: not first.alive, "the child to die")
            summary = _in_a_thread_that_exits(c.summary)  # restarts it from that thread
            second = link._child
            assert summary and second is not None and second is not first
            assert link.restarts == 1
            for _ in range(2):
                fleet.step(1.0)
                view = await c.poll()
            assert link._child is second and _alive(second.proc.pid)
            assert view.keys["inference/collector/child_restarts_total"] == 1.0
        finally:
            await c.stop()


def test_the_child_never_outlives_the_trainer(tmp_path: Path) -> None:
    """SIGKILL the trainer: the child exits (it watches the trainer's process; its connection
    closes too)."""
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
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=_env(),
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


def test_the_child_dies_with_the_trainer_whatever_thread_started_it_and_whoever_holds_its_link(
    tmp_path: Path,
) -> None:
    """A trainer whose collector was built in a helper thread (gone since), and which forked a
    worker (a DataLoader's) that keeps the child's connection open: the child lives as long as
    the trainer, and exits when the trainer is SIGKILLed although its connection stays open."""
    fleet = SimFleet.build(1, seed=9)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        script = textwrap.dedent(
            f"""
            import os, threading, time
            from fleetscope import Collector
            box = []
            def build():
                c = Collector([{server.urls[0]!r}], interval=3600, isolation="process")
                c.backend.link.call("ping").result(120)
                box.append(c)
            t = threading.Thread(target=build)
            t.start()
            t.join()
            deadline = time.monotonic() + 120
            while os.path.exists(f"/proc/self/task/{{t.native_id}}"):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            c = box[0]
            c.summary()  # from the main thread: restarts the child if it died with the thread
            link = c.backend.link
            worker = os.fork()
            if worker == 0:  # holds the trainer's end of the child's connection, for a while
                time.sleep(300)
                os._exit(0)
            print(link._child.proc.pid, link.restarts, worker, flush=True)
            time.sleep(3600)
            """
        )
        trainer = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=_env(),
        )
        worker = 0
        try:
            assert trainer.stdout is not None
            child, restarts, worker = map(int, trainer.stdout.readline().split())
            assert restarts == 0 and _alive(child)
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait(30)
            _wait(lambda: not _alive(child), "the orphaned child to die", timeout=60)
            assert _alive(worker)  # the connection was open all along: the child saw the death
        finally:
            if worker:
                os.kill(worker, signal.SIGKILL)
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait(30)
            if trainer.stdout is not None:
                trainer.stdout.close()


@pytest.mark.parametrize("watch", ["pidfd", "parent-pid"])
def test_a_child_watching_its_parent_exits_when_that_process_dies(
    watch: str, tmp_path: Path
) -> None:
    """``exit_with_parent`` alone, no connection: the kernel's pidfd, and where there is none the
    parent-pid check."""
    no_pidfd = "del os.pidfd_open" if watch == "parent-pid" else ""
    child_code = (
        f"import os, sys, time\n{no_pidfd}\n"
        "from fleetscope.collector.child import exit_with_parent\n"
        "exit_with_parent(int(sys.argv[1]))\n"
        "print('watching', flush=True)\n"
        "time.sleep(300)\n"
    )
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen(
            [sys.executable, "-c", {child_code!r}, str(os.getpid())],
            stdout=subprocess.PIPE, text=True,
        )
        assert child.stdout.readline().strip() == "watching"
        print(child.pid, flush=True)
        time.sleep(3600)
        """
    )
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=_env()
    )
    child = 0
    try:
        assert trainer.stdout is not None
        child = int(trainer.stdout.readline())
        assert _alive(child)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(30)
        _wait(lambda: not _alive(child), "the orphaned child to die", timeout=60)
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(30)
        if trainer.stdout is not None:
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
            env=_env(),
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


@pytest.mark.parametrize("in_window", [False, True])
async def test_a_killed_child_costs_coverage_in_the_run_labels_too(in_window: bool) -> None:
    """A killed child restarts from the last state the trainer holds; what happened between
    that state and the new child's first scrape was never seen. The window said so, but
    ``combined`` (and ``idle``, when the death was outside a window) said 1.0 with 41 % of
    the tokens missing. Every label whose time the gap was says it is missing; ``idle`` does
    not take a gap that happened inside a window (docs/bad-data.md §7)."""
    fleet = SimFleet.build(2, dp=2, seed=5)
    fleet.step(5.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, isolation="process")
        await c.wait_ready()
        await c.poll()
        fleet.step(1.0)
        await c.poll()  # idle: counted, coverage 1.0 so far
        w = c.window("train")
        if in_window:
            await w.astart()
        first = cast(ProcessBackend, c.backend).link._child
        assert first is not None
        fleet.step(1.0)
        await c.poll()
        cast(ProcessBackend, c.backend).link.kill()
        _wait(lambda: not first.alive, "the child to die")
        fleet.step(1.0)
        await c.poll()  # a new child: fresh baselines, the gap unseen
        fleet.step(1.0)
        await c.poll()
        if in_window:
            await w.astop()
        summary: dict[str, Any] = dict(c.summary())
        await c.stop()
    assert summary["inference_summary/combined/coverage"] < 1.0
    idle = summary["inference_summary/idle/coverage"]
    if in_window:
        assert summary["inference_summary/train/coverage"] < 1.0
        assert idle == 1.0  # the gap was the window's
    else:
        assert idle < 1.0
