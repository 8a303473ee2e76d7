"""``GET /version`` once per endpoint (SGLang: ``/server_info``), the catalog check against
the body, deadlines and backoff, and no secrets in the warnings."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine

import httpx
import pytest

from fleetscope.exposition import parse
from fleetscope.sources.base import Endpoint, ScrapeResult
from fleetscope.sources.http.server_version import (
    JUDGE_BODIES,
    ServerVersions,
    expected_families,
    version_tuple,
)
from fleetscope.sources.http.source import HttpSource
from fleetscope.util.warn import RateLimitedWarner
from fleetscope_sim import FleetServer, SimFleet
from support.paths import DATA

SG = DATA / "sglang-0.5.23"
# what httpx.MockTransport answers with: a sync or an async handler
Handler = (
    Callable[[httpx.Request], httpx.Response]
    | Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, endpoint: str, kind: str, message: str) -> None:
        self.calls.append((endpoint, kind, message))


def _client(handler: Handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _result(name: str, text: str) -> ScrapeResult:
    return ScrapeResult(name, parse(text), 0.0, 0.0)


async def _settle(sv: ServerVersions, ep: Endpoint, text: str, client: httpx.AsyncClient) -> None:
    async def get() -> httpx.AsyncClient:
        return client

    tasks = sv.start(get, [ep], [_result(ep.name, text)])
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)


def test_version_tuple_and_expected_names() -> None:
    assert version_tuple("0.5.23") == (0, 5, 23)
    assert version_tuple("0.11.1rc2.dev3+gabc") == (0, 11, 1)
    assert version_tuple("0.5.2.post1") == (0, 5, 2)
    sg = expected_families("sglang", "0.5.23")
    assert sg["vllm:kv_cache_usage_perc"] == ("sglang:full_token_usage", "sglang:token_usage")
    assert sg["vllm:num_requests_waiting"] == ("sglang:num_queue_reqs",)
    vl = expected_families("vllm", "0.32.0")
    assert set(vl["vllm:kv_cache_usage_perc"]) == {
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    }


def test_sglang_version_from_server_info_and_a_missing_name_warned_once() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"version": "0.5.23", "api_key": "sk-never-logged"})
        return httpx.Response(404, json={"detail": "Not Found"})

    full = (SG / "single_after.prom").read_text()
    cut = "\n".join(ln for ln in full.split("\n") if "sglang:num_queue_reqs" not in ln)
    warn = Recorder()
    sv = ServerVersions(warn, deadline=5.0)
    ep = Endpoint("http://127.0.0.1:1", name="server3")

    async def main() -> None:
        client = _client(handler)
        await _settle(sv, ep, cut, client)
        assert asked == ["/version", "/server_info"]  # SGLang 0.5.23 has no /version
        assert sv.version("server3") == "0.5.23"
        for _ in range(JUDGE_BODIES + 3):
            sv.start(lambda: client, [ep], [_result("server3", cut)])  # type: ignore[arg-type, return-value]  # a sync getter, never called: version settled
        assert asked == ["/version", "/server_info"]  # asked once
        r = sv.annotate(_result("server3", cut))
        assert (r.engine_kind, r.server_version) == ("sglang", "0.5.23")

    asyncio.run(main())
    catalog = [c for c in warn.calls if c[1] == "catalog"]
    assert len(catalog) == 1
    endpoint, _, message = catalog[0]
    assert endpoint == "server3" and "server3" in message and "sglang 0.5.23" in message
    assert "sglang:num_queue_reqs" in message and "num_running_reqs" not in message
    assert not any("sk-never" in m for _, _, m in warn.calls)


def test_complete_body_no_warning_and_idle_body_not_judged() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"version": "0.5.23"})

    warn = Recorder()
    sv = ServerVersions(warn, deadline=5.0)
    ep_full, ep_idle = Endpoint("http://a:1", name="full"), Endpoint("http://b:1", name="idle")
    full = (SG / "single_after.prom").read_text()
    idle = (SG / "single_idle.prom").read_text()  # no tokenizer series before a request

    async def main() -> None:
        client = _client(handler)
        await _settle(sv, ep_full, full, client)
        await _settle(sv, ep_idle, idle, client)
        for _ in range(JUDGE_BODIES + 2):
            sv.start(lambda: client, [ep_full, ep_idle],  # type: ignore[arg-type, return-value]  # a sync getter, never called: version settled
                     [_result("full", full), _result("idle", idle)])  # fmt: skip

    asyncio.run(main())
    assert warn.calls == []
    assert sv._probes["idle"].judged is False and sv._probes["full"].judged is True


def test_a_hanging_version_route_meets_its_deadline_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        await release.wait()  # never answers within the deadline
        return httpx.Response(200, json={"version": "9"})

    log = logging.getLogger("fleetscope.test")
    warner = RateLimitedWarner(log, prefix="fleetscope: ")

    def warn(e: str, k: str, m: str) -> None:
        warner.warn(f"{e}:{k}", m)

    sv = ServerVersions(warn, deadline=0.2)
    ep = Endpoint("http://user:hunter2@127.0.0.1:1", name="server0")
    body = (SG / "single_after.prom").read_text()

    async def main() -> float:
        client = _client(handler)

        async def get() -> httpx.AsyncClient:
            return client

        t0 = time.monotonic()
        tasks = sv.start(get, [ep], [_result("server0", body)])
        done, _ = await asyncio.wait(tasks, timeout=20)
        took = time.monotonic() - t0
        assert done == set(tasks)
        assert sv.start(get, [ep], [_result("server0", body)]) == []  # backing off
        release.set()
        return took

    with caplog.at_level(logging.WARNING, logger="fleetscope.test"):
        took = asyncio.run(main())
    assert took < 10  # the deadline (0.2 s), not the route's hang
    assert sv.version("server0") is None and not sv._probes["server0"].settled
    text = caplog.text
    assert "/version of server0 unavailable: timed out" in text and "hunter2" not in text


def test_http_source_reads_vllm_and_sglang_versions_from_the_simulator() -> None:
    fleet = SimFleet.build(2, dp=1, engine_kind="mixed", seed=2)
    fleet.step(2.0)

    async def main(urls: list[str]) -> list[ScrapeResult]:
        src = HttpSource(urls, timeout=10.0)
        try:
            for _ in range(20):  # a probe answers within the poll that started it (loopback)
                results = await src.scrape()
                if all(r.server_version for r in results):
                    return results
            return results
        finally:
            await src.aclose()

    with FleetServer(fleet) as server:
        results = asyncio.run(main(server.urls))
    got = {r.endpoint: (r.engine_kind, r.server_version) for r in results}
    assert got == {"server0": ("vllm", "0.32.0"), "server1": ("sglang", "0.5.23")}


@pytest.mark.parametrize("payload", [{"version": 3}, {"version": "x" * 500}, ["0.1"]])
def test_unusable_answers_are_no_version(payload: object) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=payload)

    sv = ServerVersions(Recorder(), deadline=5.0)
    ep = Endpoint("http://a:1", name="s")

    async def main() -> None:
        await _settle(sv, ep, (SG / "single_after.prom").read_text(), _client(handler))

    asyncio.run(main())
    assert sv.version("s") is None and sv._probes["s"].settled


def test_an_idle_multiprocess_vllm_server_is_not_judged_until_it_served() -> None:
    """A real DP=2 vLLM 0.32 body before any request: the counters exist at 0 but the engines'
    per-step gauges (running, waiting, KV usage) appear only once they stepped. No warning
    then; once tokens were generated, a missing gauge is warned about."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"version": "0.32.0"})

    idle = (DATA / "real-vllm" / "dp2_idle.prom").read_text()
    assert "\nvllm:num_requests_running{" not in idle and "vllm:generation_tokens_total" in idle
    after = (DATA / "real-vllm" / "dp2_after.prom").read_text()
    cut = "\n".join(ln for ln in after.split("\n") if "vllm:num_requests_waiting" not in ln)
    warn = Recorder()
    sv = ServerVersions(warn, deadline=5.0)
    ep = Endpoint("http://a:1", name="dp")

    async def main() -> None:
        client = _client(handler)
        await _settle(sv, ep, idle, client)
        for _ in range(JUDGE_BODIES + 5):
            sv.start(lambda: client, [ep], [_result("dp", idle)])  # type: ignore[arg-type, return-value]  # a sync getter, never called: version settled
        assert warn.calls == [] and sv._probes["dp"].judged is False
        for _ in range(JUDGE_BODIES):
            sv.start(lambda: client, [ep], [_result("dp", cut)])  # type: ignore[arg-type, return-value]  # a sync getter, never called: version settled

    asyncio.run(main())
    (call,) = [c for c in warn.calls if c[1] == "catalog"]
    assert "vllm:num_requests_waiting" in call[2] and "num_requests_running" not in call[2]


def test_an_sglang_prefill_server_is_not_expected_to_record_first_tokens() -> None:
    """SGLang's prefill server of a P/D pair records no TTFT (the decode server does): its
    complete body is judged without a warning, the decode server's too."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"version": "0.5.23"})
        return httpx.Response(404)

    warn = Recorder()
    sv = ServerVersions(warn, deadline=5.0)
    bodies = {n: (SG / f"pd_{n}_after.prom").read_text() for n in ("prefill", "decode")}
    assert "sglang:time_to_first_token_seconds_count" not in bodies["prefill"]
    eps = [Endpoint(f"http://{n}:1", name=n) for n in bodies]

    async def main() -> None:
        client = _client(handler)
        for ep in eps:
            await _settle(sv, ep, bodies[ep.name], client)
        for _ in range(JUDGE_BODIES):
            results = [_result(n, b) for n, b in bodies.items()]
            sv.start(lambda: client, eps, results)  # type: ignore[arg-type, return-value]  # a sync getter, never called: version settled

    asyncio.run(main())
    assert warn.calls == []
    assert all(sv._probes[n].judged for n in bodies)
