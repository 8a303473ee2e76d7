"""Real vLLM 0.32 (CPU) in the process that watches it: ``InProcessSource`` (issue 22).

``scripts/real_vllm/inprocess.py`` runs with the vLLM venv's Python and this tree's fleetscope:
``LLM(<the tiny model>, disable_log_stats=False)`` in its own process, a collector on
``InProcessSource()`` polling in its own thread, a window around two ``generate()`` rounds of
the same prompts. Then ``server0`` (``vllm serve`` of the same model, started by
``scripts/real_vllm/run.py``) is driven with the same prompts and parameters, in two rounds,
with a window around them, watched over HTTP. Checked:

* in-process, the window's generation-token delta equals the tokens the outputs hold, its TTFT
  count delta the requests, and the prefix cache hits (the second round repeats every prompt);
* the registry holds the family set ``vllm serve``'s ``/metrics`` exposes (less the API
  server's own RL route families), and both ways give the same statistics' names: the same
  window keys and the same poll keys.

This module runs after the main scenario (file order): the servers are idle by then.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import runpy
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_vllm" / "inprocess.py"
ENV_PYTHON = "FLEETSCOPE_REAL_VLLM_PYTHON"  # the vLLM venv's python (run.py sets it)
ENV_MODEL = "FLEETSCOPE_REAL_MODEL"  # the tiny model's directory (run.py sets it)
ENV_SERVER = "FLEETSCOPE_REAL_SERVER0"
WINDOW = "inprocess"
MAX_TOKENS = 16
ROUNDS = 2
DEADLINE_S = 900.0  # the engine's start-up on a loaded 2-core machine; a bound, not a pace


def _prompts() -> list[str]:
    """Two ~300-word shared prefixes (the prefix cache's blocks are 128 tokens on CPU)."""
    words: list[str] = runpy.run_path(str(SCRIPT.parent / "words.py"))["WORDS"]
    rng = random.Random(22)
    shared = [f"document {i}: " + " ".join(rng.choice(words) for _ in range(300)) for i in (0, 1)]
    return [
        f"{shared[i % 2]}\nquestion {i}: " + " ".join(rng.choice(words) for _ in range(5)) + "?"
        for i in range(8)
    ]


def _run_inprocess(prompts: list[str], tmp: Path) -> dict[str, Any]:
    python, model = os.environ.get(ENV_PYTHON), os.environ.get(ENV_MODEL)
    if not python or not model:
        pytest.fail(f"run by `make test-real` ({ENV_PYTHON}, {ENV_MODEL})", pytrace=False)
    plan = tmp / "prompts.json"
    plan.write_text(json.dumps({"prompts": prompts, "max_tokens": MAX_TOKENS}))
    out = tmp / "inprocess.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR",)}
    env.update(
        PYTHONPATH=str(ROOT / "src"),  # this tree's fleetscope, in the vLLM venv's Python
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp / "hf-home"),
        VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_LOOPBACK_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TMPDIR=str(tmp),
    )
    cmd = [python, str(SCRIPT), "--model", model, "--prompts", str(plan), "--out", str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert p.returncode == 0 and out.exists(), p.stdout[-3000:] + p.stderr[-5000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


async def _serve_same_prompts(url: str, prompts: list[str]) -> dict[str, Any]:
    """``server0`` driven with the same prompts and parameters, a window around the rounds."""
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import Endpoint

    collector = Collector([Endpoint(url, "server0")], interval=3600, timeout=10)
    async with httpx.AsyncClient(timeout=120) as http:

        async def done() -> float:
            body = (await http.get(url + "/metrics")).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in body.splitlines()
                if line.startswith("vllm:request_success_total{")
            )

        try:
            await collector.poll()
            window = collector.window(WINDOW)
            await window.astart()
            before = await done()
            usage = 0
            for _ in range(ROUNDS):
                bodies = [
                    {
                        "model": "tinymodel",
                        "prompt": p,
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    }
                    for p in prompts
                ]
                answers = await asyncio.gather(
                    *(http.post(url + "/v1/completions", json=b) for b in bodies)
                )
                for a in answers:
                    a.raise_for_status()
                    usage += a.json()["usage"]["completion_tokens"]
            for _ in range(120):  # vLLM records a request just after its response
                if await done() >= before + ROUNDS * len(prompts):
                    break
                await asyncio.sleep(0.5)
            keys = await window.astop()
            last = collector.last
            body = (await http.get(url + "/metrics")).text
        finally:
            await collector.stop()
    assert last is not None
    families = sorted({line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")})
    return {"window_keys": keys, "poll_keys": dict(last.keys), "usage": usage, "families": families}


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    url = os.environ.get(ENV_SERVER)
    if not url:
        pytest.fail("run by `make test-real`", pytrace=False)
    prompts = _prompts()
    inprocess = _run_inprocess(prompts, tmp_path_factory.mktemp("inprocess"))
    served = asyncio.run(_serve_same_prompts(url.rstrip("/"), prompts))
    print(
        f"\nin-process vLLM: ready after {inprocess['startup_seconds']:.1f} s, "
        f"{inprocess['requests']} requests, {inprocess['generated_tokens']} tokens; "
        f"{len(inprocess['window_keys'])} window keys, {len(inprocess['poll_keys'])} poll keys"
    )
    return {"inprocess": inprocess, "served": served}


def wkey(metric: str) -> str:
    return f"inference/{WINDOW}/agg/{metric}/delta"


def test_inprocess_totals_equal_the_outputs(both: dict[str, dict[str, Any]]) -> None:
    r = both["inprocess"]
    keys = r["window_keys"]
    assert r["requests"] == ROUNDS * 8 and r["warnings"] == []
    assert r["generated_tokens"] == ROUNDS * 8 * MAX_TOKENS  # ignore_eos: every token
    assert keys[wkey("generation_tokens_total")] == r["generated_tokens"]
    assert keys[wkey("prompt_tokens_total")] == r["prompt_tokens"]
    assert keys[wkey("time_to_first_token_seconds")] == r["requests"]
    assert keys[wkey("request_success_total")] == r["requests"]
    assert keys[wkey("prefix_cache_hits_total")] > 0  # the repeated prompts hit
    assert keys[f"inference/{WINDOW}/coverage"] == pytest.approx(1.0, abs=1e-9)
    assert r["engine_kind"] == "vllm"


def test_served_the_same_prompts_the_same_totals(both: dict[str, dict[str, Any]]) -> None:
    ip, served = both["inprocess"]["window_keys"], both["served"]["window_keys"]
    assert both["served"]["usage"] == ROUNDS * 8 * MAX_TOKENS
    for metric in ("generation_tokens_total", "time_to_first_token_seconds"):
        assert served[wkey(metric)] == ip[wkey(metric)], metric
    assert served[wkey("prefix_cache_hits_total")] > 0


def _rl_route_family(name: str) -> bool:
    """The API server's own families of its RL routes (no engine, no LLM() equivalent)."""
    from fleetscope.catalog import OPERATION_FAMILIES

    prefixes = {
        n.split("_operation")[0] for n in (*OPERATION_FAMILIES, *OPERATION_FAMILIES.values())
    }
    return name.startswith(tuple(prefixes))


def test_the_same_families_and_statistics_names(both: dict[str, dict[str, Any]]) -> None:
    ip, served = both["inprocess"], both["served"]
    ip_families = {f for f in ip["families"] if f.startswith("vllm:")}
    served_families = {
        f for f in served["families"] if f.startswith("vllm:") and not _rl_route_family(f)
    }
    assert ip_families == served_families
    for kind in ("window_keys", "poll_keys"):
        only_ip = sorted(set(ip[kind]) - set(served[kind]))
        rl_routes = sorted(k for k in set(served[kind]) - set(ip[kind]) if _served_only(k))
        only_served = sorted(set(served[kind]) - set(ip[kind]) - set(rl_routes))
        assert (only_ip, only_served) == ([], []), kind
        print(f"\n{kind}: {len(ip[kind])} the same; the server's RL routes add {rl_routes[:6]}")


def _served_only(key: str) -> bool:
    """Keys only a server has: those of its RL routes' families (``rl_weight_update_...``,
    ``sleep_mode_...``: the API server records them, an ``LLM()`` has no such routes)."""
    from fleetscope.catalog import OPERATION_FAMILIES

    names = {n.removeprefix("vllm:").split("_operation")[0] for n in OPERATION_FAMILIES}
    return any(f"/{n}_operation" in key for n in names)
