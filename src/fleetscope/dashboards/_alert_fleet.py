"""The fleet group of the rules: recording rules for the figures dashboards and SLOs read, per
``job`` and role, over vLLM and SGLang series alike (``fleetscope_role:*``).

* Latency quantiles (p50, p90, p99) of TTFT and end-to-end latency from summed bucket rates, as
  fleetscope pools them: a fleet of both engines on the bounds they share (their default
  layouts differ; a bucket of one layout only would bend the other's cumulative counts), one
  engine kind on all its bounds. Inter-token latency is never pooled across engine kinds
  (SGLang counts one observation per token, vLLM one per step: docs/sglang.md): vLLM's is
  ``inter_token_latency_seconds``, SGLang's ``sglang_inter_token_latency_seconds``.
* The prefix-cache hit rate pooled as :data:`fleetscope.catalog.RATIOS` pools it: (vLLM hits +
  SGLang cached prompt tokens) / (vLLM queries + SGLang prompt tokens).
* Prompt and generation tokens per second.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetscope import catalog
from fleetscope.dashboards._alert_health import Rule
from fleetscope.dashboards._alert_promql import (
    RuleError,
    RulePromql,
    Series,
    Target,
    duration,
    le_regex,
    native,
)
from fleetscope.dashboards._grafana_promql import QUANTILES

R = "fleetscope_role"


def shared_bounds(target: Target, families: dict[str, str]) -> tuple[float, ...] | None:
    """The finite bounds every targeted engine's family has (None: one engine, all its bounds)."""
    if len(families) < 2:
        return None
    common: set[float] | None = None
    for engine, fam in families.items():
        bounds = catalog.bucket_bounds(fam, target.versions[engine])
        if bounds is None:
            raise RuleError(
                f"fleetscope does not know the buckets of {fam} in {engine} "
                f"{target.versions[engine]}: a fleet of both engines pools on shared bounds"
            )
        common = set(bounds) if common is None else common & set(bounds)
    return tuple(sorted(common or ()))


def fleet_rules(target: Target, rate_window: float) -> list[Rule]:
    p = RulePromql(target)
    window = duration(rate_window)
    w = window
    rules: list[Rule] = []
    for metric in (catalog.TTFT, catalog.E2E):
        families = {e: native(target, e, "vllm:" + metric).family for e in target.engines}
        rules += _quantiles(p, target, metric, families, w)
    for engine in target.engines:
        name = catalog.ITL if engine == "vllm" else f"sglang_{catalog.ITL}"
        rules += _quantiles(p, target, name, {engine: f"{engine}:{catalog.ITL}"}, w)
    hits, queries = [], []
    for engine in target.engines:
        if engine == "vllm":
            num = Series(target, "vllm:prefix_cache_hits", "_total")
            den = Series(target, "vllm:prefix_cache_queries", "_total")
        else:
            num = Series(target, "sglang:cached_tokens", "_total")
            den = native(target, engine, "vllm:prompt_tokens", "_total")
        hits.append((num, f"rate({num.sel()}[{w}])"))
        queries.append((den, f"rate({den.sel()}[{w}])"))
    rules.append(
        {
            "record": f"{R}:prefix_cache_hit_rate:ratio_rate{window}",
            "expr": f"{p.per_role(hits)}\n/\n{p.per_role(queries)}",
        }
    )
    for canonical in ("vllm:generation_tokens", "vllm:prompt_tokens"):
        parts = []
        for engine in target.engines:
            s = native(target, engine, canonical, "_total")
            parts.append((s, f"rate({s.sel()}[{w}])"))
        name = canonical.split(":", 1)[1]
        rules.append({"record": f"{R}:{name}:rate{window}", "expr": p.per_role(parts)})
    return rules


def _quantiles(
    p: RulePromql, target: Target, name: str, families: dict[str, str], window: str
) -> Sequence[Rule]:
    """``name``'s p50/p90/p99 per role from the buckets of ``families`` (engine -> family)."""
    shared = shared_bounds(target, families)
    match = {"le": le_regex(shared, inf=True)} if shared is not None else None
    parts = []
    for fam in families.values():
        s = Series(target, fam, "_bucket")
        parts.append((s, f"rate({s.sel(match=match)}[{window}])"))
    buckets = p.per_role(parts, by=("le",))
    return [
        {
            "record": f"{R}:{name}:p{round(q * 100)}_rate{window}",
            "expr": f"histogram_quantile({q:g},\n{buckets}\n)",
        }
        for q in QUANTILES
    ]
