"""The Grafana dashboard's panels: their PromQL queries, for one naming style and role label.

Each panel pairs the fleet aggregate with the cross-engine tail (see
:mod:`fleetscope.dashboards.grafana`, which assembles them into the dashboard).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope import catalog

RATE = "$__rate_interval"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    max: float | None = None


_SGLANG_RANK_0 = ",".join(f'{label}=~"|0"' for label in catalog.SGLANG_RANK_LABELS)


def native_metric(metric: str, engine: str) -> str:
    """``engine``'s own name (no prefix) of a vLLM metric name, with its series suffix, from the
    catalog: ``native_metric("num_requests_running", "sglang") == "num_running_reqs"``."""
    suffix = "_total" if metric.endswith("_total") else ""
    base = metric.removesuffix(suffix)
    name = catalog.native_name("vllm:" + base, engine)
    return name.split(":", 1)[1] + suffix


class Promql:
    """Builds the selectors and expressions, for one naming style and one role label."""

    def __init__(self, metric_prefix: str | None, role_label: str, job_var: str, role_var: str):
        self.prefix = metric_prefix
        self.role = role_label
        self.filters = f'job=~"${job_var}",{role_label}=~"${role_var}"'

    def name_matcher(self, name: str, engine: str = "vllm") -> str:
        """``vllm:x`` for an exact prefix, else a ``__name__`` regex matching ``:`` and ``_``."""
        if self.prefix is None:
            return f'__name__=~"{engine}[:_]{name}"'
        return ""

    def sel(self, name: str, extra: str = "", *, filters: bool = True, engine: str = "vllm") -> str:
        """A selector for ``vllm:{name}`` (``sglang:`` with ``engine="sglang"``) with the
        dashboard's filters and ``extra`` matchers. The family must be in the catalog: a name
        an engine does not expose is a build error, not an empty panel."""
        if catalog.family_of_series(f"{engine}:{name}") is None:
            raise ValueError(f"the dashboard queries {engine}:{name}, which the catalog lacks")
        scope = self.filters if filters else ""
        # SGLang with --enable-metrics-for-all-schedulers repeats each scheduler series per
        # rank: keep the lowest (rank 0), as fleetscope's parser does; "" matches rank-less ones
        ranks = _SGLANG_RANK_0 if engine == "sglang" else ""
        matchers = [m for m in (self.name_matcher(name, engine), scope, ranks, extra) if m]
        head = ""
        if self.prefix is not None:  # an exact prefix: SGLang's takes the same separator
            head = self.prefix if engine == "vllm" else "sglang" + self.prefix[-1]
            head += name
        return head + ("{" + ",".join(matchers) + "}" if matchers else "")

    def any_engine(self, names: dict[str, str], extra: str = "") -> str:
        """One selector matching ``{engine: name}`` over engines (``vllm:a`` or ``sglang:b``),
        unfiltered: the template variables' probe, so a job serving only SGLang is listed."""
        for engine, name in names.items():
            if catalog.family_of_series(f"{engine}:{name}") is None:
                raise ValueError(f"the dashboard queries {engine}:{name}, which the catalog lacks")
        sep = "[:_]" if self.prefix is None else self.prefix[-1]
        alternatives = "|".join(f"{engine}{sep}{name}" for engine, name in names.items())
        matchers = [f'__name__=~"{alternatives}"'] + ([extra] if extra else [])
        return "{" + ",".join(matchers) + "}"

    def rate(self, name: str, extra: str = "", engine: str = "vllm") -> str:
        return f"rate({self.sel(name, extra, engine=engine)}[{RATE}])"

    @property
    def engine(self) -> str:
        return f"{self.role}, instance, engine"

    # -- building blocks
    def gauge_mean_min_max(self, name: str) -> tuple[Query, ...]:
        s, r = self.sel(name), self.role
        return (
            Query(f"avg by ({r}) ({s})", f"mean {{{{{r}}}}}"),
            Query(f"min by ({r}) ({s})", f"min engine {{{{{r}}}}}"),
            Query(f"max by ({r}) ({s})", f"max engine {{{{{r}}}}}"),
        )

    def per_engine_rate(self, name: str, extra: str = "") -> str:
        return f"sum by ({self.engine}) ({self.rate(name, extra)})"

    def counter_sum_tail(
        self, name: str, tail: str, *, tail_extra: str = "", tail_legend: str = ""
    ) -> tuple[Query, ...]:
        r = self.role
        return (
            Query(f"sum by ({r}) ({self.rate(name)})", f"sum {{{{{r}}}}}"),
            Query(
                f"{tail} by ({r}) ({self.per_engine_rate(name, tail_extra)})",
                tail_legend or f"{tail} engine {{{{{r}}}}}",
            ),
        )

    def ratio(self, num: str, den: str, by: str) -> str:
        return f"sum by ({by}) ({num}) / sum by ({by}) ({den})"

    def latency(
        self,
        name: str,
        by: str = "",
        engine: str = "vllm",
        quantiles: tuple[float, ...] = QUANTILES,
    ) -> tuple[Query, ...]:
        """Quantiles (pooled bucket rates) and the mean, per role (and ``by``)."""
        r = f"{by}, {self.role}" if by else self.role
        legend = " ".join(f"{{{{{x.strip()}}}}}" for x in r.split(","))
        out = [
            Query(
                f"histogram_quantile({q}, sum by (le, {r}) "
                f"({self.rate(name + '_bucket', engine=engine)}))",
                f"p{round(q * 100)} {legend}",
            )
            for q in quantiles
        ]
        mean = self.ratio(
            self.rate(name + "_sum", engine=engine), self.rate(name + "_count", engine=engine), r
        )
        out.append(Query(mean, f"mean {legend}"))
        return tuple(out)


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
    from fleetscope.dashboards._grafana_rl import rl_row, sglang_row

    return [
        ("Fleet", fleet),
        ("Latency", latency),
        ("Requests", requests),
        ("Scrape health", health),
        ("RL loop", rl_row(p)),
        ("SGLang", sglang_row(p)),
    ]
