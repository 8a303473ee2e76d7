"""The live terminal view in a real terminal: ``fleetscope watch`` inside tmux.

A simulated fleet is served from the test process (stepped in real time) with one decode
engine stalled: it keeps its requests running and generates nothing. ``fleetscope watch`` runs
in a detached tmux session of a private tmux server; the screen is read with
``tmux capture-pane -p`` (text) and ``-e`` (with colours): the stalled engine must be the first
engine row, STALLED, in red, and the healthy engines OK.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetscope_sim import FleetServer, SimFleet

# tmux is installed by scripts/install-test-deps.sh: a missing one fails loudly
if shutil.which("tmux") is None:
    raise RuntimeError("tmux is missing: run `make test-deps` (apt-get install tmux)")

SGR = re.compile(r"\x1b\[([0-9;]*)m")


def tmux(sock: str, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["tmux", "-S", sock, "-f", "/dev/null", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout


def engine_rows(screen: str) -> list[list[str]]:
    """The cells of each table body row (between the header rule and the bottom rule)."""
    rows: list[list[str]] = []
    in_body = False
    for line in screen.splitlines():
        line = line.strip()
        if line.startswith("┡"):
            in_body, rows = True, []  # the latest table on screen
        elif line.startswith("└"):
            in_body = False
        elif in_body and line.startswith("│"):
            rows.append([c.strip() for c in line.strip("│").split("│")])
    return rows


def is_red(params: str) -> bool:
    """An SGR parameter string that sets a red foreground (basic, bright or 256-colour)."""
    codes = params.split(";")
    return "31" in codes or "91" in codes or params in ("38;5;1", "38;5;9")


def test_watch_in_tmux_shows_the_stalled_engine_first_in_red(tmp_path: Path) -> None:
    fleet = SimFleet(seed=11)
    fleet.add_endpoint(role=None, dp=2)
    fleet.add_endpoint(role="prefill", dp=2)
    fleet.add_endpoint(role="decode", dp=2)
    fleet.add_endpoint(role="decode", dp=2)
    fleet.step(4.0)  # busy: the stalled engine keeps requests running
    fleet.endpoint("decode0").stall(engine=0)
    script = Path(sys.executable).with_name("fleetscope")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fleetscope.cli"]
    sock = str(tmp_path / "tmux.sock")  # a private tmux server, not the user's
    session = "watch"
    with FleetServer(fleet, step_interval=0.5) as server:
        argv = [
            *cmd,
            "watch",
            server.url("server0"),
            "--role",
            f"prefill={server.url('prefill0')}",
            "--role",
            f"decode={server.url('decode0')}",  # decode0 and decode1, in that order
            "--role",
            f"decode={server.url('decode1')}",
            "--interval",
            "1",
            "--stall-seconds",  # the default (30 s) is for real fleets; the flag is tested too
            "3",
        ]
        # keep the pane (and what it printed) if fleetscope exits early
        shell = f"{shlex.join(argv)}; echo FLEETSCOPE-EXITED $?; sleep 300"
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TMUX", "COLUMNS")}
        env["HOME"] = str(tmp_path)
        try:
            new = ["new-session", "-d", "-s", session, "-x", "160", "-y", "50", shell]
            subprocess.run(
                ["tmux", "-S", sock, "-f", "/dev/null", *new],
                env=env,
                check=True,
                timeout=20,
            )
            deadline = time.monotonic() + 45
            screen = ""
            while time.monotonic() < deadline:
                time.sleep(0.5)
                screen = tmux(sock, "capture-pane", "-p", "-t", session)
                assert "FLEETSCOPE-EXITED" not in screen, screen
                rows = engine_rows(screen)
                polls = [int(n) for n in re.findall(r"^fleetscope  poll (\d+)", screen, re.M)]
                if rows and rows[0][2] == "STALLED" and polls and polls[-1] >= 5:
                    break
            else:
                pytest.fail(f"no STALLED row in 45 s:\n{screen}")
            colour = tmux(sock, "capture-pane", "-p", "-e", "-t", session)
        finally:
            tmux(sock, "kill-session", "-t", session, check=False)
            tmux(sock, "kill-server", check=False)

    # one live frame, redrawn in place: log warnings go above it, never through it
    assert len(re.findall(r"^fleetscope  poll \d+", screen, re.M)) == 1, screen
    assert "WARNING fleetscope: health: decode0.0" in screen
    rows = engine_rows(screen)
    assert len(rows) == 8, screen
    ids = [r[0] for r in rows]
    assert sorted(ids) == sorted(e.engine_id for e in fleet.engines()), screen
    # the sick engine is first, STALLED; the healthy ones are OK
    assert rows[0][:3] == ["decode0.0", "decode", "STALLED"], screen
    assert float(rows[0][3]) > 0  # its requests are still running
    assert rows[0][6] in ("0.0", "—"), screen  # and it generates nothing
    statuses = {r[0]: r[2] for r in rows[1:]}
    assert all(s == "OK" for s in statuses.values()), statuses
    roles = {r[0]: r[1] for r in rows}
    assert roles["prefill0.1"] == "prefill" and roles["server0.0"] == "-"
    assert "1 sick" in screen and "endpoints 4/4" in screen

    # colours (tmux re-encodes them as SGR codes): the STALLED row is red, OK is green
    coloured = {}
    for line in colour.splitlines():
        cells = line.strip().strip("│").split("│")
        name = SGR.sub("", cells[0]).strip()
        if line.startswith("│") and name in ids:
            coloured[name] = [SGR.findall(c) for c in cells]
    assert set(coloured) == set(ids), colour
    assert all(any(is_red(c) for c in cell) for cell in coloured["decode0.0"][:3]), colour
    for name in ids[1:]:
        engine_cell, _, status_cell = coloured[name][:3]
        assert not any(is_red(c) for c in engine_cell + status_cell), (name, colour)
        assert "32" in status_cell, (name, colour)
