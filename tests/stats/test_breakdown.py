"""The engine-time breakdown's rules (docs/rules.md §3.13), one at a time: each interval in one
class judged at its end scrape, a queue counts as saturation only when it lasted, SGLang's own
idle count, the verdict's thresholds, the latency tails, and the sums kept in a saved state."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState
from fleetscope.keys.breakdown import (
    ENGINE_BREAKDOWN_MAX,
    breakdown_keys,
    breakdown_listed_engines,
)
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.accumulate import Accumulator
from fleetscope.stats.breakdown import (
    BUSY,
    IDLE,
    PAUSED,
    PHASES,
    SATURATED,
    SYNCING,
    Phase,
    PhaseClassifier,
    VerdictThresholds,
    bottleneck_role,
    engine_phase_seconds,
    scope_phase_seconds,
    shares,
    verdict,
)
from fleetscope.stats.reduce import EngineInput
from fleetscope.stats.tails import TAIL_FACTOR, count_above, tail_engines
from fleetscope.stats.windows import WindowSet
from support.paths import ROOT

WALL = 1_795_970_000.0


def body(
    running: float = 0,
    waiting: float = 0,
    capacity: float | None = None,
    kv: float = 0.1,
    preemptions: float = 0,
    engines: int = 1,
    served: float | None = None,
) -> str:
    """A vLLM body with the gauges the classes are judged on (``capacity``: the waiting queue
    broken down by reason, the rest ``deferred``)."""
    lines: list[str] = []

    def family(name: str, kind: str, value: float, extra: str = "") -> None:
        lines.append(f"# TYPE {name} {kind}")
        for e in range(engines):
            lines.append(f'{name}{{engine="{e}",model_name="m"{extra}}} {value}')

    family("vllm:num_requests_running", "gauge", running)
    family("vllm:num_requests_waiting", "gauge", waiting)
    if capacity is not None:
        lines.append("# TYPE vllm:num_requests_waiting_by_reason gauge")
        for e in range(engines):
            for reason, v in (("capacity", capacity), ("deferred", waiting - capacity)):
                lines.append(
                    f'vllm:num_requests_waiting_by_reason{{engine="{e}",model_name="m",'
                    f'reason="{reason}"}} {v}'
                )
    family("vllm:kv_cache_usage_perc", "gauge", kv)
    lines.append("# TYPE vllm:num_preemptions counter")
    for e in range(engines):
        lines.append(f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} {preemptions}')
    if served is not None:  # the running seconds of the finished requests (their sum)
        name = "vllm:request_inference_time_seconds"
        lines.append(f"# TYPE {name} histogram")
        for e in range(engines):
            labels = f'engine="{e}",model_name="m"'
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {served}')
            lines.append(f"{name}_count{{{labels}}} {served}")
            lines.append(f"{name}_sum{{{labels}}} {served}")
    return "\n".join(lines) + "\n"


class Feed:
    """Bodies of one endpoint, one per poll, 5 s apart, through a fleet state."""

    def __init__(self) -> None:
        self.state = FleetState()
        self.parser = Parser()
        self.t = 0.0

    def poll(self, text: str, name: str = "ep") -> list[EngineInput]:
        self.t += 5.0
        expo = self.parser.parse(text, time=self.t, wall_time=WALL + self.t)
        return self.state.observe([ScrapeResult(name, expo, self.t, WALL + self.t)]).inputs


def classes(
    c: PhaseClassifier,
    inputs: list[EngineInput],
    held: list[bool] | None = None,
    syncing: bool = False,
) -> list[Phase | None]:
    return c.classify(inputs, held, syncing=syncing)


def test_each_interval_is_one_class_judged_at_its_end_scrape() -> None:
    f, c = Feed(), PhaseClassifier()
    assert classes(c, f.poll(body())) == [None]  # a baseline covers no time
    assert classes(c, f.poll(body())) == [(IDLE, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=3))) == [(BUSY, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=3, kv=0.95))) == [(SATURATED, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=3, preemptions=2))) == [(SATURATED, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=3, preemptions=2))) == [(BUSY, 5.0, 0.0)]  # none new
    # a queue at the end only is an arrival the next engine step admits; at both ends, it lasted
    assert classes(c, f.poll(body(running=3, waiting=2))) == [(BUSY, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=3, waiting=4))) == [(SATURATED, 5.0, 0.0)]
    assert classes(c, f.poll(body(running=0, waiting=1))) == [(SATURATED, 5.0, 0.0)]
    assert classes(c, f.poll(body())) == [(IDLE, 5.0, 0.0)]


def test_requests_between_two_idle_scrapes_count_their_running_seconds() -> None:
    """Requests shorter than the interval can start and finish between two scrapes that both
    find nothing to do: their running seconds (vLLM's own) are busy, at most the interval."""
    f, c = Feed(), PhaseClassifier()
    assert classes(c, f.poll(body(served=0.0))) == [None]  # the baseline: nothing to do
    assert classes(c, f.poll(body(served=1.5))) == [(BUSY, 1.5, 3.5)]
    assert classes(c, f.poll(body(served=1.5))) == [(IDLE, 5.0, 0.0)]
    assert classes(c, f.poll(body(served=10.0))) == [(BUSY, 5.0, 0.0)]  # overlapping ones
    assert classes(c, f.poll(body(running=2, served=11.0))) == [(BUSY, 5.0, 0.0)]
    # busy at its start: its end decides, as for any interval (one interval per change)
    assert classes(c, f.poll(body(served=40.0))) == [(IDLE, 5.0, 0.0)]
    # summed per engine: the busy part and the idle part of the split interval
    ws = WindowSet()
    f, c = Feed(), PhaseClassifier()
    for served in (0.0, 1.5, 1.5):
        inputs = f.poll(body(served=served))
        ws.attribute(inputs, now=f.t, phases=c.classify(inputs))
    (es,) = [a for a in ws.run["combined"].engines.values() if a.is_engine]
    assert es.phases == [8.5, 1.5, 0.0, 0.0, 0.0]


def test_requests_deferred_for_remote_kv_are_not_the_engines_work() -> None:
    f, c = Feed(), PhaseClassifier()
    f.poll(body(waiting=3, capacity=0))
    assert classes(c, f.poll(body(waiting=3, capacity=0))) == [(IDLE, 5.0, 0.0)]
    assert classes(c, f.poll(body(waiting=3, capacity=1))) == [(BUSY, 5.0, 0.0)]
    assert classes(c, f.poll(body(waiting=3, capacity=1))) == [(SATURATED, 5.0, 0.0)]


def test_syncing_then_paused_come_first() -> None:
    f, c = Feed(), PhaseClassifier()
    f.poll(body(engines=2))
    inputs = f.poll(body(running=5, kv=0.99, engines=2))
    assert classes(c, inputs, held=[True, False]) == [(PAUSED, 5.0, 0.0), (SATURATED, 5.0, 0.0)]
    inputs = f.poll(body(running=5, kv=0.99, engines=2))
    assert classes(c, inputs, held=[True, False], syncing=True) == [(SYNCING, 5.0, 0.0)] * 2


def test_what_cannot_be_judged_is_left_out() -> None:
    f, c = Feed(), PhaseClassifier()
    text = "# TYPE vllm:generation_tokens counter\n"
    text += 'vllm:generation_tokens_total{engine="0"} 5\nprocess_start_time_seconds 1.0\n'
    f.poll(text)
    inputs = f.poll(text.replace(" 5\n", " 9\n"))
    assert [i.is_engine for i in inputs] == [True, False]
    assert classes(c, inputs) == [None, None]  # no gauge to judge; an endpoint's row
    assert classes(c, inputs, held=[True, False]) == [(PAUSED, 5.0, 0.0), None]
    # without a gauge, its start is unknown: it may have had work (no short-request split)
    assert classes(c, f.poll(body(served=2.0))) == [(IDLE, 5.0, 0.0)]
    assert classes(c, f.poll(body(served=3.0))) == [(BUSY, 1.0, 4.0)]


def test_a_kv_threshold_of_the_users() -> None:
    f, c = Feed(), PhaseClassifier(kv_full=0.8)
    f.poll(body())
    assert classes(c, f.poll(body(running=1, kv=0.85))) == [(SATURATED, 5.0, 0.0)]


def test_sglangs_own_idle_count_decides_its_idle_time() -> None:
    """SGLang counts the seconds its scheduler had nothing to do: over a window, those are
    its idle engine-seconds (at most its seconds neither paused nor syncing)."""
    data = ROOT / "tests" / "data" / "sglang-0.5.23"
    idle, after = (data / "dp2_idle.prom").read_text(), (data / "dp2_after.prom").read_text()
    f = Feed()
    ws = WindowSet()
    c = PhaseClassifier()
    for text in (idle, after):
        inputs = f.poll(text)
        ws.attribute(inputs, now=f.t, phases=c.classify(inputs))
    engines = {e: a for e, a in ws.run["combined"].engines.items() if a.is_engine}
    assert len(engines) == 2
    for es in engines.values():
        judged = list(es.phases)
        assert sum(judged) == 5.0 and judged[IDLE] == 0.0  # requests queued at the end
        p = engine_phase_seconds(es)
        assert p[IDLE] == 5.0  # its own count says 7.5 s: capped at the 5 s it was judged
        assert math.fsum(p) == 5.0
    # the cap: what is left after its own idle count stays saturated at most as judged
    es = next(iter(engines.values()))
    es.phases = [0.0, 4.0, 6.0, 3.0, 0.0]  # 10 s judged busy or saturated
    assert engine_phase_seconds(es) == [7.5, 0.0, 2.5, 3.0, 0.0]


def test_the_idle_counter_is_a_catalog_family() -> None:
    from fleetscope import catalog

    family = catalog.FAMILY_BY_NAME[catalog.SCHEDULER_IDLE_FAMILY]
    assert (family.engine, family.type) == ("sglang", "counter")


def test_verdict_thresholds() -> None:
    t = VerdictThresholds()
    assert verdict([0.95, 0.05, 0, 0, 0]) == "engines_idle"
    assert verdict([t.idle - 0.01, 1 - t.idle + 0.01, 0, 0, 0]) == "balanced"
    assert verdict([0.0, 0.4, 0.6, 0, 0]) == "engines_saturated"
    assert verdict([0.0, 0.8, 0.0, 0.0, 0.2]) == "weight_sync"
    assert verdict([0.0, 0.75, 0.0, 0.25, 0.0]) == "paused"
    # several qualify: the largest share; a tie goes to syncing, paused, saturated, idle
    assert verdict([0.5, 0.0, 0.0, 0.2, 0.3]) == "engines_idle"
    assert verdict([0.0, 0.2, 0.4, 0.0, 0.4]) == "weight_sync"
    assert verdict([0.0, 0.0, 0.0, 1.0, 0.0], VerdictThresholds(paused=1.01)) == "balanced"


def test_the_bottleneck_role_is_the_busier_side() -> None:
    idle, busy, saturated = [0.9, 0.1, 0, 0, 0], [0.1, 0.9, 0, 0, 0], [0, 0.5, 0.5, 0, 0]
    assert bottleneck_role({"prefill": idle, "decode": saturated}) == "decode"
    assert bottleneck_role({"prefill": saturated, "decode": busy}) == "prefill"
    assert bottleneck_role({"prefill": idle, "decode": busy}) == "decode"
    assert bottleneck_role({"decode": busy}) is None
    assert bottleneck_role({"prefill": idle, "decode": idle}) is None  # no side stands out
    assert shares([0, 0, 0, 0, 0]) is None
    assert shares([1, 3, 0, 0, 0]) == [0.25, 0.75, 0, 0, 0]


def test_count_above_interpolates_in_the_bucket_that_holds_the_value() -> None:
    bounds = (1.0, 2.0, 4.0, math.inf)
    counts = np.array([10.0, 30.0, 40.0, 42.0])
    assert count_above(bounds, counts, 2.0) == 12.0
    assert count_above(bounds, counts, 3.0) == 7.0  # half of (2, 4]'s 10, and the +Inf 2
    assert count_above(bounds, counts, 0.5) == 37.0  # the lowest bucket starts at 0
    assert count_above(bounds, counts, 5.0) == 2.0


def test_a_slow_engine_holds_the_tail_alike_engines_do_not() -> None:
    bounds = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
    fast = np.array([90.0, 99.0, 100.0, 100.0, 100.0, 100.0])
    slow = np.array([10.0, 40.0, 70.0, 90.0, 100.0, 100.0])
    alike = [(f"e{i}", bounds, fast) for i in range(4)]
    assert tail_engines(alike, 1.0) == []
    rows = [*alike[:3], ("slow", bounds, slow)]
    (held,) = tail_engines(rows, 4.0)
    assert held.engine == "slow" and held.tail_share == 1.0
    assert held.observation_share == 0.25 and held.tail_share >= TAIL_FACTOR * 0.25
    assert held.p99 > 4.0
    assert tail_engines([("slow", bounds, slow)], 4.0) == []  # alone, it is the scope
    few = [(e, b, c / 10) for e, b, c in rows]
    assert tail_engines(few, 4.0) == []  # 40 observations: a p99 of so few says nothing


def test_phases_survive_a_saved_state_and_old_states_load() -> None:
    f, c = Feed(), PhaseClassifier()
    ws = WindowSet()
    ws.start("train", 0.0)
    for text in (body(), body(running=2), body(running=2, kv=0.99)):
        inputs = f.poll(text, name="ep")
        ws.attribute(inputs, now=f.t, phases=c.classify(inputs))
    state = json.loads(json.dumps(ws.state_dict()))
    back = WindowSet()
    back.load_state_dict(state)
    (es,) = [a for a in back.run["combined"].engines.values() if a.is_engine]
    assert es.phases == [0.0, 5.0, 5.0, 0.0, 0.0]
    (open_acc,) = [o["acc"] for o in state["open"]]
    for e in open_acc["engines"]:
        del e["phases"]  # a state saved before the breakdown existed
    old = Accumulator.from_state_dict(open_acc)
    assert all(a.phases == [0.0] * len(PHASES) for a in old.engines.values())
    # a window's sums fold into its run label with their phases
    back.stop("train", f.t)
    (es,) = [a for a in back.run["train"].engines.values() if a.is_engine]
    assert es.phases == [0.0, 5.0, 5.0, 0.0, 0.0]


def test_scopes_sum_their_engines_and_large_fleets_key_only_the_extremes() -> None:
    f, c = Feed(), PhaseClassifier()
    acc = Accumulator("x")
    for text in (body(engines=70), body(running=1, engines=70)):
        inputs = f.poll(text)
        acc.add(inputs, phases=c.classify(inputs))
    scopes, per_engine = scope_phase_seconds(acc.engines)
    assert scopes == {"agg": [0.0, 350.0, 0.0, 0.0, 0.0]}
    assert len(per_engine) == 70 > ENGINE_BREAKDOWN_MAX
    per_engine["ep.3"] = [5.0, 0.0, 0.0, 0.0, 0.0]
    per_engine["ep.9"] = [0.0, 1.0, 4.0, 0.0, 0.0]
    listed = breakdown_listed_engines(per_engine, dict.fromkeys(per_engine))
    assert listed == ["ep.3", "ep.9"]
    stats = acc.stats()
    assert stats is not None
    keys = breakdown_keys(acc.engines, stats, "inference/x", summary=False)
    assert keys["inference/x/agg/engine_time/busy_share"] == 1.0
    # engines alike: the most idle and the most saturated are one (the first), six keys
    engine_keys = [k for k in keys if k.startswith("inference/x/ep.")]
    assert len(engine_keys) == 6 and set(engine_keys) <= keys.full_only
    assert not [k for k in keys if k.startswith("inference/x/agg/") and k in keys.full_only]
    assert pytest.approx(1.0) == sum(keys[f"inference/x/agg/engine_time/{p}_share"] for p in PHASES)
