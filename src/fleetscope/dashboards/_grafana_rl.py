"""The Grafana dashboard's "RL loop" and "SGLang" rows (PromQL over the raw series).

RL loop: what vLLM's own series say about the RL loop: weight-update seconds per operation
(``vllm:rl_weight_update_operation_duration_seconds{operation}``: quantiles from pooled bucket
rates, and the mean), calls per second and in flight (``..._operations_in_flight``), engines
asleep time-weighted over the rate interval (``1 - avg_over_time(engine_sleep_state{
sleep_state="awake"})`` summed: asleep engine-seconds per second), and sleep-mode operation
seconds. No vLLM series says "paused" or carries a weight version, and the trainer's syncs are
fleetscope's: paused engine-seconds, version skew and sync wall time are fleetscope keys (the
W&B workspace's RL loop section, docs/rl-lifecycle.md), not PromQL.

SGLang: the same fleet view for ``sglang:`` series (SGLang 0.5.x names, docs/sglang.md):
running / queued requests, KV token usage, token rates, TTFT and end-to-end latency.
"""

from __future__ import annotations

from fleetscope import catalog
from fleetscope.dashboards._grafana_promql import RATE, PanelSpec, Promql, Query, native_metric

_RL = "rl_weight_update_operation_duration_seconds"
_SLEEP_OPS = "sleep_mode_operation_duration_seconds"


def rl_row(p: Promql) -> list[PanelSpec]:
    r = p.role
    awake = p.sel("engine_sleep_state", 'sleep_state="awake"')
    return [
        PanelSpec(
            "Weight-update seconds per operation",
            "vLLM's RL weight-update handlers (init, start, update, finish, ...): p50/p90 from "
            "pooled bucket rates, and the mean (sum / count), per operation.",
            "s",
            p.latency(_RL, by="operation", quantiles=(0.5, 0.9)),
        ),
        PanelSpec(
            "Weight-update calls / s, in flight",
            "Calls per second per operation (failed calls count too), and handlers awaiting "
            "the engine now.",
            "short",
            (
                Query(
                    f"sum by (operation, {r}) ({p.rate(_RL + '_count')})",
                    f"calls/s {{{{operation}}}} {{{{{r}}}}}",
                ),
                Query(
                    f"sum by (operation, {r}) ({p.sel('rl_weight_update_operations_in_flight')})",
                    f"in flight {{{{operation}}}} {{{{{r}}}}}",
                ),
            ),
        ),
        PanelSpec(
            "Engines asleep (time-weighted)",
            "Engines whose engine_sleep_state awake gauge is 0, averaged over the rate "
            "interval (asleep engine-seconds per second). vLLM has no series for /pause: "
            "paused engine-seconds, version skew and sync wall time are fleetscope's keys.",
            "short",
            (
                Query(
                    f"sum by ({r}) (1 - avg_over_time({awake}[{RATE}]))",
                    f"asleep {{{{{r}}}}}",
                ),
                Query(f"count by ({r}) ({awake})", f"engines {{{{{r}}}}}"),
            ),
        ),
        PanelSpec(
            "Sleep-mode operation seconds",
            "/sleep, /wake_up, /release_kv_cache_memory handlers: p90 and mean per operation.",
            "s",
            p.latency(_SLEEP_OPS, by="operation", quantiles=(0.9,)),
        ),
    ]


def sglang_row(p: Promql) -> list[PanelSpec]:
    # SGLang says its own role (engine_type: prefill / decode / unified): split by it as well
    # as by the target's role label, so P/D SGLang fleets need no scrape labels
    r = f"{p.role}, {catalog.SGLANG_ROLE_LABEL}"
    lg = f"{{{{{p.role}}}}} {{{{{catalog.SGLANG_ROLE_LABEL}}}}}"

    def sel(metric: str) -> str:  # SGLang's own name of a vLLM metric, from the catalog
        return p.sel(native_metric(metric, "sglang"), engine="sglang")

    def rate(metric: str) -> str:
        return p.rate(native_metric(metric, "sglang"), engine="sglang")

    def latency(metric: str) -> tuple[Query, ...]:
        return p.latency(
            native_metric(metric, "sglang"), by=catalog.SGLANG_ROLE_LABEL, engine="sglang"
        )

    running, queued = catalog.RUNNING, catalog.WAITING
    return [
        PanelSpec(
            "SGLang: running and queued requests",
            f"sglang:{native_metric(running, 'sglang')} and "
            f"{native_metric(queued, 'sglang')}, summed per "
            "role (rank 0 of each engine: other ranks repeat it).",
            "short",
            (
                Query(f"sum by ({r}) ({sel(running)})", f"running {lg}"),
                Query(f"sum by ({r}) ({sel(queued)})", f"queued {lg}"),
            ),
        ),
        PanelSpec(
            "SGLang: KV token usage",
            f"sglang:{native_metric(catalog.KV_USAGE, 'sglang')} (used share of the full-attention "
            "KV pool, vLLM's kv_cache_usage_perc): mean and the fullest engine.",
            "percentunit",
            (
                Query(f"avg by ({r}) ({sel(catalog.KV_USAGE)})", f"mean {lg}"),
                Query(f"max by ({r}) ({sel(catalog.KV_USAGE)})", f"max engine {lg}"),
            ),
            max=1.0,
        ),
        PanelSpec(
            "SGLang: tokens / s",
            "Generation and prompt tokens per second (counted as requests finish), fleet totals "
            "per role.",
            "short",
            (
                Query(f"sum by ({r}) ({rate(catalog.GENERATION_TOKENS)})", f"generation {lg}"),
                Query(f"sum by ({r}) ({rate(catalog.PROMPT_TOKENS)})", f"prompt {lg}"),
            ),
        ),
        PanelSpec(
            "SGLang: time to first token",
            "TTFT quantiles from pooled bucket rates, and the mean.",
            "s",
            latency(catalog.TTFT),
        ),
        PanelSpec(
            "SGLang: end-to-end request latency",
            "E2E latency quantiles and mean.",
            "s",
            latency(catalog.E2E),
        ),
    ]
