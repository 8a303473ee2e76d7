"""The Ray path against a real local Ray cluster (Ray's metrics agent, OpenTelemetry backend).

Three actors record vLLM's metrics through ``ray.util.metrics`` exactly the way vLLM's
``RayPrometheusStatLogger`` does (names sanitized ``vllm:x`` -> ``vllm_x``, tag keys
``model_name``, ``engine`` plus ``ReplicaId`` = "" outside Serve): two are the run's own (one
prefill, one decode), the third is a foreign "twin" with the same tags as the prefill one.

* worker ids: each actor's ``get_worker_id()`` equals what ``worker_ids_of_actors`` reads from
  Ray for its handle;
* a ``Collector(source=RaySource(identity))`` finds the agent from ``ray.nodes()``, keeps the two
  own engines, drops the twin, and after known increments logs exactly them:
  ``inference/agg/generation_tokens_total/delta`` etc., also per role scope;
* an ``identity_lookup`` built on ``RayIdentity.of_actors`` gives the same engines.

Ray is a test dependency: a missing Ray fails this module (no skip). ``ray.init`` dominates the
runtime: 10-45 s here, depending on the machine's load; the rest takes ~10 s.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import httpx
import pytest
import ray  # not importorskip: CI installs Ray, and a missing Ray must fail loudly
from ray import cloudpickle
from ray.util import metrics as ray_metrics

from fleetscope.collector.core import Collector, FleetView
from fleetscope.sources.ray.source import (
    RayIdentity,
    RaySource,
    discover_agents,
    worker_ids_of_actors,
)
from support.ray_cluster import local_ray

# Ray's own functions used here, without annotations upstream: their signatures, typed here
register_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
ray_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes

# Ray's workers cannot import this test module: ship its actor class by value
register_pickle_by_value(sys.modules[__name__])

REPORT_INTERVAL_MS = 1000
MODEL = "tiny-llama"
LABELS = ("model_name", "engine")
TTFT_BUCKETS = [0.01, 0.1, 1.0, 10.0]


def _ray_name(name: str) -> str:
    """vLLM's ``_get_sanitized_opentelemetry_name``. Ray 2.60 accepts ``vllm:x`` with a
    FutureWarning but its agent never exports it (checked: absent after 5 s)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


@ray.remote(num_cpus=0)
class FakeVllmEngine:
    """Records vLLM's metrics like ``RayPrometheusStatLogger`` (``ReplicaId`` appended to the
    tag keys, "" outside Ray Serve); gauges are re-set every 0.2 s, as a running engine does
    every step (Ray expires a gauge ~2 report intervals after its last update)."""

    def __init__(self, model_name: str, engine: int) -> None:
        keys = (*LABELS, "ReplicaId")
        self.tags = {"model_name": model_name, "engine": str(engine), "ReplicaId": ""}
        self.prompt = ray_metrics.Counter(
            _ray_name("vllm:prompt_tokens"), description="Prefill tokens.", tag_keys=keys
        )
        self.generation = ray_metrics.Counter(
            _ray_name("vllm:generation_tokens"), description="Generation tokens.", tag_keys=keys
        )
        self.running = ray_metrics.Gauge(
            _ray_name("vllm:num_requests_running"), description="Running.", tag_keys=keys
        )
        self.ttft = ray_metrics.Histogram(
            _ray_name("vllm:time_to_first_token_seconds"),
            description="TTFT.",
            boundaries=TTFT_BUCKETS,
            tag_keys=keys,
        )
        self.running_now = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._refresh_gauges, daemon=True).start()

    def _refresh_gauges(self) -> None:
        while True:
            with self.lock:
                self.running.set(self.running_now, tags=self.tags)
            time.sleep(0.2)

    def worker_id(self) -> str:
        return ray.get_runtime_context().get_worker_id()

    def record(self, prompt: int, generation: int, running: float, ttfts: list[float]) -> bool:
        if prompt:  # Ray's Counter.inc(0) raises; vLLM's wrapper skips zeros the same way
            self.prompt.inc(prompt, tags=self.tags)
        if generation:
            self.generation.inc(generation, tags=self.tags)
        for t in ttfts:
            self.ttft.observe(t, tags=self.tags)
        with self.lock:
            self.running_now = running
            self.running.set(running, tags=self.tags)
        return True


# the actor class ray.remote made of it (.remote, .options): mypy keeps the decorated
# class's own type, and Ray's actor handles are untyped
ENGINE_ACTOR: Any = FakeVllmEngine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray(
        "fsray-",
        _metrics_export_port=_free_port(),
        _system_config={"metrics_report_interval_ms": REPORT_INTERVAL_MS},
    ) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def engines(ray_cluster: Any) -> tuple[list[Any], list[str]]:
    """(own prefill, own decode, foreign twin of the prefill one) and their worker ids."""
    actors = [
        ENGINE_ACTOR.remote(MODEL, 0),
        ENGINE_ACTOR.remote(MODEL, 1),
        ENGINE_ACTOR.remote(MODEL, 0),  # same tags as the prefill engine, another worker
    ]
    wids: list[str] = ray.get([a.worker_id.remote() for a in actors], timeout=60)
    return actors, wids


def _agent_url() -> str:
    (ep,) = discover_agents(ray_nodes())
    return ep.metrics_url


def _samples(body: str) -> dict[tuple[str, str], float]:
    """(sample name, WorkerId) -> value, for the ray_vllm_* samples we record (no buckets)."""
    out: dict[tuple[str, str], float] = {}
    rx = re.compile(r'^(ray_vllm_\w+)\{.*WorkerId="([0-9a-f]*)".* (\S+)$')
    for line in body.splitlines():
        m = rx.match(line)
        if m and not m.group(1).endswith("_bucket"):
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def _wait_for_agent(
    url: str, want: Mapping[tuple[str, str], float], timeout: float = 20.0
) -> dict[tuple[str, str], float]:
    """Until the agent serves every expected value (Ray reports every report interval)."""
    deadline = time.monotonic() + timeout
    got: dict[tuple[str, str], float] = {}
    while time.monotonic() < deadline:
        try:
            got = _samples(httpx.get(url, timeout=5).text)
        except httpx.HTTPError:
            got = {}
        if all(got.get(k) == v for k, v in want.items()):
            return got
        time.sleep(0.2)
    missing = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
    raise AssertionError(f"agent at {url} never showed {missing} (want, got)")


def _expect(
    wids: Sequence[str], totals: Sequence[tuple[float, float, float, int]]
) -> dict[tuple[str, str], float]:
    """Expected agent samples from per-actor (prompt, generation, running, ttft count)."""
    want: dict[tuple[str, str], float] = {}
    for wid, (p, g, r, n) in zip(wids, totals, strict=True):
        want[("ray_vllm_prompt_tokens_total", wid)] = p
        want[("ray_vllm_generation_tokens_total", wid)] = g
        want[("ray_vllm_num_requests_running", wid)] = r
        want[("ray_vllm_time_to_first_token_seconds_count", wid)] = n
    return want


def _record(actors: Sequence[Any], plan: Sequence[tuple[int, int, float, list[float]]]) -> None:
    ray.get([a.record.remote(*p) for a, p in zip(actors, plan, strict=True)], timeout=30)


def test_worker_ids_from_actor_handles(engines: tuple[list[Any], list[str]]) -> None:
    actors, wids = engines
    assert len(set(wids)) == 3 and all(re.fullmatch(r"[0-9a-f]{56}", w) for w in wids)
    # Ray's actor table, read for the handles (works without the dashboard)
    assert worker_ids_of_actors(actors, timeout=10) == wids
    assert worker_ids_of_actors([a._actor_id.hex() for a in actors]) == wids
    ident = RayIdentity.of_actors(actors[:2], roles=["prefill", "decode"])
    assert ident.worker_ids == set(wids[:2])
    assert ident.roles == {wids[0]: "prefill", wids[1]: "decode"}


async def test_collector_counts_exactly_the_own_engines(
    engines: tuple[list[Any], list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    actors, wids = engines
    own_p, own_d, twin = wids
    url = _agent_url()
    node = next(n for n in ray_nodes() if n["Alive"])
    endpoint = f"node-{node['NodeID'][:8]}"
    e_p, e_d = f"{endpoint}.{own_p[:8]}-0", f"{endpoint}.{own_d[:8]}-1"

    # warm-up: every series exists before the baseline (Ray omits counters never incremented)
    warm = [(100, 1, 2, [0.05]), (7, 50, 5, [0.5]), (1000, 1000, 99, [5.0])]
    _record(actors, warm)
    seen = _wait_for_agent(url, _expect(wids, [(p, g, r, len(t)) for p, g, r, t in warm]))
    assert seen[("ray_vllm_prompt_tokens_total", twin)] == 1000  # the twin is in the body

    identity = RayIdentity(worker_ids={own_p, own_d}, roles={own_p: "prefill", own_d: "decode"})
    source = RaySource(identity)  # agents from ray.nodes()
    collector = Collector(source=source, interval=3600)
    try:
        first = await collector.poll()
        assert [e.metrics_url for e in source.endpoints] == [url]
        assert set(first.engines) == {e_p, e_d}
        assert first.engines[e_p].role == "prefill" and first.engines[e_d].role == "decode"
        assert first.engines[e_p].running == 2 and first.engines[e_d].running == 5
        assert first.keys["inference/agg/num_requests_running/sum"] == 2 + 5  # not the twin's 99
        assert source.foreign_engines == 1 and source.missing == set()

        # known increments; the twin does far more, and none of it may count
        inc = [(300, 3, 4, [0.05, 0.05, 0.5]), (20, 400, 9, [0.5]), (5000, 7000, 77, [5.0] * 5)]
        _record(actors, inc)
        totals = [
            (p0 + p1, g0 + g1, r1, len(t0) + len(t1))
            for (p0, g0, _, t0), (p1, g1, r1, t1) in zip(warm, inc, strict=True)
        ]
        _wait_for_agent(url, _expect(wids, totals))
        view = await collector.poll()
    finally:
        await collector.stop()

    k = view.keys
    assert k["inference/agg/engines_reporting"] == 2
    assert k["inference/agg/prompt_tokens_total/delta"] == 300 + 20
    assert k["inference/agg/generation_tokens_total/delta"] == 3 + 400
    assert k["inference/agg/time_to_first_token_seconds/delta"] == 3 + 1
    assert k["inference/agg/num_requests_running/sum"] == 4 + 9
    assert k["inference/prefill/prompt_tokens_total/delta"] == 300
    assert k["inference/prefill/generation_tokens_total/delta"] == 3
    assert k["inference/decode/prompt_tokens_total/delta"] == 20
    assert k["inference/decode/generation_tokens_total/delta"] == 400
    assert k["inference/prefill/engines_reporting"] == 1
    assert k["inference/decode/engines_reporting"] == 1
    assert k[f"inference/{e_d}/num_requests_running"] == 9
    assert k["inference/agg/generation_tokens_total:rate/sum"] > 0
    assert not [key for key in k if twin[:8] in key]
    assert view.engines[e_p].running == 4 and view.engines[e_d].running == 9
    assert view.engines[e_d].kv_usage is None  # not recorded: missing, never 0
    # the bucket layout survives the trip through Ray: TTFT quantiles come from pooled buckets
    assert k["inference/decode/time_to_first_token_seconds/p50"] <= TTFT_BUCKETS[2]
    assert not [
        r for r in caplog.records if r.name == "fleetscope" and r.levelno >= logging.WARNING
    ]


async def test_identity_lookup_from_actor_handles(engines: tuple[list[Any], list[str]]) -> None:
    actors, wids = engines

    def lookup() -> RayIdentity:
        return RayIdentity.of_actors(actors[:2], roles=["prefill", "decode"], timeout=5)

    source = RaySource(identity_lookup=lookup, nodes=ray.nodes)
    collector = Collector(source=source, interval=3600)
    try:
        view = await collector.poll()
    finally:
        await collector.stop()
    assert source.disabled is None
    assert sorted(e.split(".", 1)[1] for e in view.engines) == sorted(
        [f"{wids[0][:8]}-0", f"{wids[1][:8]}-1"]
    )
    assert {e.role for e in view.engines.values()} == {"prefill", "decode"}


def test_failed_lookup_for_a_dead_actor(
    engines: tuple[list[Any], list[str]], ray_cluster: Any
) -> None:
    """A lookup that cannot succeed raises (RaySource turns that into a disabled source)."""
    actor = ENGINE_ACTOR.remote(MODEL, 5)
    ray.get(actor.worker_id.remote(), timeout=60)
    ray.kill(actor)
    for _ in range(50):
        try:
            worker_ids_of_actors([actor], timeout=1)
        except LookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("a killed actor still resolves to a worker id")


async def test_a_restarted_actor_is_re_resolved_and_counted_from_its_start(
    engines: tuple[list[Any], list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """An actor restarts (``max_restarts``) in a new worker under a new worker id. With an
    ``identity_lookup``, RaySource looks it up again, follows the new worker, and counts
    the new process from 0: the work it did before fleetscope first saw it is not lost."""
    actor = ENGINE_ACTOR.options(max_restarts=1).remote(MODEL, 7)
    old = ray.get(actor.worker_id.remote(), timeout=60)
    url = _agent_url()
    node = next(n for n in ray_nodes() if n["Alive"])
    endpoint = f"node-{node['NodeID'][:8]}"
    ray.get(actor.record.remote(100, 50, 1.0, [0.05]), timeout=30)
    _wait_for_agent(url, {("ray_vllm_generation_tokens_total", old): 50})

    lookups: list[str] = []

    def lookup() -> RayIdentity:
        ident = RayIdentity.of_actors([actor], roles=["decode"], timeout=5)
        lookups.extend(ident.worker_ids)
        return ident

    source = RaySource(identity_lookup=lookup, nodes=ray.nodes, relookup_after=1)
    collector = Collector(source=source, interval=3600)
    caplog.set_level(logging.INFO, logger="fleetscope")
    try:
        first = await collector.poll()
        assert set(first.engines) == {f"{endpoint}.{old[:8]}-7"}
        assert lookups == [old]
        train = collector.window("train")  # spans the restart
        await train.astart()

        ray.kill(actor, no_restart=False)
        deadline = time.monotonic() + 60
        new = old
        while new == old:
            assert time.monotonic() < deadline, "the actor did not restart"
            try:
                new = ray.get(actor.worker_id.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                time.sleep(0.5)
        # the new process works before fleetscope hears of it
        ray.get(actor.record.remote(30, 20, 2.0, [0.5]), timeout=30)
        _wait_for_agent(url, {("ray_vllm_generation_tokens_total", new): 20})

        e_new = f"{endpoint}.{new[:8]}-7"
        views: list[FleetView] = []
        while e_new not in (views[-1].engines if views else {}):
            assert len(views) < 6, [sorted(v.engines) for v in views]
            time.sleep(1.1)  # polls a clock-skew margin apart, like a real interval
            views.append(await collector.poll())
        arrival = views[-1]
        window = await train.astop()
    finally:
        await collector.stop()
        ray.kill(actor, no_restart=True)

    assert lookups[-1] == new and source.disabled is None
    assert set(arrival.engines) == {e_new}  # the dead worker is not the run's any more
    assert arrival.engines[e_new].role == "decode"
    # counted from 0 at first sight: everything the new process did
    assert arrival.keys["inference/agg/generation_tokens_total/delta"] == 20
    assert arrival.keys["inference/agg/prompt_tokens_total/delta"] == 30
    assert source.missing == set()
    assert any(
        "Ray identity re-resolved: 1 new worker id" in r.getMessage() for r in caplog.records
    )
    # the window across the restart is exact, and complete: the old worker is expected until
    # its last scrape, the new one from the start of the interval it was counted over
    assert window["inference/train/agg/generation_tokens_total/delta"] == 20
    assert window["inference/train/coverage"] == pytest.approx(1.0, abs=1e-12)
