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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetscope.identity import Role
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


# ------------------------------------------------------------------ width, height, pipes

#: the numeric columns (full and short headers) and a figure as the view prints it
NUMERIC_HEADERS = {"run", "wait", "KV", "gen tok/s", "gen/s", "prompt tok/s", "prompt/s", "hit"}
NUMERIC_HEADERS |= {"TTFT"}
FIGURE = re.compile(r"^(—|-?\d+(\.\d+)?[kMGT]?%?\*?)$")
#: the demo's mixed fleet: server1 is an SGLang server with two DP replicas
MIXED: list[tuple[Role | None, str]] = [
    (None, "vllm"),
    (None, "sglang"),
    ("prefill", "vllm"),
    ("decode", "vllm"),
]


def mixed_fleet() -> SimFleet:
    """The demo's mixed fleet, busy, with one decode engine stalled."""
    fleet = SimFleet(seed=11)
    for role, kind in MIXED:
        fleet.add_endpoint(role=role, dp=2, engine_kind=kind)
    fleet.step(4.0)
    fleet.endpoint("decode0").stall(engine=0)
    return fleet


def watch_argv(server: FleetServer, *extra: str) -> list[str]:
    script = Path(sys.executable).with_name("fleetscope")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fleetscope.cli"]
    return [
        *cmd,
        "watch",
        server.url("server0"),
        server.url("server1"),
        "--role",
        f"prefill={server.url('prefill0')}",
        "--role",
        f"decode={server.url('decode0')}",
        "--stall-seconds",
        "3",
        *extra,
    ]


def frame(screen: str) -> tuple[int, list[str], list[list[str]], str]:
    """The last frame on screen: its poll, table header, body rows, and its text."""
    heads = list(re.finditer(r"^fleetscope  poll (\d+)", screen, re.M))
    if not heads:
        return -1, [], [], ""
    text = screen[heads[-1].start() :]
    header: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("┃"):
            header = [c.strip() for c in line.strip().strip("┃").split("┃")]
    return int(heads[-1][1]), header, engine_rows(text), text


def test_live_view_fits_80x24_and_160x48(tmp_path: Path) -> None:
    """The mixed fleet with a stalled engine at the default terminal size and a large one:
    every engine shown, no cut cell, every figure parses, the left-out columns named, the SGLang
    replicas with figures and every engine a state."""
    fleet = mixed_fleet()
    ids = {e.engine_id for e in fleet.engines()}
    sock = str(tmp_path / "tmux.sock")
    sizes = {"narrow": (80, 24), "wide": (160, 48)}
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TMUX", "COLUMNS")}
    env["HOME"] = str(tmp_path)
    frames: dict[str, tuple[int, list[str], list[list[str]], str]] = {}
    with FleetServer(fleet, step_interval=0.5) as server:
        shell = f"{shlex.join(watch_argv(server, '--interval', '1'))}; echo FLEETSCOPE-EXITED $?"
        shell += "; sleep 300"
        try:
            for name, (w, h) in sizes.items():
                new = ["new-session", "-d", "-s", name, "-x", str(w), "-y", str(h), shell]
                subprocess.run(
                    ["tmux", "-S", sock, "-f", "/dev/null", *new],
                    env=env,
                    check=True,
                    timeout=20,
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.5)
                for name in sizes:
                    screen = tmux(sock, "capture-pane", "-p", "-t", name)
                    assert "FLEETSCOPE-EXITED" not in screen, screen
                    frames[name] = frame(screen)
                if all(
                    poll >= 5 and rows and rows[0][:1] == ["decode0.0"] and "STALLED" in rows[0]
                    for poll, _h, rows, _t in frames.values()
                ):
                    break
            else:
                pytest.fail(f"no STALLED first row in 60 s:\n{frames}")
        finally:
            tmux(sock, "kill-server", check=False)

    for name, (_poll, header, rows, text) in frames.items():
        width, height = sizes[name]
        assert len(text.splitlines()) < height, text
        assert all(len(line) <= width for line in text.splitlines()), text
        assert "…" not in text and "..." not in text, text  # nothing cut, no overflow
        assert header[:1] == ["engine"] and "status" in header and "state" in header, text
        cells = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
        assert set(cells) == ids and len(rows) == len(ids), text  # every engine, once
        for cell in cells.values():
            for head, v in cell.items():
                if head in NUMERIC_HEADERS:
                    assert FIGURE.match(v), (head, v, text)
            assert cell["state"] in ("serving", "idle", "stalled"), text
        gen = "gen tok/s" if "gen tok/s" in header else "gen/s"
        for eid in ("server1.0", "server1.1"):  # SGLang, DP 2: its own figures
            assert cells[eid][gen] != "—" and cells[eid]["TTFT"].endswith("*"), text
        assert cells["decode0.0"]["state"] == "stalled", text
        if width == 80:
            assert "wider terminal shows:" in text and "gen/s" in header, text
        else:
            assert "wider terminal shows" not in text and "prompt tok/s" in header, text


def test_watch_piped_prints_one_line_per_poll(tmp_path: Path) -> None:
    """stdout not a terminal: one line per poll, never a table, then the run summary."""
    fleet = mixed_fleet()
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    env["HOME"] = str(tmp_path)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    poll_line = re.compile(
        r"^fleetscope  poll (\d+)  engines 8/8  gen \S+ tok/s  run \d+ wait \d+  "
        r"KV \d+% max \d+%  TTFT p50 \S+ p99 \S+ s  health (ok|\d+: .+)$",
        re.M,
    )
    with FleetServer(fleet, step_interval=0.5) as server:
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen(
                watch_argv(server, "--interval", "0.5"), stdout=o, stderr=e, env=env
            )
        try:
            deadline = time.monotonic() + 60
            # four polls and the stall reported (judged over 3 s)
            while len(poll_line.findall(out.read_text())) < 4 or "stalled" not in out.read_text():
                assert proc.poll() is None, (out.read_text(), err.read_text())
                assert time.monotonic() < deadline, (out.read_text(), err.read_text())
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)  # a last poll, the run summary, exit 0
            assert proc.wait(timeout=60) == 0, err.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = out.read_text().splitlines()
    polls = [m for m in map(poll_line.match, lines) if m]
    assert len(polls) >= 4 and lines[: len(polls)] == [m[0] for m in polls], lines
    assert [int(m[1]) for m in polls] == list(range(len(polls))), lines  # from the baseline
    assert any("generation_stalled decode0.0" in m[2] for m in polls), lines  # the stall
    rest = "\n".join(lines[len(polls) :])
    assert "run summary" in rest and "┃ engine" not in rest, rest  # the summary, no engine table
