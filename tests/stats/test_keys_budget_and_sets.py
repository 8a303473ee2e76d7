"""The key budget counts the keys really emitted, and the compact key set (docs/sinks.md).

Fleets come from the simulator's real vLLM families, rendered and parsed directly (no HTTP),
through the same FleetState the collector uses.
"""

from __future__ import annotations

import math
import pickle

import numpy as np

from fleetscope.dashboards.wandb_workspace import inference_panels, panel_keys
from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.keys import (
    DEFAULT_KEY_BUDGET,
    HEADLINE_METRICS,
    SKYRL_STEP_KEYS,
    KeyDict,
    KeyOptions,
    scope_keys,
)
from fleetscope.sources.base import ScrapeResult
from fleetscope_sim import SimFleet


def observe(fleet: SimFleet, options: KeyOptions | None = None, polls: int = 3) -> PollResult:
    """``polls`` polls of the simulated fleet, 5 simulated seconds apart; the last result."""
    state = FleetState(key_options=options)
    parsers: dict[str, Parser] = {}
    res = None
    fleet.step(3.0)
    for _ in range(polls):
        fleet.step(5.0)
        t, wall = fleet.clock.sim_time, fleet.clock.wall()
        scrapes = []
        for ep in fleet.endpoints:
            expo = parsers.setdefault(ep.name, Parser()).parse(
                ep.render().decode(), time=t, wall_time=wall
            )
            scrapes.append(ScrapeResult(ep.name, expo, t, wall, role=ep.role))
        res = state.observe(scrapes)
    assert res is not None
    return res


def demo_fleet() -> SimFleet:
    """The demo's fleet: 8 engines (two plain dp2 servers, a dp2 prefill and a dp2 decode)."""
    return SimFleet.build(4, dp=2, roles=[None, None, "prefill", "decode"], seed=0)


def engine_part(res: PollResult) -> dict[str, float]:
    scopes = set(res.stats.scopes) | {"health", "collector"}
    return {k: v for k, v in res.keys.items() if k.split("/")[1] not in scopes}


# --------------------------------------------------------------------------- the budget


def test_26_single_engine_servers_keep_every_engines_keys() -> None:
    res = observe(SimFleet.build(26, seed=1))
    st = res.stats
    engines = [e for e, is_eng in zip(st.engine_ids, st.is_engine, strict=True) if is_eng]
    assert len(engines) == 26
    keys = res.keys
    assert len(keys) <= DEFAULT_KEY_BUDGET
    for e in st.engine_ids:  # every finite value of every engine (and endpoint row) has its key
        want = {f"inference/{e}/{c}" for c, v in st.engine(e).items() if math.isfinite(v)}
        assert want and want <= keys.keys(), e
    # the count is exact: scope keys + one key per finite cell (+ the health keys)
    n_cells = int(np.isfinite(st.matrix).sum())
    assert len(engine_part(res)) == n_cells
    assert n_cells > 26 * 100  # not the 1-2 tail engines of the old count


def test_over_the_budget_every_engines_headlines_then_tails() -> None:
    fleet = SimFleet.build(26, seed=1)
    res = observe(fleet)
    n_scope = len(scope_keys(res.stats))
    n_cells = int(np.isfinite(res.stats.matrix).sum())
    headline_cells = sum(
        1
        for e in res.stats.engine_ids
        for m, v in res.stats.engine(e).items()
        if m in HEADLINE_METRICS and math.isfinite(v)
    )
    assert headline_cells == 26 * len(HEADLINE_METRICS)

    # all engines' keys do not fit, their headlines do: every engine keeps its headlines
    budget = n_scope + n_cells - 1
    res = observe(SimFleet.build(26, seed=1), KeyOptions(key_budget=budget))
    per_engine = engine_part(res)
    assert len(per_engine) == headline_cells
    assert {k.split("/", 2)[2] for k in per_engine} == set(HEADLINE_METRICS)
    assert len({k.split("/")[1] for k in per_engine}) == 26

    # not even the headlines fit: the tail engines' headlines, within the budget
    budget = n_scope + 3 * len(HEADLINE_METRICS)
    res = observe(SimFleet.build(26, seed=1), KeyOptions(key_budget=budget))
    per_engine = engine_part(res)
    assert 0 < len(per_engine) <= 3 * len(HEADLINE_METRICS)
    assert len({k.split("/")[1] for k in per_engine}) <= 3
    assert len(res.keys) - len(per_engine) - n_scope < 50  # health keys only beyond the budget


# --------------------------------------------------------------------------- the compact set


def test_compact_set_at_8_engines_keeps_what_is_required() -> None:
    res = observe(demo_fleet())
    keys = res.keys
    assert isinstance(keys, KeyDict)
    compact = keys.compact()
    assert compact.keys() <= keys.keys()
    assert all(compact[k] == keys[k] for k in compact)
    assert len(keys) > 3000 and len(compact) <= 1300, (len(keys), len(compact))
    # every prime-rl overview panel key (colocated and disaggregated layouts) the poll has
    required = panel_keys(inference_panels(False)) | panel_keys(inference_panels(True))
    present = {k for k in required if k in keys}
    assert len(present) > 40
    assert present <= compact.keys(), sorted(present - compact.keys())
    # every engine's headline metrics
    for e in res.stats.engine_ids:
        for m in HEADLINE_METRICS:
            k = f"inference/{e}/{m}"
            if k in keys:
                assert k in compact, k
    # the health and collector keys added after rendering are in both sets
    assert "inference/agg/engines_reporting" in compact
    # what is left out, by meaning
    assert not [k for k in compact if k.endswith("/median")]
    assert not [
        k for k in compact if "_sum/" in k or "_count/" in k or k.endswith(("_sum", "_count"))
    ]
    assert "inference/agg/generation_tokens_total/sum" not in compact  # a sum of lifetime totals
    assert "inference/server0.0/generation_tokens_total" not in compact  # a lifetime total
    assert "inference/agg/time_to_first_token_seconds:rate/sum" not in compact  # = requests/s
    assert "inference/agg/prefix_cache_hit_rate/sum" not in compact  # a sum of ratios
    assert "inference/agg/kv_cache_usage_perc/sum" not in compact  # a sum of fractions
    assert "inference/agg/iteration_tokens_total:rate/sum" in compact  # engine steps/s
    assert "inference/agg/request_success_total{finished_reason=length}:rate/sum" in compact


def test_skyrl_schema_compact_is_every_key() -> None:
    res = observe(demo_fleet(), KeyOptions(schema="skyrl"))
    keys = res.keys
    assert isinstance(keys, KeyDict)
    assert keys.compact() == dict(keys)
    for scope, base in (("agg", "vllm/"), ("decode", "vllm/decode/"), ("prefill", "vllm/prefill/")):
        metrics = res.stats.scopes[scope].metrics
        for key, (metric, stat) in SKYRL_STEP_KEYS.items():
            v = metrics.get(metric, {}).get(stat)
            if v is not None and math.isfinite(v):
                assert base + key in keys, base + key


def test_key_dict_update_and_pickle_keep_the_marks() -> None:
    a = KeyDict({"x": 1.0, "y": 2.0}, full_only={"y"})
    a.update(KeyDict({"z": 3.0}, full_only={"z"}))
    a.update({"w": 4.0})  # a plain mapping: in both sets
    assert a.compact() == {"x": 1.0, "w": 4.0}
    b = pickle.loads(pickle.dumps(a))
    assert isinstance(b, KeyDict) and b == a and b.full_only == {"y", "z"}
    assert a.select("full") is a
