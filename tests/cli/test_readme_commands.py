"""Every ``fleetscope ...`` command in README.md's code blocks, run through the installed
``fleetscope`` entry point with the README's flags exactly as written.

What is changed, and only that: the README's placeholder servers (``http://gpu0:8000``,
``http://p0:8000``...: hosts that do not exist here) are replaced by simulated vLLM servers
(``fleetscope_sim``) on loopback ports the OS picks, one per distinct placeholder, and
files the commands name (``before.prom``, ``fleet.txt``) are created in the working folder.
``fleetscope simulate ... --port-base 18000`` runs with its ``--port-base`` rewritten to free
ports: a reader may be running the README's simulator on those very ports.
Commands that run until stopped are stopped with SIGTERM once they have shown a poll (an
event: output, a file's content), and must then exit 0. ``fleetscope demo`` is run end to end
by tests/cli/test_demo_wandb.py and only recognised here. A README command this file does not
know fails the test, so a new command in the README needs its check here.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx
import pytest

from fleetscope.identity import Role
from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT, VLLM_DIR

ROOT = ROOT
README = ROOT / "README.md"
DEADLINE_S = 180  # a bound for a loaded machine, not a pace
PLACEHOLDER = re.compile(r"http://([a-z][a-z0-9-]*):8000")


def readme_commands() -> list[str]:
    """``fleetscope ...`` commands of the fenced shell blocks, comments dropped, ``&&`` split."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            part: list[str] = []
            for w in [*words, "&&"]:
                if w in ("&&", "||", ";"):
                    if part and part[0] == "fleetscope":
                        out.append(shlex.join(part))
                    part = []
                else:
                    part.append(w)
    return out


COMMANDS = readme_commands()


def test_readme_has_the_commands_we_check() -> None:
    assert len(COMMANDS) >= 7, COMMANDS
    assert "fleetscope simulate --endpoints 4 --dp 2 --port-base 18000" in COMMANDS


def entry_point() -> str:
    script = shutil.which("fleetscope")
    assert script, "the fleetscope console script is not installed"
    return script


class Proc:
    """A command running in the background, its output collected as it comes."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.p.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(self.p.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: IO[str], sink: list[str]) -> None:
        for line in iter(stream.readline, ""):
            sink.append(line)

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def wait_for(self, predicate: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.p.poll() is not None:
                for t in self._threads:
                    t.join(5)
                if predicate():
                    return
                raise AssertionError(f"exited {self.p.returncode} before {what}:\n{self.text()}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.p.send_signal(sig)
        rc = self.p.wait(DEADLINE_S)
        for t in self._threads:
            t.join(5)
        return rc

    def kill(self) -> None:
        """Kill it if still running; close its pipes once their readers are done."""
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(30)
        for t in self._threads:
            t.join(5)
        for stream in (self.p.stdout, self.p.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(home),
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true",
        NETRC=str(tmp_path / "no-netrc"),
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
    )
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *extra])
    return tmp_path, env


def with_sim_servers(command: str, stack: list[FleetServer]) -> tuple[str, dict[str, str]]:
    """The command with each placeholder server replaced by a simulated one (same role)."""
    hosts = list(dict.fromkeys(PLACEHOLDER.findall(command)))
    if not hosts:
        return command, {}
    fleet = SimFleet(seed=11)
    for host in hosts:
        role: Role | None = (
            "prefill" if host.startswith("p") else "decode" if host.startswith("d") else None
        )
        fleet.add_endpoint(role=role, dp=1)
    fleet.step(3.0)
    server = FleetServer(fleet, step_interval=0.25)
    server.start()
    stack.append(server)
    urls = dict(zip(hosts, server.urls, strict=True))
    return PLACEHOLDER.sub(lambda m: urls[m.group(1)], command), urls


def free_port_base(n: int) -> int:
    """The first of ``n`` consecutive ports nobody listens on now: the README's own ports may
    be taken by a simulator its reader started (the suite never needs them free)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")


def check_simulate(
    command: str, argv: list[str], cwd: Path, env: dict[str, str], procs: list[Proc]
) -> None:
    endpoints = re.search(r"--endpoints (\d+)", command)
    assert endpoints is not None, command
    n = int(endpoints.group(1))
    port = free_port_base(n)  # the README's --port-base, rewritten to free ports
    i = argv.index("--port-base")
    argv = [*argv[: i + 1], str(port), *argv[i + 2 :]]
    proc = Proc(argv, cwd, env)
    procs.append(proc)  # killed by the test whatever happens
    proc.wait_for(lambda: proc.text().count("/metrics") >= n, f"{n} servers listed")
    for i in range(n):
        r = httpx.get(f"http://127.0.0.1:{port + i}/metrics", timeout=30)
        kind = "sglang:" if "--engines mixed" in command and i % 2 else "vllm:"
        assert r.status_code == 200 and kind in r.text
    assert proc.stop(signal.SIGINT) == 0, proc.text()


def check_demo(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """--engines mixed: a vLLM + SGLang fleet, end to end."""
    from fleetscope.sinks.jsonl import read_jsonl

    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=3 * DEADLINE_S)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = p.stdout[p.stdout.rfind("fleetscope demo: done") :]
    assert "run_status: success" in report and "server1 0.5.23" in report, report
    _, s = read_jsonl(cwd / "fleetscope-demo" / "polls.jsonl")
    assert s["inference_summary/endpoints/server0/engine_version"] == "0.32.0"
    assert s["inference_summary/endpoints/server1/engine_kind"] == "sglang"
    ttft = "inference_summary/combined/agg/time_to_first_token_seconds/"
    assert s[ttft + "pooled_bounds"] == 6.0 and ttft + "p90" in s


def check_inspect(command: str, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    for name in re.findall(r"(\S+\.prom)", command):
        src = "single_load.prom" if "before" in name else "single_after.prom"
        shutil.copy(VLLM_DIR / src, cwd / name)
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=DEADLINE_S)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "generation_tokens_total" in p.stdout


def check_watch_once(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=DEADLINE_S)  # fmt: skip
    assert p.returncode == 0, p.stderr
    keys = json.loads(p.stdout)
    assert keys["inference/agg/engines_reporting"] == 1


def check_alerts(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """The rule file it writes passes ``promtool check rules`` (it must be installed)."""
    from support.prom import find_promtool_binary

    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=DEADLINE_S)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = argv[argv.index("--out") + 1]
    assert "FleetscopeGenerationStalled" in (cwd / out).read_text(encoding="utf-8")
    check = subprocess.run([find_promtool_binary(), "check", "rules", out], cwd=cwd,
                           capture_output=True, text=True, timeout=DEADLINE_S)  # fmt: skip
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr


def check_watch_multiproc(
    argv: list[str], cwd: Path, env: dict[str, str], procs: list[Proc]
) -> None:
    """The README's directory, with the multiprocess files of two API server processes
    serving one engine; the view prints one line per poll with that engine."""
    from support.multiproc import counter_rows, write_file

    directory = cwd / argv[argv.index("--multiproc-dir") + 1]
    directory.mkdir()
    write_file(directory, "counter_101.db", counter_rows(40.0))
    write_file(directory, "counter_102.db", counter_rows(2.0))
    proc = Proc(argv, cwd, env)
    procs.append(proc)  # killed by the test whatever happens
    line = re.compile(r"^fleetscope  poll \d+  engines 1/1  ", re.M)
    proc.wait_for(lambda: bool(line.search("".join(proc.out))), "a poll")
    assert proc.stop(signal.SIGTERM) == 0, proc.text()


def check_watch(
    argv: list[str], cwd: Path, env: dict[str, str], stack: list[FleetServer], procs: list[Proc]
) -> None:
    from fleetscope.sinks.jsonl import read_jsonl

    files = [a for a in argv if a.endswith(".txt")]
    if "--endpoints-file" in argv:
        # the README's file, listing a simulated server
        _, file_urls = with_sim_servers("http://gpu0:8000", stack)
        (cwd / files[0]).write_text(f"# the fleet\n{file_urls['gpu0']}\n")
    proc = Proc(argv, cwd, env)
    procs.append(proc)  # killed by the test whatever happens
    jsonl = next((cwd / a for a in argv if a.endswith(".jsonl")), None)
    names = ["prefill0", "decode0", "decode1"] if "--role" in argv else ["server0"]
    if jsonl is not None:
        proc.wait_for(
            lambda: jsonl.exists() and len(read_jsonl(jsonl)[0]) >= 2, "two polls in the JSONL"
        )
    else:  # not a terminal: the view prints one line per poll (all engines up)
        line = re.compile(rf"^fleetscope  poll \d+  engines {len(names)}/{len(names)}  ", re.M)
        proc.wait_for(lambda: bool(line.search("".join(proc.out))), "a poll")
    assert proc.stop(signal.SIGTERM) == 0, proc.text()
    if jsonl is not None:
        assert read_jsonl(jsonl)[1]["run_status"] == "success"
    if "--wandb-project" in argv:
        assert list(cwd.rglob("offline-run-*")), "no offline W&B run"


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command: str, workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    sub = shlex.split(command)[1]
    if sub == "demo" and "--engines" not in command:
        pytest.skip("run end to end by tests/cli/test_demo_wandb.py")
    stack: list[FleetServer] = []
    procs: list[Proc] = []
    try:
        cmd, _ = with_sim_servers(command, stack)
        argv = [entry_point(), *shlex.split(cmd)[1:]]
        if sub == "simulate":
            check_simulate(command, argv, cwd, env, procs)
        elif sub == "demo":
            check_demo(argv, cwd, env)
        elif sub == "inspect":
            check_inspect(command, argv, cwd, env)
        elif sub == "watch" and "--once" in argv:
            check_watch_once(argv, cwd, env)
        elif sub == "watch" and "--multiproc-dir" in argv:
            check_watch_multiproc(argv, cwd, env, procs)
        elif sub == "watch":
            check_watch(argv, cwd, env, stack, procs)
        elif sub == "alerts":
            check_alerts(argv, cwd, env)
        else:
            raise AssertionError(f"README command not checked by this test: {command}")
    finally:
        for proc in procs:
            proc.kill()
        for server in stack:
            server.stop()
