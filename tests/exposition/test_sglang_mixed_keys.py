"""Every mapped key of a mixed vLLM + SGLang fleet, against values read from the bodies' text.

A real vLLM 0.32 DP=2 server, an SGLang 0.5.23 single server and an SGLang DP=2 server (bodies
made by SGLang's own metrics code, tests/data/sglang-0.5.23/), scraped twice 30 s apart. For
every SGLang family the catalog maps onto a vLLM metric, the fleet scope's keys must equal what
the text says, computed here without the parser: counters' increases and rates, gauges' sums,
minima and maxima over engines, histograms' counts, pooled means and p50/p90/p99 by PromQL's
rules on the bounds every engine shares (docs/rules.md §3.5), and ``pooled_bounds``.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from test_sglang import observe_polls

from fleetscope import catalog
from fleetscope.stats.plans import metric_name
from support.paths import DATA, VLLM_DIR
from support.promql import promql_bucket_quantile

SG = DATA / "sglang-0.5.23"
SECONDS = 30.0
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")

# (name, before, after): vLLM's engines are ``engine``; SGLang's are ``dp_rank`` (absent: the
# server's only engine, or its tokenizer's series with DP > 1)
BODIES = {
    "v": ((VLLM_DIR / "dp2_idle.prom").read_text(), (VLLM_DIR / "dp2_load.prom").read_text()),
    "s": ((SG / "single_idle.prom").read_text(), (SG / "single_after.prom").read_text()),
    "d": ((SG / "dp2_idle.prom").read_text(), (SG / "dp2_after.prom").read_text()),
}


def samples(text: str, family: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of one family's samples (rank repeats left out)."""
    out = []
    for line in text.split("\n"):
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith(family):
            continue
        name, labels = m.group(1), dict(_LABEL.findall(m.group(2) or ""))
        if name[len(family) :] not in ("", "_total", "_bucket", "_sum", "_count"):
            continue
        if any(labels.get(r, "0") != "0" for r in RANKS):
            continue
        out.append((name, labels, float(m.group(3))))
    return out


def engine_of(body: str, labels: dict[str, str]) -> str:
    return body + "." + labels.get("engine", labels.get("dp_rank", "-"))


def families_of(canonical: str) -> dict[str, str]:
    """body -> the family name it exposes for ``canonical``."""
    sglang = catalog.native_name(canonical, "sglang")
    return {"v": canonical, "s": sglang, "d": sglang}


def increases(canonical: str, suffix: str) -> dict[str, float]:
    """engine -> the increase of ``family{suffix}`` summed over its other labels."""
    out: dict[str, float] = defaultdict(float)
    for body, family in families_of(canonical).items():
        before, after = BODIES[body]
        for sign, text in ((-1.0, before), (1.0, after)):
            for name, labels, v in samples(text, family):
                if name == family + suffix:
                    out[engine_of(body, labels)] += sign * v
    return dict(out)


def bucket_increases(canonical: str) -> dict[str, dict[float, float]]:
    out: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for body, family in families_of(canonical).items():
        before, after = BODIES[body]
        for sign, text in ((-1.0, before), (1.0, after)):
            for name, labels, v in samples(text, family):
                if name == family + "_bucket":
                    out[engine_of(body, labels)][float(labels["le"])] += sign * v
    return out


def mapped(kind: str) -> list[str]:
    """Canonical vLLM names of the SGLang families the catalog maps, of one type."""
    return sorted(
        {
            f.canonical
            for f in catalog.FAMILIES
            if f.engine == "sglang"
            and f.canonical
            and f.canonical.startswith("vllm:")
            and not (f.rename or f.fallback)
            and f.type == kind
        }
    )


@pytest.fixture(scope="module")
def agg() -> dict[str, dict[str, float]]:
    polls = [(t, {n: pair[i] for n, pair in BODIES.items()}) for i, t in enumerate((0, SECONDS))]
    return observe_polls(polls).stats.scopes["agg"].metrics


def test_the_catalog_maps_what_the_issue_lists() -> None:
    names = set(mapped("counter")) | set(mapped("gauge")) | set(mapped("histogram"))
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:request_queue_time_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    } <= names


@pytest.mark.parametrize("canonical", mapped("counter"))
def test_mapped_counters(agg: dict[str, dict[str, float]], canonical: str) -> None:
    got = agg.get(metric_name(canonical) + "_total")
    inc = increases(canonical, "_total")
    if not inc:  # served by neither engine in these bodies (created on first use)
        assert got is None
        return
    total = sum(inc.values())
    assert got is not None
    assert got["delta"] == pytest.approx(total, rel=1e-12, abs=1e-9)
    rate = agg[metric_name(canonical) + "_total:rate"]
    assert rate["sum"] == pytest.approx(total / SECONDS, rel=1e-9)


@pytest.mark.parametrize("canonical", mapped("gauge"))
def test_mapped_gauges(agg: dict[str, dict[str, float]], canonical: str) -> None:
    values: dict[str, float] = defaultdict(float)
    for body, family in families_of(canonical).items():
        for _, labels, v in samples(BODIES[body][1], family):
            values[engine_of(body, labels)] += v
    got = agg.get(metric_name(canonical))
    if not values:
        assert got is None
        return
    assert got is not None
    assert got["sum"] == pytest.approx(sum(values.values()), rel=1e-12, abs=1e-12)
    assert got["max"] == pytest.approx(max(values.values()), rel=1e-12)
    assert got["min"] == pytest.approx(min(values.values()), rel=1e-12)
    assert len([b for b in BODIES if any(e.startswith(b + ".") for e in values)]) >= 2


@pytest.mark.parametrize("canonical", mapped("histogram"))
def test_mapped_histograms(agg: dict[str, dict[str, float]], canonical: str) -> None:
    buckets = {e: b for e, b in bucket_increases(canonical).items() if b}
    got = agg.get(metric_name(canonical))
    assert buckets and got is not None, canonical
    counts, sums = increases(canonical, "_count"), increases(canonical, "_sum")
    n = sum(counts.values())
    assert got["delta"] == n
    mean = agg[metric_name(canonical) + ":mean"]["pooled"]
    assert mean == pytest.approx(sum(sums.values()) / n, rel=1e-12)
    shared = sorted(set.intersection(*(set(b) for b in buckets.values())))
    assert got["pooled_bounds"] == len([b for b in shared if b != float("inf")])
    pooled = [(le, sum(b[le] for b in buckets.values())) for le in shared]
    for q in (0.5, 0.9, 0.99):
        want = promql_bucket_quantile(q, pooled)
        assert got[f"p{round(q * 100)}"] == pytest.approx(want, rel=1e-12), (canonical, q)
    kinds = {e.split(".")[0] for e in buckets}
    assert "v" in kinds and kinds & {"s", "d"}, kinds  # both engines pooled


def _with_spec_decode(text: str, drafts: float, accepted: float) -> str:
    """A vLLM body with speculative-decoding counters for its engine 0 (vLLM's names)."""
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
    ]
    label = '{engine="0",model_name="tinymodel"}'
    lines += [f"vllm:spec_decode_num_drafts_total{label} {drafts}"]
    lines += [f"vllm:spec_decode_num_accepted_tokens_total{label} {accepted}"]
    return text + "\n".join(lines) + "\n"


def test_mean_acceptance_length_pools_vllm_and_sglang_counters() -> None:
    """Tokens per verification step, the bonus token included: vLLM's 1 + accepted / drafts,
    SGLang's completion tokens / verify steps (its own per-request ``spec_accept_length``),
    pooled over both from exact counter increases; the gauges are never read."""
    v_before, v_after = BODIES["v"]
    v_before = _with_spec_decode(v_before, 10.0, 5.0)
    v_after = _with_spec_decode(v_after, 110.0, 185.0)
    s_before, s_after = BODIES["s"]
    polls = [(0.0, {"v": v_before, "s": s_before}), (SECONDS, {"v": v_after, "s": s_after})]
    result = observe_polls(polls)
    verify = increases("vllm:generation_tokens", "_total")  # SGLang's generation tokens ...
    gen_s = verify["s.-"]
    calls = [v for _, labels, v in samples(s_after, "sglang:spec_verify_calls") if labels]
    (verify_s,) = calls  # ... over its verify steps (absent before: from 0)
    drafts, accepted = 100.0, 180.0
    agg = result.stats.scopes["agg"].metrics["spec_decode_mean_acceptance_length"]
    assert agg["pooled"] == pytest.approx((drafts + accepted + gen_s) / (drafts + verify_s))
    per_engine = {
        e: result.stats.engine(e).get("spec_decode_mean_acceptance_length")
        for e in result.stats.engine_ids
    }
    assert per_engine["v.0"] == pytest.approx(1 + accepted / drafts)
    assert per_engine["s.0"] == pytest.approx(gen_s / verify_s)
    assert per_engine.get("v.1") is None  # no speculative decoding there
