"""The terminal view's rows: one per engine, with its figures, state and health status."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetscope import catalog
from fleetscope.identity import endpoint_of

if TYPE_CHECKING:
    from fleetscope.fleet.state import PollResult


KV_FULL = 0.95


@dataclass(frozen=True, slots=True)
class EngineRow:
    engine_id: str
    role: str
    status: str  # OK | STALLED | KV FULL | PREEMPTING | QUEUEING | NO DATA
    severity: int  # 2 red, 1 yellow, 0 fine
    running: float | None
    waiting: float | None
    kv: float | None
    gen_rate: float | None
    prompt_rate: float | None
    hit_rate: float | None
    ttft: float | None
    kind: str = "-"  # vLLM | SGLang | - (not known)
    weights: str = ""  # the served weight version ("" when versions are not in use)
    stale: bool = False  # it serves an older version than the trainer's
    state: str = ""  # serving | idle | stalled | PAUSED | ASLEEP | "" (unknown)
    #: ``ttft`` is its server's, shared by its DP replicas (SGLang's tokenizer families)
    ttft_shared: bool = False


def _f(m: Mapping[str, float], k: str) -> float | None:
    v = m.get(k)
    return None if v is None or math.isnan(v) else v


# health condition -> (status shown, severity)
STATUS: dict[str, tuple[str, int]] = {
    "generation_stalled": ("STALLED", 2),
    "engine_outlier": ("SLOW", 2),
    "kv_cache_near_full": ("KV FULL", 1),
    "preemption_burst": ("PREEMPTING", 1),
    "queue_growing": ("QUEUEING", 1),
}


def status_of(conditions: list[str]) -> tuple[str, int]:
    """The worst of an engine's health conditions (see fleetscope.health), or OK."""
    worst = ("OK", 0)
    for c in conditions:
        st = STATUS.get(c)
        if st is not None and st[1] > worst[1]:
            worst = st
    return worst


def _rl_cells(result: PollResult, endpoint: str, engine: str) -> dict[str, Any]:
    """The kind, weights and state cells of one engine (its endpoint's, docs/rl-lifecycle.md)."""
    from fleetscope.rl.view import KIND_NAMES

    info = getattr(result, "endpoint_info", {}).get(endpoint)
    if info is None:
        return {}
    asleep = None
    for inp in result.inputs:
        if inp.engine_id == engine:
            from fleetscope.rl.states import asleep_from_gauge

            asleep = asleep_from_gauge(inp.delta.current)
            break
    if asleep is None and info.engines and info.engines_asleep == info.engines:
        asleep = True
    state = "ASLEEP" if asleep else "PAUSED" if info.paused else ""
    if not state and (info.paused is not None or asleep is not None):
        state = "serving"
    weights = ""
    if info.version is not None:
        weights = info.version if not info.lag else f"{info.version} ({-info.lag:+d})"
    return {
        "kind": KIND_NAMES.get(info.kind or "", "-"),
        "weights": weights,
        "stale": bool(info.lag and info.lag > 0),
        "state": state,
    }


# SGLang's scheduler counts the tokens each DP replica processes, per mode, as it makes them
# (``realtime_tokens_total``); its tokenizer's prompt / generation / cached-token counters and
# latency histograms are one per server when DP > 1 (endpoint-level: docs/sglang.md)
_PREFILL_COMPUTE = "realtime_tokens_total{mode=prefill_compute}:rate"
_PREFILL_CACHE = "realtime_tokens_total{mode=prefill_cache}:rate"


def _prompt_and_hit(m: Mapping[str, float]) -> tuple[float | None, float | None]:
    """An engine's prompt tokens/s and prefix-cache hit rate: its own counters (vLLM, and an
    SGLang server with one replica), else its scheduler's prefill tokens, computed and cached."""
    prompt, hit = _f(m, catalog.PROMPT_RATE), _f(m, catalog.PREFIX_HIT_RATE)
    compute, cache = _f(m, _PREFILL_COMPUTE), _f(m, _PREFILL_CACHE)
    if compute is None and cache is None:
        return prompt, hit
    prefilled = (compute or 0.0) + (cache or 0.0)
    if hit is None and prefilled > 0:
        hit = (cache or 0.0) / prefilled
    return (prefilled if prompt is None else prompt), hit


def _activity(m: Mapping[str, float], conditions: list[str]) -> str:
    """What an engine is doing by its own figures: stalled, serving (requests running or
    waiting) or idle; "" when it reported neither gauge."""
    if "generation_stalled" in conditions:
        return "stalled"
    running, waiting = _f(m, catalog.RUNNING), _f(m, catalog.WAITING)
    if running is None and waiting is None:
        return ""
    return "serving" if (running or 0) > 0 or (waiting or 0) > 0 else "idle"


def _endpoint_figures(result: PollResult) -> dict[str, Mapping[str, float]]:
    """Each endpoint's own engine-less figures (an SGLang server's tokenizer with DP > 1)."""
    stats = result.stats
    return {
        endpoint_of(eid): stats.engine(eid)
        for i, eid in enumerate(stats.engine_ids)
        if not stats.is_engine[i]
    }


def _engine_row(
    result: PollResult,
    eid: str,
    role: str | None,
    conditions: list[str],
    shared: Mapping[str, float],
) -> EngineRow:
    """One engine's row: its own figures; its server's TTFT where it has none (marked)."""
    m = result.stats.engine(eid)
    status, sev = status_of(conditions)
    gen = next((v for k in catalog.DECODE_RATES if (v := _f(m, k)) is not None), None)
    prompt, hit = _prompt_and_hit(m)
    ttft = _f(m, catalog.TTFT + ":mean")
    ttft_shared = ttft is None and _f(shared, catalog.TTFT + ":mean") is not None
    if ttft_shared:
        ttft = _f(shared, catalog.TTFT + ":mean")
    cells = _rl_cells(result, endpoint_of(eid), eid)
    if cells.get("state") not in ("PAUSED", "ASLEEP"):
        cells["state"] = _activity(m, conditions) or cells.get("state", "")
    return EngineRow(
        eid,
        role or "-",
        status,
        sev,
        _f(m, catalog.RUNNING),
        _f(m, catalog.WAITING),
        _f(m, catalog.KV_USAGE),
        gen,
        prompt,
        hit,
        ttft,
        ttft_shared=ttft_shared,
        **cells,
    )


def engine_rows(result: PollResult, roles: Mapping[str, str | None]) -> list[EngineRow]:
    """Every engine of the poll, and one NO DATA row per endpoint that did not answer; the
    sickest first."""
    stats = result.stats
    rows: list[EngineRow] = []
    conditions: dict[str, list[str]] = {}
    for ev in getattr(result, "events", []):
        conditions.setdefault(ev.subject, []).append(ev.condition)
    shared = _endpoint_figures(result)
    for i, eid in enumerate(stats.engine_ids):
        if not stats.is_engine[i]:
            continue
        role = roles.get(eid, roles.get(endpoint_of(eid)))
        ep = endpoint_of(eid)
        rows.append(_engine_row(result, eid, role, conditions.get(eid, []), shared.get(ep, {})))
    for sc in result.scrapes:
        if not sc.ok:
            cells = _rl_cells(result, sc.endpoint, "")
            cells.pop("state", None)  # not observed this poll
            rows.append(
                EngineRow(sc.endpoint + ".*", sc.role or "-", "NO DATA", 2, *(None,) * 7, **cells)
            )
    rows.sort(key=lambda r: (-r.severity, r.engine_id))
    return rows


# (metric, stat) of the fleet-wide scope that the terminal's run summary shows
SUMMARY_HEADLINES: frozenset[tuple[str, str]] = frozenset(
    {
        (catalog.GENERATION_TOKENS, "delta"),
        (catalog.PROMPT_TOKENS, "delta"),
        (catalog.REQUEST_SUCCESS, "delta"),
        (catalog.PREEMPTIONS, "delta"),
        (catalog.GENERATION_RATE, "sum"),
        (catalog.PROMPT_RATE, "sum"),
        (catalog.PREFIX_HIT_RATE, "pooled"),
        (catalog.TTFT, "p90"),
        (catalog.TTFT, "p90_clamped"),
        (catalog.TPOT, "p90"),
        (catalog.TPOT, "p90_clamped"),
        (catalog.E2E, "tail_held_by"),  # the engines that hold the latency tails
        (catalog.TTFT, "tail_held_by"),
    }
)


def summary_headline(key: str) -> bool:
    """``run_status``, a run label's own keys (``{root}/{label}/coverage``, SkyRL's
    ``vllm_correct_aggregate/{label}/output_tokens_total``) and the headline ``agg`` stats."""
    parts = key.split("/")
    if len(parts) <= 3:
        return True
    return len(parts) == 5 and parts[2] == "agg" and (parts[3], parts[4]) in SUMMARY_HEADLINES
