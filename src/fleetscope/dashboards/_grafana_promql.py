"""The Grafana dashboard's PromQL building blocks: panel and query specs, and the selectors
and expressions for one naming style and role label (:class:`Promql`), shared by the panel rows
(:mod:`fleetscope.dashboards._grafana_panels`, :mod:`fleetscope.dashboards._grafana_rl`).
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
