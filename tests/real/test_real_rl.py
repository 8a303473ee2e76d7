"""RL figures against real vLLM servers (tests/real/rl_scenario.py): paused / asleep
engine-seconds, served versions and skew (every poll, per role, over a window), weight syncs,
the weight-update and sleep-mode histograms, checked against what the test did and timed, the
scraped bodies and PromQL."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from fleetscope.collector.core import FleetView
from fleetscope.identity import EngineId
from fleetscope.rl.engine_deltas import generation_delta
from fleetscope.sinks.terminal import window_lines
from real import bodies as B
from real.rl_scenario import ROLES, VERSIONS, WINDOW, Call, RLRun
from real.scenario import RealRun

OPS = ("init", "start", "update", "finish")
RL_HIST = "vllm:rl_weight_update_operation_duration_seconds"
SLEEP_HIST = "vllm:sleep_mode_operation_duration_seconds"
TRANSFER = {
    "init": "/init_weight_transfer_engine",
    "start": "/start_weight_update",
    "update": "/update_weights",
    "finish": "/finish_weight_update",
}
SLEEP_OPS = {"sleep": "/sleep", "wake": "/wake_up"}
# family -> (the only endpoint that calls it, operation -> the route it times, the phase whose
# body is from before its first call: the families are created lazily)
HISTS = {
    "rl": (RL_HIST, "server0", TRANSFER, "skew"),
    "sleep": (SLEEP_HIST, "server1", SLEEP_OPS, "paused"),
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
REL = 1e-9
# boundary polls hold their tokens for the next regular row (docs/rl-lifecycle.md §3)
BOUNDARY = {"window_start", "window_stop", "sync1_enter", "sync1_exit", "sync2_enter", "sync2_exit"}
STALE = "inference/rl/stale_generation_tokens"


def engines(view: FleetView, endpoint: str) -> dict[EngineId, float]:
    """Each engine of ``endpoint`` in this poll: its interval seconds."""
    return {
        e: d.seconds
        for e, d in view.result.deltas.items()
        if e.is_engine and e.endpoint == endpoint and not d.baseline_only
    }


def scrape_time(view: FleetView, endpoint: str) -> float:
    (sc,) = [s for s in view.result.scrapes if s.endpoint == endpoint]
    return sc.time


def tokens(view: FleetView, endpoint: str) -> float:
    """Tokens the endpoint's engines generated in this poll's interval (exact deltas)."""
    return sum(
        generation_delta(d)
        for e, d in view.result.deltas.items()
        if e.is_engine and e.endpoint == endpoint
    )


def known(view: FleetView, endpoint: str) -> bool:
    """The collector knew the endpoint's served version at this poll (an announced one)."""
    return f"inference/{endpoint}/weight_version_index" in view.keys


def lag(run: RLRun, i: int, endpoint: str) -> int:
    """How many announced versions the endpoint was behind at view ``i``, by the test's calls."""
    policy, served = run.truth[i]
    assert policy is not None
    return VERSIONS.index(policy) - VERSIONS.index(served[endpoint])


def stale_tokens(run: RLRun, i: int, endpoints: Iterable[str] | None = None) -> float:
    """View ``i``'s stale tokens by the rule: engines of endpoints the collector knew at that
    poll and that served an older version than the trainer's, by the test's own calls."""
    _, view = run.views[i]
    return sum(
        tokens(view, ep) for ep in endpoints or run.urls if known(view, ep) and lag(run, i, ep) > 0
    )


def calls(run: RLRun, server: str, path: str) -> list[Call]:
    return [c for c in run.calls if c.server == server and c.path == path]


def prom_by_operation(real_run: RealRun, expr: str, t: float) -> dict[str, float]:
    return {r["metric"]["operation"]: r["value"] for r in real_run.prom.query(expr, t)}


def test_every_rl_call_answered(real_rl: RLRun) -> None:
    """What works on CPU: pause / resume / sleep / wake_up / versions, and the ipc weight
    transfer with an empty chunk (a real chunk needs CUDA IPC: not tried, it kills the engine)."""
    bad = [(c.server, c.path, c.status, c.answer) for c in real_rl.calls if c.status != 200]
    assert not bad, bad
    assert real_rl.call("server0", "/is_paused").answer == {"is_paused": True}
    assert real_rl.load["total"]["ok"] == real_rl.load["total"]["sent"] > 0
    assert real_rl.load2["total"]["ok"] == real_rl.load2["total"]["sent"] > 0


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
    # the sleep-mode histogram: created at the first /sleep, one observation per call
    assert SLEEP_HIST not in real_rl.bodies["paused"]["server1"]
    final = real_rl.bodies["final"]["server1"]
    for op, path in SLEEP_OPS.items():
        done = calls(real_rl, "server1", path)
        child = f"sleep_mode_operation_duration_seconds{{operation={op}}}"
        run = f"inference_summary/combined/server1/{child}"
        assert len(done) == 1
        assert real_rl.summary[f"{run}/delta"] == B.total(
            final, SLEEP_HIST + "_count", operation=op
        )
        assert real_rl.summary[f"{run}/delta"] == len(done), op
        secs = B.total(final, SLEEP_HIST + "_sum", operation=op)
        assert real_rl.summary[f"{run}_sum/delta"] == pytest.approx(secs, rel=1e-12)
        assert 0 < secs <= done[0].t1 - done[0].t0  # the handler's own time, inside the call
        assert real_rl.summary[f"inference_summary/combined/agg/{child}/delta"] == len(done)
    assert SLEEP_HIST not in real_rl.bodies["final"]["server0"]


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
    # per role: server0 is `prefill`, server1 (2 engines, stale) `decode`
    assert k["inference/rl/decode/engines_stale"] == 2
    assert k["inference/rl/prefill/engines_stale"] == 0
    assert k["inference/rl/decode/max_version_lag"] == 1
    assert k["inference/rl/prefill/max_version_lag"] == 0
    assert k["inference/rl/decode/stale_generation_tokens"] == stale
    assert k["inference/rl/prefill/stale_generation_tokens"] == 0
    (fresh,) = real_rl.phase("fresh")
    assert fresh.keys["inference/rl/engines_stale"] == 0
    assert fresh.keys["inference/rl/engines_unknown_version"] == 0
    assert real_rl.summary["inference_summary/rl/policy_versions"] == 3
    for ep in real_rl.urls:
        got = real_rl.summary[f"inference_summary/endpoints/{ep}/weight_version"]
        assert got == real_rl.weight_info["final"][ep] == "step-2"


def test_every_poll_judges_versions_by_what_the_test_set(real_rl: RLRun) -> None:
    """Every poll once a version is announced (boundary polls too): the policy index, and per
    endpoint the served index and lag when known, equal what the test's own calls set (checked
    against the /weight_info answers it fetched); engines stale / unknown per role and for the
    fleet; a regular row's stale tokens are its interval's plus the held boundary polls'."""
    for phase, served in real_rl.served_at.items():
        assert real_rl.weight_info[phase] == served, phase
    held = 0.0
    judged = 0
    for i, (phase, view) in enumerate(real_rl.views):
        policy, served = real_rl.truth[i]
        k = view.keys
        if policy is None:
            assert "inference/rl/policy_version_index" not in k, phase
            continue
        judged += 1
        assert k["inference/rl/policy_version_index"] == VERSIONS.index(policy), phase
        fleet_stale = fleet_unknown = 0
        for ep, role in ROLES.items():
            n = sum(1 for e in view.result.deltas if e.is_engine and e.endpoint == ep)
            stale = unknown = 0
            if known(view, ep):
                assert k[f"inference/{ep}/weight_version_index"] == VERSIONS.index(served[ep])
                assert k[f"inference/{ep}/weight_version_lag"] == lag(real_rl, i, ep)
                stale = n if lag(real_rl, i, ep) > 0 else 0
            else:
                assert f"inference/{ep}/weight_version_lag" not in k, (phase, ep)
                unknown = n
            assert k[f"inference/rl/{role}/engines_stale"] == stale, (phase, ep)
            assert k[f"inference/rl/{role}/engines_unknown_version"] == unknown, (phase, ep)
            fleet_stale += stale
            fleet_unknown += unknown
        assert k["inference/rl/engines_stale"] == fleet_stale, phase
        assert k["inference/rl/engines_unknown_version"] == fleet_unknown, phase
        if phase in BOUNDARY:
            assert STALE not in k, phase
            held += stale_tokens(real_rl, i)
        else:
            assert k[STALE] == stale_tokens(real_rl, i) + held, phase
            held = 0.0
    assert judged >= 20, judged


def test_window_versions_lags_and_stale_tokens(real_rl: RLRun) -> None:
    """Window ``rollout`` (from just before the first sync to just after the last version
    update): per endpoint the oldest / newest / last version served at its polls, the largest
    lag, fleet and per role, and its stale tokens: the sum of its polls' (its start poll's
    interval is before it), never more than server1's own counter increased around it."""
    w, summary = real_rl.window, real_rl.summary
    inside = real_rl.span("window_start", "window_stop")[1:]
    head = f"inference/{WINDOW}"
    # the versions the test set, by the /weight_info answers it fetched around the window
    start, final = real_rl.weight_info["window_start"], real_rl.weight_info["final"]
    assert start == dict.fromkeys(real_rl.urls, "default")
    assert final == dict.fromkeys(real_rl.urls, "step-2")
    for ep in real_rl.urls:
        seen = [
            VERSIONS.index(real_rl.truth[i][1][ep])
            for i in inside
            if known(real_rl.views[i][1], ep)
        ]
        got = [w[f"{head}/{ep}/weight_version_index/{s}"] for s in ("oldest", "newest", "last")]
        assert got == [min(seen), max(seen), seen[-1]], (ep, seen)
        assert got[1:] == [VERSIONS.index(final[ep])] * 2, ep
        run = [
            summary[f"inference_summary/{WINDOW}/{ep}/weight_version_index/{s}"]
            for s in ("oldest", "newest", "last")
        ]
        assert run == got, ep
    # server1 was known at the skew poll, still at vLLM's initial version
    assert w[f"{head}/server1/weight_version_index/oldest"] == VERSIONS.index(start["server1"])
    # the largest lag, fleet and per role (server0 is never behind)
    lags = {
        ep: [lag(real_rl, i, ep) for i in inside if known(real_rl.views[i][1], ep)]
        for ep in real_rl.urls
    }
    assert w[f"{head}/rl/max_version_lag"] == max(max(v) for v in lags.values()) >= 1
    for ep, role in ROLES.items():
        assert w[f"{head}/rl/{role}/max_version_lag"] == max(lags[ep]), role
    assert max(lags["server0"]) == 0
    # stale tokens: the sum of the window's polls', all of them server1's
    stale = w[f"{head}/rl/stale_generation_tokens"]
    assert stale == sum(stale_tokens(real_rl, i) for i in inside)
    assert summary[f"inference_summary/{WINDOW}/rl/stale_generation_tokens"] == stale
    grew = {
        ep: B.total(real_rl.bodies["final"][ep], "vllm:generation_tokens_total")
        - B.total(real_rl.bodies["window_start"][ep], "vllm:generation_tokens_total")
        for ep in real_rl.urls
    }
    assert 0 < stale <= grew["server1"], (stale, grew)
    # every token of the window, and those of unknown version status
    total = {ep: sum(tokens(real_rl.views[i][1], ep) for i in inside) for ep in real_rl.urls}
    assert w[f"{head}/rl/generation_tokens"] == sum(total.values())
    unknown = sum(
        tokens(v, ep)
        for i in inside
        for ep in real_rl.urls
        if not known(v := real_rl.views[i][1], ep)
    )
    assert w[f"{head}/rl/unknown_version_generation_tokens"] == unknown
    for ep, role in ROLES.items():
        assert total[ep] <= grew[ep], ep
        assert w[f"{head}/rl/{role}/generation_tokens"] == total[ep], role
        want = sum(stale_tokens(real_rl, i, [ep]) for i in inside)
        assert w[f"{head}/rl/{role}/stale_generation_tokens"] == want, role
    assert w[f"{head}/rl/prefill/stale_generation_tokens"] == 0
    assert w[f"{head}/rl/decode/stale_generation_tokens"] == stale


def test_weight_syncs_and_the_engines_update_histograms(real_rl: RLRun) -> None:
    s1, s2 = real_rl.syncs["step-1"], real_rl.syncs["step-2"]
    upd = real_rl.call("server0", "/update_weight_version")
    assert upd.t1 - upd.t0 <= s1["inference/rl/sync/seconds"]
    # both boundary polls are inside the `async with`: at most the test's own wall time
    for version, s in real_rl.syncs.items():
        entered, left = real_rl.sync_walls[version]
        assert s["inference/rl/sync/seconds"] <= left - entered, version
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


def test_weight_update_counts_equal_promql(real_run: RealRun, real_rl: RLRun) -> None:
    name = "vllm[:_]rl_weight_update_operation_duration_seconds_count"
    got = real_run.prom.query(f'sum by (operation) ({{__name__=~"{name}"}})', real_rl.t_promql)
    counts = {r["metric"]["operation"]: r["value"] for r in got}
    assert {op: counts.get(op) for op in OPS} == dict.fromkeys(OPS, 1.0)


@pytest.mark.parametrize("kind", sorted(HISTS))
def test_operation_histograms_equal_promql(real_run: RealRun, real_rl: RLRun, kind: str) -> None:
    """Per operation: the calls, the seconds (``_sum``) and p50/p90/p99 of fleetscope's run
    summary for the endpoint (and its role and the fleet) equal PromQL over the real
    Prometheus's scrapes at ``t_promql``. The family is created at its first call (absent in
    the body of an earlier phase, and never on the other server), so PromQL's cumulative
    values are the increase over the run."""
    family, ep, routes, before = HISTS[kind]
    assert family not in real_rl.bodies[before][ep]
    (other,) = [e for e in real_rl.urls if e != ep]
    assert family not in real_rl.bodies["final"][other]
    t, base = real_rl.t_promql, family.removeprefix("vllm:")
    sel = f'__name__=~"vllm[:_]{base}_{{}}",instance="{real_run.targets[ep]}"'

    def series(part: str) -> str:
        return "{" + sel.format(part) + "}"

    counts = prom_by_operation(real_run, f"sum by (operation) ({series('count')})", t)
    seconds = prom_by_operation(real_run, f"sum by (operation) ({series('sum')})", t)
    assert set(counts) == set(routes), counts
    final = real_rl.bodies["final"][ep]
    summary = real_rl.summary
    for op, route in routes.items():
        child = f"{base}{{operation={op}}}"
        run = f"inference_summary/combined/{ep}/{child}"
        n = len(calls(real_rl, ep, route))
        assert summary[f"{run}/delta"] == counts[op] == n, op
        assert seconds[op] == B.total(final, family + "_sum", operation=op)  # same scrape value
        assert summary[f"{run}_sum/delta"] == pytest.approx(seconds[op], rel=1e-12), op
        for scope in ("agg", ROLES[ep]):
            got = summary[f"inference_summary/combined/{scope}/{child}_sum/delta"]
            assert got == pytest.approx(seconds[op], rel=1e-12), (op, scope)
        buckets = f"sum by (le, operation) ({series('bucket')})"
        for stat, q in QUANTILES.items():
            (want,) = [
                r["value"]
                for r in real_run.prom.query(f"histogram_quantile({q}, {buckets})", t)
                if r["metric"]["operation"] == op
            ]
            assert math.isfinite(want) and want > 0, (op, stat, want)
            got = summary[f"{run}/{stat}"]
            assert got == pytest.approx(want, rel=REL, abs=1e-12), (op, stat)
        if kind == "rl":  # the weight transfer: in the second sync and in the window
            s2 = real_rl.syncs["step-2"]
            got = s2[f"inference/rl/sync/engine_update_seconds{{operation={op}}}"]
            assert got == pytest.approx(seconds[op], rel=1e-12), op
            win = f"inference/{WINDOW}/{ep}/{child}"
            assert real_rl.window[f"{win}/delta"] == n, op
            assert real_rl.window[f"{win}_sum/delta"] == pytest.approx(seconds[op], rel=1e-12)


def test_engine_time_of_the_window_follows_its_polls_and_syncs(real_rl: RLRun) -> None:
    """The engine-time breakdown (docs/rules.md §3.13) over the window: its engine-seconds are
    the engines' own intervals of its polls, and its syncing ones those of the two syncs' polls
    (from each entry poll, exclusive, to its exit poll), to the float."""
    names = [p for p, _ in real_rl.views]

    def seconds(first: str, last: str) -> float:
        """Engine-seconds of the polls after ``first`` up to ``last`` (inclusive)."""
        i, j = names.index(first), names.index(last)
        return math.fsum(
            inp.delta.seconds
            for _, view in real_rl.views[i + 1 : j + 1]
            for inp in view.result.inputs
            if inp.is_engine and not inp.delta.baseline_only
        )

    b = f"inference/{WINDOW}/agg/engine_time"
    w = real_rl.window
    print("\nengine time, window rollout:", *window_lines(w))
    total = w[f"{b}/engine_seconds"]
    assert total == pytest.approx(seconds("window_start", "window_stop"), rel=1e-9)
    phases = ("idle", "busy", "saturated", "paused", "syncing")
    assert math.fsum(w[f"{b}/{p}_share"] for p in phases) == pytest.approx(1.0, abs=1e-12)
    syncing = seconds("sync1_enter", "sync1_exit") + seconds("sync2_enter", "sync2_exit")
    assert total * w[f"{b}/syncing_share"] == pytest.approx(syncing, rel=1e-9)
    verdicts = {"engines_idle", "engines_saturated", "weight_sync", "paused", "balanced"}
    assert real_rl.summary[f"inference_summary/{WINDOW}/bottleneck"] in verdicts
    # before the window: server0's pause and server1's sleep were `paused`, each of its engines
    # for at least the polls the test made while it lasted
    s = real_rl.summary
    for endpoint, phase in (("server0", "paused"), ("server1", "asleep")):
        held = [v for p, v in real_rl.views if p == phase]
        least = math.fsum(
            inp.delta.seconds
            for view in held
            for inp in view.result.inputs
            if inp.is_engine and inp.engine_id.startswith(endpoint + ".")
        )
        got = sum(
            s[f"inference_summary/combined/{e}/engine_time/engine_seconds"]
            * s[f"inference_summary/combined/{e}/engine_time/paused_share"]
            for e in {i.engine_id for v in held for i in v.result.inputs if i.is_engine}
            if e.startswith(endpoint + ".")
        )
        assert least > 0 and got >= least - 1e-9, (endpoint, got, least)
