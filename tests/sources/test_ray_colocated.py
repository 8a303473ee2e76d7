"""Engines inside a trainer's Ray actors (verl's hybrid layout: one engine in each rollout worker
actor), recording through Ray's metrics agent, read with ``RaySource``.

Against a real local Ray cluster: each of two rollout workers holds an engine that records
vLLM's metrics with ``ray.util.metrics`` the way vLLM's ``RayPrometheusStatLogger`` does (names
sanitized, tags ``model_name``, ``engine`` and ``ReplicaId``). Every worker's engine is engine
``0`` of the same model, so the tags are identical: only the worker id tells them apart. A
third actor of the trainer (a critic) holds no engine; a fourth runs an engine that is not the
run's (another job's worker on the same node, same tags).

* ``RayIdentity.of_actors(rollout_workers)`` finds both engines as separate engines, and none of
  the critic's or the other job's;
* a window around one ``generate_sequences`` call of each worker holds exactly the tokens,
  requests and TTFT observations they recorded, per engine and for the fleet.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import pytest
import ray
from ray import cloudpickle
from ray.util import metrics as ray_metrics

from fleetscope.collector.core import Collector
from fleetscope.sources.ray.source import RayIdentity, RaySource, discover_agents
from support.ray_cluster import local_ray

pytestmark = pytest.mark.slow  # a Ray cluster: 10-45 s to start on a loaded machine

# Ray's own functions are untyped: typed names for the ones used here
_by_value: Callable[[Any], None] = cloudpickle.register_pickle_by_value
_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes
_by_value(sys.modules[__name__])  # Ray's workers cannot import this module: ship it by value

REPORT_INTERVAL_MS = 1000
DEADLINE_S = 120.0  # a bound for a loaded machine, not a pace
TTFT_BUCKETS = [0.01, 0.1, 1.0, 10.0]


def _ray_name(name: str) -> str:
    """vLLM's ``_get_sanitized_opentelemetry_name`` (``vllm:x`` -> ``vllm_x``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


class _RolloutWorker:
    """A trainer worker holding an engine (engine "0" of its own ``LLM``) whose stat logger is
    Ray's: what it records goes to the node's metrics agent, tagged with this worker's id."""

    def __init__(self, model: str) -> None:
        keys = ("model_name", "engine", "ReplicaId")
        self.tags = {"model_name": model, "engine": "0", "ReplicaId": ""}
        self.prompt = ray_metrics.Counter(
            _ray_name("vllm:prompt_tokens"), description="Prompt tokens.", tag_keys=keys
        )
        self.tokens = ray_metrics.Counter(
            _ray_name("vllm:generation_tokens"), description="Generated.", tag_keys=keys
        )
        self.ok = ray_metrics.Counter(
            _ray_name("vllm:request_success"),
            description="Finished.",
            tag_keys=(*keys, "finished_reason"),
        )
        self.ttft = ray_metrics.Histogram(
            _ray_name("vllm:time_to_first_token_seconds"),
            description="TTFT.",
            boundaries=TTFT_BUCKETS,
            tag_keys=keys,
        )

    def worker_id(self) -> str:
        return str(ray.get_runtime_context().get_worker_id())

    def generate_sequences(self, prompts: int, max_tokens: int) -> int:
        """One rollout: ``prompts`` requests of 10 prompt tokens, ``max_tokens`` each."""
        self.prompt.inc(10 * prompts, tags=self.tags)
        self.tokens.inc(prompts * max_tokens, tags=self.tags)
        self.ok.inc(prompts, tags={**self.tags, "finished_reason": "length"})
        for _ in range(prompts):
            self.ttft.observe(0.05, tags=self.tags)
        return prompts * max_tokens


class _CriticWorker:
    """A worker of the same trainer without an engine."""

    def ready(self) -> bool:
        return True


RolloutWorker: Any = ray.remote(num_cpus=0)(_RolloutWorker)
CriticWorker: Any = ray.remote(num_cpus=0)(_CriticWorker)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_ray(
        "fsrayco-",
        _metrics_export_port=_free_port(),
        _system_config={"metrics_report_interval_ms": REPORT_INTERVAL_MS},
    ) as ctx:
        yield ctx


def _generated(url: str) -> dict[str, float]:
    """WorkerId -> ``ray_vllm_generation_tokens_total`` in the agent's body."""
    rx = re.compile(r'^ray_vllm_generation_tokens_total\{.*WorkerId="([0-9a-f]*)".* (\S+)$')
    try:
        body = httpx.get(url, timeout=10).text
    except httpx.HTTPError:
        return {}
    return {m.group(1): float(m.group(2)) for line in body.splitlines() if (m := rx.match(line))}


def _wait_for_agent(url: str, want: Mapping[str, float]) -> None:
    """Until the agent serves every worker's expected total (it reports once per interval)."""
    deadline = time.monotonic() + DEADLINE_S
    got: dict[str, float] = {}
    while time.monotonic() < deadline:
        got = _generated(url)
        if all(got.get(w) == v for w, v in want.items()):
            return
        time.sleep(0.2)
    raise AssertionError(f"the agent at {url} never showed {dict(want)} (got {got})")


async def test_engines_in_rollout_worker_actors(cluster: Any) -> None:
    workers = [RolloutWorker.remote("policy"), RolloutWorker.remote("policy")]
    critic = CriticWorker.remote()
    other_job = RolloutWorker.remote("policy")  # same node, same tags, not the run's
    wids = ray.get([w.worker_id.remote() for w in workers], timeout=DEADLINE_S)
    other = ray.get(other_job.worker_id.remote(), timeout=DEADLINE_S)
    assert ray.get(critic.ready.remote(), timeout=DEADLINE_S)
    (agent,) = discover_agents(_nodes())
    node = next(n for n in _nodes() if n["Alive"])
    engines = {f"node-{node['NodeID'][:8]}.{w[:8]}-0" for w in wids}

    # warm-up: Ray exports a counter only once it was incremented
    warm = ray.get([w.generate_sequences.remote(1, 1) for w in [*workers, other_job]])
    _wait_for_agent(agent.metrics_url, {w: 1.0 for w in [*wids, other]})

    def lookup() -> RayIdentity:  # the trainer's rollout worker group
        return RayIdentity.of_actors(workers, timeout=10)

    source = RaySource(identity_lookup=lookup, nodes=ray.nodes)
    collector = Collector(source=source, interval=3600)
    try:
        first = await collector.poll()
        assert set(first.engines) == engines  # two engines, neither the critic nor the other job
        rollout = collector.window("rollout")
        await rollout.astart()
        done = ray.get(
            [
                workers[0].generate_sequences.remote(8, 32),
                workers[1].generate_sequences.remote(3, 100),
                other_job.generate_sequences.remote(50, 1000),
            ],
            timeout=DEADLINE_S,
        )
        _wait_for_agent(
            agent.metrics_url,
            {wids[0]: 1.0 + done[0], wids[1]: 1.0 + done[1], other: 1.0 + done[2]},
        )
        keys = await rollout.astop()
        view = collector.last
    finally:
        await collector.stop()
    assert warm == [1, 1, 1] and view is not None
    assert set(view.engines) == engines and source.foreign_engines == 1
    assert keys["inference/rollout/agg/generation_tokens_total/delta"] == 8 * 32 + 3 * 100
    assert keys["inference/rollout/agg/prompt_tokens_total/delta"] == 10 * (8 + 3)
    assert keys["inference/rollout/agg/request_success_total/delta"] == 8 + 3
    assert keys["inference/rollout/agg/time_to_first_token_seconds/delta"] == 8 + 3
    assert keys["inference/rollout/coverage"] == pytest.approx(1.0, abs=1e-12)
    e0, e1 = (f"node-{node['NodeID'][:8]}.{w[:8]}-0" for w in wids)
    assert view.keys[f"inference/{e0}/generation_tokens_total"] == 1 + 8 * 32
    assert view.keys[f"inference/{e1}/generation_tokens_total"] == 1 + 3 * 100
