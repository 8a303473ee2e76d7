"""``fleetscope watch`` as a process: SIGTERM / SIGHUP / SIGINT stop it cleanly (last poll, run
summary to every sink, sinks closed, exit 0), and the library's ``stop_on_signals``.

Every wait is on an event (what fleetscope wrote, a process exit), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from fleetscope.sinks.jsonl import read_jsonl
from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT

DEADLINE_S = 120  # generous for a loaded machine: a bound on waiting, not an expected time


def fleetscope_cmd() -> list[str]:
    """The installed console script (it honours PYTHONPATH=src), else the module."""
    script = shutil.which("fleetscope") or str(Path(sys.executable).with_name("fleetscope"))
    return [script] if Path(script).exists() else [sys.executable, "-m", "fleetscope.cli"]


def wait_until(
    predicate: Callable[[], object], proc: subprocess.Popen[str] | None = None, what: str = ""
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} while waiting for {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def polls_in(path: Path) -> int:
    return len(read_jsonl(path)[0]) if path.exists() else 0


@pytest.fixture
def sim_url() -> Iterator[str]:
    fleet = SimFleet(seed=5)
    fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    with FleetServer(fleet, step_interval=0.25) as server:
        yield server.url("server0")


def base_env() -> dict[str, str]:
    """This checkout's src first, as an absolute path, whatever the working folder."""
    env = dict(os.environ)
    src = ROOT / "src"
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(src), *extra])
    return env


def wandb_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path / "wb"),
        WANDB_CONFIG_DIR=str(tmp_path / "wb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wb-data"),
        WANDB_SILENT="true",
        NETRC=str(tmp_path / "no-netrc"),
        PYTHONUNBUFFERED="1",
    )
    (tmp_path / "wb").mkdir()
    return env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_watch_stops_cleanly_on_signal(tmp_path: Path, sim_url: str, sig: int) -> None:
    out = tmp_path / "polls.jsonl"
    use_wandb = sig == signal.SIGTERM  # the offline W&B run is checked once (it is slow)
    env = wandb_env(tmp_path) if use_wandb else base_env()
    cmd = [*fleetscope_cmd(), "watch", sim_url, "--no-tui", "--interval", "0.3"]
    cmd += ["--jsonl", str(out)]
    if use_wandb:
        cmd += ["--wandb-project", "sigtest", "--wandb-mode", "offline"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: polls_in(out) >= 2, proc, "two polls in the JSONL")
        n_before = polls_in(out)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    polls, summary = read_jsonl(out)
    assert len(polls) > n_before  # the final poll
    assert summary["run_status"] == "success", summary
    assert "inference_summary/combined/agg/generation_tokens_total/delta" in summary
    lines = out.read_text().splitlines()
    assert json.loads(lines[-1]).keys() == {"summary"}  # the summary is the last line
    assert signal.Signals(sig).name in err
    if use_wandb:
        runs = list((tmp_path / "wb").rglob("offline-run-*"))
        assert len(runs) == 1, runs
        leet = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", str(runs[0]), "--json"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=env,
            check=False,
        )
        assert leet.returncode == 0, leet.stderr
        records = [json.loads(x) for x in leet.stdout.splitlines() if x.strip()]
        exits = [r for r in records if r["type"] == "exit"]
        assert len(exits) == 1 and exits[0]["exit"].get("exit_code", 0) == 0, exits  # finished


# --------------------------------------------------------------------------- the library


class FakeBackgroundCollector:
    def __init__(self) -> None:
        self.stopped_in: str | None = None
        self.entered = threading.Event()

    def stop_background(self) -> None:
        self.stopped_in = threading.current_thread().name


def test_stop_on_signals_background_thread_mode_chains_previous_handler() -> None:
    """Thread mode: the handler only flags; a watcher thread stops the collector; then the
    previous Python handler runs, in the main thread."""
    from fleetscope.collector.signals import stop_on_signals

    calls: list[tuple[int, str]] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        calls.append((signum, threading.current_thread().name))

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        c = FakeBackgroundCollector()
        handle = stop_on_signals(c, signals=(signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handle.stopped.wait(30)
        wait_until(lambda: calls, what="the previous handler")  # handlers run between bytecodes
        assert c.stopped_in == "fleetscope-signals"  # not inside the signal handler
        assert calls == [(signal.SIGUSR1, threading.main_thread().name)]
        assert handle.received == signal.SIGUSR1
        assert signal.getsignal(signal.SIGUSR1) is previous  # restored after chaining
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_stop_on_signals_asyncio_mode_stops_a_real_collector(tmp_path: Path, sim_url: str) -> None:
    """Asyncio mode: the signal schedules ``await collector.stop()``; the summary reaches the
    sink and the collector is closed."""
    import asyncio

    from fleetscope.collector.core import Collector
    from fleetscope.collector.signals import stop_on_signals
    from fleetscope.sinks.jsonl import JsonlSink

    out = tmp_path / "lib.jsonl"

    async def main() -> int:
        collector = Collector([sim_url], interval=0.3, sinks=[JsonlSink(out)])
        await collector.start()
        handle = stop_on_signals(collector, signals=(signal.SIGUSR2,), chain=False)
        while polls_in(out) < 1:
            await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR2)
        got = await asyncio.wait_for(handle.wait(), DEADLINE_S)
        handle.restore()
        return got

    assert asyncio.run(main()) == signal.SIGUSR2
    _, summary = read_jsonl(out)
    assert summary["run_status"] == "success"


BACKGROUND_SCRIPT = """
import sys, time
from fleetscope.collector.core import Collector
from fleetscope.collector.signals import stop_on_signals
from fleetscope.sinks.jsonl import JsonlSink

c = Collector([sys.argv[1]], interval=0.3, sinks=[JsonlSink(sys.argv[2])])
c.start_background()
stop_on_signals(c)  # chain=True: after the clean stop, SIGTERM does what it did before
while True:  # a synchronous trainer's loop
    time.sleep(0.01)
"""


def test_background_collector_sigterm_stops_cleanly_then_terminates(
    tmp_path: Path, sim_url: str
) -> None:
    """A synchronous trainer with a background collector: SIGTERM stops the collector (last
    poll, summary) and then, chained to the default disposition, still ends the process."""
    out = tmp_path / "bg.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", BACKGROUND_SCRIPT, sim_url, str(out)],
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(),
    )
    try:
        wait_until(lambda: polls_in(out) >= 2, proc, "two polls")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # the default action, after the stop
    _, summary = read_jsonl(out)
    assert summary["run_status"] == "success", err
