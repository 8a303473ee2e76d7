"""The Grafana dashboard's panels: their PromQL queries, for one naming style and role label.

Each panel pairs the fleet aggregate with the cross-engine tail (see
:mod:`fleetscope.dashboards.grafana`, which assembles them into the dashboard). The building
blocks are in :mod:`fleetscope.dashboards._grafana_promql`, the "RL loop" and "SGLang" rows in
:mod:`fleetscope.dashboards._grafana_rl`.
"""

from __future__ import annotations

from fleetscope import catalog
from fleetscope.dashboards._grafana_promql import PanelSpec, Promql, Query
from fleetscope.dashboards._grafana_rl import rl_row, sglang_row


def panel_rows(p: Promql) -> list[tuple[str, list[PanelSpec]]]:
    r = p.role
    hit_rate_pooled = p.ratio(
        p.rate("prefix_cache_hits_total"), p.rate("prefix_cache_queries_total"), r
    )
    hit_rate_engine = p.ratio(
        p.rate("prefix_cache_hits_total"), p.rate("prefix_cache_queries_total"), p.engine
    )
    success = catalog.REQUEST_SUCCESS
    up_sel = "{" + p.filters + "}"
    fleet = [
        PanelSpec(
            "KV cache usage",
            "Fraction of KV cache blocks in use: fleet mean, and the least and most loaded engine.",
            "percentunit",
            p.gauge_mean_min_max(catalog.KV_USAGE),
            max=1.0,
        ),
        PanelSpec(
            "Preemptions / s",
            "Fleet total, and the engine preempting most (one engine out of KV shows here).",
            "ops",
            p.counter_sum_tail(catalog.PREEMPTIONS, "max"),
        ),
        PanelSpec(
            "Running requests",
            "Requests in model execution batches: mean per engine, min and max engine.",
            "short",
            p.gauge_mean_min_max(catalog.RUNNING),
        ),
        PanelSpec(
            "Waiting requests",
            "Requests waiting to be scheduled: mean per engine, min and max engine.",
            "short",
            p.gauge_mean_min_max(catalog.WAITING),
        ),
        PanelSpec(
            "Prefix cache hit rate",
            "Pooled over the fleet (hits / queries, not a mean of ratios), and the worst engine.",
            "percentunit",
            (
                Query(hit_rate_pooled, f"pooled {{{{{r}}}}}"),
                Query(f"min by ({r}) ({hit_rate_engine})", f"min engine {{{{{r}}}}}"),
            ),
            max=1.0,
        ),
        PanelSpec(
            "Generation tokens / s",
            "Fleet total, and the slowest generating engine. Prefill engines are left out of "
            "the minimum (they generate ~1 token per request and would pin it at 0, hiding a "
            "stalled decode engine).",
            "short",
            p.counter_sum_tail(
                catalog.GENERATION_TOKENS,
                "min",
                tail_extra=f'{r}!="prefill"',
                tail_legend=f"min engine {{{{{r}}}}} (no prefill)",
            ),
        ),
        PanelSpec(
            "Prompt tokens / s",
            "Fleet total, and the engine processing most prompt tokens.",
            "short",
            p.counter_sum_tail(catalog.PROMPT_TOKENS, "max"),
        ),
    ]
    latency = [
        PanelSpec(
            "Time to first token",
            "TTFT quantiles from pooled bucket rates, and the mean (sum / count).",
            "s",
            p.latency(catalog.TTFT),
        ),
        PanelSpec(
            "Time per output token (per request)",
            "TPOT per request: quantiles and mean.",
            "s",
            p.latency(catalog.TPOT),
        ),
        PanelSpec(
            "Inter-token latency",
            "ITL quantiles and mean.",
            "s",
            p.latency(catalog.ITL),
        ),
        PanelSpec(
            "End-to-end request latency",
            "E2E latency quantiles and mean.",
            "s",
            p.latency(catalog.E2E),
        ),
    ]
    requests = [
        PanelSpec(
            "Truncation share",
            'Share of finished requests that stopped at max tokens (finished_reason="length").',
            "percentunit",
            (
                Query(
                    p.ratio(p.rate(success, 'finished_reason="length"'), p.rate(success), r),
                    f"length / all {{{{{r}}}}}",
                ),
            ),
            max=1.0,
        ),
        PanelSpec(
            "Finished requests / s",
            "By finish reason.",
            "reqps",
            (
                Query(
                    f"sum by (finished_reason, {r}) ({p.rate(success)})",
                    f"{{{{finished_reason}}}} {{{{{r}}}}}",
                ),
            ),
        ),
    ]
    health = [
        PanelSpec(
            "Scrape targets up",
            "Targets whose last scrape succeeded, and all targets.",
            "short",
            (
                Query(f"sum by (job, {r}) (up{up_sel})", f"up {{{{job}}}} {{{{{r}}}}}"),
                Query(f"count by (job, {r}) (up{up_sel})", f"targets {{{{job}}}} {{{{{r}}}}}"),
            ),
        ),
        PanelSpec(
            "Engines reporting",
            "Engines that exposed KV cache usage in the last scrape.",
            "short",
            (
                Query(
                    f"count by ({r}) ({p.sel(catalog.KV_USAGE)})",
                    f"engines {{{{{r}}}}}",
                ),
            ),
        ),
        PanelSpec(
            "Scrape duration",
            "Slowest scrape per job and role.",
            "s",
            (
                Query(
                    f"max by (job, {r}) (scrape_duration_seconds{up_sel})",
                    f"max {{{{job}}}} {{{{{r}}}}}",
                ),
            ),
        ),
    ]
    return [
        ("Fleet", fleet),
        ("Latency", latency),
        ("Requests", requests),
        ("Scrape health", health),
        ("RL loop", rl_row(p)),
        ("SGLang", sglang_row(p)),
    ]
