"""Every ```python block of README.md, run as written in its own interpreter (this venv's).

What is changed, and only that, each rule listed here and checked to still match the README:

* the README's placeholder servers (``http://gpu0:8000``, ``http://prefill-0:8000``...: hosts
  that do not exist here) are replaced by simulated vLLM servers (``fleetscope_sim``) on
  loopback ports the OS picks, one per distinct placeholder (``prefill-``/``decode-`` hosts get
  that role);
* ``SHORTEN``: waits that stand for a training phase are shortened (exact substrings);
* ``PRELUDE``/``POSTLUDE``: what a block takes from the reader's program (``vllm_actors``: two
  actors of a private local Ray; ``vllm``: a stand-in engine recording vLLM's metric names,
  ``support.fake_vllm``) is defined before it, and checked or shut down after it;
* files a block reads (``before.prom``, ``after.prom``) are real captures copied into its
  working folder.

W&B runs offline (``WANDB_MODE=offline``, a temp ``WANDB_DIR``, no key, no netrc): nothing
leaves the machine. A block that cannot run as written is a bug in the README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT, TESTS, VLLM_DIR

README = ROOT / "README.md"
TIMEOUT_S = 240  # a bound for a loaded machine, not a pace
PLACEHOLDER = re.compile(r"http://([a-z][a-z0-9-]*):8000")

# exact substring -> its replacement: a training phase of the example, shortened
SHORTEN = {
    "await asyncio.sleep(60)": "await asyncio.sleep(1)",
}

# a substring that identifies a block -> code run before it / after it
_RAY_MARK = "fs.RayIdentity.of_actors(vllm_actors"
_INPROCESS_MARK = "source=fs.InProcessSource()"
PRELUDE = {
    _INPROCESS_MARK: """\
# (test prelude) `import vllm` gives a stand-in engine: no model, vLLM's metric names
from support.fake_vllm import install

install()
""",
    _RAY_MARK: """\
# (test prelude) a private local Ray, and two actors standing in for the reader's vLLM engines
import ray
from support.ray_cluster import local_ray

_ray = local_ray("fsreadme")
_ray.__enter__()


@ray.remote(num_cpus=0)
class _Engine:
    def ready(self) -> bool:
        return True


vllm_actors = [_Engine.remote(), _Engine.remote()]
ray.get([a.ready.remote() for a in vllm_actors])
""",
}
POSTLUDE = {
    _INPROCESS_MARK: """\
# (test postlude) the window holds exactly the tokens the outputs hold
assert len(outputs) == 64, len(outputs)
generated = sum(len(o.outputs[0].token_ids) for o in outputs)
assert keys["inference/rollout/agg/generation_tokens_total/delta"] == generated == 64 * 64, keys
assert keys["inference/rollout/agg/request_success_total/delta"] == 64, keys
""",
    _RAY_MARK: """\
# (test postlude) the lookup found both actors, with their roles
assert len(identity.worker_ids) == 2, identity
assert sorted(identity.roles.values()) == ["decode", "prefill"], identity
assert collector is not None
_ray.__exit__(None, None, None)
""",
}
# files a block reads -> the capture copied in its place
FILES = {
    "before.prom": VLLM_DIR / "single_load.prom",
    "after.prom": VLLM_DIR / "single_after.prom",
}


def python_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


BLOCKS = python_blocks()


def block_id(block: str) -> str:
    for line in block.splitlines():
        if line.strip() and not line.startswith(("import ", "from ", "#")):
            return re.sub(r"\W+", "_", line.strip())[:40].strip("_")
    return "block"


def test_readme_has_python_blocks_and_every_rule_matches() -> None:
    assert len(BLOCKS) >= 4, BLOCKS
    joined = "\n".join(BLOCKS)
    for rule in [*SHORTEN, *PRELUDE, *POSTLUDE]:
        assert rule in joined, f"rewrite rule no longer matches the README: {rule!r}"
    assert any(name in joined for name in FILES)


def rewritten(block: str, urls: dict[str, str]) -> str:
    for old, new in SHORTEN.items():
        block = block.replace(old, new)
    block = PLACEHOLDER.sub(lambda m: urls[m.group(1)], block)
    before = "".join(p + "\n" for mark, p in PRELUDE.items() if mark in block)
    after = "".join("\n" + p for mark, p in POSTLUDE.items() if mark in block)
    return before + block + after


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
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
    )
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(TESTS), *extra])
    return env


def _marks(block: str) -> list[pytest.MarkDecorator]:
    slow = _RAY_MARK in block or "WandbSink" in block  # a Ray cluster, a W&B service
    return [pytest.mark.slow] if slow else []


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=block_id(b), marks=_marks(b)) for b in BLOCKS]
)
def test_readme_python_block(block: str, tmp_path: Path, env: dict[str, str]) -> None:
    hosts = list(dict.fromkeys(PLACEHOLDER.findall(block)))
    server = None
    urls: dict[str, str] = {}
    if hosts:
        fleet = SimFleet(seed=11)
        for host in hosts:
            role = host.split("-")[0] if host.startswith(("prefill-", "decode-")) else None
            fleet.add_endpoint(role=role, dp=1)
        fleet.step(3.0)
        server = FleetServer(fleet, step_interval=0.25)
        server.start()
        urls = dict(zip(hosts, server.urls, strict=True))
    for name, src in FILES.items():
        if name in block:
            shutil.copy(src, tmp_path / name)
    script = tmp_path / "block.py"
    script.write_text(rewritten(block, urls), encoding="utf-8")
    try:
        p = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        if server is not None:
            server.stop()
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    if "print(" in block:
        assert p.stdout.strip(), p.stderr[-3000:]
    if "WandbSink" in block:
        assert list(tmp_path.rglob("offline-run-*")), "no offline W&B run"
