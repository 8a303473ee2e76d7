"""RL figures against real vLLM servers (tests/real/rl_scenario.py): paused / asleep
engine-seconds, served versions and skew, weight syncs, the weight-update histograms, checked
against what the test did and timed, the scraped bodies and PromQL."""

from __future__ import annotations

import pytest

from fleetscope.identity import EngineId
from fleetscope.versions import generation_delta
from real import bodies as B
from real.rl_scenario import RLRun

OPS = ("init", "start", "update", "finish")
RL_HIST = "vllm:rl_weight_update_operation_duration_seconds"


def engines(view, endpoint: str) -> dict[EngineId, float]:
    """Each engine of ``endpoint`` in this poll: its interval seconds."""
    return {
        e: d.seconds
        for e, d in view.result.deltas.items()
        if e.is_engine and e.endpoint == endpoint and not d.baseline_only
    }


def scrape_time(view, endpoint: str) -> float:
    (sc,) = [s for s in view.result.scrapes if s.endpoint == endpoint]
    return sc.time


def test_every_rl_call_answered(real_rl: RLRun) -> None:
    """What works on CPU: pause / resume / sleep / wake_up / versions, and the ipc weight
    transfer with an empty chunk (a real chunk needs CUDA IPC: not tried, it kills the engine)."""
    bad = [(c.server, c.path, c.status, c.answer) for c in real_rl.calls if c.status != 200]
    assert not bad, bad
    assert real_rl.call("server0", "/is_paused").answer == {"is_paused": True}
    assert real_rl.load["total"]["ok"] == real_rl.load["total"]["sent"] > 0


def test_paused_seconds_follow_the_rule_and_the_test_timing(real_rl: RLRun) -> None:
    views = [v for _, v in real_rl.views]
    want = 0.0
    for v in views:
        info = v.result.endpoint_info["server0"]
        if info.paused:
            want += sum(engines(v, "server0").values())
    paused = real_rl.phase("paused")
    # a probe that missed its deadline under load leaves a poll's state unknown (None, counted
    # nowhere): never "not paused" during the pause
    state = [v.result.endpoint_info["server0"].paused for v in paused]
    assert all(p is not False for p in state), state
    assert real_rl.phase("resumed")[0].result.endpoint_info["server0"].paused is not True
    total = real_rl.summary["inference_summary/combined/server0/paused_engine_seconds"]
    assert total == pytest.approx(want, rel=1e-12)
    # against the test's own clock: the pause spans at least the known paused polls after the
    # /pause answer, at most from the last poll before it to the last known paused poll
    pause = real_rl.call("server0", "/pause")
    before = scrape_time(real_rl.phase("before_pause")[-1], "server0")
    known = [i for i, v in enumerate(views) if v.result.endpoint_info["server0"].paused]
    first, last_i = known[0], known[-1]
    last = scrape_time(views[last_i], "server0")
    since = max(pause.t1, scrape_time(views[first - 1], "server0"))
    unknown = sum(  # intervals inside the pause whose state the collector could not know
        scrape_time(views[i], "server0") - scrape_time(views[i - 1], "server0")
        for i in range(first + 1, last_i)
        if views[i].result.endpoint_info["server0"].paused is None
    )
    assert last - since - unknown <= total + 1e-9 and total <= last - before
    for v in paused:  # every poll row of the pause whose state is known
        if v.result.endpoint_info["server0"].paused:
            assert v.keys["inference/server0/engines_paused"] == 1
            assert v.keys["inference/agg/engines_paused"] >= 1
    # the scraped body: a pause leaves engine_sleep_state awake (vLLM says nothing of pauses)
    body = real_rl.bodies["paused"]["server0"]
    assert B.total(body, "vllm:engine_sleep_state", sleep_state="awake") == 1.0


def test_sleeping_seconds_from_the_sleep_gauges(real_rl: RLRun) -> None:
    asleep = real_rl.phase("asleep")
    for v in asleep:
        assert v.keys["inference/server1/engines_asleep"] == 2  # DP=2: both engines
        # a sleep pauses the scheduler (absent: that poll's /is_paused missed its deadline)
        assert v.keys.get("inference/server1/engines_paused", 2) == 2
    want = sum(
        sum(engines(v, "server1").values())
        for _, v in real_rl.views
        if v.result.endpoint_info["server1"].engines_asleep == 2
    )
    total = real_rl.summary["inference_summary/combined/server1/sleeping_engine_seconds"]
    assert total == pytest.approx(want, rel=1e-12) and total > 0
    sleep, last = real_rl.call("server1", "/sleep"), scrape_time(asleep[-1], "server1")
    before = scrape_time(real_rl.phase("resumed")[-1], "server1")
    assert 2 * (last - sleep.t1) <= total <= 2 * (last - before)
    text = real_rl.bodies["asleep"]["server1"]
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:engine_sleep_state{")]
    awake = [ln for ln in lines if 'sleep_state="awake"' in ln]
    assert len(awake) == 2 and all(ln.endswith(" 0.0") for ln in awake), lines
    fleet = real_rl.summary["inference_summary/combined/agg/sleeping_engine_seconds"]
    assert fleet == pytest.approx(total, rel=1e-12)  # nothing else slept


def test_versions_and_skew(real_rl: RLRun) -> None:
    assert real_rl.weight_info["skew"] == {"server0": "step-1", "server1": "default"}
    assert real_rl.weight_info["final"] == {"server0": "step-2", "server1": "step-2"}
    (skew,) = real_rl.phase("skew")
    k = skew.keys
    assert k["inference/rl/policy_version_index"] == 1
    assert k["inference/rl/engines_stale"] == 2  # server1's two engines missed step-1
    assert k["inference/rl/max_version_lag"] == 1
    assert k["inference/server1/weight_version_lag"] == 1
    assert k["inference/server0/weight_version_lag"] == 0
    stale = sum(
        generation_delta(d)
        for e, d in skew.result.deltas.items()
        if e.is_engine and e.endpoint == "server1"
    )
    assert k["inference/rl/stale_generation_tokens"] == stale
    (fresh,) = real_rl.phase("fresh")
    assert fresh.keys["inference/rl/engines_stale"] == 0
    assert fresh.keys["inference/rl/engines_unknown_version"] == 0
    assert real_rl.summary["inference_summary/rl/policy_versions"] == 3


def test_weight_syncs_and_the_engines_update_histograms(real_rl: RLRun) -> None:
    s1, s2 = real_rl.syncs["step-1"], real_rl.syncs["step-2"]
    upd = real_rl.call("server0", "/update_weight_version")
    assert upd.t1 - upd.t0 <= s1["inference/rl/sync/seconds"]
    assert not any("engine_update_count" in k for k in s1)  # /update_weight_version is untimed
    before = real_rl.bodies["skew"]["server0"]
    after = real_rl.bodies["final"]["server0"]
    assert RL_HIST not in before  # created lazily, at the first transfer call
    transfer = [
        c
        for c in real_rl.calls
        if c.path.startswith(("/init_weight", "/start_weight", "/update_weights", "/finish_weight"))
    ]
    first, last = min(c.t0 for c in transfer), max(c.t1 for c in transfer)
    assert last - first <= s2["inference/rl/sync/seconds"]
    for op in OPS:
        count = B.total(after, RL_HIST + "_count", operation=op)
        secs = B.total(after, RL_HIST + "_sum", operation=op)
        assert count == 1, (op, count)
        assert s2[f"inference/rl/sync/engine_update_count{{operation={op}}}"] == count
        assert s2[f"inference/rl/sync/engine_update_seconds{{operation={op}}}"] == pytest.approx(
            secs
        )
        path = {
            "init": "/init_weight_transfer_engine",
            "start": "/start_weight_update",
            "update": "/update_weights",
            "finish": "/finish_weight_update",
        }[op]
        c = real_rl.call("server0", path)
        assert 0 < secs <= c.t1 - c.t0  # the handler's own time, inside the test's call
    summary = real_rl.summary
    assert summary["inference_summary/rl/sync/count"] == 2
    assert summary["inference_summary/rl/sync/engine_update_count{operation=update}"] == 1


def test_weight_update_counts_equal_promql(real_run, real_rl: RLRun) -> None:
    name = "vllm[:_]rl_weight_update_operation_duration_seconds_count"
    got = real_run.prom.query(f'sum by (operation) ({{__name__=~"{name}"}})', real_rl.t_promql)
    counts = {r["metric"]["operation"]: r["value"] for r in got}
    assert {op: counts.get(op) for op in OPS} == dict.fromkeys(OPS, 1.0)
