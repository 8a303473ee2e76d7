"""``fleetscope watch --policy-version-file``: the trainer writes its policy version into a file;
the installed entry point announces each new version and compares every server's
``/weight_info`` with it. Every wait is on what fleetscope wrote (the JSONL), never a sleep."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_cli_watch import DEADLINE_S, base_env, fleetscope_cmd, wait_until

from fleetscope.cli._policy_file import PolicyVersionFile
from fleetscope.sinks.jsonl import read_jsonl
from fleetscope_sim import FleetServer, SimFleet


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def rows(path: Path) -> list[dict[str, Any]]:
    return [p["metrics"] for p in read_jsonl(path)[0]] if path.exists() else []


def a_row(path: Path, **want: float) -> bool:
    """Some poll row has every key of ``want`` (``__`` stands for ``/``) at that value."""
    keys = {"inference/" + k.replace("__", "/"): v for k, v in want.items()}
    return any(all(r.get(k) == v for k, v in keys.items()) for r in rows(path))


def test_watch_follows_the_policy_version_file(tmp_path: Path) -> None:
    fleet = SimFleet(seed=7)
    fleet.add_endpoint(dp=1)
    fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    for ep in fleet.endpoints:
        ep.update_weight_version("v0")
    version_file = tmp_path / "policy.txt"
    write_atomically(version_file, "v0\n")
    out = tmp_path / "polls.jsonl"
    with FleetServer(fleet, step_interval=0.25) as server:
        cmd = [*fleetscope_cmd(), "watch", *server.urls, "--no-tui", "--interval", "0.3"]
        cmd += ["--jsonl", str(out), "--policy-version-file", str(version_file)]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=base_env())
        try:
            wait_until(
                lambda: a_row(
                    out,
                    rl__policy_version_index=0.0,
                    rl__engines_stale=0.0,
                    rl__engines_unknown_version=0.0,
                ),
                proc,
                "v0 announced, every server on it",
            )
            fleet.endpoint("server0").update_weight_version("v1")  # server1 misses it
            write_atomically(version_file, "v1\n")
            wait_until(
                lambda: a_row(
                    out,
                    rl__policy_version_index=1.0,
                    rl__engines_stale=2.0,
                    rl__max_version_lag=1.0,
                    server1__weight_version_lag=1.0,
                    server0__weight_version_lag=0.0,
                ),
                proc,
                "v1 announced from the file, server1's two engines stale",
            )
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=DEADLINE_S)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    _, summary = read_jsonl(out)
    assert summary["inference_summary/rl/policy_versions"] == 2
    before_v1 = [r for r in rows(out) if r.get("inference/rl/policy_version_index") == 0.0]
    assert before_v1 and all(r["inference/rl/engines_stale"] == 0 for r in before_v1)


def test_watch_takes_the_rl_health_thresholds(tmp_path: Path) -> None:
    """``--stale-seconds`` and ``--paused-seconds`` reach the collector: with 0.5 s both
    conditions fire on the first poll past 0.5 s, where the defaults (60 s) would not for a
    minute. Judged on what the process reports (its rows, and each event's own seconds in its
    warning), never on the test's clock."""
    fleet = SimFleet(seed=7)
    fleet.add_endpoint(dp=1)
    fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    for ep in fleet.endpoints:
        ep.update_weight_version("v0")
    version_file = tmp_path / "policy.txt"
    write_atomically(version_file, "v0\n")
    out = tmp_path / "polls.jsonl"
    with FleetServer(fleet, step_interval=0.25) as server:
        cmd = [*fleetscope_cmd(), "watch", *server.urls, "--no-tui", "--interval", "0.3"]
        cmd += ["--jsonl", str(out), "--policy-version-file", str(version_file)]
        cmd += ["--stale-seconds", "0.5", "--paused-seconds", "0.5"]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=base_env())
        try:
            wait_until(
                lambda: a_row(out, rl__policy_version_index=0.0, server0__engines_paused=0.0),
                proc,
                "v0 announced, /is_paused asked",
            )
            fleet.endpoint("server0").pause()
            fleet.endpoint("server0").update_weight_version("v1")  # server1 misses it
            write_atomically(version_file, "v1\n")
            wait_until(
                lambda: a_row(out, health__engine_paused=1.0, health__stale_version=2.0),
                proc,
                "server0 paused and server1's two engines stale, both past 0.5 s",
            )
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=DEADLINE_S)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    # the first event of each condition came past 0.5 s, long before the defaults' 60 s
    paused = re.search(r"server0\.0: paused or asleep for (\d+) s", err)
    stale = re.search(r"server1\.0: serves 'v0', 1 version\(s\) behind .* for (\d+) s", err)
    assert paused and stale, err
    assert int(paused.group(1)) < 60 and int(stale.group(1)) < 60, err


class FakeCollector:
    def __init__(self) -> None:
        self.announced: list[str] = []

    def set_policy_version(self, v: str) -> None:
        self.announced.append(v)


def test_the_file_is_read_only_when_it_changes_and_empty_keeps_the_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "v.txt"
    c = FakeCollector()
    follower = PolicyVersionFile(str(f), c)  # type: ignore[arg-type]
    assert follower.check() is None  # no file yet: warned once, nothing announced
    assert follower.check() is None
    assert caplog.text.count("policy version file") == 1
    write_atomically(f, "step-1\nignored second line\n")
    assert follower.check() == "step-1"
    assert follower.check() == "step-1"  # unchanged stamp: not read, not announced again
    f.write_text("")  # a trainer truncating in place, for a moment
    assert follower.check() == "step-1"
    assert "empty" in caplog.text
    write_atomically(f, "  step-2  \n")
    assert follower.check() == "step-2"
    write_atomically(f, "step-1\n")  # a rollback is announced too
    assert follower.check() == "step-1"
    assert c.announced == ["step-1", "step-2", "step-1"]
