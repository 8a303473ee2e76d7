"""Keys of where the engines' time went, and of who holds the latency tail (docs/rules.md §3.13).

At a window's stop (``{prefix}/{label}/...``) and in the run summary
(``{prefix}_summary/{label}/...``), per scope (``agg``, each role, each group):

* ``{scope}/engine_time/{idle,busy,saturated,paused,syncing}_share``: shares of
  ``{scope}/engine_time/engine_seconds`` (they sum to 1);
* ``{scope}/engine_time/tokens_per_busy_engine_second``: generated tokens per busy or saturated
  engine-second, beside the window's tokens per second (``generation_tokens_total:rate/sum``),
  and ``{scope}/engine_time/idle_cost_tokens``: the idle engine-seconds at that rate;
* per engine, ``{engine}/engine_time/...``: the shares and engine-seconds of every engine of a
  fleet of at most :data:`ENGINE_BREAKDOWN_MAX` engines, else of each role's most idle and most
  saturated engine (the full key set only);
* ``{scope}/{metric}/tail_engines`` (e2e latency, TTFT): how many engines hold the scope's
  tail, and for each, ``{engine}/{metric}/p99`` and ``{engine}/{metric}/tail_share``
  (:mod:`fleetscope.stats.tails`).

The run summary also names them: ``{label}/bottleneck`` and ``{label}/{role}/bottleneck`` (one
of ``engines_idle``, ``engines_saturated``, ``weight_sync``, ``paused``, ``balanced``),
``{label}/bottleneck_role`` on a prefill/decode fleet, and
``{label}/{scope}/{metric}/tail_held_by`` (the engines, space-separated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleetscope import catalog
from fleetscope.keys.sets import KeyDict, is_finite
from fleetscope.stats.breakdown import (
    BUSY,
    IDLE,
    PHASES,
    SATURATED,
    bottleneck_role,
    scope_phase_seconds,
    shares,
    verdict,
)
from fleetscope.stats.engine_sum import EngineSum
from fleetscope.stats.reduce import PollStats
from fleetscope.stats.tails import TAIL_METRICS, latency_tails

__all__ = [
    "ENGINE_BREAKDOWN_MAX",
    "ENGINE_TIME",
    "ROLES",
    "breakdown_keys",
    "breakdown_listed_engines",
    "share_key",
]

ENGINE_TIME = "engine_time"
ENGINE_BREAKDOWN_MAX = 64
ROLES = ("prefill", "decode")


def share_key(phase: str) -> str:
    """``engine_time/{phase}_share``, below a scope or an engine."""
    return f"{ENGINE_TIME}/{phase}_share"


def _time_keys(out: KeyDict, base: str, seconds: Sequence[float], share: Sequence[float]) -> None:
    for phase, v in zip(PHASES, share, strict=True):
        out[f"{base}/{share_key(phase)}"] = v
    out[f"{base}/{ENGINE_TIME}/engine_seconds"] = sum(seconds)


def breakdown_listed_engines(
    per_engine: Mapping[str, Sequence[float]], roles: Mapping[str, str | None]
) -> list[str]:
    """The engines whose own breakdown is keyed: every one of a fleet of at most
    :data:`ENGINE_BREAKDOWN_MAX`, else each role's most idle and most saturated engine."""
    if len(per_engine) <= ENGINE_BREAKDOWN_MAX:
        return list(per_engine)
    chosen: dict[str, None] = {}
    by_role: dict[str | None, list[str]] = {}
    for eid in per_engine:
        by_role.setdefault(roles.get(eid), []).append(eid)
    for members in by_role.values():
        for k in (IDLE, SATURATED):
            chosen[max(members, key=lambda e: per_engine[e][k] / sum(per_engine[e]))] = None
    return list(chosen)


def breakdown_keys(
    engines: Mapping[str, EngineSum],
    stats: PollStats,
    base: str,
    *,
    summary: bool,
    per_engine_keys: bool = True,
) -> KeyDict:
    """The engine-time and latency-tail keys of one window (``summary=False``) or run label,
    under ``base`` (``{prefix}/{label}``); ``per_engine_keys``: the engines' own keys and the
    tails too (the default schema; SkyRL's gets the scopes' only)."""
    out = KeyDict()
    scopes, per_engine = scope_phase_seconds(engines)
    role_shares: dict[str, list[float]] = {}
    for scope, seconds in scopes.items():
        share = shares(seconds)
        if share is None:
            continue
        _time_keys(out, f"{base}/{scope}", seconds, share)
        _cost_keys(out, f"{base}/{scope}/{ENGINE_TIME}", seconds, stats, scope)
        if scope in ROLES:
            role_shares[scope] = share
        if summary and (scope == "agg" or scope in ROLES):
            out[f"{base}/bottleneck" if scope == "agg" else f"{base}/{scope}/bottleneck"] = verdict(
                share
            )
    role = bottleneck_role(role_shares)
    if summary and role is not None:
        out[f"{base}/bottleneck_role"] = role
    if not per_engine_keys:
        return out
    roles = {eid: engines[eid].role for eid in per_engine}
    for eid in breakdown_listed_engines(per_engine, roles):
        seconds = per_engine[eid]
        share = shares(seconds)
        if share is not None:
            part = KeyDict()
            _time_keys(part, f"{base}/{eid}", seconds, share)
            out.update(part)
            out.full_only.update(part)
    out.update(_tail_keys(engines, stats, base, summary=summary))
    return out


def _cost_keys(
    out: KeyDict, base: str, seconds: Sequence[float], stats: PollStats, scope: str
) -> None:
    """Generated tokens per busy engine-second, and what the idle engine-seconds cost at it."""
    s = stats.scopes.get(scope)
    tokens = None if s is None else s.metrics.get(catalog.GENERATION_TOKENS, {}).get("delta")
    busy = seconds[BUSY] + seconds[SATURATED]
    if tokens is None or not is_finite(tokens) or not busy > 0:
        return
    rate = tokens / busy
    out[f"{base}/tokens_per_busy_engine_second"] = rate
    out[f"{base}/idle_cost_tokens"] = rate * seconds[IDLE]


def _tail_keys(
    engines: Mapping[str, EngineSum], stats: PollStats, base: str, *, summary: bool
) -> KeyDict:
    p99: dict[tuple[str, str], float] = {}
    for scope in ("agg", *ROLES):
        s = stats.scopes.get(scope)
        for metric in TAIL_METRICS:
            v = None if s is None else s.metrics.get(metric, {}).get("p99")
            if v is not None and is_finite(v):
                p99[(scope, metric)] = v
    out = KeyDict()
    for (scope, metric), held in sorted(latency_tails(engines, p99).items()):
        out[f"{base}/{scope}/{metric}/tail_engines"] = float(len(held))
        for t in held:
            out[f"{base}/{t.engine}/{metric}/p99"] = t.p99
            out[f"{base}/{t.engine}/{metric}/tail_share"] = t.tail_share
        if summary and held:
            out[f"{base}/{scope}/{metric}/tail_held_by"] = " ".join(t.engine for t in held)
    return out
