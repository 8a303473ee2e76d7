"""SkyRL parity (ANCHORS.md, "SkyRL"): what SkyRL's vLLM metrics do, fleetscope does, under
SkyRL's key names (``schema="skyrl"``), without SkyRL's defects.

``docs/skyrl-parity.md`` maps every SkyRL behaviour and defect to the test that shows it; the
ones already shown elsewhere (windows, Ray, annotations, sinks) are named there, the rest are
here:

* every metric of SkyRL's list, in a sync trainer's ``train`` / ``eval`` windows (with a pause)
  and per role, equal to values computed by hand from what prometheus_client wrote;
* the async trainer's per-poll ``vllm/*`` keys and its ``combined`` run summary;
* a reset of an unrelated counter keeps the window and its latency metrics;
* the same metrics against the simulator's ground truth over real HTTP, through an engine
  restart and a failed scrape inside the window;
* the Ray identity lookup's default bound, and Ray agents rediscovered while running.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleetscope.collector.core import Collector
from fleetscope.exposition import Parser
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.http.wire import Response
from fleetscope.sources.ray.source import (
    IDENTITY_LOOKUP_TIMEOUT,
    RAY_AGENT_IDENTITY,
    RayIdentity,
    RaySource,
    worker_ids_of_actors,
)
from fleetscope_sim import FleetServer, LoadProfile, SimFleet
from support.loads import KV_PRESSURE_LOAD
from support.paths import RAY_DIR, fixture_text
from support.promql import promql_bucket_quantile

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

WALL = 1_795_970_000.0
MODEL = "tinymodel"
TTFT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
TPOT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1)
# endpoint -> (role, engine labels)
LAYOUT: dict[str, tuple[Role, tuple[str, ...]]] = {
    "prefill0": ("prefill", ("0",)),
    "decode0": ("decode", ("0", "1")),
}
ENGINES = [f"{ep}.{e}" for ep, (_, labels) in LAYOUT.items() for e in labels]
ROLE = {f"{ep}.{e}": role for ep, (role, labels) in LAYOUT.items() for e in labels}
COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "num_preemptions",
    "kv_offload_load_bytes",
    "kv_offload_store_bytes",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
)
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
POSITIONS = ("0", "1")


def workload(k: int, j: int, prefill: bool) -> dict[str, Any]:
    """What engine number ``j`` does in tick ``k``: counter increments, histogram observations
    and the gauges' values at the end of the tick. Varies by engine and tick."""
    prompt = 100.0 * (j + 1) + 7 * k
    drafts = 20.0 + j
    accepted = 2 * drafts - k % 5
    pos0 = drafts - k % 2
    return {
        "prompt_tokens": prompt,
        "generation_tokens": 5.0 + k if prefill else 200.0 + 300 * j + 50 * k,
        "prefix_cache_queries": prompt,
        "prefix_cache_hits": prompt // 2 - j,
        "external_prefix_cache_queries": 40.0 + j,
        "external_prefix_cache_hits": 10.0 + k % 4,
        "num_preemptions": float((k + j) % 3),
        "kv_offload_load_bytes": 1000.0 * (j + 1) * k,
        "kv_offload_store_bytes": 500.0 * k + 3,
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": 3 * drafts,
        "spec_decode_num_accepted_tokens": accepted,
        "per_pos": {"0": pos0, "1": accepted - pos0},
        "ttft": [0.02 * (j + 1) + 0.013 * i for i in range(3 + k % 3)],
        "tpot": [0.004 * (j + 1) + 0.003 * i for i in range(2 + k % 2)],
        "num_requests_running": 4.0 + 2 * j + (k * k) % 7,
        "num_requests_waiting": float((k * j) % 4),
        "kv_cache_usage_perc": 0.1 + 0.05 * j + 0.02 * (k % 7),
    }


class ScriptedFleet:
    """vLLM-shaped endpoints written by prometheus_client (vLLM's own writer), advanced tick by
    tick by the test, served to a Collector as a ``source``. Every tick's workload is kept, so
    every statistic's exact value is known."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ticks: list[dict[str, dict[str, Any]]] = []  # tick -> engine id -> workload
        self.times: list[float] = []
        self._parsers = {ep: Parser() for ep in LAYOUT}
        self.registries: dict[str, CollectorRegistry] = {}
        self.m: dict[str, dict[str, Any]] = {}
        for ep in LAYOUT:
            reg = CollectorRegistry()
            labels = ["model_name", "engine"]
            fams: dict[str, Any] = {g: Gauge(f"vllm:{g}", g, labels, registry=reg) for g in GAUGES}
            fams.update({c: Counter(f"vllm:{c}", c, labels, registry=reg) for c in COUNTERS})
            fams["per_pos"] = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "per position",
                [*labels, "position"],
                registry=reg,
            )
            fams["ttft"] = Histogram(
                "vllm:time_to_first_token_seconds",
                "ttft",
                labels,
                buckets=TTFT_BOUNDS,
                registry=reg,
            )
            fams["tpot"] = Histogram(
                "vllm:request_time_per_output_token_seconds",
                "tpot",
                labels,
                buckets=TPOT_BOUNDS,
                registry=reg,
            )
            self.registries[ep], self.m[ep] = reg, fams
        self.tick(0.0)

    def tick(self, dt: float = 10.0) -> None:
        self.now += dt
        k = len(self.ticks)
        work: dict[str, dict[str, Any]] = {}
        for j, eid in enumerate(ENGINES):
            ep, label = eid.split(".")
            w = work[eid] = workload(k, j, ROLE[eid] == "prefill")
            fams = self.m[ep]
            for c in COUNTERS:
                fams[c].labels(MODEL, label).inc(w[c])
            for pos, v in w["per_pos"].items():
                fams["per_pos"].labels(MODEL, label, pos).inc(v)
            for h in ("ttft", "tpot"):
                for v in w[h]:
                    fams[h].labels(MODEL, label).observe(v)
            for g in GAUGES:
                fams[g].labels(MODEL, label).set(w[g])
        self.ticks.append(work)
        self.times.append(self.now)

    def reset_series(self, eid: str, counter: str) -> None:
        """One counter series of one engine starts again from 0 (a new child, new _created),
        as a buggy exporter or a partial restart would show it. The current tick's increment
        is applied again so the expected totals stay the tick's workload."""
        ep, label = eid.split(".")
        fam = self.m[ep][counter]
        fam.remove(MODEL, label)
        fam.labels(MODEL, label).inc(self.ticks[-1][eid][counter])

    async def scrape(self) -> list[ScrapeResult]:
        out = []
        for ep, (role, _) in LAYOUT.items():
            body = generate_latest(self.registries[ep])
            expo = self._parsers[ep].parse(body, time=self.now, wall_time=WALL + self.now)
            out.append(ScrapeResult(ep, expo, self.now, WALL + self.now, role=role))
        return out

    def take_departures(self) -> list[Departure]:
        return []

    async def aclose(self) -> None:
        pass

    # ------------------------------------------------------------------ expected values

    def total(self, ticks: Iterable[int], engines: Iterable[str], q: str) -> float:
        engines = list(engines)
        total: float = sum(self.ticks[k][e][q] for k in ticks for e in engines)
        return total

    def pos_total(self, ticks: Iterable[int], engines: Iterable[str], pos: str) -> float:
        engines = list(engines)
        total: float = sum(self.ticks[k][e]["per_pos"][pos] for k in ticks for e in engines)
        return total

    def observations(self, ticks: Iterable[int], engines: Iterable[str], h: str) -> list[float]:
        engines = list(engines)
        return [v for k in ticks for e in engines for v in self.ticks[k][e][h]]


def pooled_quantile(q: float, obs: list[float], bounds: tuple[float, ...]) -> float:
    buckets = [(b, sum(1 for v in obs if v <= b)) for b in bounds]
    return promql_bucket_quantile(q, [*buckets, (math.inf, len(obs))])


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def expected_skyrl(
    f: ScriptedFleet, ticks: list[int], seconds: float, engines: list[str]
) -> dict[str, float]:
    """SkyRL's window metrics for these engines over these ticks, computed by hand."""

    def tot(q: str) -> float:
        return f.total(ticks, engines, q)

    ttft, tpot = (f.observations(ticks, engines, h) for h in ("ttft", "tpot"))
    gen, drafts = tot("generation_tokens"), tot("spec_decode_num_drafts")
    want = {
        "generation_throughput_tok_s": gen / seconds,
        "prompt_throughput_tok_s": tot("prompt_tokens") / seconds,
        "prefix_cache_hit_rate": tot("prefix_cache_hits") / tot("prefix_cache_queries"),
        "external_prefix_cache_hit_rate": (
            tot("external_prefix_cache_hits") / tot("external_prefix_cache_queries")
        ),
        "num_preemptions": tot("num_preemptions"),
        "preemptions_per_million_tokens": tot("num_preemptions") * 1e6 / gen,
        "kv_offload_load_throughput_bytes_s": tot("kv_offload_load_bytes") / seconds,
        "kv_offload_store_throughput_bytes_s": tot("kv_offload_store_bytes") / seconds,
        "ttft_seconds_avg": sum(ttft) / len(ttft),
        "ttft_seconds_p90": pooled_quantile(0.9, ttft, TTFT_BOUNDS),
        "tpot_seconds_avg": sum(tpot) / len(tpot),
        "tpot_seconds_p90": pooled_quantile(0.9, tpot, TPOT_BOUNDS),
        "draft_num_draft_tokens": tot("spec_decode_num_draft_tokens"),
        "draft_num_accepted_tokens": tot("spec_decode_num_accepted_tokens"),
        "draft_acceptance_rate": (
            tot("spec_decode_num_accepted_tokens") / tot("spec_decode_num_draft_tokens")
        ),
        "draft_mean_acceptance_length": 1 + tot("spec_decode_num_accepted_tokens") / drafts,
    }
    for pos in POSITIONS:
        want[f"draft_acceptance_rate_pos_{int(pos) + 1}"] = (
            f.pos_total(ticks, engines, pos) / drafts
        )
    # token-rate spread across engines; a decode-only rate leaves prefill engines out of a
    # scope that mixes roles (their ~0 tokens/s is by design, not imbalance)
    if len(engines) >= 2:
        rates = {e: f.total(ticks, [e], "prompt_tokens") / seconds for e in engines}
        want["prompt_throughput_cv"] = cv(list(rates.values()))
        want["prompt_throughput_cv_num_engines"] = float(len(engines))
        gen_engines = [e for e in engines if ROLE[e] != "prefill"] or engines
        if len(gen_engines) >= 2:
            rates = {e: f.total(ticks, [e], "generation_tokens") / seconds for e in gen_engines}
            want["generation_throughput_cv"] = cv(list(rates.values()))
            want["generation_throughput_cv_num_engines"] = float(len(gen_engines))
    return want


def time_weighted(f: ScriptedFleet, ticks: list[int], engines: list[str]) -> dict[str, float]:
    """Gauges over a window: each engine's time-weighted mean (the value at the end of each of
    its scrape intervals, weighted by the interval), summed (running, waiting) or averaged
    (KV usage) over the engines, as SkyRL reduces one snapshot."""
    per: dict[str, dict[str, float]] = {g: {} for g in GAUGES}
    for e in engines:
        for g in GAUGES:
            area = sum(f.ticks[k][e][g] * (f.times[k] - f.times[k - 1]) for k in ticks)
            per[g][e] = area / sum(f.times[k] - f.times[k - 1] for k in ticks)
    return {
        "num_requests_running": sum(per["num_requests_running"].values()),
        "num_requests_waiting": sum(per["num_requests_waiting"].values()),
        "kv_cache_usage_perc": statistics.fmean(per["kv_cache_usage_perc"].values()),
    }


def assert_keys(got: Mapping[str, Any], base: str, want: Mapping[str, float]) -> None:
    for name, value in want.items():
        key = f"{base}{name}"
        assert key in got, key
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


SCOPES: dict[str, list[str]] = {
    "": ENGINES,
    "prefill/": [e for e in ENGINES if ROLE[e] == "prefill"],
    "decode/": [e for e in ENGINES if ROLE[e] == "decode"],
}


# --------------------------------------------------------------------------- sync trainer


async def test_sync_trainer_windows_every_skyrl_metric_exact() -> None:
    """A sync trainer: ``train`` (paused once) and ``eval`` windows. Every metric of SkyRL's
    list under ``vllm/{train,eval}[/{prefill,decode}]/...``, equal to the hand-computed value;
    rates over active seconds only; gauges time-weighted over the window (not one snapshot);
    a reset of one unrelated counter inside the window voids nothing (SkyRL drops the window,
    latency metrics included); the run summary under ``vllm_correct_aggregate/...``."""
    f = ScriptedFleet()  # tick 0: the baseline
    c = Collector(source=f, schema="skyrl", interval=3600, fetch_model_info=False)

    async def at(action: Callable[[], Any]) -> Any:
        f.tick()
        return await action()

    train, ev = c.window("train"), c.window("eval")
    await c.poll()  # t=0   tick 0
    await at(train.astart)  # t=10  tick 1 -> idle
    await at(c.poll)  # t=20  tick 2 -> train
    await at(train.apause)  # t=30  tick 3 -> train; 20 active seconds
    await at(c.poll)  # t=40  tick 4 -> idle (paused)
    await at(train.aresume)  # t=50  tick 5 -> idle
    f.tick()  # t=60  tick 6 -> train, with one unrelated counter reset
    f.reset_series("decode0.1", "kv_offload_store_bytes")
    await c.poll()
    train_keys = await at(train.astop)  # t=70  tick 7 -> train; 40 active seconds
    await at(ev.astart)  # t=80  tick 8 -> idle
    eval_keys = await at(ev.astop)  # t=90  tick 9 -> eval; 10 active seconds
    f.tick()  # t=100 tick 10 -> idle (the collector's last poll)
    await c.stop()
    summary = c.summary()

    windows = {
        "train": ([2, 3, 6, 7], 40.0, train_keys),
        "eval": ([9], 10.0, eval_keys),
    }
    for label, (ticks, secs, keys) in windows.items():
        for sub, engines in SCOPES.items():
            base = f"vllm/{label}/{sub}"
            assert_keys(keys, base, expected_skyrl(f, ticks, secs, engines))
            assert_keys(keys, base, time_weighted(f, ticks, engines))
        assert not [k for k in keys if not k.startswith(f"vllm/{label}/")]
    # gauges over the window, not the last snapshot (SkyRL logs the snapshot at stop())
    last = sum(f.ticks[7][e]["num_requests_running"] for e in ENGINES)
    assert train_keys["vllm/train/num_requests_running"] != pytest.approx(last)
    # a prefill-only scope has one engine: no spread to report
    assert "vllm/train/prefill/prompt_throughput_cv" not in train_keys

    # the run summary: SkyRL's keys and totals per label and role, plus measurement_seconds
    runs = {"train": ([2, 3, 6, 7], 40.0), "eval": ([9], 10.0), "combined": (range(1, 11), 100.0)}
    for label, (run_ticks, secs) in runs.items():
        for sub, engines in SCOPES.items():
            base = f"vllm_correct_aggregate/{label}/{sub}"
            want = expected_skyrl(f, list(run_ticks), secs, engines)
            for name in list(want):  # SkyRL keeps these out of the run summary
                if name.startswith(("draft_num_", "draft_acceptance_rate_pos_")) or "_cv" in name:
                    del want[name]
            totals = {
                "output_tokens_total": "generation_tokens",
                "prompt_tokens_total": "prompt_tokens",
                "preemptions_total": "num_preemptions",
                "kv_offload_store_bytes_total": "kv_offload_store_bytes",
                "kv_offload_load_bytes_total": "kv_offload_load_bytes",
            }
            for key, q in totals.items():
                want[key] = f.total(run_ticks, engines, q)
            want["measurement_seconds"] = secs
            assert_keys(summary, base, want)
            for gone in ("num_requests_running", "draft_num_draft_tokens", "prompt_throughput_cv"):
                assert f"{base}{gone}" not in summary
    assert summary["run_status"] == "success"
    # tokens produced between windows are not lost: `idle` has them, `combined` is the run
    idle = f.total([1, 4, 5, 8, 10], ENGINES, "generation_tokens")
    assert summary["vllm_correct_aggregate/idle/output_tokens_total"] == idle
    # no window was voided
    assert summary["vllm_correct_aggregate/train/coverage"] == 1.0
    assert summary["vllm_correct_aggregate/train/failed_scrapes"] == 0


# --------------------------------------------------------------------------- async trainer


async def test_async_trainer_per_poll_keys_and_combined_summary() -> None:
    """An async trainer opens no window: every poll logs ``vllm/[{role}/]...`` over the poll's
    interval, and the run summary is ``vllm_correct_aggregate/combined/...``."""
    f = ScriptedFleet()
    c = Collector(source=f, schema="skyrl", interval=3600, fetch_model_info=False)
    await c.poll()
    views = []
    for _ in range(3):
        f.tick()
        views.append(await c.poll())
    f.tick()  # the collector's last poll, at stop()
    await c.stop()
    summary = c.summary()
    for k, view in zip((1, 2, 3), views, strict=True):
        for sub, engines in SCOPES.items():
            want = expected_skyrl(f, [k], 10.0, engines)
            assert_keys(view.keys, f"vllm/{sub}", want)
            snapshot = {g: [f.ticks[k][e][g] for e in engines] for g in GAUGES}
            assert view.keys[f"vllm/{sub}num_requests_running"] == sum(
                snapshot["num_requests_running"]
            )
            assert view.keys[f"vllm/{sub}kv_cache_usage_perc"] == pytest.approx(
                statistics.fmean(snapshot["kv_cache_usage_perc"])
            )
        assert not [key for key in view.keys if key.startswith(("vllm/train", "vllm/eval"))]
        assert not [key for key in view.keys if key.startswith("inference")]
        for cond in ("generation_stalled", "scrape_failed"):
            assert view.keys[f"vllm/health/{cond}"] == 0
    base = "vllm_correct_aggregate/combined/"
    run = [1, 2, 3, 4]
    assert summary[base + "output_tokens_total"] == f.total(run, ENGINES, "generation_tokens")
    assert summary[base + "measurement_seconds"] == 40.0
    assert summary[base + "decode/output_tokens_total"] == f.total(
        run, SCOPES["decode/"], "generation_tokens"
    )
    assert_keys(
        summary,
        base,
        {"ttft_seconds_p90": expected_skyrl(f, run, 40.0, ENGINES)["ttft_seconds_p90"]},
    )
    assert not [k for k in summary if "/train/" in k or "/eval/" in k]


# --------------------------------------------------------------------------- simulator, HTTP


def _truth(fleet: SimFleet) -> dict[str, dict[str, Any]]:
    out = {}
    for e in fleet.engines():
        t = e.truth
        row: dict[str, Any] = {
            f: t.counter(f"vllm:{f}_total")
            for f in (
                "generation_tokens",
                "prompt_tokens",
                "prefix_cache_hits",
                "prefix_cache_queries",
                "external_prefix_cache_hits",
                "external_prefix_cache_queries",
                "num_preemptions",
            )
        }
        for h in ("time_to_first_token_seconds", "request_time_per_output_token_seconds"):
            hist = t.histogram(f"vllm:{h}")
            assert hist is not None, h
            row[h] = (dict(hist.cumulative_by_bound()), hist.sum, hist.count)
        out[e.engine_id] = row
    return out


async def test_window_metrics_equal_the_simulators_ground_truth_through_faults() -> None:
    """Real HTTP, the simulator's vLLM families: the ``train`` window's SkyRL metrics per role
    equal the ground truth although one engine restarted (every series reset) and one server
    failed a scrape inside the window — either voids a SkyRL window."""
    pressure = LoadProfile(**KV_PRESSURE_LOAD)
    fleet = SimFleet(seed=21)
    fleet.add_endpoint(role="prefill", dp=1)
    fleet.add_endpoint(role="decode", dp=2)
    fleet.add_endpoint(role="decode", dp=1, load=pressure)  # preempts
    fleet.step(3.0)
    with FleetServer(fleet) as server:
        eps = [Endpoint(server.url(ep.name), ep.name, ep.role) for ep in fleet.endpoints]
        c = Collector(eps, schema="skyrl", interval=3600, timeout=5.0, fetch_model_info=False)

        async def step_poll() -> None:
            fleet.step(2.0)
            await asyncio.sleep(0.05)
            await c.poll()

        await c.poll()
        train = c.window("train")
        await train.astart()
        t0 = _truth(fleet)
        await step_poll()
        fleet.endpoint("decode0").restart_engine(1)  # right after a scrape: nothing unseen
        await step_poll()
        fleet.endpoint("prefill0").set_http_error(500)
        await step_poll()
        fleet.endpoint("prefill0").clear_faults()
        await step_poll()
        fleet.step(2.0)
        keys = await train.astop()
        t1 = _truth(fleet)
        await c.stop()
    summary: dict[str, Any] = c.summary()  # float values, and the run status (str)
    secs = summary["vllm_correct_aggregate/train/measurement_seconds"]
    assert summary["vllm_correct_aggregate/train/failed_scrapes"] == 1
    assert summary["vllm_correct_aggregate/train/engine_restarts"] == 1
    scopes = {
        "": list(t1),
        "prefill/": [e for e in t1 if e.startswith("prefill")],
        "decode/": [e for e in t1 if e.startswith("decode")],
    }
    for sub, engines in scopes.items():

        def d(q: str, engines: list[str] = engines) -> float:
            total: float = sum(t1[e][q] - t0[e][q] for e in engines)
            return total

        want = {
            "generation_throughput_tok_s": d("generation_tokens") / secs,
            "prompt_throughput_tok_s": d("prompt_tokens") / secs,
            "prefix_cache_hit_rate": d("prefix_cache_hits") / d("prefix_cache_queries"),
            "num_preemptions": d("num_preemptions"),
            "preemptions_per_million_tokens": d("num_preemptions") * 1e6 / d("generation_tokens"),
        }
        if d("external_prefix_cache_queries") > 0:
            want["external_prefix_cache_hit_rate"] = d("external_prefix_cache_hits") / d(
                "external_prefix_cache_queries"
            )
        for h, name in (
            ("time_to_first_token_seconds", "ttft_seconds"),
            ("request_time_per_output_token_seconds", "tpot_seconds"),
        ):
            pooled: dict[float, float] = {}
            for e in engines:
                (c1, _, _), (c0, _, _) = t1[e][h], t0[e][h]
                for le, n in c1.items():
                    pooled[le] = pooled.get(le, 0.0) + n - c0[le]
            total = sum(t1[e][h][1] - t0[e][h][1] for e in engines)
            count = sum(t1[e][h][2] - t0[e][h][2] for e in engines)
            if count == 0:  # no observation: no value (never a 0)
                assert f"vllm/train/{sub}{name}_avg" not in keys
                continue
            want[f"{name}_avg"] = total / count
            want[f"{name}_p90"] = promql_bucket_quantile(0.9, sorted(pooled.items()))
        assert_keys(keys, f"vllm/train/{sub}", want)
        base = f"vllm_correct_aggregate/train/{sub}"
        assert summary[base + "output_tokens_total"] == d("generation_tokens")
        assert summary[base + "preemptions_total"] == d("num_preemptions")
    assert keys["vllm/train/decode/num_preemptions"] > 0
    assert keys["vllm/train/decode/external_prefix_cache_hit_rate"] > 0
    assert summary["run_status"] == "success"


# --------------------------------------------------------------------------- Ray


def test_identity_lookup_is_bounded_by_10_seconds_by_default() -> None:
    """SkyRL bounds the lookup of its API-server actors' worker ids by 10 s; so does fleetscope
    (a failure or a timeout disables only the Ray source: see test_ray_fixtures)."""
    assert IDENTITY_LOOKUP_TIMEOUT == 10.0
    assert RaySource(identity_lookup=lambda: RayIdentity()).lookup_timeout == 10.0
    assert inspect.signature(worker_ids_of_actors).parameters["timeout"].default == 10.0


class _Agents(HttpSource):
    """Ray agents' bodies by URL, from memory (the real parser and identity labels)."""

    def __init__(self, bodies: dict[str, str]) -> None:
        super().__init__(identity_labels=RAY_AGENT_IDENTITY)
        self.bodies = bodies

    async def _fetch(self, ep: Endpoint) -> Response:
        return Response(200, {}, self.bodies[ep.metrics_url].encode())


async def test_ray_agents_are_rediscovered_while_running() -> None:
    """SkyRL fixes its endpoints at start; fleetscope's Ray source re-reads the node list
    (every ``rediscover_every`` polls): a node that joins mid-run is followed."""
    meta = json.loads((RAY_DIR / "ray_default_meta.json").read_text())
    vmeta = json.loads((RAY_DIR / "ray_vllm_default_meta.json").read_text())
    node_a, node_b = meta["node"], vmeta["node"]
    assert node_a["NodeID"] != node_b["NodeID"]

    def url(node: dict[str, Any]) -> str:
        return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"

    nodes = [node_a]
    own = {meta["identities"][n]["worker_id"] for n in ("own0", "own1")}
    own.add(vmeta["identity"]["worker_id"])
    src = RaySource(
        RayIdentity(worker_ids=own),
        nodes=lambda: list(nodes),
        rediscover_every=2,
        http=_Agents(
            {
                url(node_a): fixture_text("ray_default.prom"),
                url(node_b): fixture_text("ray_vllm_default.prom"),
            }
        ),
    )
    c = Collector(source=src, interval=3600, fetch_model_info=False)
    try:
        first = await c.poll()
        nodes.append(node_b)  # a node joins
        second = await c.poll()
        third = await c.poll()  # the node list is read again
    finally:
        await c.stop()
    assert first.keys["inference/agg/engines_reporting"] == 2
    assert second.keys["inference/agg/endpoints_expected"] == 1
    assert third.keys["inference/agg/engines_reporting"] == 3
    assert third.keys["inference/agg/endpoints_expected"] == 2
