"""Tests of the simulated vLLM fleet against real vLLM 0.32 expositions and its own truth."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from functools import lru_cache

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleetscope_sim import (
    CONTENT_TYPE_LATEST,
    FleetServer,
    LoadProfile,
    SimEndpoint,
    SimFleet,
    cli_main,
)
from fleetscope_sim.ledger import HistogramCounts, Ledger
from fleetscope_sim.vllm_families import FAMILIES, build_1_2_5_buckets
from support.paths import DATA

FIXTURES = DATA / "fixtures" / "vllm-0.32.0-cpu"
WALL = 1_800_000_000.0

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

# a family of a body: (type, help, label names, bucket bounds)
FamilyEntry = tuple[str, str, frozenset[str], tuple[float, ...]]
# a sample: (sample name, sorted label items)
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
Served = tuple[SimFleet, FleetServer]


# -- helpers ---------------------------------------------------------------------------------------
def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()  # a missing fixture fails loudly


def parse(text: str | bytes) -> dict[str, Metric]:
    if isinstance(text, bytes):
        text = text.decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def catalogue(text: str | bytes) -> dict[str, FamilyEntry]:
    """name -> (type, help, label names, bucket bounds) for every family of a body."""
    out: dict[str, FamilyEntry] = {}
    for name, fam in parse(text).items():
        labels = frozenset(k for s in fam.samples for k in s.labels if k != "le")
        bounds = tuple(
            sorted(
                {float(s.labels["le"]) for s in fam.samples if "le" in s.labels},
            )
        )
        out[name] = (fam.type, fam.documentation, labels, bounds)
    return out


def sample_values(text: str | bytes) -> dict[SampleKey, float]:
    """(sample name, sorted label items) -> value."""
    out: dict[SampleKey, float] = {}
    for fam in parse(text).values():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@lru_cache(maxsize=32)
def _samples(body: bytes) -> tuple[Sample, ...]:
    return tuple(s for fam in text_string_to_metric_families(body.decode()) for s in fam.samples)


def value(text: str | bytes, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    body = text.encode() if isinstance(text, str) else text
    matching = [
        s.value
        for s in _samples(body)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    if not matching:
        raise KeyError((name, labels))
    return sum(matching)


def vllm_only(cat: dict[str, FamilyEntry]) -> dict[str, FamilyEntry]:
    return {k: v for k, v in cat.items() if k.startswith("vllm:") and not k.endswith("_created")}


def hist_of(truth: Ledger, family: str, *key: str) -> HistogramCounts:
    """``truth.histogram(family, *key)``, which must exist."""
    hist = truth.histogram(family, *key)
    assert hist is not None, (family, key)
    return hist


# -- catalogue vs real vLLM ------------------------------------------------------------------------
def test_single_mode_matches_real_vllm_families_types_labels_buckets() -> None:
    real = catalogue(fixture_text("single_after.prom"))
    fleet = SimFleet.build(1, seed=3, wall_start=WALL)
    fleet.run(5.0)
    sim = catalogue(fleet.endpoints[0].render())
    assert set(sim) == set(real)  # incl. process_/python_/http_ families and every _created
    assert len(vllm_only(sim)) == 39
    for name in real:
        assert sim[name] == real[name], name
    assert sim["vllm:iteration_tokens_total"][0] == "histogram"
    assert sim["vllm:request_prompt_tokens"][3][-2:] == (500.0, math.inf)


def test_single_idle_matches_real_idle_body() -> None:
    real = catalogue(fixture_text("single_idle.prom"))
    sim = catalogue(SimFleet.build(1, wall_start=WALL).endpoints[0].render())
    assert set(sim) == set(real)
    for name in real:
        assert sim[name][:3] == real[name][:3], name


def test_help_and_type_lines_are_byte_identical() -> None:
    real = fixture_text("single_after.prom").splitlines()
    fleet = SimFleet.build(1, wall_start=WALL)
    fleet.run(3.0)
    sim = fleet.endpoints[0].render().decode().splitlines()
    real_meta = {line for line in real if line.startswith("#")}
    sim_meta = {line for line in sim if line.startswith("#")}
    assert sim_meta == real_meta  # HELP texts exactly, incl. trailing spaces of http_*


def test_multiprocess_mode_matches_real_dp2_under_load() -> None:
    real_text = fixture_text("dp2_load.prom")
    real = catalogue(real_text)
    fleet = SimFleet.build(1, dp=2, seed=1, wall_start=WALL)
    assert fleet.endpoints[0].mode == "multiprocess"
    fleet.run(5.0)
    body = fleet.endpoints[0].render()
    sim = catalogue(body)
    assert set(sim) == set(real)
    for name in real:
        assert sim[name] == real[name], name
    assert not [n for n in sim if n.endswith("_created")]
    assert not [n for n in sim if n.startswith(("process_", "python_"))]
    # families grouped by type like the real multiprocess body
    real_order = [f.type for f in text_string_to_metric_families(real_text)]
    sim_order = [f.type for f in text_string_to_metric_families(body.decode())]
    assert sim_order == real_order


def test_multiprocess_idle_has_no_gauge_samples_before_first_step() -> None:
    real = parse(fixture_text("dp2_idle.prom"))
    endpoint = SimFleet.build(1, dp=2, wall_start=WALL).endpoints[0]
    sim = parse(endpoint.render())
    assert set(sim) == set(real)
    real_empty = {n for n, f in real.items() if not f.samples}
    sim_empty = {n for n, f in sim.items() if not f.samples}
    assert (
        sim_empty
        == real_empty
        == {
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:num_requests_waiting_by_reason",
            "vllm:kv_cache_usage_perc",
        }
    )
    assert len(sim["vllm:engine_sleep_state"].samples) == 6
    assert len(sim["vllm:cache_config_info"].samples) == 2


def test_dp_engines_have_distinct_engine_labels() -> None:
    fleet = SimFleet.build(1, dp=4, seed=2, wall_start=WALL)
    fleet.run(3.0)
    fams = parse(fleet.endpoints[0].render())
    for name, fam in fams.items():
        if not name.startswith("vllm:"):
            continue
        engines = {s.labels.get("engine") for s in fam.samples}
        if name == "vllm:admission_rejections":
            assert engines == {None}
        else:
            assert engines == {"0", "1", "2", "3"}, name
    info = {s.labels["engine"]: s.labels for s in fams["vllm:cache_config_info"].samples}
    labels = info["0"]
    assert int(labels["kv_cache_size_tokens"]) == int(labels["num_gpu_blocks"]) * int(
        labels["block_size"]
    )
    # engines of one server see different traffic
    body = fleet.endpoints[0].render()
    gen = [value(body, "vllm:generation_tokens_total", engine=e) for e in "0123"]
    assert len(set(gen)) > 1


# -- frozen steps, fast renderer, determinism ------------------------------------------------------
def test_frozen_steps_and_fast_renderer_is_byte_identical() -> None:
    fleet = SimFleet.build(2, dp=1, seed=5, wall_start=WALL)
    fleet.add_endpoint(dp=2)
    for _ in range(3):
        fleet.step(0.7)
        for ep in fleet.endpoints:
            first = ep.render()
            assert ep.render() == first
            time.sleep(0.001)
            # re-rendered from scratch: still identical (no wall-clock input between steps)
            assert ep.render(use_cache=False) == first
            assert ep.render_fast(use_cache=False) == first
    fleet.endpoints[0].add_lazy_series()
    fleet.endpoints[2].add_lazy_series("vllm:prompt_tokens_cached_by_source_total", "lmcache")
    fleet.endpoints[2].restart()
    fleet.endpoints[1].restart_engine(0)
    for _ in range(2):
        for ep in fleet.endpoints:
            assert ep.render(use_cache=False) == ep.render_fast(use_cache=False)
        fleet.step(2.0)


def test_deterministic_with_seed() -> None:
    def bodies(seed: int) -> list[bytes]:
        fleet = SimFleet.build(2, dp=2, seed=seed, wall_start=WALL)
        fleet.run(4.0, dt=0.5)
        return [ep.render() for ep in fleet.endpoints]

    assert bodies(7) == bodies(7)
    assert bodies(7) != bodies(8)


# -- load model and truth --------------------------------------------------------------------------
COUNTER_FAMILIES = [f.name for f in FAMILIES if f.kind == "counter" and f.per_engine]


def test_counters_monotone_and_equal_to_truth() -> None:
    fleet = SimFleet.build(1, dp=2, seed=11, wall_start=WALL)
    endpoint = fleet.endpoints[0]
    previous: dict[SampleKey, float] = {}
    for _ in range(8):
        fleet.step(1.0)
        values = sample_values(endpoint.render())
        for sample, v in values.items():
            name = sample[0]
            if name.endswith(("_total", "_bucket", "_count")) and sample in previous:
                assert v >= previous[sample], sample
        previous = values
    body = endpoint.render()
    for engine in endpoint.engines:
        truth = engine.truth
        for family in COUNTER_FAMILIES:
            for key, total in truth.counter_series(family).items():
                labels = {"engine": engine.label}
                spec = next(f for f in FAMILIES if f.name == family)
                if key:
                    assert spec.label is not None, family
                    labels[spec.label] = key[0]
                assert value(body, family, **labels) == total, (family, key)
        for family, series in truth.histograms.items():
            hist = series[()]
            base = family
            assert value(body, base + "_count", engine=engine.label) == hist.count
            assert value(body, base + "_sum", engine=engine.label) == pytest.approx(hist.sum)
            for le, cum in hist.cumulative_by_bound().items():
                le_text = "+Inf" if math.isinf(le) else repr(le)
                assert value(body, base + "_bucket", engine=engine.label, le=le_text) == cum


def test_truth_obeys_vllm_invariants() -> None:
    fleet = SimFleet.build(1, dp=2, seed=4, wall_start=WALL)
    fleet.run(10.0)
    for e in fleet.engines():
        t = e.truth
        prompt = t.counter("vllm:prompt_tokens_total")
        assert prompt > 0
        assert t.counter("vllm:prefix_cache_queries_total") == prompt
        assert t.counter("vllm:prompt_tokens_by_source_total") == prompt
        hits = t.counter("vllm:prefix_cache_hits_total")
        assert 0 < hits < prompt
        assert t.counter("vllm:prompt_tokens_by_source_total", "local_cache_hit") == hits
        cached = t.counter("vllm:prompt_tokens_cached_total")
        assert cached == t.counter("vllm:prompt_tokens_cached_by_source_total") == hits
        finished = t.counter("vllm:request_success_total")
        assert t.counter("vllm:request_success_total", "length") > 0
        assert t.counter("vllm:request_success_total", "stop") > 0
        for fam in ("vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens"):
            assert hist_of(t, fam).count == finished
        gen = t.counter("vllm:generation_tokens_total")
        ttft = hist_of(t, "vllm:time_to_first_token_seconds").count
        assert hist_of(t, "vllm:inter_token_latency_seconds").count == gen - ttft
        it = hist_of(t, "vllm:iteration_tokens_total")
        assert t.counter("vllm:num_preemptions_total") == 0
        assert it.sum == t.counter("vllm:prompt_tokens_by_source_total", "local_compute") + gen
        assert hist_of(t, "vllm:request_prefill_kv_computed_tokens").count == finished
        # raw observations are kept and agree with the buckets
        obs = hist_of(t, "vllm:time_to_first_token_seconds").observations
        assert obs is not None and sum(n for _, n in obs) == ttft
        assert len(t.gauge_history) == 10


def test_prefill_and_decode_roles() -> None:
    fleet = SimFleet.build(2, roles=["prefill", "decode"], seed=9, wall_start=WALL)
    fleet.run(8.0)
    prefill, decode = fleet.endpoints
    assert (prefill.name, decode.name) == ("prefill0", "decode0")
    p = prefill.engines[0].truth
    finished = p.counter("vllm:request_success_total")
    assert finished > 0
    assert p.counter("vllm:request_success_total", "length") == finished
    assert hist_of(p, "vllm:request_generation_tokens").sum == finished  # one token each
    assert hist_of(p, "vllm:inter_token_latency_seconds").count == 0
    d = decode.engines[0].truth
    assert d.counter("vllm:prompt_tokens_by_source_total", "local_compute") == 0
    external = d.counter("vllm:prompt_tokens_by_source_total", "external_kv_transfer")
    assert external > 0
    assert d.counter("vllm:prompt_tokens_cached_by_source_total", "p2p") == external
    assert d.counter("vllm:external_prefix_cache_hits_total") == external
    assert d.counter("vllm:prompt_tokens_cached_total") == d.counter(
        "vllm:prefix_cache_hits_total"
    ) + d.counter("vllm:external_prefix_cache_hits_total")
    # generation rate: ~0 per request on prefill, many tokens per request on decode
    d_fin = d.counter("vllm:request_success_total")
    assert d.counter("vllm:generation_tokens_total") > 10 * d_fin
    assert fleet.truth_total("vllm:generation_tokens_total", role="decode") == d.counter(
        "vllm:generation_tokens_total"
    )


def test_preemptions_under_kv_pressure() -> None:
    load = LoadProfile(arrival_rate=30.0, num_gpu_blocks=80, output_tokens_median=150.0)
    fleet = SimFleet.build(1, load=load, seed=2, wall_start=WALL)
    usage = []
    for _ in range(10):
        fleet.step(1.0)
        usage.append(value(fleet.endpoints[0].render(), "vllm:kv_cache_usage_perc"))
    t = fleet.endpoints[0].engines[0].truth
    preemptions = t.counter("vllm:num_preemptions_total")
    assert preemptions > 0
    assert max(usage) > 0.8 and max(usage) <= 1.0
    assert hist_of(t, "vllm:request_num_preemptions").sum <= preemptions
    assert hist_of(t, "vllm:iteration_tokens_total").sum > t.counter(
        "vllm:prompt_tokens_by_source_total", "local_compute"
    ) + t.counter("vllm:generation_tokens_total")  # recomputed tokens
    body = fleet.endpoints[0].render()
    assert value(body, "vllm:num_requests_waiting") == value(
        body, "vllm:num_requests_waiting_by_reason"
    )


def test_admission_rejections_when_queue_is_full() -> None:
    load = LoadProfile(arrival_rate=200.0, max_num_queued_reqs=5, max_num_seqs=4)
    fleet = SimFleet.build(1, load=load, wall_start=WALL)
    fleet.run(2.0)
    ep = fleet.endpoints[0]
    rejected = ep.truth.counter("vllm:admission_rejections_total", "max_num_queued_reqs")
    assert rejected > 0
    assert value(ep.render(), "vllm:admission_rejections_total", reason="max_num_queued_reqs") == (
        rejected
    )


# -- faults in the state ---------------------------------------------------------------------------
def test_restart_resets_values_and_moves_created_and_start_time() -> None:
    fleet = SimFleet.build(1, seed=1, wall_start=WALL)
    ep = fleet.endpoints[0]
    fleet.run(5.0)
    before = ep.render()
    fleet.step(1.0)
    truth_before = ep.engines[0].truth.counter("vllm:generation_tokens_total")
    ep.restart()
    after = ep.render()
    assert value(after, "vllm:generation_tokens_total") == 0
    assert value(after, "vllm:request_success_total") == 0
    assert value(after, "vllm:request_prompt_tokens_count") == 0
    assert value(after, "process_start_time_seconds") > value(before, "process_start_time_seconds")
    assert value(after, "vllm:prompt_tokens_created") > value(before, "vllm:prompt_tokens_created")
    assert value(after, "process_start_time_seconds") == pytest.approx(WALL + 6.0, abs=0.02)
    truth = ep.engines[0].truth
    assert truth.restarts == 1 and truth.restart_times == [6.0]
    assert truth.lost_at_restart[0]["vllm:generation_tokens_total"][()] == truth_before
    fleet.step(1.0)
    gained = value(ep.render(), "vllm:generation_tokens_total")
    assert gained > 0
    assert truth.counter("vllm:generation_tokens_total") == truth_before + gained


def test_restart_in_multiprocess_mode_hides_gauges_until_next_step() -> None:
    fleet = SimFleet.build(1, dp=2, seed=1, wall_start=WALL)
    ep = fleet.endpoints[0]
    fleet.run(3.0)
    assert parse(ep.render())["vllm:num_requests_running"].samples
    ep.restart()
    fams = parse(ep.render())
    assert not fams["vllm:num_requests_running"].samples
    assert not fams["vllm:kv_cache_usage_perc"].samples
    assert value(ep.render(), "vllm:prompt_tokens_total") == 0
    fleet.step(1.0)
    assert len(parse(ep.render())["vllm:num_requests_running"].samples) == 2


def test_restart_engine_keeps_process_start_time() -> None:
    fleet = SimFleet.build(1, dp=2, mode="single", seed=1, wall_start=WALL)
    ep = fleet.endpoints[0]
    fleet.run(3.0)
    before = ep.render()
    ep.restart_engine(1)
    after = ep.render()
    assert value(after, "process_start_time_seconds") == value(before, "process_start_time_seconds")
    assert value(after, "vllm:prompt_tokens_total", engine="1") == 0
    assert value(after, "vllm:prompt_tokens_total", engine="0") == value(
        before, "vllm:prompt_tokens_total", engine="0"
    )
    assert value(after, "vllm:prompt_tokens_created", engine="1") > value(
        before, "vllm:prompt_tokens_created", engine="1"
    )


def test_stalled_decode_engine_stops_generating_while_requests_stay_running() -> None:
    fleet = SimFleet.build(2, roles=["prefill", "decode"], seed=3, wall_start=WALL)
    fleet.run(3.0)
    decode = fleet.endpoint("decode0")
    decode.stall()
    fleet.step(1.0)
    gen0 = value(decode.render(), "vllm:generation_tokens_total")
    running0 = value(decode.render(), "vllm:num_requests_running")
    fleet.run(3.0)
    body = decode.render()
    assert running0 > 0
    assert value(body, "vllm:generation_tokens_total") == gen0
    assert value(body, "vllm:num_requests_running") == running0
    assert value(body, "vllm:num_requests_waiting") > 0
    decode.clear_faults()
    fleet.step(1.0)
    assert value(decode.render(), "vllm:generation_tokens_total") > gen0


def test_lazy_series_appears_mid_run_from_zero() -> None:
    fleet = SimFleet.build(1, dp=2, seed=6, wall_start=WALL)
    ep = fleet.endpoints[0]
    fleet.run(3.0)
    assert value(ep.render(), "vllm:request_success_total") > 0
    with pytest.raises(KeyError):
        value(ep.render(), "vllm:request_success_total", finished_reason="timeout")
    ep.add_lazy_series("vllm:request_success_total", "timeout", share=0.5)
    ep.add_lazy_series("vllm:prompt_tokens_by_source_total", "remote_compute", share=0.3)
    fleet.run(4.0)
    body = ep.render()
    for e in ep.engines:
        new = value(body, "vllm:request_success_total", engine=e.label, finished_reason="timeout")
        assert new == e.truth.counter("vllm:request_success_total", "timeout") > 0
        assert value(body, "vllm:prompt_tokens_by_source_total", engine=e.label) == (
            e.truth.counter("vllm:prompt_tokens_total")
        )
        assert (
            e.truth.counter("vllm:request_success_total")
            == hist_of(e.truth, "vllm:request_prompt_tokens").count
        )
    # single mode: the lazy child gets its own _created, later than the others
    single = SimFleet.build(1, seed=6, wall_start=WALL)
    single.run(2.0)
    sep = single.endpoints[0]
    sep.add_lazy_series()
    single.run(5.0)
    body = sep.render()
    created_new = value(body, "vllm:request_success_created", finished_reason="timeout")
    created_old = value(body, "vllm:request_success_created", finished_reason="stop")
    assert created_new > created_old + 1.0


def test_change_buckets_and_max_model_len_layouts() -> None:
    fleet = SimFleet.build(1, seed=8, wall_start=WALL)
    wide = fleet.add_endpoint(max_model_len=1024)
    fleet.run(4.0)
    narrow = fleet.endpoints[0]
    narrow_bounds = catalogue(narrow.render())["vllm:request_prompt_tokens"][3]
    wide_bounds = catalogue(wide.render())["vllm:request_prompt_tokens"][3]
    assert narrow_bounds[-2:] == (500.0, math.inf)
    assert wide_bounds[-2:] == (1000.0, math.inf)
    assert json.loads(json.dumps(wide.models_json()))["data"][0]["max_model_len"] == 1024
    count = value(narrow.render(), "vllm:request_prompt_tokens_count")
    new_bounds = build_1_2_5_buckets(1024)
    narrow.change_buckets("vllm:request_prompt_tokens", new_bounds)
    body = narrow.render()
    assert catalogue(body)["vllm:request_prompt_tokens"][3] == (*new_bounds, math.inf)
    assert value(body, "vllm:request_prompt_tokens_count") == count
    hist = hist_of(narrow.engines[0].truth, "vllm:request_prompt_tokens")
    assert hist.bounds == new_bounds and hist.count == count
    with pytest.raises(ValueError):
        narrow.change_buckets("vllm:prompt_tokens_total", (1.0,))


# -- HTTP ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    fleet = SimFleet.build(3, roles=[None, "prefill", "decode"], seed=1)
    fleet.add_endpoint(dp=2)
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        yield fleet, server


@pytest.fixture
def clean(served: Served) -> Iterator[Served]:
    fleet, server = served
    yield fleet, server
    for ep in fleet.endpoints:
        ep.clear_faults()


def test_http_routes(clean: Served) -> None:
    fleet, server = clean
    assert len(server.urls) == 4 and all(u.startswith("http://127.0.0.1:") for u in server.urls)
    with httpx.Client(timeout=5) as client:
        for ep, url in zip(fleet.endpoints, server.urls, strict=True):
            r = client.get(f"{url}/metrics")
            assert r.status_code == 200
            assert client.get(f"{url}/metrics").content == r.content  # frozen between steps
            assert r.headers["content-type"] == CONTENT_TYPE_LATEST
            assert r.content == ep.render()
            assert int(r.headers["content-length"]) == len(r.content)
            models = client.get(f"{url}/v1/models").json()
            assert models["data"][0]["id"] == "tinymodel"
            assert models["data"][0]["max_model_len"] == 512
            info = client.get(f"{url}/get_metrics_worker_info").json()
            assert info == {"worker_id": ep.worker_id, "role": ep.role}
            assert len(info["worker_id"]) == 56
            assert client.get(f"{url}/health").status_code == 200
            assert client.get(f"{url}/nope").status_code == 404
        roles = [client.get(f"{u}/get_metrics_worker_info").json()["role"] for u in server.urls]
        assert roles == [None, "prefill", "decode", None]
        assert server.url("decode0") == server.urls[2]


def test_http_keep_alive_serves_several_requests_on_one_connection(clean: Served) -> None:
    fleet, server = clean
    port = server.ports[0]
    expected = fleet.endpoints[0].render()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        stream = sock.makefile("rb")
        for path in ("/metrics", "/health", "/metrics"):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status = stream.readline()
            assert status.startswith(b"HTTP/1.1 200")
            headers: dict[str, str] = {}
            while (line := stream.readline()) != b"\r\n":
                key, _, val = line.decode().partition(":")
                headers[key.lower()] = val.strip()
            assert headers["connection"] == "keep-alive"
            body = stream.read(int(headers["content-length"]))
            if path == "/metrics":
                assert body == expected
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        rest = stream.read()  # the server closes after answering
        assert rest.startswith(b"HTTP/1.1 200") and b"Connection: close" in rest


def test_http_faults(clean: Served) -> None:
    fleet, server = clean
    ep = fleet.endpoints[0]
    url = server.metrics_urls[0]
    with httpx.Client(timeout=5) as client:
        ep.set_http_error(500)
        assert client.get(url).status_code == 500
        ep.set_http_error(503)
        assert client.get(url).status_code == 503
        ep.clear_faults()

        ep.set_garbage()
        r = client.get(url)
        assert r.status_code == 200
        with pytest.raises(ValueError):
            parse(r.text)
        ep.clear_faults()

        ep.set_truncated()
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(url)
        ep.clear_faults()

        ep.set_disconnect()
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(url)
        ep.clear_faults()

        ep.set_huge_body(3)
        r = client.get(url)
        assert len(r.content) == 3 * 1024 * 1024
        assert r.content.startswith(ep.render())
        ep.clear_faults()

        ep.set_content_type("text/html")
        assert client.get(url).headers["content-type"] == "text/html"
        ep.clear_faults()

        ep.set_nan_values()
        fams = parse(client.get(url).text)
        assert math.isnan(fams["vllm:kv_cache_usage_perc"].samples[0].value)
        ep.clear_faults()

        ep.set_duplicate_series()
        text = client.get(url).text
        assert text.count("\nvllm:prompt_tokens_total{") == 2
        ep.clear_faults()

        ep.set_slow(3.0)
        with pytest.raises(httpx.ReadTimeout):
            client.get(url, timeout=0.3)
        # other endpoints are not delayed meanwhile
        t0 = time.monotonic()
        assert client.get(server.metrics_urls[1]).status_code == 200
        assert time.monotonic() - t0 < 1.5
        ep.clear_faults()
        assert client.get(url).status_code == 200


def test_endpoint_down_and_fleet_growing_mid_run() -> None:
    fleet = SimFleet.build(2, seed=2)
    fleet.step(1.0)
    with FleetServer(fleet) as server, httpx.Client(timeout=5) as client:
        url = server.metrics_urls[1]
        server.close_endpoint("server1")
        with pytest.raises(httpx.ConnectError):
            client.get(url)
        assert client.get(server.metrics_urls[0]).status_code == 200
        server.open_endpoint("server1")
        assert client.get(url).status_code == 200
        late = fleet.add_endpoint(role="decode", dp=2)
        fleet.step(1.0)
        (late_url,) = server.serve_new_endpoints()
        assert server.urls[-1] == late_url == server.url("decode0")
        assert client.get(f"{late_url}/metrics").content == late.render()
        assert client.get(f"{late_url}/get_metrics_worker_info").json()["role"] == "decode"


def test_http_scrapes_consistent_while_stepping(clean: Served) -> None:
    fleet, server = clean
    stop = threading.Event()
    errors: list[BaseException] = []

    def stepper() -> None:
        try:
            while not stop.is_set():
                fleet.step(0.05)
                time.sleep(0.01)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=stepper)
    thread.start()
    try:
        with httpx.Client(timeout=5) as client:
            seen = set()
            for _ in range(12):
                body = client.get(server.metrics_urls[3]).content
                fams = parse(body)
                waiting = sum(s.value for s in fams["vllm:num_requests_waiting"].samples)
                by_reason = sum(
                    s.value for s in fams["vllm:num_requests_waiting_by_reason"].samples
                )
                assert waiting == by_reason
                seen.add(value(body, "vllm:prompt_tokens_total"))
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert len(seen) > 1


def test_server_with_256_endpoints_and_auto_stepping() -> None:
    fleet = SimFleet.build(256, seed=0, record_observations=False)
    with FleetServer(fleet, step_interval=0.2) as server:
        assert len(set(server.urls)) == 256

        async def scrape(port: int) -> tuple[bytes, bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.read()
            writer.close()
            return head, body

        async def scrape_all() -> list[tuple[bytes, bytes]]:
            return await asyncio.gather(*(scrape(port) for port in server.ports))

        t0 = time.monotonic()
        answers = asyncio.run(scrape_all())
        assert time.monotonic() - t0 < 10
        for head, body in answers:
            assert head.startswith(b"HTTP/1.1 200 OK")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            assert length == len(body) > 40_000
        time.sleep(0.5)
        assert fleet.clock.sim_time > 0.2  # stepped in real time by the server
    assert server._thread is None


def test_port_base_and_standalone_endpoint() -> None:
    ep = SimEndpoint("solo", dp=1, seed=1)
    ep.step(2.0)
    assert value(ep.render(), "vllm:generation_tokens_total") > 0
    fleet = SimFleet.build(2)
    probe = FleetServer(fleet).start()
    base = probe.ports[0]
    probe.stop()
    server = None
    for _ in range(5):  # another process may take the probed ports meanwhile: probe again
        try:
            server = FleetServer(fleet, port_base=base).start()
            break
        except OSError:
            probe = FleetServer(fleet).start()
            base = probe.ports[0]
            probe.stop()
    assert server is not None, "no free pair of consecutive ports found"
    try:
        assert server.ports == [base, base + 1]
        assert httpx.get(f"{server.urls[1]}/health", timeout=5).status_code == 200
    finally:
        server.stop()


def test_cli_main_serves_for_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--prefill", "1", "--decode", "2", "--dp", "2", "--duration", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "prefill0" in out and "decode1" in out and "/metrics" in out
