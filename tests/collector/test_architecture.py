"""The contracts between the stages: engine identity as a value, one source protocol with one
clock per field, options that reach every shard, declared sink hooks, the public API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import httpx
import pytest

import fleetscope
from fleetscope.collector.core import Collector
from fleetscope.identity import EngineId
from fleetscope.sinks.base import EventSink, PollSink, RunSink, Sink, WindowSink
from fleetscope.sources.base import MembershipSource, Source
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.prometheus import PrometheusSource
from fleetscope_sim import FleetServer, SimFleet

if TYPE_CHECKING:
    from fleetscope.fleet.state import PollResult
    from fleetscope.health import HealthEvent
    from fleetscope.sinks.base import Value


def test_public_api_imports_from_the_top_level() -> None:
    f = fleetscope
    for name in ("Collector", "parse", "Endpoint", "JsonlSink", "ShardedCollector", "FleetView"):
        assert getattr(f, name) is not None
    assert set(f.__all__) >= {"Collector", "HealthThresholds", "EngineLoad", "WindowError"}
    # the optional extras are not imported by `import fleetscope`
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fleetscope, sys; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('wandb', 'ray', 'mlflow', 'tensorboard')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_engine_id_is_a_value_never_split() -> None:
    e = EngineId("rack1", "a.b")
    assert (e.endpoint, e.label, str(e)) == ("rack1", "a.b", "rack1.a.b")
    by_id: dict[str, int] = {e: 1}  # an EngineId is a str: keys by the rendered id
    assert by_id["rack1.a.b"] == 1  # usable where the rendered id is expected
    row = EngineId("rack1")
    assert row.endpoint == "rack1" and not row.is_engine
    assert EngineId.from_json(json.loads(json.dumps(e.to_json()))).endpoint == "rack1"


@pytest.mark.parametrize("bad", ["rack1.gpu0", "a/b", "sp ace", ".x"])
def test_endpoint_names_with_separators_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="endpoint name"):
        Endpoint("http://127.0.0.1:1", name=bad)


async def test_removing_an_endpoint_drops_exactly_its_engines() -> None:
    """The bug of dotted names: the endpoint's own row looked like an engine of another
    endpoint and its baselines were never dropped. With EngineId values, removing ``rack1``
    drops every row of ``rack1`` and nothing of ``rack10``."""
    fleet = SimFleet(seed=3)
    fleet.add_endpoint(dp=2)
    fleet.add_endpoint(dp=1)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector(
            [Endpoint(server.urls[0], name="rack1"), Endpoint(server.urls[1], name="rack10")],
            interval=3600,
        )
        await c.poll()
        assert {str(e) for e in c.state.baselines.engines()} >= {"rack1.0", "rack1.1", "rack10.0"}
        c.remove_endpoints("rack1")
        view = await c.poll()
        await c.stop()
    # the collector's baselines are keyed by EngineId (Baselines.engines() says list[str])
    left = cast("list[EngineId]", c.state.baselines.engines())
    assert all(e.endpoint == "rack10" for e in left), left
    assert set(view.engines) == {"rack10.0"}
    assert all(isinstance(e, EngineId) for e in view.engines)


def test_every_source_implements_the_one_protocol() -> None:
    assert isinstance(HttpSource(), Source) and isinstance(HttpSource(), MembershipSource)
    assert isinstance(PrometheusSource("http://127.0.0.1:9"), Source)
    from fleetscope.sources.ray.source import RaySource

    assert isinstance(RaySource(), Source)


def test_endpoints_and_a_source_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Collector(["http://127.0.0.1:1"], source=PrometheusSource("http://127.0.0.1:9"))


def _prometheus_transport(state: dict[str, float]) -> httpx.MockTransport:
    """A Prometheus API whose one target was scraped at ``state['t']`` (wall clock)."""

    def vector(rows: list[tuple[dict[str, str], float]]) -> httpx.Response:
        result = [{"metric": m, "value": [state["t"], repr(v)]} for m, v in rows]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/metadata":
            meta = {"vllm:generation_tokens_total": [{"type": "counter"}]}
            return httpx.Response(200, json={"status": "success", "data": meta})
        q = request.url.params["query"]
        target = {"instance": "h:1", "job": "j"}
        if q == "up":
            return vector([({"__name__": "up", **target}, 1.0)])
        if q == "timestamp(up)":
            return vector([(target, state["t"])])
        metric = {"__name__": "vllm:generation_tokens_total", "engine": "0", **target}
        return vector([(metric, state["tokens"])])

    return httpx.MockTransport(handler)


async def test_prometheus_source_times_are_this_process_monotonic_clock() -> None:
    """``ScrapeResult.time`` is this process' monotonic clock for every source (the target's
    wall scrape time translated), ``wall_time`` the target's own: a window still open at
    ``stop()`` gets its active seconds (it got 0 when the source filled ``time`` with wall
    time and the collector closed windows at ``time.monotonic()``)."""
    state = {"t": time.time() - 0.5, "tokens": 5.0}
    src = PrometheusSource("http://prom:9090", names={"h:1": "server0"})
    src._client = httpx.AsyncClient(transport=_prometheus_transport(state))
    c = Collector(source=src, interval=3600)
    (sc,) = await src.scrape()
    assert sc.wall_time == state["t"]
    # the same instant on this clock: one fixed offset between the clocks (read at start)
    assert sc.time == sc.wall_time + src._clock_offset
    assert abs(src._clock_offset - (time.monotonic() - time.time())) < 5.0
    await c.poll()
    w = c.window("train")
    await w.astart()
    state.update(t=time.time(), tokens=25.0)
    await asyncio.sleep(0.3)
    await c.stop()  # the window is still open: closed at the end of the run
    s: dict[str, Any] = c.summary()  # float values, and the run status (str)
    assert s["inference_summary/train/agg/generation_tokens_total/delta"] == 20.0
    assert s["inference_summary/train/active_seconds"] > 0.2


class _AllHooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        self.calls.append("log")

    def log_poll(self, result: PollResult) -> None:
        self.calls.append("log_poll")

    def log_events(self, events: Sequence[HealthEvent]) -> None:
        self.calls.append("log_events")

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        self.calls.append("log_summary")

    def on_window_start(self, label: str) -> None:
        self.calls.append(f"start:{label}")

    def on_window_stop(self, label: str) -> None:
        self.calls.append(f"stop:{label}")

    def on_run_end(self, status: str) -> None:
        self.calls.append(f"end:{status}")

    def close(self) -> None:
        self.calls.append("close")


async def test_declared_sink_hooks_are_all_called_in_order() -> None:
    sink = _AllHooks()
    assert all(isinstance(sink, p) for p in (Sink, PollSink, EventSink, WindowSink, RunSink))
    fleet = SimFleet(seed=1)
    fleet.add_endpoint(dp=1)
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, sinks=[sink])
        await c.poll()
        async with c.window("eval"):
            fleet.step(1.0)
        await c.stop(status="failed")
    calls = [x for x in sink.calls if x != "log_events"]
    assert calls[0] == "log_poll" and "log" not in calls  # log_poll replaces log
    assert calls.index("start:eval") < calls.index("stop:eval") < calls.index("log_summary")
    assert calls[-2:] == ["end:failed", "close"]


async def test_sharded_shards_receive_every_option() -> None:
    """Headers, TLS verification, the body cap and model groups reach every shard (they were
    dropped when shards built their own HTTP source from two options)."""
    from fleetscope.collector.sharded import ShardedCollector
    from support.ray_cluster import local_ray

    fleet = SimFleet(seed=2)
    for _ in range(3):
        fleet.add_endpoint(dp=1)
    fleet.step(1.0)
    with local_ray("fs-arch-"), FleetServer(fleet) as server:
        c = ShardedCollector(
            server.urls,
            shards=2,
            interval=3600,
            headers={"Authorization": "Bearer t0k"},
            verify=False,
            max_body_bytes=123_456,
            group_by_model=True,
            timeout=7.0,
        )
        try:
            assert c.sharded is not None  # inline: the shards are this process's
            settings = await c.sharded.settings()
            view = await c.poll()
        finally:
            await c.stop()
    assert len(settings) == 2
    for s in settings:
        assert s["headers"]["Authorization"] == "Bearer t0k"
        assert s["verify"] is False and s["max_body_bytes"] == 123_456
        assert s["group_by_model"] is True and s["timeout"] == 7.0
    assert any(k.startswith("inference/model:") for k in view.keys)  # the driver's groups
