"""A newcomer's surface (issue 21): every bad value or state is one or two lines on stderr that
say what to do, never a traceback; exit code 2 for a usage error, 1 for a failure at run time.

Everything runs through the installed ``fleetscope`` entry point, as a user would type it.
Every wait is bounded and on an event (a process exit), never a fixed sleep.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetscope.sinks.jsonl import read_jsonl
from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT, VLLM_DIR

DEADLINE_S = 120  # a bound on waiting for a loaded machine, not an expected time
ENTRY_POINT = Path(sys.executable).with_name("fleetscope")
LOAD = VLLM_DIR / "single_load.prom"
AFTER = VLLM_DIR / "single_after.prom"
NOWHERE = "http://127.0.0.1:9"  # never contacted: the command line is refused first


def env(*, path_first: Path | None = None, **extra: str) -> dict[str, str]:
    """This checkout's src first on the path (after ``path_first``), whatever the folder."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    paths = [str(p) for p in (path_first, ROOT / "src") if p is not None]
    paths += [os.path.abspath(p) for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out.update(extra)
    return out


def fleetscope(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    assert ENTRY_POINT.exists(), f"no installed entry point at {ENTRY_POINT}"
    kw.setdefault("env", env())
    if "stdout" not in kw:
        kw["capture_output"] = True
    # the overload mypy picks is lost with ``**kw: object``: the ignore makes the call Any
    proc: subprocess.CompletedProcess[str] = subprocess.run(
        [str(ENTRY_POINT), *args],
        text=True,
        timeout=DEADLINE_S,
        check=False,
        **kw,  # type: ignore[call-overload]
    )
    return proc


def problem_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr's lines: one or two, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, proc.stderr
    return lines


def assert_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = problem_lines(proc)
    assert lines[0].startswith("usage: fleetscope"), proc.stderr
    for w in words:
        assert w in lines[-1], (w, proc.stderr)


def assert_failure(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    text = "\n".join(problem_lines(proc))
    for w in words:
        assert w in text, (w, proc.stderr)


# ------------------------------------------------------------------ values argparse refuses


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["watch", NOWHERE, "--interval", "0"], ["--interval", "positive", "'0'"]),
        (["watch", NOWHERE, "--interval", "-5"], ["--interval", "positive", "'-5'"]),
        (["watch", NOWHERE, "--timeout", "-1"], ["--timeout", "positive"]),
        (["watch", NOWHERE, "--duration", "0"], ["--duration", "positive"]),
        (["watch", NOWHERE, "--interval", "nan"], ["--interval", "positive"]),
        (["watch", NOWHERE, "--interval", "soon"], ["--interval", "expected a number"]),
        # the health thresholds: the same flags and checks as `alerts` (cli/_health_flags.py)
        (["watch", NOWHERE, "--stall-seconds", "-5"], ["--stall-seconds", "positive", "'-5'"]),
        (["watch", NOWHERE, "--kv-full", "1.5"], ["--kv-full", "at most 1"]),
        (["watch", NOWHERE, "--outlier-fraction", "0"], ["--outlier-fraction", "positive"]),
        (["inspect", str(LOAD), str(AFTER), "--interval", "-10"], ["--interval", "positive"]),
        (["inspect", str(LOAD), str(AFTER), "--interval", "0"], ["--interval", "positive"]),
        (["inspect", NOWHERE, NOWHERE, "--timeout", "0"], ["--timeout", "positive"]),
        (["demo", "--duration", "-3"], ["--duration", "positive"]),
        (["demo", "--interval", "0"], ["--interval", "positive"]),
    ],
)
def test_numbers_that_must_be_positive(argv: list[str], words: list[str]) -> None:
    assert_usage_error(fleetscope(*argv), *words)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["watch", "gpu0:8000"], ["'gpu0:8000' is not an http(s) URL", "http://gpu0:8000"]),
        (["watch", "localhost"], ["not an http(s) URL", "http://localhost"]),
        (["watch", "ftp://gpu0:8000"], ["not an http(s) URL"]),
        (["watch", "http://gpu0:99999"], ["no valid port"]),
        (["watch", "--role", "decode=gpu0:8000"], ["--role", "http://gpu0:8000"]),
        (["watch", "--role", "encode=http://gpu0:8000"], ["prefill=URL or decode=URL"]),
        (["watch", "--once", "gpu0:8000"], ["not an http(s) URL"]),
    ],
)
def test_a_url_without_a_scheme_is_refused_like_in_the_endpoints_file(
    argv: list[str], words: list[str]
) -> None:
    assert_usage_error(fleetscope(*argv), *words)


def test_a_url_with_credentials_is_refused_without_showing_them() -> None:
    proc = fleetscope("watch", "alice:s3cret@gpu0:8000")
    assert_usage_error(proc, "not an http(s) URL")
    assert "s3cret" not in proc.stderr


# ------------------------------------------------------ options that would silently do nothing


@pytest.mark.parametrize(
    "option",
    [
        ["--wandb-entity", "team"],
        ["--wandb-name", "run"],
        ["--wandb-dir", "wb"],
        ["--wandb-alerts"],
        ["--wandb-keys", "full"],
        ["--wandb-keys", "compact"],
        ["--wandb-mode", "offline"],
    ],
)
@pytest.mark.parametrize("once", [False, True])
def test_wandb_options_need_a_project(option: list[str], once: bool) -> None:
    argv = ["watch", NOWHERE, "--jsonl", "x.jsonl", *option, *(["--once"] if once else [])]
    assert_usage_error(fleetscope(*argv), option[0], "needs --wandb-project")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["watch", NOWHERE, "--json"], ["--json needs --once"]),
        (["watch", NOWHERE, "--json", "--jsonl", "x.jsonl"], ["--json needs --once"]),
        (["watch", NOWHERE, "--no-tui"], ["--no-tui needs --jsonl FILE or --wandb-project"]),
        (["watch", NOWHERE, "--once", "--duration", "5"], ["--duration does nothing"]),
        (["watch"], ["give at least one endpoint URL"]),
        (["inspect", str(LOAD), str(AFTER), "--compact"], ["--compact needs --json"]),
    ],
)
def test_options_that_would_do_nothing_are_refused(argv: list[str], words: list[str]) -> None:
    assert_usage_error(fleetscope(*argv), *words)


# ------------------------------------------------------------------ failures at run time


@pytest.fixture
def sim_url() -> Iterator[str]:
    fleet = SimFleet(seed=7)
    fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    with FleetServer(fleet, step_interval=0.25) as server:
        yield server.url("server0")


@pytest.mark.parametrize("once", [False, True])
def test_an_unwritable_jsonl_path(tmp_path: Path, once: bool) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    target = blocker / "polls.jsonl"  # under a file: no user, root included, can create it
    argv = ["watch", NOWHERE, "--jsonl", str(target), "--no-tui", *(["--once"] if once else [])]
    assert_failure(fleetscope(*argv), f"cannot write --jsonl {target}", "a path you can write")


def test_once_writes_the_jsonl_too(tmp_path: Path, sim_url: str) -> None:
    out = tmp_path / "polls.jsonl"
    proc = fleetscope(
        "watch", sim_url, "--once", "--json", "--interval", "0.3", "--jsonl", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    import json

    printed = json.loads(proc.stdout)
    rows, summary = read_jsonl(out)
    assert len(rows) >= 2  # the two polls (and the last one at the stop)
    key = "inference/agg/generation_tokens_total/delta"
    assert rows[1]["metrics"][key] == printed[key]  # the poll it printed
    assert summary["run_status"] == "success"


def test_once_logs_to_wandb_too(tmp_path: Path, sim_url: str) -> None:
    wb = tmp_path / "wb"
    wb.mkdir()
    wandb_env = env(
        WANDB_MODE="offline",
        WANDB_DIR=str(wb),
        WANDB_CONFIG_DIR=str(tmp_path / "wb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wb-data"),
        WANDB_SILENT="true",
        NETRC=str(tmp_path / "no-netrc"),
    )
    argv = ["watch", sim_url, "--once", "--interval", "0.3"]
    argv += ["--wandb-project", "once", "--wandb-mode", "offline", "--wandb-dir", str(wb)]
    proc = fleetscope(*argv, env=wandb_env)
    assert proc.returncode == 0, proc.stderr
    assert "server0" in proc.stdout  # the table is still printed
    assert list(wb.rglob("offline-run-*")), "no offline W&B run"


def test_simulate_on_a_busy_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = fleetscope("simulate", "--endpoints", "1", "--port-base", str(port))
    assert_failure(proc, f"port {port}", "in use", "--port-base")


def test_grafana_dashboard_without_its_extra_names_the_extra(tmp_path: Path) -> None:
    """The extra is blocked from outside: a sitecustomize makes its import fail, as if it were
    not installed."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['grafana_foundation_sdk'] = None  # not installed\n"
    )
    proc = fleetscope("dashboard", "grafana", env=env(path_first=tmp_path))
    assert_failure(proc, "grafana-foundation-sdk", "pip install 'fleetscope[dashboards]'")
    assert proc.stdout == ""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    dashboards = readme[readme.index("- **Dashboards**") :]
    dashboards = dashboards[: dashboards.index("\n- **")]
    assert 'pip install "fleetscope[dashboards]"' in dashboards


def test_grafana_dashboard_to_an_unwritable_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    proc = fleetscope("dashboard", "grafana", "--out", str(tmp_path / "a-file" / "fleet.json"))
    assert_failure(proc, "cannot write --out")


@pytest.mark.parametrize("json_out", [True, False])
def test_output_into_a_closed_pipe_ends_quietly(json_out: bool) -> None:
    """``fleetscope inspect ... --json | head``: the reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        argv = ["inspect", str(LOAD), str(AFTER), *(["--json"] if json_out else [])]
        proc = fleetscope(*argv, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 1


def test_inspect_json_applies_the_filter() -> None:
    import json

    proc = fleetscope("inspect", str(LOAD), str(AFTER), "--json", "--filter", "tokens_total:rate")
    assert proc.returncode == 0, proc.stderr
    keys = json.loads(proc.stdout)
    assert "inference/agg/generation_tokens_total:rate/sum" in keys
    assert all("tokens_total:rate" in k for k in keys), sorted(keys)


# --------------------------------------------------- inspect: a total deadline, headers too


@pytest.fixture
def trickling_headers() -> Iterator[str]:
    """A loopback server that answers every connection with header bytes, one every 0.1 s,
    never ending the headers: no read ever waits long enough for a read timeout."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)

    def trickle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(0.1):
                    conn.sendall(b"X")
            except OSError:
                pass  # the client hung up

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def test_inspect_trickling_headers_stop_at_the_deadline(trickling_headers: str) -> None:
    url = trickling_headers
    t0 = time.monotonic()
    proc = fleetscope("inspect", url, url, "--timeout", "1", "--json")
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr  # inspect: a source it cannot read
    text = "\n".join(problem_lines(proc))
    assert "not complete after 1 s (--timeout)" in text, text
    assert took < 30  # before: ran until killed


# ----------------------------------------------------------- scripts/install-test-deps.sh


def install_script_env(tmp_path: Path, *, have: tuple[str, ...]) -> tuple[Path, dict[str, str]]:
    """A copy of the script in an empty project, and a PATH with only what it needs: fake
    ``prometheus`` / ``tmux`` (those in ``have``), a fake ``python3`` (pip), a fake
    ``apt-get`` that records being run, and the few real tools the script uses."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    script = project / "scripts" / "install-test-deps.sh"
    shutil.copy(ROOT / "scripts" / "install-test-deps.sh", script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {name: f"echo {name} 1.0" for name in have}
    fakes["python3"] = 'echo "python3 $*"'
    fakes["apt-get"] = f'echo "$*" >> {tmp_path}/apt-get-ran; exit 1'
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for tool in ("dirname", "id", "head"):
        real = shutil.which(tool)
        assert real is not None, tool
        (bin_dir / tool).symlink_to(real)
    return script, {"PATH": str(bin_dir), "HOME": str(tmp_path)}


def run_script(script: Path, env: dict[str, str], *prefix: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [*prefix, bash, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE_S,
        check=False,
    )


def test_install_script_skips_apt_when_both_are_there(tmp_path: Path) -> None:
    script, script_env = install_script_env(tmp_path, have=("prometheus", "tmux"))
    proc = run_script(script, script_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "apt-get skipped" in proc.stdout
    assert not (tmp_path / "apt-get-ran").exists()
    assert "python3 -m pip install -q -e .[test]" in proc.stdout


def test_install_script_without_apt_get_says_so_in_one_line(tmp_path: Path) -> None:
    script, script_env = install_script_env(tmp_path, have=("tmux",))
    (Path(script_env["PATH"]) / "apt-get").unlink()
    proc = run_script(script, script_env)
    if os.geteuid() != 0:  # the root check comes first
        assert proc.returncode == 1
        return
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no apt-get" in lines[0], proc.stderr
    assert "python3" not in proc.stdout  # stopped before pip


def test_install_script_not_as_root_says_so_in_one_line() -> None:
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # run it as nobody
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and no setpriv to drop it")
        prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    # a folder anyone can read (pytest's tmp_path is root's own)
    with tempfile.TemporaryDirectory() as base:
        Path(base).chmod(0o755)
        script, script_env = install_script_env(Path(base), have=())
        proc = run_script(script, script_env, *prefix)
        assert not (Path(base) / "apt-get-ran").exists()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs root" in lines[0], proc.stderr
