"""The W&B workspace's ``Inference`` section as a pure spec: :func:`inference_panels` (titles and
key names; tested against the keys the collector really emits). Each panel pairs the fleet
aggregate with the cross-engine tail that flags one sick engine (prime-rl's seven panels, plus
latency, truncation and the collector's own health):

=============================  ==============================  ==================================
panel                          colocated fleet (``agg``)       disaggregated (role-aware)
=============================  ==============================  ==================================
KV cache usage                 mean + min/max                  agg mean; decode min/max; prefill max
Preemptions /s                 sum + max                       agg sum; decode max; prefill max
Running requests               mean + min/max                  agg mean; decode min/max; prefill max
Waiting requests               mean + min/max                  agg mean; decode min/max; prefill max
Prefix cache hit rate          pooled + min                    agg pooled; prefill min; decode min
Generation tokens /s           sum + min                       agg sum; decode min
Prompt tokens /s               sum + max                       agg sum; prefill max
TTFT                           p50/p90/p99 + slowest mean      decode p50/p90/p99; slowest mean
                                                               per role
TPOT (per request), ITL        p50/p90/p99 + slowest mean      decode p50/p90/p99 + slowest mean
SGLang ITL (its own keys)      p50/p90/p99 + slowest mean      decode p50/p90/p99 + slowest mean
Truncation share (``length``)  pooled + max                    decode pooled + max (vLLM only)
Engines reporting / failures   agg                             agg + engines per role
Health conditions              ``health/*``                    ``health/*``
=============================  ==============================  ==================================

Role-aware: in disaggregated runs every tail comes from its role's scope, never from ``agg``
(``inference/decode/generation_tokens_total:rate/min``: prefill engines would pin ``agg``'s
minimum near 0 and hide a stalled decode engine), and the decode-only quantities (TPOT, ITL,
truncation: prefill requests all end with ``finished_reason=length``) use the decode scope
for the aggregate as well.

Both engine kinds: SGLang's families share vLLM's keys where the catalog maps them (one panel
for both); SGLang's inter-token latency has its own keys (``sglang_inter_token_latency_seconds``:
its count means something else) and panel; SGLang has no finish reason, so truncation is a vLLM
panel. ``inference_panels(..., engines=("vllm",))`` leaves out the other kind's panels.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from fleetscope import catalog
from fleetscope.health import CONDITIONS
from fleetscope.keys.breakdown import share_key
from fleetscope.stats.breakdown import PHASES

SECTION_NAME = "Inference"
DEFAULT_NAME = "fleetscope: inference"
DEFAULT_NAME_DISAGGREGATED = "fleetscope: inference (prefill/decode)"

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class Panel:
    """One line chart: its title and the metric keys it plots (in legend order)."""

    title: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Spec:
    title: str
    fleet: tuple[str, ...]  # "metric/stat" of the fleet aggregate
    tail: tuple[str, ...]  # the cross-engine tail, colocated fleets (from agg)
    role_tails: tuple[tuple[Role, tuple[str, ...]], ...]  # disaggregated: (role, tail) pairs
    fleet_role: Role | None = None  # disaggregated: aggregate from this role instead of agg
    engine: str | None = None  # an engine kind's own keys only (None: every kind's)


def _q(metric: str) -> tuple[str, ...]:
    return tuple(f"{metric}/{q}" for q in ("p50", "p90", "p99"))


# the metric names come from the catalog (an SGLang engine's are parsed under the same names)
_KV = catalog.KV_USAGE
_PRE = catalog.PREEMPTION_RATE
_RUN = catalog.RUNNING
_WAIT = catalog.WAITING
_HIT = catalog.PREFIX_HIT_RATE
_GEN = catalog.GENERATION_RATE
_PROMPT = catalog.PROMPT_RATE
_TTFT = catalog.TTFT
_TPOT = catalog.TPOT
_ITL = catalog.ITL
_SGLANG_ITL = "sglang_" + catalog.ITL  # SGLang's own ITL (docs/sglang.md: not vLLM's)
_TRUNC = catalog.LENGTH_SHARE

_SPECS: tuple[_Spec, ...] = (
    _Spec(
        "KV cache usage (mean; min/max engine)",
        (f"{_KV}/mean",),
        (f"{_KV}/min", f"{_KV}/max"),
        (("decode", (f"{_KV}/min", f"{_KV}/max")), ("prefill", (f"{_KV}/max",))),
    ),
    _Spec(
        "Preemptions /s (fleet sum; max engine)",
        (f"{_PRE}/sum",),
        (f"{_PRE}/max",),
        (("decode", (f"{_PRE}/max",)), ("prefill", (f"{_PRE}/max",))),
    ),
    _Spec(
        "Running requests (mean; min/max engine)",
        (f"{_RUN}/mean",),
        (f"{_RUN}/min", f"{_RUN}/max"),
        (("decode", (f"{_RUN}/min", f"{_RUN}/max")), ("prefill", (f"{_RUN}/max",))),
    ),
    _Spec(
        "Waiting requests (mean; min/max engine)",
        (f"{_WAIT}/mean",),
        (f"{_WAIT}/min", f"{_WAIT}/max"),
        (("decode", (f"{_WAIT}/min", f"{_WAIT}/max")), ("prefill", (f"{_WAIT}/max",))),
    ),
    _Spec(
        "Prefix cache hit rate (pooled; min engine)",
        (f"{_HIT}/pooled",),
        (f"{_HIT}/min",),
        (("prefill", (f"{_HIT}/min",)), ("decode", (f"{_HIT}/min",))),
    ),
    _Spec(
        "Generation tokens /s (fleet sum; min engine)",
        (f"{_GEN}/sum",),
        (f"{_GEN}/min",),
        (("decode", (f"{_GEN}/min",)),),
    ),
    _Spec(
        "Prompt tokens /s (fleet sum; max engine)",
        (f"{_PROMPT}/sum",),
        (f"{_PROMPT}/max",),
        (("prefill", (f"{_PROMPT}/max",)),),
    ),
    _Spec(
        "TTFT seconds (p50/p90/p99; slowest engine mean)",
        _q(_TTFT),
        (f"{_TTFT}:mean/max",),
        (("decode", (f"{_TTFT}:mean/max",)), ("prefill", (f"{_TTFT}:mean/max",))),
        fleet_role="decode",
    ),
    _Spec(
        "TPOT seconds, per request (p50/p90/p99; slowest engine mean)",
        _q(_TPOT),
        (f"{_TPOT}:mean/max",),
        (("decode", (f"{_TPOT}:mean/max",)),),
        fleet_role="decode",
    ),
    _Spec(
        "ITL seconds (p50/p90/p99; slowest engine mean)",
        _q(_ITL),
        (f"{_ITL}:mean/max",),
        (("decode", (f"{_ITL}:mean/max",)),),
        fleet_role="decode",
        engine="vllm",
    ),
    _Spec(
        "SGLang ITL seconds (p50/p90/p99; slowest engine mean)",
        _q(_SGLANG_ITL),
        (f"{_SGLANG_ITL}:mean/max",),
        (("decode", (f"{_SGLANG_ITL}:mean/max",)),),
        fleet_role="decode",
        engine="sglang",
    ),
    _Spec(  # SGLang exposes no finish reason
        "Truncation share, finished_reason=length (pooled; max engine)",
        (f"{_TRUNC}/pooled",),
        (f"{_TRUNC}/max",),
        (("decode", (f"{_TRUNC}/max",)),),
        fleet_role="decode",
        engine="vllm",
    ),
    _Spec(
        "Collector: engines reporting, scrape failures",
        ("engines_reporting", "scrape_failures"),
        (),
        (("prefill", ("engines_reporting",)), ("decode", ("engines_reporting",))),
    ),
)


ENGINE_KINDS: tuple[str, ...] = ("vllm", "sglang")


def inference_panels(
    disaggregated: bool, prefix: str = "inference", engines: Iterable[str] = ENGINE_KINDS
) -> list[Panel]:
    """The inference section's panels. ``disaggregated``: take tails from role scopes;
    ``engines``: the engine kinds of the fleet (a kind's own panels only for those)."""
    panels: list[Panel] = []
    kinds = set(engines)
    for s in _SPECS:
        if s.engine is not None and s.engine not in kinds:
            continue
        if disaggregated:
            scope = s.fleet_role or "agg"
            keys = [f"{prefix}/{scope}/{k}" for k in s.fleet]
            for role, tail in s.role_tails:
                keys += [f"{prefix}/{role}/{k}" for k in tail]
        else:
            keys = [f"{prefix}/agg/{k}" for k in (*s.fleet, *s.tail)]
        panels.append(Panel(s.title, tuple(dict.fromkeys(keys))))
    panels.append(
        Panel(
            "Health: engines in each condition",
            tuple(f"{prefix}/health/{c}" for c in CONDITIONS),
        )
    )
    return panels


#: the section of the engine-time breakdown: one panel per window (docs/rules.md §3.13)
BREAKDOWN_SECTION_NAME = "Engine time"


def breakdown_panels(
    windows: Iterable[str], disaggregated: bool, prefix: str = "inference"
) -> list[Panel]:
    """One panel per window label: the shares of its engine-seconds that were idle, busy,
    saturated, paused and syncing, logged at each of its stops (``agg``; and a panel per role
    when ``disaggregated``: which side is the bottleneck)."""
    scopes = ("agg", "prefill", "decode") if disaggregated else ("agg",)
    panels = []
    for label in dict.fromkeys(windows):
        for scope in scopes:
            where = "" if scope == "agg" else f", {scope}"
            panels.append(
                Panel(
                    f"Engine time, window {label}{where}: idle / busy / saturated / paused / "
                    "syncing shares",
                    tuple(f"{prefix}/{label}/{scope}/{share_key(p)}" for p in PHASES),
                )
            )
    return panels


def panel_keys(panels: Iterable[Panel]) -> set[str]:
    """Every metric key the panels reference."""
    return {k for p in panels for k in p.keys}


def default_view_name(disaggregated: bool) -> str:
    return DEFAULT_NAME_DISAGGREGATED if disaggregated else DEFAULT_NAME
