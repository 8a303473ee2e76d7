#!/usr/bin/env python3
"""List every sglang: family an SGLang wheel defines, by constructing the collectors.

Loads the wheel's metrics code with the same stubs as generate.py, turns every optional
part on (LoRA, HiCache, streaming sessions, EPLB balancedness, priority scheduling), builds
every collector class plus the module-level metrics (cpu monitor, HTTP request metrics,
func timer, startup timer), and prints JSON: name, type, labels, buckets, help, defined by.

    /tmp/sgvenv/bin/python scripts/sglang_bodies/families.py --wheel-dir /tmp/sg523 > families.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel-dir", required=True)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("sg_generate", os.path.join(HERE, "generate.py"))
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    case = gen._case("families")
    cfg = {
        "obs": case["obs"],
        "disagg": "null",
        "parallel": gen.case_parallel(case, {"tp_rank": 0, "dp_rank": 0}),
    }
    mc, server_args = gen.load_sglang(os.path.abspath(args.wheel_dir), cfg)
    mc.exports_expert_balancedness_to_prometheus = lambda: True  # bound by name at import

    from prometheus_client import Counter, Gauge, Histogram, Summary

    # name -> (who defines it, the metric): Any, as the private attributes read below
    # (_type, _labelnames, _upper_bounds, _multiprocess_mode...) are per metric class
    owners: dict[str, tuple[str, Any]] = {}

    def scan(owner: str, obj: object) -> None:
        for v in vars(obj).values():
            if isinstance(v, (Counter, Gauge, Histogram, Summary)):
                owners[v._name] = (owner, v)
            elif hasattr(v, "_gauge") and isinstance(v._gauge, Gauge):  # GaugeHistogram
                owners[v._gauge._name] = (
                    owner + " (GaugeHistogram: gt/le bucket labels)",
                    v._gauge,
                )

    sched = mc.SchedulerMetricsCollector(
        labels={
            "model_name": "m",
            "engine_type": "unified",
            "tp_rank": 0,
            "pp_rank": 0,
            "moe_ep_rank": 0,
            "priority": "",
            "dp_rank": 0,
        },
        server_args=server_args,
        enable_lora=True,
        enable_hierarchical_cache=True,
        enable_streaming_session=True,
    )
    scan("SchedulerMetricsCollector", sched)
    tok = mc.TokenizerMetricsCollector(
        server_args=server_args,
        labels={"model_name": "m", "engine_type": "unified", "priority": ""},
    )
    scan("TokenizerMetricsCollector", tok)
    scan(
        "StorageMetricsCollector",
        mc.StorageMetricsCollector(
            labels={"storage_backend": "file", "tp_rank": 0, "dp_rank": 0, "pp_rank": 0}
        ),
    )
    scan(
        "RadixCacheMetricsCollector",
        mc.RadixCacheMetricsCollector(
            labels={"cache_type": "RadixCache", "tp_rank": 0, "pp_rank": 0, "dp_rank": 0}
        ),
    )
    scan("ExpertDispatchCollector", mc.ExpertDispatchCollector(ep_size=4))
    scan("EncoderMetricsCollector", mc.EncoderMetricsCollector(labels={"model_name": "m"}))

    hm = importlib.import_module("sglang.srt.observability.http_request_metrics")
    hm.init_http_request_metrics()
    scan("http_request_metrics._HttpRequestMetrics", hm._http_request_metrics)
    scan("http_request_metrics (RefCountedGauge)", hm._http_request_metrics.routing_keys_active)
    ft = importlib.import_module("sglang.srt.observability.func_timer")
    ft.enable_func_timer()
    owners[ft.FUNC_LATENCY._name] = ("func_timer.enable_func_timer", ft.FUNC_LATENCY)
    st = importlib.import_module("sglang.srt.observability.startup_func_log_and_timer")
    st.enable_startup_timer()
    owners[st.STARTUP_LATENCY_SECONDS._name] = (
        "startup_func_log_and_timer.enable_startup_timer",
        st.STARTUP_LATENCY_SECONDS,
    )

    out: list[dict[str, Any]] = []
    # Defined outside the constructible collectors (read from source, not constructed here):
    out.append(
        {
            "name": "sglang:process_cpu_seconds_total",
            "type": "counter",
            "labels": ["component"],
            "defined_in": "cpu_monitor.start_cpu_monitor_thread (tokenizer, detokenizer, "
            "data_parallel_controller, detokenizer_router; needs a thread + psutil)",
            "help": "Total CPU time consumed by this process (user + system)",
        }
    )
    out.append(
        {
            "name": "sglang:encoder_dp_pending_requests",
            "type": "gauge",
            "labels": ["<encoder labels>", "dp_rank"],
            "multiprocess_mode": "mostrecent",
            "defined_in": "disaggregation/encoder/runtime.py (EPD encoder server only)",
            "help": "Number of pending requests per encoder DP rank.",
        }
    )
    for name, (owner, m) in sorted(owners.items()):
        typ = m._type
        exposed = name + "_total" if typ == "counter" and not name.endswith("_total") else name
        rec = {
            "name": exposed,
            "type": typ,
            "labels": list(m._labelnames),
            "defined_in": owner,
            "help": m._documentation,
        }
        if typ == "histogram":
            rec["buckets"] = [b for b in m._upper_bounds if b != float("inf")]
        if typ == "gauge":
            rec["multiprocess_mode"] = m._multiprocess_mode
        out.append(rec)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
