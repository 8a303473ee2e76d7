#!/usr/bin/env python3
"""Resolve extract.py output of two vLLM versions into tests/data/vllm-families/families.json.

    python scripts/vllm_families/extract.py <0.32 vllm pkg> 0.32.0 > /tmp/v032.json
    python scripts/vllm_families/extract.py <0.33 vllm pkg> 0.33.0 > /tmp/v033.json
    python scripts/vllm_families/build.py /tmp/v032.json /tmp/v033.json \
        <vllm pkg>/v1/metrics/buckets.py tests/data/fixtures/vllm-0.32.0-cpu \
        > tests/data/vllm-families/families.json

Label expressions are resolved with the rules in RULES (each one read off the vLLM source:
PrometheusStatLogger builds `labelnames = ["model_name", "engine"]` and hands it to the spec
decode, perf and KV-connector metric classes, which keep it as `labelnames` /
`self._labelnames`). Families seen in the real vLLM 0.32 bodies are checked against them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
import types
from typing import Any

BASE = ["model_name", "engine"]

# JSON records: one definition of extract.py's output, one family of families.json
Definition = dict[str, Any]
Family = dict[str, Any]
# a histogram's buckets: the bounds, a description, or None (not a histogram)
Buckets = list[float] | str | None

# exact source text of a labelnames expression -> label list
RULES = {
    "labelnames": BASE,
    "self._labelnames": BASE,
    "metric_labelnames": [*BASE, "operation", "status"],  # mooncake store: labelnames + [...]
    "pos_labelnames": [*BASE, "position"],  # spec decode: labelnames + ["position"]
    "labels": [*BASE, "operation"],  # umbp: labels = labelnames + ["operation"]
    "self._labelnames + INFO_LABELS": [
        *BASE,
        "backend",
        "page_cache",
        "lazy_offload",
        "capacity_blocks",
    ],
    "self._info_keys": [*BASE, "<OffloadingSpec.config_info_keys(extra_config)>"],
    "[self.labelname_max_lora, self.labelname_waiting_lora_adapters, "
    "self.labelname_running_lora_adapters]": [
        "max_lora",
        "waiting_lora_adapters",
        "running_lora_adapters",
    ],
}

DEPRECATED_BY = {
    "vllm:kv_offload_total_bytes_total": "vllm:kv_offload_load_bytes_total"
    " + vllm:kv_offload_store_bytes_total (transfer_type CPU_to_GPU / GPU_to_CPU)",
    "vllm:kv_offload_total_time_total": "vllm:kv_offload_load_time_total"
    " + vllm:kv_offload_store_time_total",
    "vllm:kv_offload_size": "vllm:kv_offload_load_size + vllm:kv_offload_store_size",
}


def labels_of(d: Definition) -> list[str]:
    t = d["labelnames"]
    if d["how"] == "metadata table":
        extra: list[str] = []
        if t:
            t2 = t.replace("TIER_LABEL", "'tier'")
            try:
                extra = list(ast.literal_eval(t2))
            except Exception:
                if t in RULES:
                    return RULES[t]
                extra = [f"<{t}>"]
        return BASE + extra  # OffloadingPromMetrics._create_metric: self._labelnames + metadata
    if d["how"] == "(name, help) tuple":
        return BASE  # spec decode / diffusion counters: labelnames=labelnames
    if t is None:
        return []
    if t in RULES:
        return RULES[t]
    m = re.fullmatch(r"(labelnames|self\._labelnames) \+ (\[.*\])", t)
    if m:
        return BASE + list(ast.literal_eval(m.group(2)))
    try:
        return list(ast.literal_eval(t))
    except Exception:
        return [f"<{t}>"]


def unit_of(name: str, typ: str) -> str:
    n = name.split(":", 1)[1]
    if n.endswith("_info"):
        return "info (value 1)"
    for suf, u in (
        ("_seconds", "seconds"),
        ("_perc", "ratio 0-1"),
        ("_bytes", "bytes"),
        ("_time", "seconds"),
        ("bytes_transferred", "bytes"),
        ("_size", "bytes"),
        ("tokens", "tokens"),
        ("_blocks", "blocks"),
    ):
        if n.removesuffix("_total").endswith(suf) or suf in n:
            return u
    if "requests" in n or "reqs" in n:
        return "requests"
    return ""


def load_buckets(path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_buckets", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def buckets_of(d: Definition, bmod: types.ModuleType) -> Buckets:
    b = d["buckets"]
    if d["type"] != "histogram":
        return None
    if isinstance(b, list):
        return b
    if b is None:
        return "prometheus_client default"
    m = re.fullmatch(r"(\w+)_buckets", b)
    if m and m.group(1) in (
        "request_latency",
        "time_to_first_token",
        "inter_token_latency",
        "iteration_tokens",
        "request_params_n",
        "request_num_preemptions",
        "kv_cache_residency",
    ):
        bounds: list[float] = bmod.histogram_buckets(m.group(1))
        return bounds
    if b == "_BYTES_BUCKETS":  # mooncake/stats.py: tuple(2 ** (10 + i) for i in range(1, 25, 2))
        return [float(2 ** (10 + i)) for i in range(1, 25, 2)]
    if b == "residency_buckets":  # hisparse: histogram_buckets("kv_cache_residency")
        residency: list[float] = bmod.histogram_buckets("kv_cache_residency")
        return residency
    if b == "buckets[1:]":
        return "nixl `buckets` list without its first bound (0.005 … )"
    if b == "request_tokens_buckets":
        return "1-2-5 series up to max_model_len (buckets.build_1_2_5_buckets)"
    if b == "deprecated_size_metadata.buckets":
        return "TRANSFER_SIZE_BUCKETS (same as kv_offload_load_size)"
    return f"<{b}>"


def build(ext: dict[str, Any], bmod: types.ModuleType) -> list[Family]:
    out: dict[str, Family] = {}
    for d in ext["definitions"]:
        if not re.fullmatch(r"vllm:[a-z0-9_]+", d["name"]):
            continue
        typ = "counter" if d["type"] == "?" else d["type"]
        name = d["name"]
        exposed = name + "_total" if typ == "counter" and not name.endswith("_total") else name
        rec = dict(
            name=exposed,
            type=typ,
            labels=labels_of(d),
            unit=unit_of(exposed, typ),
            buckets=buckets_of(dict(d, type=typ), bmod),
            defined_in=f"{d['file']}:{d['line']}",
            definition=d["how"],
            help=d["help"] if isinstance(d["help"], str) else str(d["help"]),
            deprecated_by=DEPRECATED_BY.get(exposed),
        )
        if typ == "gauge" and d.get("multiprocess_mode"):
            rec["multiprocess_mode"] = d["multiprocess_mode"].strip("'\"")
        rec["engine_label"] = "engine" in rec["labels"]
        prev = out.get(exposed)
        # the deprecated offload trio is listed in a metadata table *and* constructed with
        # transfer_type; the constructor is what is registered
        if prev is None or (prev["definition"] == "metadata table" and d["how"] == "constructor"):
            out[exposed] = rec
    # built from a local variable the extractor cannot follow (loggers.log_metrics_info)
    out["vllm:cache_config_info"] = dict(
        name="vllm:cache_config_info",
        type="gauge",
        labels=["<CacheConfig fields: metrics_info() keys>", "engine"],
        unit="info (value 1)",
        buckets=None,
        defined_in="vllm/v1/metrics/loggers.py (log_metrics_info)",
        definition="constructor (name from local variable)",
        multiprocess_mode="mostrecent",
        help="Information of the LLMEngine CacheConfig",
        deprecated_by=None,
        engine_label=True,
    )
    return [out[k] for k in sorted(out)]


def check_against_bodies(fams: list[Family], fixtures: str) -> tuple[list[str], list[str]]:
    """Label sets of the real 0.32 bodies vs the resolved ones."""
    from prometheus_client.parser import text_string_to_metric_families

    by = {f["name"]: f for f in fams}
    problems: list[str] = []
    seen: set[str] = set()
    for fn in sorted(os.listdir(fixtures)):
        if not fn.endswith(".prom"):
            continue
        with open(os.path.join(fixtures, fn)) as f:
            text = f.read()
        for fam in text_string_to_metric_families(text):
            if not fam.name.startswith("vllm:") or fam.name.endswith("_created"):
                continue
            name = fam.name + "_total" if fam.type == "counter" else fam.name
            seen.add(name)
            rec = by.get(name)
            if rec is None:
                problems.append(f"{name}: in {fn}, not extracted")
                continue
            for s in fam.samples:
                got = set(s.labels) - {"le", "quantile"}
                want = {x for x in rec["labels"] if not x.startswith("<")}
                if not want <= got or (
                    not any(x.startswith("<") for x in rec["labels"]) and got != want
                ):
                    problems.append(f"{name}: body labels {sorted(got)} vs source {rec['labels']}")
                    break
    return sorted(seen), problems


def _bk(b: Buckets) -> str:
    if b is None:
        return ""
    if isinstance(b, str):
        return b
    if len(b) <= 6:
        return ", ".join(f"{x:g}" for x in b)
    return f"{len(b)}: {b[0]:g}, {b[1]:g} … {b[-1]:g}"


def _labels(ls: list[str]) -> str:
    if ls[:2] == BASE:
        rest = ls[2:]
        return "B" + (" + " + ", ".join(rest) if rest else "")
    return ", ".join(ls) if ls else "(none)"


def table(fams: list[Family], only: set[str] | None = None) -> str:
    rows = ["| family | type | labels | unit | buckets | defined in |", "|---|---|---|---|---|---|"]
    for f in fams:
        if only is not None and f["name"] not in only:
            continue
        dep = " **deprecated**" if f.get("deprecated_by") else ""
        rows.append(
            f"| `{f['name']}`{dep} | {f['type']} | {_labels(f['labels'])} | {f['unit']} | "
            f"{_bk(f['buckets'])} | `{f['defined_in'].split(':')[0].removeprefix('vllm/')}` |"
        )
    return "\n".join(rows)


def main() -> None:
    e32, e33, bpath, fixtures = sys.argv[1:5]
    readme_tables = sys.argv[5] if len(sys.argv) > 5 else None
    bmod = load_buckets(bpath)
    res: dict[str, list[Family]] = {}
    for path in (e32, e33):
        with open(path) as f:
            ext = json.load(f)
        res[ext["version"]] = build(ext, bmod)
    seen, problems = check_against_bodies(res["0.32.0"], fixtures)
    print(
        f"checked {len(seen)} families of the real 0.32 bodies; problems: {problems}",
        file=sys.stderr,
    )
    json.dump(res, sys.stdout, indent=1)
    sys.stdout.write("\n")
    if readme_tables:
        new = {f["name"] for f in res["0.33.0"]} - {f["name"] for f in res["0.32.0"]}
        with open(readme_tables, "w") as fh:
            fh.write("<!-- NEW33 -->\n" + table(res["0.33.0"], new) + "\n")
            fh.write("<!-- T33 -->\n" + table(res["0.33.0"]) + "\n")
            fh.write("<!-- T32 -->\n" + table(res["0.32.0"]) + "\n")


if __name__ == "__main__":
    main()
