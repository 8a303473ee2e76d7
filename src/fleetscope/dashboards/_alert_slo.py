"""SLO objectives (``ttft:0.99<2.5s``) as multiwindow, multi-burn-rate alerts, computed from
the engines' bucket counters (the SRE workbook's recipe, "Alerting on SLOs").

An objective says: that share of requests has a latency at or below the threshold. Its error
ratio over a window is ``1 - Δbucket{le=threshold} / Δcount``, pooled over the engines of a role
(vLLM and SGLang alike: both count the same events in their buckets). The threshold must be one
of the engine version's default bucket bounds (``catalog.bucket_bounds``): a bucket counter is
exact only at its own bound, so another threshold is refused with the nearest bounds named.

Alerts page when the budget burns at 14.4 times its sustainable rate over 1 h (2 % of a 30-day
budget) and over the last 5 min, or at 6 times over 6 h (5 %) and the last 30 min: the long
window says it matters, the short one that it is still happening.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from fleetscope import catalog
from fleetscope.dashboards._alert_health import AlertDoc, Rule, alert_rule
from fleetscope.dashboards._alert_promql import RulePromql, Series, Target, le_regex

#: SLI name -> the vLLM family (the engines' own names from the catalog)
SLIS: dict[str, str] = {
    "ttft": "vllm:" + catalog.TTFT,
    "itl": "vllm:" + catalog.ITL,
    "tpot": "vllm:" + catalog.TPOT,
    "e2e": "vllm:" + catalog.E2E,
}
#: (burn rate, long window, short window), severity: the SRE workbook's two paging pairs
BURNS: tuple[tuple[float, str, str], ...] = ((14.4, "1h", "5m"), (6.0, "6h", "30m"))
RECORD = "fleetscope_slo:errors:ratio_rate{window}"
ALERT = "FleetscopeSloBudgetBurn"
DOC = AlertDoc(
    "slo",
    # the rule's own labels are not the sample's: burn rate and windows are filled in per rule
    "{{ $labels.slo }} ({{ $labels.job }} {{ $labels.role }}): error budget burning "
    "{burn}x over {long} and {short}",
    "The share of requests slower than the objective's threshold burns the error budget at "
    "the burn rate or faster, over the long window and still over the short one.",
    "Find the role and engines that are slow (the latency quantiles per role, the queue, KV "
    "and stall alerts of the same engines); shed load, add engines or roll back the change.",
)

_SLO_RE = re.compile(r"(?P<sli>[a-z0-9]+):(?P<obj>[0-9.]+)<(?P<thr>[0-9.]+)(?P<unit>ms|s)")


@dataclass(frozen=True)
class Slo:
    """``objective`` of requests have ``sli`` at or below ``threshold`` seconds."""

    sli: str
    objective: float
    threshold: float

    @property
    def name(self) -> str:
        return f"{self.sli}:{self.objective:g}<{self.threshold:g}s"


def parse_slo(text: str) -> Slo:
    """``ttft:0.99<2.5s`` (or ``500ms``) -> :class:`Slo`; ``ValueError`` in one line."""
    m = _SLO_RE.fullmatch(text.strip())
    usage = f"expected SLI:OBJECTIVE<THRESHOLD such as ttft:0.99<2.5s, not {text!r}"
    if m is None:
        raise ValueError(usage)
    if m["sli"] not in SLIS:
        raise ValueError(f"{m['sli']!r} is not an SLI: one of {', '.join(SLIS)} ({usage})")
    try:
        objective, threshold = float(m["obj"]), float(m["thr"])
    except ValueError:
        raise ValueError(usage) from None
    if not 0 < objective < 1:
        raise ValueError(f"the objective must be between 0 and 1, not {m['obj']} ({usage})")
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"the threshold must be positive, not {m['thr']}{m['unit']}")
    return Slo(m["sli"], objective, threshold / 1000 if m["unit"] == "ms" else threshold)


def family(slo: Slo, engine: str) -> str:
    """The family ``engine`` records the SLI in."""
    canonical = SLIS[slo.sli]
    if engine == "vllm":
        return canonical
    if slo.sli == "itl":  # not mapped: SGLang counts an observation per token (docs/sglang.md)
        return "sglang:" + catalog.ITL
    return catalog.native_name(canonical, engine)


def slo_problem(slo: Slo, target: Target) -> str | None:
    """Why the rules cannot judge ``slo`` for ``target`` (one line), or None."""
    if slo.sli == "itl" and len(target.engines) > 1:
        return (
            f"--slo {slo.name}: vLLM and SGLang count inter-token latency differently "
            "(docs/sglang.md), so it is not pooled: give --engines vllm or --engines sglang"
        )
    for engine in target.engines:
        name, version = family(slo, engine), target.versions[engine]
        bounds = catalog.bucket_bounds(name, version)
        if bounds is None:
            return (
                f"--slo {slo.name}: fleetscope does not know the buckets of {name} in "
                f"{engine} {version} (checked: {', '.join(catalog.CHECKED_VERSIONS[engine])})"
            )
        if not any(math.isclose(b, slo.threshold, rel_tol=1e-9) for b in bounds):
            return (
                f"--slo {slo.name}: {slo.threshold:g}s is not a bucket bound of {name} in "
                f"{engine} {version}; {_nearest(bounds, slo.threshold)}"
            )
    return None


def _nearest(bounds: tuple[float, ...], x: float) -> str:
    below = [b for b in bounds if b < x]
    above = [b for b in bounds if b > x]
    if not below:
        return f"the smallest is {above[0]:g}s"
    if not above:
        return f"the largest is {below[-1]:g}s"
    return f"the nearest are {below[-1]:g}s and {above[0]:g}s"


def slo_rules(target: Target, slos: tuple[Slo, ...]) -> list[Rule]:
    """Every objective's error ratios (one record per window) and its two burn alerts."""
    p = RulePromql(target)
    rules: list[Rule] = []
    for slo in slos:
        problem = slo_problem(slo, target)
        if problem is not None:
            raise ValueError(problem)
        windows = sorted({w for _, *pair in BURNS for w in pair}, key=_seconds)
        for window in windows:
            rules.append(
                {
                    "record": RECORD.format(window=window),
                    "expr": _error_ratio(p, target, slo, window),
                    "labels": {"slo": slo.name},
                }
            )
        for burn, long, short in BURNS:
            rules.append(_burn_alert(target, slo, burn, long, short))
    return rules


def _error_ratio(p: RulePromql, target: Target, slo: Slo, window: str) -> str:
    good, total = [], []
    for engine in target.engines:
        bucket = Series(target, family(slo, engine), "_bucket")
        count = Series(target, family(slo, engine), "_count")
        le = {"le": le_regex([slo.threshold])}
        good.append((bucket, f"rate({bucket.sel(match=le)}[{window}])"))
        total.append((count, f"rate({count.sel()}[{window}])"))
    return f"1 - (\n{p.per_role(good)}\n/\n{p.per_role(total)}\n)"


def _burn_alert(target: Target, slo: Slo, burn: float, long: str, short: str) -> Rule:
    r = target.role_label
    budget = f"({burn:g} * (1 - {slo.objective:g}))"
    sel = f'{{slo="{slo.name}"}}'
    expr = (
        f"{RECORD.format(window=long)}{sel} > {budget}\n"
        f"and on (job, {r})\n"
        f"{RECORD.format(window=short)}{sel} > {budget}"
    )
    labels = {"slo": slo.name, "long_window": long, "short_window": short, "burn_rate": f"{burn:g}"}
    summary = DOC.summary.replace("$labels.role", f"$labels.{r}")
    summary = summary.replace("{burn}", f"{burn:g}").replace("{long}", long)
    doc = dataclasses.replace(DOC, summary=summary.replace("{short}", short))
    return alert_rule(ALERT, expr, "0s", doc, severity="critical", labels=labels)


def _seconds(window: str) -> int:
    return int(window[:-1]) * {"m": 60, "h": 3600}[window[-1]]
