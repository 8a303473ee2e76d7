"""The health group of the alert rules: fleetscope's :class:`~fleetscope.health.HealthMonitor`
conditions as Prometheus alerting rules, per engine, for vLLM and SGLang series alike.

The group first records every engine's figures in one shape (``fleetscope_engine:*``, labels
``job, instance, engine`` and the role label; :mod:`fleetscope.dashboards._alert_promql`), then
alerts on them, evaluated every scrape interval so that every scrape is judged, as every poll is
by fleetscope. "Since the previous poll" is ``irate`` / ``idelta`` (the last two samples).

A fleetscope streak counts the interval that ends at the first poll where its condition holds;
Prometheus' ``for:`` counts from that evaluation on, so ``for:`` is the threshold less one scrape
interval (and at least ``polls - 1`` intervals where the condition also needs polls in a row).
What Prometheus cannot judge as fleetscope does is in :data:`DIFFERENCES` and docs/alerts.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetscope import catalog
from fleetscope.dashboards._alert_promql import (
    RulePromql,
    Series,
    Target,
    duration,
    native,
    union,
)
from fleetscope.health import HealthThresholds

Rule = dict[str, Any]

#: how long a target must have served engine series to be alerted on when it is down
TARGET_SEEN = "1h"

E = "fleetscope_engine"
RUNNING = f"{E}:num_requests_running"
WAITING = f"{E}:num_requests_waiting"
WAITING_DELTA = f"{E}:num_requests_waiting:idelta"
KV_USAGE = f"{E}:kv_cache_usage_perc"
DECODE = f"{E}:decode_tokens:irate"
DECODE_ACTIVE = f"{E}:decode_tokens_active:irate"
PREEMPTIONS = f"{E}:num_preemptions:idelta"
ROLE_MEDIAN = "fleetscope_role:decode_tokens_active:median_irate"


@dataclass(frozen=True)
class AlertDoc:
    """What an alert means and what to do: its annotations and its docs/alerts.md entry."""

    condition: str  # the HealthMonitor condition (or "slo")
    summary: str
    meaning: str
    runbook: str


ALERTS: dict[str, AlertDoc] = {
    "FleetscopeGenerationStalled": AlertDoc(
        "generation_stalled",
        "{{ $labels.instance }} engine {{ $labels.engine }}: {{ $value }} requests running, "
        "no token generated",
        "Requests are running on the engine and it generated no token for the stall time "
        "(prefill engines are not judged: they generate one token per request by design).",
        "Read the engine's log and its GPU (a hung collective, an NCCL timeout, an OOM loop); "
        "if it does not recover, drain it and restart it.",
    ),
    "FleetscopeKvCacheNearFull": AlertDoc(
        "kv_cache_near_full",
        "{{ $labels.instance }} engine {{ $labels.engine }}: KV cache "
        "{{ $value | humanizePercentage }} full",
        "The engine's KV cache usage stayed at or above the threshold for the KV time "
        "(one reading near 100 % is routine: vLLM packs the cache, then preempts).",
        "Look at its running batch and preemptions; lower max_num_seqs or the context length, "
        "route fewer long requests to it, or add KV memory or engines.",
    ),
    "FleetscopeQueueGrowing": AlertDoc(
        "queue_growing",
        "{{ $labels.instance }} engine {{ $labels.engine }}: waiting queue growing, "
        "{{ $value }} waiting",
        "The engine's waiting queue grew at every scrape for the queue time and is longer than "
        "its running batch: requests arrive faster than it serves them.",
        "Compare its arrivals with its peers' (a router imbalance) and its token rate (a slow "
        "engine); rebalance the router or add engines.",
    ),
    "FleetscopePreemptionBurst": AlertDoc(
        "preemption_burst",
        "{{ $labels.instance }} engine {{ $labels.engine }}: {{ $value }} preemptions "
        "in one scrape interval",
        "At least the burst threshold of running requests were preempted (SGLang: retracted) "
        "between two scrapes: the KV cache ran out.",
        "Check the engine's KV usage and request lengths; lower its concurrency (max_num_seqs) "
        "or give it more KV memory.",
    ),
    "FleetscopeEngineOutlier": AlertDoc(
        "engine_outlier",
        "{{ $labels.instance }} engine {{ $labels.engine }}: {{ $value | humanize }} tokens/s, "
        "far below its role's median",
        "The engine, with work to do, decoded below the outlier fraction of its role's median "
        "token rate at every scrape for the outlier time (roles of 3 or more busy engines, "
        "not prefill).",
        "Compare its GPU (clocks, thermals, ECC errors), batch and placement with its peers'; "
        "drain and restart it if it stays slow.",
    ),
    "FleetscopeTargetDown": AlertDoc(
        "scrape_failed",
        "{{ $labels.instance }} ({{ $labels.job }}): the last scrape failed",
        "Prometheus could not scrape an engine server that served engine series in the last "
        f"{TARGET_SEEN}.",
        "Check the server process and its /metrics route (crashed, restarting, unreachable); "
        "restart it, or remove it from the scrape configuration if it is gone for good.",
    ),
    "FleetscopeEngineAsleep": AlertDoc(
        "engine_paused",
        "{{ $labels.instance }} engine {{ $labels.engine }}: asleep",
        "vLLM's engine_sleep_state says the engine is not awake, for the paused time "
        "(vLLM only: SGLang exposes no sleep state).",
        "If no weight sync is in progress, wake the engine (POST /wake_up) and find out why "
        "the trainer left it asleep.",
    ),
}

#: where Prometheus' judgement must differ from fleetscope's (docs/alerts.md says the same)
DIFFERENCES: dict[str, str] = {
    "FleetscopeQueueGrowing": "the queue must exceed the running batch for the whole for: "
    "time (fleetscope: at the poll that fires)",
    "FleetscopePreemptionBurst": "preemptions between two scrapes (fleetscope: two polls): "
    "scale --preemption-burst with the scrape interval",
    "FleetscopeEngineOutlier": "a role is the engines of one job with the same role label",
    "FleetscopeTargetDown": f"only targets that served engine series in the last {TARGET_SEEN}",
    "FleetscopeEngineAsleep": "asleep only: no series says paused (/pause), and Prometheus "
    "does not know the trainer's weight syncs (fleetscope does not count time inside one)",
}


class HealthRules:
    """The health group's rules for one target, thresholds and scrape interval."""

    def __init__(self, target: Target, thresholds: HealthThresholds, scrape_interval: float):
        self.t = target
        self.p = RulePromql(target)
        self.th = thresholds
        self.scrape = scrape_interval
        self.window = duration(4 * scrape_interval)  # holds the last two samples, and a miss
        r = target.role_label
        self.not_prefill = f'{r}!="prefill"'
        self.on = f"on ({self.p.engine_labels})"

    def hold(self, seconds: float, polls: int = 1) -> str:
        """``for:``: the threshold less the scrape interval that ends at the first evaluation
        that sees the condition, and at least ``polls - 1`` intervals."""
        return duration(max(seconds - self.scrape, (polls - 1) * self.scrape, 0.0))

    # -- per-engine records
    def _each(self, canonical: str, suffix: str = "", *, fn: str = "") -> str:
        parts = []
        for engine in self.t.engines:
            s = native(self.t, engine, canonical, suffix)
            vector = f"{fn}({s.sel()}[{self.window}])" if fn else s.sel()
            parts.append(self.p.per_engine(s, vector))
        return union(parts)

    def _kv_usage(self) -> str:
        parts = []
        for engine in self.t.engines:
            s = native(self.t, engine, "vllm:" + catalog.KV_USAGE)
            part = self.p.per_engine(s, s.sel())
            if engine == "sglang":  # the rounded max-of-pools gauge, where full_token_usage is not
                old = Series(self.t, "sglang:token_usage")
                part = f"{part}\nor\n{self.p.per_engine(old, old.sel())}"
            parts.append(part)
        return union(parts)

    def _decode_rate(self) -> str:
        """Tokens decoded since the previous scrape, per second (catalog.DECODE_RATES: SGLang's
        scheduler counts ``realtime_tokens_total{mode="decode"}`` per engine as it decodes)."""
        parts = []
        for engine in self.t.engines:
            if engine == "vllm":
                s = Series(self.t, "vllm:generation_tokens", "_total")
                vector = f"irate({s.sel()}[{self.window}])"
            else:
                s = Series(self.t, "sglang:realtime_tokens", "_total")
                vector = f"irate({s.sel(eq={'mode': 'decode'})}[{self.window}])"
            parts.append(self.p.per_engine(s, vector))
        return union(parts)

    def records(self) -> list[Rule]:
        th, on = self.th, self.on
        decode = f"{DECODE_ACTIVE}{{{self.not_prefill}}}"
        return [
            {"record": RUNNING, "expr": self._each("vllm:num_requests_running")},
            {"record": WAITING, "expr": self._each("vllm:num_requests_waiting")},
            {
                "record": WAITING_DELTA,
                "expr": self._each("vllm:num_requests_waiting", fn="idelta"),
            },
            {"record": KV_USAGE, "expr": self._kv_usage()},
            {"record": DECODE, "expr": self._decode_rate()},
            {
                "record": PREEMPTIONS,
                "expr": self._each(catalog.PREEMPTIONS_FAMILY, "_total", fn="idelta"),
            },
            {  # engines with work to do: an idle engine is not an outlier
                "record": DECODE_ACTIVE,
                "expr": f"{DECODE}\nand {on}\n({RUNNING} > 0 or {WAITING} > 0)",
            },
            {  # the roles judged: 3 or more busy engines, a median above idle
                "record": ROLE_MEDIAN,
                "expr": f"quantile by (job, {self.t.role_label}) (0.5, {decode})\n"
                f">= {th.outlier_min_median:g}\n"
                f"and on (job, {self.t.role_label})\n"
                f"count by (job, {self.t.role_label}) ({decode}) >= 3",
            },
        ]

    # -- alerts
    def alerts(self) -> list[Rule]:
        th, on, r = self.th, self.on, self.t.role_label
        out = [
            self._alert(
                "FleetscopeGenerationStalled",
                f"{RUNNING}{{{self.not_prefill}}} > 0\nand {on}\n{DECODE} == 0",
                self.hold(th.stall_seconds),
            ),
            self._alert(
                "FleetscopeKvCacheNearFull",
                f"{KV_USAGE} >= {th.kv_full:g}",
                self.hold(th.kv_seconds, th.kv_polls),
            ),
            self._alert(
                "FleetscopeQueueGrowing",
                f"({WAITING} > {on} {RUNNING})\nand {on}\n{WAITING_DELTA} > 0",
                self.hold(th.queue_seconds, th.queue_polls),
            ),
            self._alert(
                "FleetscopePreemptionBurst", f"{PREEMPTIONS} >= {th.preemption_burst:g}", "0s"
            ),
            self._alert(
                "FleetscopeEngineOutlier",
                f"{DECODE_ACTIVE}\n< on (job, {r}) group_left ()\n"
                f"({th.outlier_fraction:g} * {ROLE_MEDIAN})",
                self.hold(th.outlier_seconds),
            ),
            self._alert("FleetscopeTargetDown", self._target_down(), "0s"),
        ]
        if "vllm" in self.t.engines:
            s = Series(self.t, catalog.SLEEP_STATE_FAMILY)
            awake = self.p.per_engine(s, s.sel(eq={"sleep_state": "awake"}))
            out.append(
                self._alert("FleetscopeEngineAsleep", f"{awake} == 0", self.hold(th.paused_seconds))
            )
        return out

    def _target_down(self) -> str:
        seen = []
        for engine in self.t.engines:
            s = native(self.t, engine, "vllm:num_requests_running")
            seen.append(f"present_over_time({s.sel()}[{TARGET_SEEN}])")
        return f"up == 0\nand on (job, instance)\ncount by (job, instance) ({' or '.join(seen)})"

    def _alert(self, name: str, expr: str, hold: str) -> Rule:
        doc = ALERTS[name]
        return alert_rule(name, expr, hold, doc, severity="warning")


def alert_rule(
    name: str,
    expr: str,
    hold: str,
    doc: AlertDoc,
    severity: str,
    labels: dict[str, str] | None = None,
) -> Rule:
    """An alerting rule with fleetscope's labels and annotations."""
    rule: Rule = {"alert": name, "expr": expr}
    if hold != "0s":
        rule["for"] = hold
    rule["labels"] = {"severity": severity, "condition": doc.condition, **(labels or {})}
    rule["annotations"] = {
        "summary": doc.summary,
        "description": doc.meaning,
        "runbook": doc.runbook,
    }
    return rule
