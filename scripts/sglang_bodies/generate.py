#!/usr/bin/env python3
"""Make real SGLang /metrics bodies with SGLang's own metrics code.

SGLang's wheels need CUDA, so no server runs here.  Instead this script loads
``sglang/srt/observability/metrics_collector.py`` from an *unpacked* SGLang
wheel, untouched, with the real ``prometheus_client``.  Only the heavy imports
that module pulls in and that are irrelevant to metrics (torch-backed
``nvtx_utils``, ``runtime_context``, ``server_args``...) are replaced by
``sys.modules`` stubs.  ``DisaggregationMode`` and ``ForwardMode`` are not
re-typed: their class bodies are cut out of the wheel's own source with ``ast``.

SGLang serves ``/metrics`` in prometheus_client *multiprocess* mode
(``PROMETHEUS_MULTIPROC_DIR``, ``MultiProcessCollector``; see
``sglang/srt/utils/common.py:add_prometheus_middleware``): the tokenizer
manager (HTTP server process) and every scheduler process write their own
mmap files and the HTTP server merges them.  This script does the same: every
SGLang process of a case is a separate child process of this script (with a
fixed fake pid, so ``pid`` labels of ``multiprocess_mode="all"`` gauges are
deterministic), and the body is rendered from the merged directory with
``generate_latest`` (text 0.0.4) and, for one case, the OpenMetrics encoder.

Collectors are constructed the way SGLang constructs them:
``SchedulerMetricsCollector.init_new(...)`` (scheduler.py:init_metrics_collector),
``TokenizerMetricsCollector(server_args, labels=tokenizer_metric_labels(), bucket_*=...)``
(tokenizer_manager.py:init_metric_collector_watchdog) and
``RadixCacheMetricsCollector(labels=radix_cache_metric_labels(...))``
(mem_cache/base_prefix_cache.py:init_metrics_collector).  They are then driven
with a scripted load whose true values are recorded independently into
``truth.json``.

Usage:
    python scripts/sglang_bodies/generate.py --wheel-dir /tmp/sg523 \
        --out tests/data/sglang-0.5.23
    # or let it download and unpack the wheel into a cache dir:
    python scripts/sglang_bodies/generate.py --download 0.5.23 --out tests/data/sglang-0.5.23
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

HERE = os.path.abspath(__file__)

# JSON-shaped records (a case and its processes go to the child processes as JSON): Any
Case = dict[str, Any]  # _case(): name, disagg, tp, dp, obs, seed, n_req, spec, procs
Proc = dict[str, Any]  # one SGLang process of a case: role, pid (, tp_rank, dp_rank, tp_size)
Req = dict[str, Any]  # one scripted request (make_requests)
Record = dict[str, Any]  # one series of truth.json
# SGLang objects (collectors, stats) built from the wheel at run time: Any
SgCollector = Any

# --------------------------------------------------------------------------
# Cases.  Every case lists the SGLang processes of one server.
# --------------------------------------------------------------------------

MODEL = "Qwen/Qwen3-0.6B"

BASE_OBS: dict[str, Any] = dict(
    enable_metrics=True,
    enable_metrics_for_all_schedulers=False,
    extra_metric_labels=None,
    tokenizer_metrics_allowed_custom_labels=None,
    bucket_time_to_first_token=None,
    bucket_inter_token_latency=None,
    bucket_e2e_request_latency=None,
    prompt_tokens_buckets=None,
    generation_tokens_buckets=None,
    kv_events_config=None,
    stat_loggers=None,
)


def _case(
    name: str,
    disagg: str = "null",
    tp: int = 1,
    dp: int | None = None,
    obs: dict[str, Any] | None = None,
    seed: int = 1,
    n_req: int = 12,
    spec: bool = False,
) -> Case:
    o = dict(BASE_OBS)
    o.update(obs or {})
    procs: list[Proc] = [{"role": "tokenizer", "pid": 1000}]
    dps = [None] if dp is None else list(range(dp))
    pid = 2000
    for d in dps:
        for t in range(tp):
            procs.append(
                {"role": "scheduler", "pid": pid, "tp_rank": t, "dp_rank": d, "tp_size": tp}
            )
            pid += 1
    return dict(
        name=name,
        disagg=disagg,
        tp=tp,
        dp=dp,
        obs=o,
        seed=seed,
        n_req=n_req,
        spec=spec,
        procs=procs,
    )


CASES = [
    _case("single", spec=True, seed=1),
    _case("dp2", dp=2, seed=2, n_req=16),
    _case("pd_prefill", disagg="prefill", seed=3),
    _case("pd_decode", disagg="decode", seed=3),
    _case(
        "custom_buckets",
        seed=4,
        obs=dict(
            bucket_time_to_first_token=[0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
            bucket_inter_token_latency=[0.005, 0.01, 0.02, 0.05, 0.1],
            bucket_e2e_request_latency=[0.5, 1.0, 2.0, 5.0, 10.0],
            prompt_tokens_buckets=["tse", "1000", "2", "6"],
            generation_tokens_buckets=["custom", "16", "64", "256", "1024"],
        ),
    ),
    _case("all_tp_ranks", tp=2, seed=5, obs=dict(enable_metrics_for_all_schedulers=True)),
    # Same tp=2 server without --enable-metrics-for-all-schedulers: the tp_rank 1
    # scheduler still constructs a collector (init_new builds one whenever
    # --enable-metrics is on) so its pre-seeded counter children show up.
    _case("tp2_default", tp=2, seed=5),
]

# --------------------------------------------------------------------------
# Loading the wheel's metrics code with stubs
# --------------------------------------------------------------------------


def _extract_class(path: str, name: str, ns: dict[str, Any]) -> type:
    with open(path) as f:
        src = f.read()
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            mod = ast.Module(body=[node], type_ignores=[])
            exec(compile(mod, path, "exec"), ns)
            cls: type = ns[name]
            return cls
    raise LookupError(f"{name} not in {path}")


def _pkg(name: str, path: str | None = None) -> Any:
    """A stub module in ``sys.modules`` (Any: the caller sets its attributes)."""
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    sys.modules[name] = m
    return m


def load_sglang(wheel_dir: str, cfg: dict[str, Any]) -> tuple[types.ModuleType, object]:
    """Install stubs and import the wheel's metrics_collector module."""
    root = os.path.join(wheel_dir, "sglang")
    srt = os.path.join(root, "srt")
    _pkg("sglang", root)
    _pkg("sglang.srt", srt)
    _pkg("sglang.srt.observability", os.path.join(srt, "observability"))
    _pkg("sglang.srt.disaggregation", os.path.join(srt, "disaggregation"))
    _pkg("sglang.srt.model_executor", os.path.join(srt, "model_executor"))
    _pkg("sglang.srt.managers", os.path.join(srt, "managers"))

    # sglang.srt.utils: package stub (its __init__ imports torch); only
    # get_bool_env_var is needed.  gauge_histogram loads for real from the wheel.
    u = _pkg("sglang.srt.utils", os.path.join(srt, "utils"))

    def get_bool_env_var(name: str, default: str = "false") -> bool:
        return os.getenv(name, default).lower() in ("true", "1")

    u.get_bool_env_var = get_bool_env_var

    nv = _pkg("sglang.srt.utils.nvtx_utils")
    nv.NVTX_SCHEDULER_ENABLED = False

    def profile_range(*a: object, **k: object) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def scheduler_nvtx_method(*a: object, **k: object) -> Callable[[Any], Any]:
        return lambda f: f

    nv.profile_range = profile_range
    nv.scheduler_nvtx_method = scheduler_nvtx_method

    du = _pkg("sglang.srt.disaggregation.utils")
    du.DisaggregationMode = _extract_class(
        os.path.join(srt, "disaggregation", "utils.py"),
        "DisaggregationMode",
        {"Enum": enum.Enum, "__name__": "sglang.srt.disaggregation.utils"},
    )
    fb = _pkg("sglang.srt.model_executor.forward_batch_info")
    fb.ForwardMode = _extract_class(
        os.path.join(srt, "model_executor", "forward_batch_info.py"),
        "ForwardMode",
        {
            "IntEnum": enum.IntEnum,
            "auto": enum.auto,
            "__name__": "sglang.srt.model_executor.forward_batch_info",
        },
    )

    sa = _pkg("sglang.srt.server_args")

    class ServerArgs:  # only passed through to the collectors
        pass

    sa.ServerArgs = ServerArgs

    rc = _pkg("sglang.srt.runtime_context")
    obs = types.SimpleNamespace(**cfg["obs"])
    parallel = types.SimpleNamespace(**cfg["parallel"])
    serving = types.SimpleNamespace(served_model_name=MODEL, enable_streaming_session=False)
    disagg = types.SimpleNamespace(disaggregation_mode=cfg["disagg"], enable_pd_role_switch=False)
    schedule = types.SimpleNamespace(
        enable_priority_scheduling=False,
        prefill_delayer_max_delay_passes=30,  # server_args default
        prefill_delayer_forward_passes_buckets=None,
        prefill_delayer_wait_seconds_buckets=None,
    )

    class _Ctx:
        def is_config_namespace_published(self, ns: object) -> bool:
            return False  # -> resolve_collector_class returns the default class

    rc.get_context = lambda: _Ctx()
    rc.get_observability = lambda: obs
    rc.get_parallel = lambda: parallel
    rc.get_serving = lambda: serving
    rc.get_disagg = lambda: disagg
    rc.get_schedule = lambda: schedule
    rc.exports_expert_balancedness_to_prometheus = lambda: False

    import importlib

    return importlib.import_module("sglang.srt.observability.metrics_collector"), ServerArgs()


# --------------------------------------------------------------------------
# Truth bookkeeping (independent of prometheus_client)
# --------------------------------------------------------------------------


# (name, sorted (label, str(value)) pairs)
Key = tuple[str, tuple[tuple[str, str], ...]]


class Hist(TypedDict):
    buckets: list[float]  # upper bounds
    obs: list[list[float]]  # [value, n]
    sum: float


class Truth:
    def __init__(self) -> None:
        self.counters: dict[Key, float] = {}  # (name, labels) -> value
        self.gauges: dict[Key, float | str] = {}  # (name, labels) -> value ("NaN")
        self.hists: dict[Key, Hist] = {}  # (name, labels) -> buckets, [v, n] observations, sum

    @staticmethod
    def _k(name: str, labels: Mapping[str, object]) -> Key:
        return (name, tuple(sorted((k, str(v)) for k, v in labels.items())))

    def inc(self, name: str, labels: Mapping[str, object], v: float) -> None:
        k = self._k(name, labels)
        self.counters[k] = self.counters.get(k, 0) + v

    def seed(self, name: str, labels: Mapping[str, object]) -> None:
        self.counters.setdefault(self._k(name, labels), 0)

    def set(self, name: str, labels: Mapping[str, object], v: float | str) -> None:
        self.gauges[self._k(name, labels)] = v

    def observe(
        self,
        name: str,
        labels: Mapping[str, object],
        buckets: Sequence[float],
        v: float,
        n: int = 1,
        sum_inc: float | None = None,
    ) -> None:
        k = self._k(name, labels)
        h = self.hists.setdefault(k, {"buckets": list(buckets), "obs": [], "sum": 0.0})
        h["obs"].append([v, n])
        h["sum"] += v * n if sum_inc is None else sum_inc

    def hseed(self, name: str, labels: Mapping[str, object], buckets: Sequence[float]) -> None:
        self.hists.setdefault(
            self._k(name, labels), {"buckets": list(buckets), "obs": [], "sum": 0.0}
        )

    def dump(self) -> dict[str, list[Record]]:
        def lab(k: Key) -> dict[str, str]:
            return dict(k[1])

        out: dict[str, list[Record]] = {"counters": [], "gauges": [], "histograms": []}
        for k, v in sorted(self.counters.items()):
            out["counters"].append({"name": k[0], "labels": lab(k), "value": v})
        for k, value in sorted(self.gauges.items()):
            out["gauges"].append({"name": k[0], "labels": lab(k), "value": value})
        for k, h in sorted(self.hists.items()):
            bounds = h["buckets"]
            cum: list[float] = []
            for b in bounds:
                cum.append(sum(n for v, n in h["obs"] if v <= b))
            count = sum(n for v, n in h["obs"])
            out["histograms"].append(
                {
                    "name": k[0],
                    "labels": lab(k),
                    "buckets": [
                        [("+Inf" if b == float("inf") else b), c]
                        for b, c in zip(bounds, cum, strict=False)
                    ]
                    + ([["+Inf", count]] if bounds[-1] != float("inf") else []),
                    "count": count,
                    "sum": h["sum"],
                    "observations": h["obs"],
                }
            )
        return out


def _dy(rng: random.Random, lo: float, hi: float, denom: int = 256) -> float:
    """A dyadic rational in [lo, hi] so float sums are exact."""
    return rng.randint(int(lo * denom), int(hi * denom)) / denom


# --------------------------------------------------------------------------
# The scripted load
# --------------------------------------------------------------------------


def make_requests(case: Case) -> list[Req]:
    """All requests of a case; scheduler processes pick theirs by dp_rank."""
    rng = random.Random(case["seed"])
    reqs: list[Req] = []
    ndp = case["dp"] or 1
    for i in range(case["n_req"]):
        prompt = rng.randint(40, 3000)
        device = rng.choice([0, 0, 64, 128, 256]) if prompt > 300 else 0
        host = rng.choice([0, 0, 32]) if device else 0
        storage = 0
        gen = rng.randint(2, 60)
        aborted = i == case["n_req"] - 1  # the last one is aborted by the client
        stream = i % 3 != 0
        ttft = _dy(rng, 0.02, 1.5)
        # chunks of new tokens after the first one: (interval, n_new_tokens)
        chunks, left = [], gen - 1
        while left > 0:
            n = min(left, rng.choice([1, 1, 2, 4]))
            chunks.append((_dy(rng, 0.004, 0.09, 1024) * n, n))
            left -= n
        queue = _dy(rng, 0.0, 0.3, 1024)
        reqs.append(
            dict(
                i=i,
                dp=i % ndp,
                prompt=prompt,
                device=device,
                host=host,
                storage=storage,
                gen=gen,
                stream=stream,
                ttft=ttft,
                chunks=chunks,
                queue=queue,
                aborted=aborted,
                spec_verify_ct=(gen + 2) // 3 if case["spec"] else 0,
                grammar=(i == 1),
            )
        )
    return reqs


def run_tokenizer(
    mc: types.ModuleType, server_args: object, case: Case, truth: Truth, drive: bool
) -> None:
    obs = case["obs"]
    labels = mc.tokenizer_metric_labels()
    col = mc.TokenizerMetricsCollector(
        server_args=server_args,
        labels=labels,
        bucket_time_to_first_token=obs["bucket_time_to_first_token"],
        bucket_e2e_request_latency=obs["bucket_e2e_request_latency"],
        bucket_inter_token_latency=obs["bucket_inter_token_latency"],
    )
    startup: dict[str, Any] = {  # emit_startup_time's argument
        "load_weight": 12.5,
        "kv_cache_allocation": 1.25,
        "scheduler_e2e": 30.5,
        "tokenizer_e2e": 2.75,
        "cuda_graph": {"decode": 8.5},
    }
    col.emit_startup_time(startup)
    for p in ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e"):
        truth.set("sglang:startup_time_seconds", {**labels, "phase": p}, startup[p])
    truth.set("sglang:startup_cuda_graph_time_seconds", {**labels, "phase": "decode"}, 8.5)
    if not drive:
        return
    prefill_only = case["disagg"] == "prefill"
    ttft_b = col.histogram_time_to_first_token._upper_bounds
    itl_b = col.histogram_inter_token_latency._upper_bounds
    e2e_b = col.histogram_e2e_request_latency._upper_bounds
    pt_b = col.prompt_tokens_histogram._upper_bounds
    gt_b = col.generation_tokens_histogram._upper_bounds
    for r in make_requests(case):
        sl = {**labels, "is_streaming": "true" if r["stream"] else "false"}
        if r["aborted"]:
            # TokenizerManager.abort_request: counter only (the abort output that may follow is
            # not modelled)
            col.observe_one_aborted_request(col.labels)
            truth.inc("sglang:num_aborted_requests_total", labels, 1)
            continue
        gen = 1 if prefill_only else r["gen"]
        if not prefill_only:
            col.observe_time_to_first_token(labels, r["ttft"], stream=r["stream"])
            truth.observe("sglang:time_to_first_token_seconds", sl, ttft_b, r["ttft"])
            for interval, n in r["chunks"]:
                col.observe_inter_token_latency(labels, interval, n)
                # fast path: one bucket += n at interval/n, sum += interval
                truth.observe(
                    "sglang:inter_token_latency_seconds",
                    labels,
                    itl_b,
                    interval / n,
                    n,
                    sum_inc=interval,
                )
        decode_time = sum(c[0] for c in r["chunks"])
        e2e = r["ttft"] + decode_time
        tpot = None if prefill_only else (decode_time / (gen - 1))
        cached = r["device"] + r["host"] + r["storage"]
        details = {"device": r["device"], "host": r["host"]}
        col.observe_one_finished_request(
            labels,
            r["prompt"],
            gen,
            cached,
            e2e,
            r["grammar"],
            details,
            spec_verify_ct=r["spec_verify_ct"],
            is_streaming=r["stream"],
            time_per_output_token=tpot,
        )
        truth.inc("sglang:prompt_tokens_total", sl, r["prompt"])
        truth.inc("sglang:generation_tokens_total", sl, gen)
        if r["spec_verify_ct"]:
            truth.inc("sglang:spec_verify_calls_total", labels, r["spec_verify_ct"])
        for src in ("device", "host"):
            if r[src]:
                truth.inc("sglang:cached_tokens_total", {**labels, "cache_source": src}, r[src])
        truth.inc("sglang:num_requests_total", sl, 1)
        if r["grammar"]:
            truth.inc("sglang:num_so_requests_total", labels, 1)
        truth.observe("sglang:e2e_request_latency_seconds", sl, e2e_b, e2e)
        if tpot is not None:
            truth.observe("sglang:request_time_per_output_token_seconds", sl, itl_b, tpot)
        truth.observe("sglang:prompt_tokens_histogram", labels, pt_b, float(r["prompt"]))
        truth.observe(
            "sglang:uncached_prompt_tokens_histogram", labels, pt_b, float(r["prompt"] - cached)
        )
        truth.observe("sglang:generation_tokens_histogram", labels, gt_b, float(gen))


def run_scheduler(
    mc: types.ModuleType, server_args: object, case: Case, proc: Proc, truth: Truth, drive: bool
) -> None:
    col_ctx = mc.SchedulerMetricsCollector.init_new(
        server_args=server_args,
        enable_priority_scheduling=False,
        enable_lora=False,
        enable_hierarchical_cache=False,
    )
    col = col_ctx.collector
    seed_scheduler_children(col, truth)

    # RadixCache collector: every scheduler rank (base_prefix_cache.py)
    rlabels = mc.radix_cache_metric_labels(
        "RadixCache", types.SimpleNamespace(**case_parallel(case, proc)), False
    )
    rcol = mc.RadixCacheMetricsCollector(labels=rlabels)

    max_tokens = emit_startup_constants(col, truth)
    if not col_ctx.current_scheduler_metrics_enabled:
        return
    if not drive:
        # metrics_reporter._maybe_log_idle_metrics: an idle scheduler publishes
        # log_stats every 30 s with zero queues and the pool stats of an empty pool.
        stats = mc.SchedulerStats(kv_available_tokens=max_tokens)
        col.log_stats(stats)
        record_log_stats(mc, col, stats, proc, truth)
        return

    engine = case["disagg"]
    mine = [r for r in make_requests(case) if r["dp"] == (proc["dp_rank"] or 0)]
    eff = drive_scheduler_requests(col, truth, engine, mine)
    drive_scheduler_steps(col, rcol, rlabels, truth, engine)
    drive_pd_transfers(col, truth, engine, mine)
    log_final_stats(mc, col, case, proc, truth, engine, eff, max_tokens)


def seed_scheduler_children(col: SgCollector, truth: Truth) -> None:
    """The children SchedulerMetricsCollector's constructor pre-seeds."""
    L = col.labels
    # pre-seeded children (constructor)
    for m in ("input", "device_hit", "host_hit", "storage_hit"):
        truth.seed("sglang:prefill_effective_tokens_total", {**L, "mode": m})
    truth.seed("sglang:scheduler_idle_seconds_total", L)
    truth.seed("sglang:scheduler_process_cpu_seconds_total", L)
    from sglang.srt.observability.scheduler_stage_metrics import (
        FORWARD_OVERLAP_NONE,
        SCHEDULER_STAGE_CATEGORIES,
    )

    for c in SCHEDULER_STAGE_CATEGORIES:
        truth.seed(
            "sglang:scheduler_stage_seconds_total",
            {**L, "category": c, "forward_overlap": FORWARD_OVERLAP_NONE},
        )
    for k in ("scheduled", "imbalance"):
        truth.seed("sglang:dp_attention_tokens_total", {**L, "kind": k})
        truth.seed("sglang:dp_attention_pairs_total", {**L, "kind": k})
    for s in ("active", "idle"):
        truth.seed("sglang:dp_attention_steps_total", {**L, "rank_state": s})
    truth.hseed(
        "sglang:dp_attention_token_imbalance_ratio",
        L,
        col.dp_attention_token_imbalance_ratio._upper_bounds,
    )
    truth.hseed(
        "sglang:dp_attention_sync_wait_seconds", L, col.dp_attention_sync_wait_seconds._upper_bounds
    )


def emit_startup_constants(col: SgCollector, truth: Truth) -> int:
    """emit_constants at startup (every rank that has a collector); returns the pool size."""
    L = col.labels
    max_tokens = 200000
    consts: dict[str, Any] = dict(  # emit_constants' keyword arguments
        max_total_num_tokens=max_tokens,
        max_total_num_tokens_swa=None,
        weight_memory_usage_gb=1.25,
        kv_cache_memory_usage_gb=21.5,
        graph_memory_usage_gb={"decode": 0.5},
        max_running_requests_under_SLO=None,
        page_size=1,
        num_pages=max_tokens,
        context_len=40960,
        startup_available_gpu_memory_gb=78.5,
    )
    col.emit_constants(**consts)
    for k in (
        "max_total_num_tokens",
        "weight_memory_usage_gb",
        "kv_cache_memory_usage_gb",
        "page_size",
        "num_pages",
        "context_len",
        "startup_available_gpu_memory_gb",
    ):
        truth.set("sglang:" + k, L, consts[k])
    truth.set("sglang:graph_memory_usage_gb", {**L, "phase": "decode"}, 0.5)
    return max_tokens


def drive_scheduler_requests(
    col: SgCollector, truth: Truth, engine: str, mine: list[Req]
) -> dict[str, int]:
    """The requests' queue times and one log interval's realtime and effective prefill
    tokens; returns the effective prefill tokens by mode."""
    L = col.labels
    qb = col.queue_time._upper_bounds
    sb = col.per_stage_req_latency_seconds._upper_bounds
    pc = pcache = dec = 0
    eff = {"input": 0, "device_hit": 0, "host_hit": 0}
    for r in mine:
        col.observe_queue_time(r["queue"])
        truth.observe("sglang:queue_time_seconds", L, qb, r["queue"])
        stage = "prefill_waiting" if engine != "decode" else "decode_waiting"
        col.observe_per_stage_req_latency(stage, r["queue"])
        truth.observe("sglang:per_stage_req_latency_seconds", {**L, "stage": stage}, sb, r["queue"])
        cached = r["device"] + r["host"]
        if engine != "decode":
            pc += r["prompt"] - cached
            pcache += cached
            # mode="input" is the computed (uncached) part: hit rate = hits / (input + hits)
            eff["input"] += r["prompt"] - cached
            eff["device_hit"] += r["device"]
            eff["host_hit"] += r["host"]
        if engine != "prefill" and not r["aborted"]:
            dec += r["gen"] - 1  # the first token comes out of the prefill forward
    # one log interval worth of realtime tokens
    col.increment_realtime_tokens(
        None, prefill_compute_tokens=pc, prefill_cache_tokens=pcache, decode_tokens=dec
    )
    for m, v in (("prefill_compute", pc), ("prefill_cache", pcache), ("decode", dec)):
        if v:
            truth.inc("sglang:realtime_tokens_total", {**L, "mode": m}, v)
    if engine != "decode":
        col.increment_effective_prefill_tokens(eff["input"], eff["device_hit"], eff["host_hit"], 0)
        for m, v in eff.items():
            if v:
                truth.inc("sglang:prefill_effective_tokens_total", {**L, "mode": m}, v)
    return eff


def drive_scheduler_steps(
    col: SgCollector, rcol: SgCollector, rlabels: dict[str, Any], truth: Truth, engine: str
) -> None:
    """Forward and idle time, CUDA graph passes, a retraction, a radix cache eviction."""
    L = col.labels
    # forward time / idle time
    col.increment_forward_execution_seconds("extend" if engine != "decode" else "decode", 1.5)
    truth.inc(
        "sglang:forward_execution_seconds_total",
        {**L, "category": "extend" if engine != "decode" else "decode"},
        1.5,
    )
    if engine == "null":
        col.increment_forward_execution_seconds("decode", 3.25)
        truth.inc("sglang:forward_execution_seconds_total", {**L, "category": "decode"}, 3.25)
    col.increment_scheduler_idle_seconds(7.5)
    truth.inc("sglang:scheduler_idle_seconds_total", L, 7.5)
    for _ in range(3):
        col.increment_decode_cuda_graph_pass(True)
    col.increment_prefill_cuda_graph_pass(False)
    truth.inc("sglang:cuda_graph_passes_total", {**L, "mode": "decode_cuda_graph"}, 3)
    truth.inc("sglang:cuda_graph_passes_total", {**L, "mode": "prefill_none"}, 1)
    # one retraction (decode OOM) on unified / decode servers
    if engine != "prefill":
        col.increment_retracted_reqs(1, 512, 17)
        truth.inc("sglang:num_retracted_requests_total", L, 1)
        truth.inc("sglang:num_retracted_input_tokens_total", L, 512)
        truth.inc("sglang:num_retracted_output_tokens_total", L, 17)
    # radix cache eviction
    rcol.increment_eviction_num_tokens(4096)
    rcol.observe_eviction_duration(0.0078125)
    truth.inc("sglang:evicted_tokens_total", rlabels, 4096)
    truth.observe(
        "sglang:eviction_duration_seconds",
        rlabels,
        rcol.eviction_duration_seconds._upper_bounds,
        0.0078125,
    )


def drive_pd_transfers(col: SgCollector, truth: Truth, engine: str, mine: list[Req]) -> None:
    """PD transfer metrics: a prefill server's KV transfers, a decode server's bootstraps."""
    L = col.labels
    # PD transfer metrics
    if engine == "prefill":
        for j, r in enumerate(mine):
            if r["aborted"]:
                continue
            lat, mb = 12.5 + j, 8.0 * (j + 1)
            spd = (mb / 1024) / (lat / 1000)
            col.observe_kv_transfer_metrics(latency_ms=lat, total_mb=mb, speed_gb_s=spd)
            truth.observe(
                "sglang:kv_transfer_latency_ms", L, col.kv_transfer_latency_ms._upper_bounds, lat
            )
            truth.observe(
                "sglang:kv_transfer_total_mb", L, col.kv_transfer_total_mb._upper_bounds, mb
            )
            truth.observe(
                "sglang:kv_transfer_speed_gb_s", L, col.kv_transfer_speed_gb_s._upper_bounds, spd
            )
        col.increment_bootstrap_failed_reqs()
        truth.inc("sglang:num_bootstrap_failed_reqs_total", L, 1)
    if engine == "decode":
        for j, _r in enumerate(mine):
            col.observe_kv_transfer_bootstrap(bootstrap_ms=3.0 + j, alloc_ms=0.5 * j)
            truth.observe(
                "sglang:kv_transfer_bootstrap_ms",
                L,
                col.kv_transfer_bootstrap_ms._upper_bounds,
                3.0 + j,
            )
            truth.observe(
                "sglang:kv_transfer_alloc_ms", L, col.kv_transfer_alloc_ms._upper_bounds, 0.5 * j
            )
        col.increment_transfer_failed_reqs()
        truth.inc("sglang:num_transfer_failed_reqs_total", L, 1)


def log_final_stats(
    mc: types.ModuleType,
    col: SgCollector,
    case: Case,
    proc: Proc,
    truth: Truth,
    engine: str,
    eff: dict[str, int],
    max_tokens: int,
) -> None:
    """The last log_stats of the run (metrics_reporter): gauges."""
    S = mc.SchedulerStats
    Q = mc.QueueCount
    used = 1234 + 200 * (proc["dp_rank"] or 0)  # TP ranks share one pool accounting
    evictable = 20000
    stats = S(
        num_running_reqs=Q(total=3 if engine != "prefill" else 1),
        num_queue_reqs=Q(total=2),
        gen_throughput=412.5 if engine != "prefill" else 0.0,
        cache_hit_rate=(eff["device_hit"] + eff["host_hit"]) / max(1, sum(eff.values())),
        decode_sum_seq_lens=4321 if engine != "prefill" else 0,
        # pool_stats_observer: token_usage = round(max(full, swa, mamba), 2); full unrounded
        token_usage=round(used / max_tokens, 2),
        full_token_usage=used / max_tokens,
        num_used_tokens=used,
        kv_used_tokens=used,
        kv_evictable_tokens=evictable,
        kv_available_tokens=max_tokens - used - evictable,
        spec_accept_length=2.5 if case["spec"] else 0.0,
        spec_accept_rate=0.75 if case["spec"] else 0.0,
        spec_num_steps=3 if case["spec"] else 0,
        spec_num_draft_tokens=4 if case["spec"] else 0,
        num_retracted_reqs=1 if engine != "prefill" else 0,
        num_prefill_bootstrap_queue_reqs=Q(total=1 if engine == "prefill" else 0),
        num_prefill_inflight_queue_reqs=Q(total=2 if engine == "prefill" else 0),
        num_decode_prealloc_queue_reqs=Q(total=1 if engine == "decode" else 0),
        num_decode_transfer_queue_reqs=Q(total=2 if engine == "decode" else 0),
        utilization=0.5,
        new_token_ratio=0.375,
        is_cuda_graph=1,
        # routing keys (--routing-key header): 3 keys running 1, 1 and 3 requests
        num_unique_running_routing_keys=3 if case["name"] == "single" else 0,
        routing_key_running_req_counts=[1, 1, 3] if case["name"] == "single" else [],
        routing_key_all_req_counts=[2, 1, 5] if case["name"] == "single" else [],
    )
    col.log_stats(stats)
    record_log_stats(mc, col, stats, proc, truth)


def record_log_stats(
    mc: types.ModuleType, col: SgCollector, stats: Any, proc: Proc, truth: Truth
) -> None:
    L = col.labels
    g: dict[str, float | str] = {}
    for f in LOG_STATS_GAUGES:
        v = getattr(stats, f)
        v = v.total if isinstance(v, mc.QueueCount) else v
        g[f] = "NaN" if isinstance(v, float) and v != v else v
    for k, v in g.items():
        truth.set("sglang:" + k, L, v)
    # multiprocess_mode "all" (the default) gauges carry a pid label
    for k, v in (("num_retracted_reqs", stats.num_retracted_reqs), ("num_paused_reqs", 0)):
        truth.set("sglang:" + k, {**L, "pid": str(proc["pid"])}, v)
    # GaugeHistogram (a plain gauge with gt/le labels): per bucket the number of
    # routing keys whose request count c satisfies gt < c <= le -- NOT cumulative.
    bounds = mc.ROUTING_KEY_REQ_COUNT_BUCKET_BOUNDS
    edges = [(0 if i == 0 else bounds[i - 1], b) for i, b in enumerate(bounds)] + [
        (bounds[-1], float("inf"))
    ]
    for fam, obs in (
        ("routing_key_running_req_count", stats.routing_key_running_req_counts),
        ("routing_key_all_req_count", stats.routing_key_all_req_counts),
    ):
        for gt, le in edges:
            n = sum(1 for c in obs if gt < c <= le)
            truth.set(
                "sglang:" + fam,
                {**L, "gt": str(gt), "le": "+Inf" if le == float("inf") else str(le)},
                n,
            )


# SchedulerStats fields that log_stats() writes to the gauge of the same name
# (LoRA / HiCache / streaming-session gauges are off in these cases).
LOG_STATS_GAUGES = (
    "num_running_reqs",
    "num_queue_reqs",
    "num_grammar_queue_reqs",
    "gen_throughput",
    "cache_hit_rate",
    "decode_sum_seq_lens",
    "token_usage",
    "full_token_usage",
    "swa_token_usage",
    "mamba_usage",
    "num_used_tokens",
    "kv_available_tokens",
    "kv_evictable_tokens",
    "kv_used_tokens",
    "swa_available_tokens",
    "swa_evictable_tokens",
    "swa_used_tokens",
    "mamba_available_tokens",
    "mamba_evictable_tokens",
    "mamba_used_tokens",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_cap_length",
    "spec_block_accept_length",
    "spec_num_steps",
    "spec_num_draft_tokens",
    "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "num_decode_host_receive_queue_reqs",
    "num_decode_deferred_kv_release_reqs",
    "pending_prealloc_token_usage",
    "prealloc_full_token_usage",
    "prealloc_swa_token_usage",
    "utilization",
    "fwd_occupancy",
    "new_token_ratio",
    "is_cuda_graph",
    "num_unique_running_routing_keys",
)


def case_parallel(case: Case, proc: Proc) -> dict[str, Any]:
    return dict(
        tp_rank=proc["tp_rank"],
        pp_rank=0,
        moe_ep_rank=0,
        dp_rank=proc["dp_rank"],
        attn_tp_rank=proc["tp_rank"],
        attn_cp_rank=0,
        attn_dp_rank=0,
    )


# --------------------------------------------------------------------------
# Child: one SGLang process
# --------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    spec = json.loads(args.child)
    case, proc = spec["case"], spec["proc"]
    # fixed pid for the multiprocess files and "all"-mode gauge pid labels
    from prometheus_client import values

    # prometheus_client leaves MultiProcessValue (and the calls in render) unannotated
    values.ValueClass = values.MultiProcessValue(lambda: proc["pid"])  # type: ignore[no-untyped-call]
    cfg = {
        "obs": case["obs"],
        "disagg": case["disagg"],
        "parallel": case_parallel(case, proc)
        if proc["role"] == "scheduler"
        else case_parallel(case, {"tp_rank": 0, "dp_rank": None}),
    }
    mc, server_args = load_sglang(args.wheel_dir, cfg)
    truth = Truth()
    if proc["role"] == "tokenizer":
        run_tokenizer(mc, server_args, case, truth, spec["drive"])
    else:
        run_scheduler(mc, server_args, case, proc, truth, spec["drive"])
    json.dump(truth.dump(), sys.stdout)


def render(mpdir: str) -> tuple[bytes, bytes]:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.openmetrics import exposition as om

    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=mpdir)  # type: ignore[no-untyped-call]
    return generate_latest(reg), om.generate_latest(reg)  # type: ignore[no-untyped-call]


def merge_processes(m: dict[str, list[Record]]) -> dict[str, list[Record]]:
    """Same label set written by two processes: MultiProcessCollector sums counters and
    histograms; "mostrecent" gauges keep the newest write (the later process here).
    Happens for real: radix_cache_metric_labels() gives every DP replica dp_rank=0 unless
    DP attention is on, so two DP replicas' RadixCache series coincide."""

    def key(x: Record) -> Key:
        return (x["name"], tuple(sorted(x["labels"].items())))

    out: dict[str, dict[Key, Record]] = {"counters": {}, "gauges": {}, "histograms": {}}
    for c in m["counters"]:
        k = key(c)
        if k in out["counters"]:
            out["counters"][k]["value"] += c["value"]
            out["counters"][k]["merged_from_processes"] = (
                out["counters"][k].get("merged_from_processes", 1) + 1
            )
        else:
            out["counters"][k] = dict(c)
    for g in m["gauges"]:
        out["gauges"][key(g)] = dict(g)
    for h in m["histograms"]:
        k = key(h)
        if k in out["histograms"]:
            o = out["histograms"][k]
            o["buckets"] = [
                [le, n + n2] for (le, n), (_, n2) in zip(o["buckets"], h["buckets"], strict=False)
            ]
            o["count"] += h["count"]
            o["sum"] += h["sum"]
            o["observations"] += h["observations"]
            o["merged_from_processes"] = o.get("merged_from_processes", 1) + 1
        else:
            out["histograms"][k] = dict(h)
    return {k: [v[x] for x in sorted(v)] for k, v in out.items()}


def run_case(
    args: argparse.Namespace, case: Case, drive: bool
) -> tuple[bytes, bytes, dict[str, list[Record]]]:
    mpdir = tempfile.mkdtemp(prefix="sgmp-")
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=mpdir, PYTHONHASHSEED="0")
    merged: dict[str, list[Record]] = {"counters": [], "gauges": [], "histograms": []}
    for proc in case["procs"]:
        spec = json.dumps({"case": case, "proc": proc, "drive": drive})
        out = subprocess.run(
            [sys.executable, HERE, "--wheel-dir", args.wheel_dir, "--child", spec],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        t = json.loads(out.stdout)
        for k in merged:
            merged[k].extend(t[k])
    merged = merge_processes(merged)
    text, omtext = render(mpdir)
    for f in glob.glob(os.path.join(mpdir, "*.db")):
        os.remove(f)
    os.rmdir(mpdir)
    return text, omtext, merged


def ensure_wheel(version: str, cache: str) -> str:
    d = os.path.join(cache, f"sglang-{version}")
    if os.path.isdir(os.path.join(d, "sglang")):
        return d
    os.makedirs(d, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}", "-d", d],
        check=True,
    )
    whl = glob.glob(os.path.join(d, "sglang-*.whl"))[0]
    zipfile.ZipFile(whl).extractall(d)
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel-dir", help="unpacked sglang wheel (dir containing sglang/)")
    ap.add_argument(
        "--download", metavar="VERSION", help="pip download + unpack this sglang version"
    )
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/fleetscope/sglang-wheels"))
    ap.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(HERE), "..", "..", "tests", "data", "sglang-0.5.23"),
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.wheel_dir:
        args.wheel_dir = ensure_wheel(args.download or "0.5.23", args.cache)
    args.wheel_dir = os.path.abspath(args.wheel_dir)
    os.makedirs(args.out, exist_ok=True)
    truth_all: dict[str, Record] = {}
    for case in CASES:
        phases = [("after", True)]
        if case["name"] in ("single", "dp2"):
            phases.insert(0, ("idle", False))
        for phase, drive in phases:
            name = f"{case['name']}_{phase}"
            text, omtext, truth = run_case(args, case, drive)
            with open(os.path.join(args.out, name + ".prom"), "wb") as f:
                f.write(text)
            if name == "single_after":
                with open(os.path.join(args.out, name + ".openmetrics.txt"), "wb") as f:
                    f.write(omtext)
            truth_all[name + ".prom"] = dict(
                case={k: case[k] for k in ("disagg", "tp", "dp", "obs", "seed", "n_req", "spec")},
                processes=case["procs"],
                driven=drive,
                **truth,
            )
            print(name, len(text), "bytes", file=sys.stderr)
    with open(os.path.join(args.out, "truth.json"), "w") as f:
        json.dump(truth_all, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
