"""The RL weight-update and sleep-mode histograms of real vLLM 0.32, per ``operation``.

The bodies in ``tests/data/real-vllm-rl/`` (see its README) were recorded around known RL calls
(``calls.json``). Those families have no ``engine`` label: they belong to the endpoint
(docs/rules.md §3.11), never to engine ``0``; ``operation`` is a breakdown label, so every
operation has its own child with exact counts, means and pooled quantiles.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from conftest import DATA
from fleetscope.catalog import BREAKDOWN_LABELS
from fleetscope.exposition import Parser
from fleetscope.fleet import FleetState, ScrapeResult

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

DATA = DATA / "real-vllm-rl"
RUNS = {"single": ("00_before", "41_final"), "dp2": ("00_before", "20_final")}
RL = "rl_weight_update_operation_duration_seconds"
SLEEP = "sleep_mode_operation_duration_seconds"
# handler path -> (family, operation) as vLLM's `record(op)` names it
OPERATIONS = {
    "/init_weight_transfer_engine": (RL, "init"),
    "/shutdown_weight_transfer_engine": (RL, "shutdown"),
    "/start_weight_update": (RL, "start"),
    "/start_draft_weight_update": (RL, "start_draft"),
    "/update_weights": (RL, "update"),
    "/finish_weight_update": (RL, "finish"),
    "/sleep": (SLEEP, "sleep"),
    "/wake_up": (SLEEP, "wake"),
    "/release_kv_cache_memory": (SLEEP, "release_kv_cache_memory"),
}


def _calls(run: str) -> list[dict]:
    return json.loads((DATA / run / "calls.json").read_text(encoding="utf-8"))


def _expected_counts(run: str) -> dict[tuple[str, str], int]:
    """Observed calls per (family, operation): failed calls (500) count, 400s do not."""
    out: dict[tuple[str, str], int] = {}
    for c in _calls(run):
        op = OPERATIONS.get(c.get("path", ""))
        if op is not None and c["status"] != 400:
            out[op] = out.get(op, 0) + 1
    return out


def _snapshot_wall(run: str, name: str) -> float:
    """The Unix time a snapshot was taken (the probe's clock, anchored by a timed call)."""
    calls = _calls(run)
    anchor = next(c for c in calls if "t_start" in c)
    start = datetime.fromisoformat(anchor["wall_utc"]).timestamp() - anchor["t_start"]
    snap = next(c for c in calls if c.get("metrics_snapshot") == f"{name}.prom")
    return start + snap["t"]


def _observe(run: str) -> dict[str, float]:
    state, parser = FleetState(), Parser()
    keys: dict[str, float] = {}
    for i, name in enumerate(RUNS[run]):
        body = (DATA / run / f"{name}.prom").read_text(encoding="utf-8")
        wall, t = _snapshot_wall(run, name), 100.0 * (i + 1)
        sc = ScrapeResult(run, parser.parse(body, time=t, wall_time=wall), t, wall)
        keys = state.observe([sc]).keys
    return keys


def test_operation_is_a_breakdown_label():
    assert "operation" in BREAKDOWN_LABELS


@pytest.mark.parametrize("run", sorted(RUNS))
def test_counts_per_operation_are_the_calls(run: str):
    keys = _observe(run)
    expected = _expected_counts(run)
    assert {op for _, op in expected} >= {"init", "update", "finish", "sleep", "wake"}
    for (family, op), n in expected.items():
        child = f"{family}{{operation={op}}}"
        # the endpoint's own row: the running total, and the interval's mean
        assert keys[f"inference/{run}/{child}_count"] == n, child
        assert f"inference/{run}/{child}:mean" in keys, child
        # fleet scope: the interval's count (the family appeared between the two scrapes: it
        # was created lazily, so all of it is new) and pooled quantiles from bucket deltas
        assert keys[f"inference/agg/{child}/delta"] == n, child
        for q in ("p50", "p90", "p99"):
            assert keys[f"inference/agg/{child}/{q}"] >= 0, (child, q)
        mean = keys[f"inference/agg/{child}:mean/pooled"]
        assert mean == pytest.approx(keys[f"inference/{run}/{child}_sum"] / n)
    # per-operation children sum to what the summed-away family would have said
    total = sum(n for (f, _), n in expected.items() if f == RL)
    ops = [k for k in keys if k.startswith(f"inference/{run}/{RL}{{") and k.endswith("_count")]
    assert sum(keys[k] for k in ops) == total


@pytest.mark.parametrize("run", sorted(RUNS))
def test_rl_families_belong_to_the_endpoint_not_engine_0(run: str):
    keys = _observe(run)
    engines = {"single": ["single.0"], "dp2": ["dp2.0", "dp2.1"]}[run]
    for e in engines:
        assert f"inference/{e}/generation_tokens_total:rate" in keys
        own = [k for k in keys if k.startswith(f"inference/{e}/")]
        assert not [k for k in own if "rl_weight_update" in k or "sleep_mode_" in k], e
    assert any(k.startswith(f"inference/{run}/{RL}{{operation=") for k in keys)
    assert any(k.startswith(f"inference/{run}/{SLEEP}{{operation=") for k in keys)
    # engine_sleep_state has an engine label: it stays per engine
    for e in engines:
        assert keys[f"inference/{e}/engine_sleep_state{{sleep_state=awake}}"] == 1.0


def test_policy_versions_are_ordered_by_first_announcement():
    from fleetscope.versions import PolicyVersions

    v = PolicyVersions(stale_seconds=10.0)
    assert not v.active and v.policy_version is None
    assert v.announce("b", now=0.0) == 0
    assert v.announce("a", now=1.0) == 1  # opaque strings: not sorted, ordered as announced
    v.served.update({"s0": "b", "s1": "a", "s2": "default"})
    assert [v.served_index(e) for e in ("s0", "s1", "s2", "s3")] == [0, 1, None, None]
    assert v.announce("b", now=2.0) == 0  # a rollback makes an earlier version current again
    assert v.announced == ["b", "a"] and v.announced_at == [0.0, 1.0]
    with pytest.raises(TypeError):
        v.announce(3)  # type: ignore[arg-type]
