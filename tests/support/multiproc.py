"""prometheus_client multiprocess files for tests (``PROMETHEUS_MULTIPROC_DIR``).

:class:`Worker`: a child process that records vLLM-named metrics with prometheus_client's own
classes in multiprocess mode (as vLLM's API servers and SGLang's schedulers do), one command at
a time, each acknowledged once written; it can exit with or without ``mark_process_dead``.

:func:`write_file`: one file written directly with prometheus_client's ``MmapedDict`` (exact
values and timestamps, any file name), for merge rules and faults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

GAUGE_MODES: tuple[str, ...] = ("all", "liveall", "min", "livemin", "max", "livemax", "sum")
GAUGE_MODES += ("livesum", "mostrecent", "livemostrecent")
TTFT_BUCKETS = (0.01, 0.1, 1.0, 10.0)
DEADLINE_S = 120.0  # a bound for a loaded machine, not a pace

_CHILD = r"""
import json, os, sys
from prometheus_client import Counter, Gauge, Histogram, Summary, multiprocess

L = ["model_name", "engine"]
tokens = Counter("vllm:generation_tokens", "Generation tokens.", L)
prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", L)
ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", L, buckets=%(buckets)r)
e2e = Summary("vllm:test_e2e_seconds", "A summary.", L)
running = Gauge("vllm:num_requests_running", "Running.", L, multiprocess_mode="mostrecent")
modes = {m: Gauge("vllm:test_gauge_" + m, m, L, multiprocess_mode=m) for m in %(modes)r}
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("exit"):
        if cmd.get("mark_dead"):
            multiprocess.mark_process_dead(os.getpid())
        print("bye", flush=True)
        break
    lab = ("m", cmd.get("engine", "0"))
    if cmd.get("tokens"):
        tokens.labels(*lab).inc(cmd["tokens"])
    if cmd.get("prompt"):
        prompt.labels(*lab).inc(cmd["prompt"])
    for v in cmd.get("ttft", []):
        ttft.labels(*lab).observe(v)
        e2e.labels(*lab).observe(v)
    if "running" in cmd:
        running.labels(*lab).set(cmd["running"])
    if "gauge" in cmd:
        for g in modes.values():
            g.labels(*lab).set(cmd["gauge"])
    print("ok", flush=True)
"""


class Worker:
    """A child process writing multiprocess files into ``directory``."""

    def __init__(self, directory: Path) -> None:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
        code = _CHILD % {"buckets": list(TTFT_BUCKETS), "modes": list(GAUGE_MODES)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        ready = self._answer()
        assert ready.startswith("ready "), ready
        self.pid = int(ready.split()[1])

    def _answer(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child answers every command (or dies: "")
        assert line, f"writer exited with {self.proc.wait(DEADLINE_S)}"
        return line.strip()

    def do(self, **cmd: Any) -> None:
        """Record ``cmd`` (tokens, prompt, ttft, running, gauge, engine); returns once written."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        assert self._answer() == "ok"

    def exit(self, *, mark_dead: bool) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"exit": True, "mark_dead": mark_dead}) + "\n")
        self.proc.stdin.flush()
        assert self._answer() == "bye"
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


# prometheus_client's writer (untyped there)
_open: Callable[[str], Any] = MmapedDict
_key: Callable[[str, str, list[str], list[str], str], str] = mmap_key

_collector: Callable[..., Any] = MultiProcessCollector


def prometheus_clients_merge(directory: Path) -> list[Metric]:
    """What ``MultiProcessCollector`` reads of ``directory`` (the reference)."""
    return list(_collector(None, path=str(directory)).collect())


def multiprocess_collector(registry: Any, directory: Path) -> None:
    """``MultiProcessCollector(registry, path=directory)``: registers it."""
    _collector(registry, path=str(directory))


Row = tuple[str, str, Mapping[str, str], float, float]  # metric, sample, labels, value, time


def write_file(directory: Path, name: str, rows: Sequence[Row]) -> Path:
    """``name`` in ``directory`` with ``rows`` (written over the values already there)."""
    path = directory / name
    d = _open(str(path))
    for metric, sample, labels, value, stamp in rows:
        key = _key(metric, sample, list(labels), list(labels.values()), metric + " help")
        d.write_value(key, value, stamp)
    d.close()
    return path


def counter_rows(tokens: float, engine: str = "0") -> list[Row]:
    labels = {"model_name": "m", "engine": engine}
    return [("vllm:generation_tokens", "vllm:generation_tokens_total", labels, tokens, 0.0)]
