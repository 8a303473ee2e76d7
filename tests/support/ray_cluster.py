"""A private local Ray cluster for tests: its own short temp dir, auth off, always shut down; a
second node on the same machine (``ray_node``), always stopped."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray  # the test extra installs Ray: a missing one must fail loudly


@contextmanager
def local_ray(prefix: str, **init_kwargs: Any) -> Iterator[Any]:
    """``ray.init(num_cpus=2, include_dashboard=False, **init_kwargs)`` in a private temp dir.

    The dir is short because Ray's unix socket paths must stay under ~107 characters. The
    environment (``RAY_AUTH_MODE``, ``TMPDIR``) is restored and the dir removed afterwards.
    """
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "TMPDIR")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["TMPDIR"] = tmp
    kwargs = {
        "num_cpus": 2,
        "include_dashboard": False,
        "_temp_dir": tmp,
        "logging_level": logging.WARNING,
        **init_kwargs,
    }
    try:
        yield ray.init(**kwargs)
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


# the cluster's nodes as ``ray.nodes()`` lists them (dicts with NodeID, Alive, Resources...)
cluster_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes


class RayNode:
    """A second raylet on this machine (``ray start --address ... --block``), in its own
    process group so that stopping it stops everything it started (raylet, agents, workers)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, node_id: str) -> None:
        self.proc = proc
        self.log = log
        self.node_id = node_id

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node (SIGTERM to its group; SIGKILL if it lingers). Idempotent."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 30.0)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        with contextlib.suppress(ProcessLookupError):  # stragglers of the group
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@contextmanager
def ray_node(
    resources: Mapping[str, float], *, num_cpus: int = 1, timeout: float = 180.0
) -> Iterator[RayNode]:
    """Join a second node to the running local cluster (``local_ray``) with ``resources``;
    it is stopped on exit whatever happens. Minimal: ``num_cpus`` CPUs, a 100 MB object
    store. Yields once the cluster lists it alive."""
    gcs = ray.get_runtime_context().gcs_address
    before = {n["NodeID"] for n in cluster_nodes()}
    log = Path(tempfile.mkstemp(prefix="raynode-", suffix=".log", dir="/tmp")[1])
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={gcs}"]
    cmd += [f"--num-cpus={num_cpus}", "--num-gpus=0", f"--object-store-memory={100 << 20}"]
    cmd += ["--resources", json.dumps(dict(resources)), "--block", "--disable-usage-stats"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node = RayNode(proc, log, "")
    try:
        deadline = time.monotonic() + timeout
        while not node.node_id:
            new = [n for n in cluster_nodes() if n["NodeID"] not in before and n["Alive"]]
            if new:
                node.node_id = new[0]["NodeID"]
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the second Ray node did not start:\n{node.tail()}")
            time.sleep(0.5)
        yield node
    finally:
        node.stop()
        log.unlink(missing_ok=True)
