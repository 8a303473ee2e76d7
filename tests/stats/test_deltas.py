"""Per-engine, per-series deltas (docs/rules.md §3.1-3.3, 3.7): one named test per rule.

Inputs are the real captures, edited in memory; expected values are read straight from the
text of the bodies, never from fleetscope.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

import numpy as np
import pytest

from fleetscope.exposition import Parser
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.identity import EngineId
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.baselines import Baselines
from fleetscope.stats.deltas import EngineDelta, engine_delta
from support.bodies import drop_lines, sample_value, sample_values, set_values
from support.paths import fixture_text

WALL = 1_795_970_000.0  # Unix time of monotonic 0 in these tests (after the captures' start)
IDLE = fixture_text("single_idle.prom")
LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
DP_IDLE = fixture_text("dp2_idle.prom")
DP_LOAD = fixture_text("dp2_load.prom")

GEN = r'^vllm:generation_tokens_total\{engine="0"'
PROMPT = r'^vllm:prompt_tokens_total\{engine="0"'
LENGTH = r'^vllm:request_success_total\{engine="0",finished_reason="length"'
TTFT_COUNT = r'^vllm:time_to_first_token_seconds_count\{engine="0"'
CUMULATIVE = r"^vllm:\w+(_total|_bucket|_count|_sum)\{"
LATE_CREATED = (
    r'^vllm:request_success_created\{.*"length"|^vllm:request_queue_time_seconds_created\{'
)


def snap(body: str, t: float, engine: str = "0", parser: Parser | None = None) -> EngineSnapshot:
    return (parser or Parser()).parse(body, time=t, wall_time=WALL + t)[engine]


def delta_of(d: EngineDelta, series: str, **labels: str) -> float:
    from fleetscope.exposition.snapshot import format_series

    sid = format_series(series, tuple(sorted(labels.items())))
    return float(d.delta[d.layout.index[sid]])


def text_delta(prev: str, cur: str, pattern: str) -> float:
    return sample_value(cur, pattern) - sample_value(prev, pattern)


def assert_all_exact(
    d: EngineDelta,
    prev_body: str,
    cur_body: str,
    engine: str = "0",
    skip: Collection[str] = (),
) -> None:
    """Every counter / bucket / count / sum of ``engine`` has delta = cur - prev (from text)."""
    prev = Parser().parse(prev_body)[engine]
    cur = Parser().parse(cur_body)[engine]
    checked = 0
    for i in d.layout.cumulative.tolist() + [h.sum for h in d.layout.histograms]:
        sid = d.layout.slot_ids[i]
        if sid in skip or sid not in prev.layout.index:
            continue
        assert d.delta[i] == pytest.approx(cur[sid] - prev[sid], abs=1e-9), sid
        checked += 1
    assert checked > 50


# --------------------------------------------------------------------------- 3.1 plain deltas


def test_delta_is_current_minus_baseline_with_the_engines_own_seconds() -> None:
    d = engine_delta(snap(LOAD, 100.0), snap(AFTER, 112.5))
    assert d.seconds == 12.5
    assert not d.restarted and not d.baseline_only and d.series_reset == 0
    assert delta_of(d, "vllm:generation_tokens_total") == 1998 - 25
    assert delta_of(d, "vllm:prompt_tokens_total") == 15472 - 2550
    assert delta_of(d, "vllm:request_success_total", finished_reason="length") == 49
    assert delta_of(d, "vllm:time_to_first_token_seconds_bucket", le="0.25") == (
        text_delta(LOAD, AFTER, r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.25"')
    )
    assert_all_exact(d, LOAD, AFTER)
    # gauges and `_created` carry no increase
    assert math.isnan(delta_of(d, "vllm:num_requests_running"))
    assert math.isnan(delta_of(d, "vllm:generation_tokens_created"))


def test_first_observation_is_only_a_baseline() -> None:
    b = Baselines()
    d = b.advance("server0.0", snap(AFTER, 0.0))
    assert d.baseline_only and d.seconds == 0.0
    assert np.isnan(d.delta).all()


# --------------------------------------------------------------------------- 3.2 resets


def test_reset_of_one_counter_leaves_others_intact() -> None:
    cur_body = set_values(AFTER, GEN, 5.0)  # dropped below the baseline's 25: restarted at 0
    d = engine_delta(snap(LOAD, 0.0), snap(cur_body, 10.0))
    assert not d.restarted
    assert d.series_reset == 1
    assert delta_of(d, "vllm:generation_tokens_total") == 5.0
    assert_all_exact(d, LOAD, cur_body, skip={"vllm:generation_tokens_total"})


def test_reset_of_one_histogram_child_resets_the_whole_child_only() -> None:
    # TTFT restarted: its count (and every bucket/sum) is now below the baseline's
    ttft_all = r"^vllm:time_to_first_token_seconds_(bucket|count|sum)\{"
    cur_body = set_values(AFTER, ttft_all, lambda v: min(v, 1.0) * 0.5)
    d = engine_delta(snap(LOAD, 0.0), snap(cur_body, 10.0))
    assert not d.restarted and d.series_reset == 1
    cur = snap(cur_body, 10.0)
    (h,) = [h for h in d.layout.histograms if h.name == "vllm:time_to_first_token_seconds"]
    for s in (*h.buckets, h.sum, h.count):
        assert d.delta[s] == cur.data[s]  # the whole child counts from 0
    ttft = {d.layout.slot_ids[s] for s in (*h.buckets, h.sum, h.count)}
    assert_all_exact(d, LOAD, cur_body, skip=ttft)


def test_created_reset_counts_the_new_value_even_when_it_grew() -> None:
    """A series re-created (its `_created` moved) is reset even though its value is now above
    the baseline's: a decrease-only rule would count 15472 - 2550."""
    created = r'^vllm:prompt_tokens_created\{engine="0"'
    cur_body = set_values(AFTER, created, lambda v: v + 300.0)
    d = engine_delta(snap(LOAD, 0.0), snap(cur_body, 10.0))
    assert not d.restarted and d.series_reset == 1
    assert delta_of(d, "vllm:prompt_tokens_total") == 15472.0
    assert_all_exact(d, LOAD, cur_body, skip={"vllm:prompt_tokens_total"})


def _restarted_body(body: str, *, move_start: bool = True, move_created: bool = False) -> str:
    """`body` after a process restart: every cumulative value below the baseline's, except a
    few series that already grew past their old values."""
    out = set_values(body, CUMULATIVE, lambda v: math.floor(v * 0.1))
    out = set_values(out, GEN, 4000.0)  # grew past 1998 since the restart
    out = set_values(out, LENGTH, 60.0)  # grew past 49
    if move_start:
        out = set_values(out, r"^process_start_time_seconds$", lambda v: v + 3600.0)
    if move_created:
        out = set_values(out, r"^vllm:\w+_created\{", lambda v: v + 3600.0)
    return out


def test_process_restart_counts_every_series_from_zero_including_grown() -> None:
    cur_body = _restarted_body(AFTER, move_start=True)
    cur = snap(cur_body, 10.0)
    d = engine_delta(snap(AFTER, 0.0), cur)
    assert d.restarted
    assert delta_of(d, "vllm:generation_tokens_total") == 4000.0  # not 4000 - 1998
    assert delta_of(d, "vllm:request_success_total", finished_reason="length") == 60.0
    for i in d.layout.cumulative.tolist() + [h.sum for h in d.layout.histograms]:
        assert d.delta[i] == cur.data[i], d.layout.slot_ids[i]


def test_restart_evidenced_by_moved_created_values_without_process_start() -> None:
    prev_body = drop_lines(AFTER, r"^process_start_time_seconds$")
    cur_body = _restarted_body(prev_body, move_start=False, move_created=True)
    cur = snap(cur_body, 10.0)
    d = engine_delta(snap(prev_body, 0.0), cur)
    assert cur.process_start is None and d.restarted
    assert delta_of(d, "vllm:generation_tokens_total") == 4000.0


def test_restart_inferred_from_counters_dropping_in_multiprocess_mode() -> None:
    """dp2 (multiprocess mode): no `_created`, no process_start_time_seconds. Engine 0
    restarted; engine 1 did not and stays exact."""
    eng0 = r'^vllm:\w+(_total|_bucket|_count|_sum)\{engine="0"'
    cur_body = set_values(DP_LOAD, eng0, lambda v: math.floor(v * 0.1))
    cur_body = set_values(cur_body, GEN, 400.0)  # grew past 308
    cur_body = set_values(cur_body, r'^vllm:generation_tokens_total\{engine="1"', 300.0)
    p = Parser()
    prev = p.parse(DP_LOAD, time=0.0, wall_time=WALL)
    cur = p.parse(cur_body, time=5.0, wall_time=WALL + 5)
    assert prev["0"].process_start is None and not len(prev["0"].layout.created_slots)
    d0 = engine_delta(prev["0"], cur["0"])
    d1 = engine_delta(prev["1"], cur["1"])
    assert d0.restarted and not d1.restarted
    assert delta_of(d0, "vllm:generation_tokens_total") == 400.0
    for i in d0.layout.cumulative.tolist():
        assert d0.delta[i] == cur["0"].data[i]
    assert delta_of(d1, "vllm:generation_tokens_total") == 300.0 - 267.0
    assert_all_exact(d1, DP_LOAD, cur_body, engine="1")


def test_one_counter_reset_in_multiprocess_mode_is_not_a_restart() -> None:
    cur_body = set_values(DP_LOAD, GEN, 3.0)
    cur_body = set_values(cur_body, PROMPT, lambda v: v + 10)
    p = Parser()
    d = engine_delta(p.parse(DP_LOAD, time=0.0)["0"], p.parse(cur_body, time=5.0)["0"])
    assert not d.restarted and d.series_reset == 1
    assert delta_of(d, "vllm:generation_tokens_total") == 3.0
    assert delta_of(d, "vllm:prompt_tokens_total") == 10.0


def test_restart_is_counted_and_logged_and_voids_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = FleetState()
    parsers = {"server0": Parser(), "server1": Parser()}

    def poll(bodies: dict[str, str], t: float) -> PollResult:
        return state.observe(
            [
                ScrapeResult(n, parsers[n].parse(b, time=t, wall_time=WALL + t), t, WALL + t)
                for n, b in bodies.items()
            ]
        )

    poll({"server0": LOAD, "server1": LOAD}, 0.0)
    with caplog.at_level(logging.WARNING, logger="fleetscope"):
        res = poll({"server0": _restarted_body(AFTER), "server1": AFTER}, 10.0)
    assert res.restarts == ["server0.0"]
    assert state.restarts == {"server0.0": 1}
    assert res.keys["inference/agg/engine_restarts_total"] == 1.0
    assert any(
        "server0.0" in r.getMessage() and "restart" in r.getMessage() for r in caplog.records
    )
    # the other engine is exact, and the scope total is the sum of both engines' deltas
    assert (
        delta_of(res.deltas[EngineId("server1", "0")], "vllm:generation_tokens_total") == 1998 - 25
    )
    gen = res.stats.scopes["agg"].metrics["generation_tokens_total"]["delta"]
    assert gen == 4000.0 + (1998 - 25)


# --------------------------------------------------------------------------- 3.3 new series


def test_lazily_created_series_count_their_whole_value() -> None:
    # the `length` child and a whole histogram child did not exist at the previous scrape
    prev_body = drop_lines(LOAD, r'^vllm:request_success_(total|created)\{.*"length"')
    prev_body = drop_lines(prev_body, r"^vllm:request_queue_time_seconds_")
    # their `_created` says they were created after the previous scrape (docs/rules.md §3.3;
    # the capture's own values predate it: see test_late_series_created_before_the_previous_
    # scrape_is_only_a_baseline in test_bad_values.py)
    cur_body = set_values(AFTER, LATE_CREATED, WALL + 5.0)
    d = engine_delta(snap(prev_body, 0.0), snap(cur_body, 10.0))
    assert not d.restarted
    assert d.series_new == 2
    assert delta_of(d, "vllm:request_success_total", finished_reason="length") == 49.0
    assert delta_of(d, "vllm:request_queue_time_seconds_count") == 50.0
    assert delta_of(d, "vllm:request_queue_time_seconds_bucket", le="+Inf") == 50.0
    assert delta_of(d, "vllm:request_queue_time_seconds_sum") == sample_value(
        AFTER, r"^vllm:request_queue_time_seconds_sum\{"
    )
    assert_all_exact(d, prev_body, AFTER)


def test_lazily_created_series_in_real_multiprocess_captures() -> None:
    """dp2_idle -> dp2_load (real): the API server's http_requests_total children and the
    engines' gauges first appear under load."""
    p = Parser()
    b = Baselines()
    idle = p.parse(DP_IDLE, time=0.0, wall_time=WALL)
    load = p.parse(DP_LOAD, time=30.0, wall_time=WALL + 30)
    assert idle.endpoint is not None and load.endpoint is not None
    b.advance("server0", idle.endpoint)
    d = b.advance("server0", load.endpoint)
    assert not d.restarted
    assert delta_of(d, "http_requests_total") == 13.0  # 11 + 2, both children new
    for e in ("0", "1"):
        b.advance(f"server0.{e}", idle[e])
        de = b.advance(f"server0.{e}", load[e])
        assert not de.restarted
        assert de.current.value("vllm:num_requests_running") is not None
        assert math.isnan(delta_of(de, "vllm:num_requests_running"))
        assert delta_of(de, "vllm:generation_tokens_total") == sample_value(
            DP_LOAD, rf'^vllm:generation_tokens_total\{{engine="{e}"'
        )


def test_histogram_bucket_missing_from_a_baseline_whose_count_was_zero_is_zero() -> None:
    bucket = r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.25"'
    prev_body = drop_lines(IDLE, bucket)  # the idle baseline: _count 0
    assert sample_value(prev_body, TTFT_COUNT) == 0.0
    d = engine_delta(snap(prev_body, 0.0), snap(LOAD, 10.0))
    assert delta_of(d, "vllm:time_to_first_token_seconds_bucket", le="0.25") == 8.0
    assert delta_of(d, "vllm:time_to_first_token_seconds_count") == 8.0


def test_histogram_bucket_missing_from_a_baseline_with_observations_is_unknown() -> None:
    bucket = r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.25"'
    prev_body = drop_lines(LOAD, bucket)  # _count 8: the missing bucket's old value is unknown
    d = engine_delta(snap(prev_body, 0.0), snap(AFTER, 10.0))
    assert math.isnan(delta_of(d, "vllm:time_to_first_token_seconds_bucket", le="0.25"))
    assert delta_of(d, "vllm:time_to_first_token_seconds_bucket", le="0.5") == (
        text_delta(LOAD, AFTER, r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.5"')
    )
    assert delta_of(d, "vllm:time_to_first_token_seconds_count") == 42.0


def test_series_that_vanishes_for_one_scrape_is_not_double_counted() -> None:
    b = Baselines()
    gone = drop_lines(AFTER, r'^vllm:request_success_(total|created)\{.*"length"')
    back = set_values(AFTER, LENGTH, 49.0 + 7)
    mid = set_values(LOAD, LENGTH, 20.0)
    b.advance("s.0", snap(mid, 0.0))
    d1 = b.advance("s.0", snap(gone, 5.0))
    assert 'vllm:request_success_total{finished_reason="length"}' not in d1.layout.index
    d2 = b.advance("s.0", snap(back, 10.0))
    # 56 - 20 over the two intervals, all attributed when the series is seen again
    assert delta_of(d2, "vllm:request_success_total", finished_reason="length") == 36.0
    assert d2.series_new == 0 and d2.series_reset == 0
    total = delta_of(d1, "vllm:generation_tokens_total") + delta_of(
        d2, "vllm:generation_tokens_total"
    )
    assert total == 1998 - 25


# --------------------------------------------------------------------------- engines come and go


def _poll(
    state: FleetState,
    parsers: dict[str, Parser],
    bodies: dict[str, str],
    t: float,
    failed: Collection[str] = (),
) -> PollResult:
    scrapes: list[ScrapeResult] = []
    for name, body in bodies.items():
        p = parsers.setdefault(name, Parser())
        if name in failed:
            scrapes.append(ScrapeResult(name, None, t, WALL + t, error="timeout"))
        else:
            expo = p.parse(body, time=t, wall_time=WALL + t)
            scrapes.append(ScrapeResult(name, expo, t, WALL + t))
    return state.observe(scrapes)


def _bump(body: str, engine: str, amount: float) -> str:
    return set_values(
        body, rf'^vllm:\w+(_total|_count|_sum)\{{engine="{engine}"', lambda v: v + amount
    )


def test_engine_missing_from_one_scrape_keeps_its_baseline_and_next_delta_is_exact() -> None:
    state = FleetState()
    parsers: dict[str, Parser] = {}
    b0 = DP_LOAD
    b1 = drop_lines(_bump(b0, "0", 10), r'engine="1"')  # engine 1 absent from this body
    b2 = _bump(_bump(_bump(b0, "0", 10), "0", 5), "1", 7)
    _poll(state, parsers, {"server0": b0}, 0.0)
    r1 = _poll(state, parsers, {"server0": b1}, 5.0)
    assert "server0.1" not in r1.deltas and r1.stats.scopes["agg"].engines == 1
    assert r1.keys["inference/agg/engines_reporting"] == 1.0
    r2 = _poll(state, parsers, {"server0": b2}, 12.0)
    d1 = r2.deltas[EngineId("server0", "1")]
    assert d1.seconds == 12.0  # the longer interval
    assert delta_of(d1, "vllm:generation_tokens_total") == 7.0
    assert r2.deltas[EngineId("server0", "0")].seconds == 7.0
    assert delta_of(r2.deltas[EngineId("server0", "0")], "vllm:generation_tokens_total") == 5.0
    assert r2.stats.engine("server0.1")["generation_tokens_total:rate"] == pytest.approx(7 / 12)


def test_failed_endpoint_keeps_its_baseline_and_the_loss_is_visible() -> None:
    state = FleetState()
    parsers: dict[str, Parser] = {}
    bodies = {"server0": LOAD, "server1": LOAD}
    _poll(state, parsers, bodies, 0.0)
    r1 = _poll(state, parsers, {"server0": AFTER, "server1": AFTER}, 5.0, failed={"server1"})
    assert set(r1.deltas) == {"server0.0", "server0"}
    assert r1.keys["inference/agg/scrape_failures"] == 1.0
    assert r1.keys["inference/agg/endpoints_reporting"] == 1.0
    assert r1.keys["inference/agg/engines_reporting"] == 1.0
    r2 = _poll(state, parsers, {"server0": AFTER, "server1": AFTER}, 9.0)
    d = r2.deltas[EngineId("server1", "0")]
    assert d.seconds == 9.0 and not d.baseline_only
    assert delta_of(d, "vllm:generation_tokens_total") == 1998 - 25
    assert r2.keys["inference/agg/scrape_failures_total"] == 1.0


def _started_at(body: str, start: float) -> str:
    out = set_values(body, r"^process_start_time_seconds$", start)
    return set_values(out, r"^vllm:\w+_created\{", start + 20.0)


def test_new_engine_that_started_after_the_previous_poll_counts_its_first_values() -> None:
    state = FleetState(clock_skew=1.0)
    parsers: dict[str, Parser] = {}
    _poll(state, parsers, {"server0": LOAD}, 0.0)  # previous poll at WALL + 0
    late = _started_at(AFTER, WALL + 3.0)  # started 3 s after that poll
    r = _poll(state, parsers, {"server0": AFTER, "server1": late}, 10.0)
    d = r.deltas[EngineId("server1", "0")]
    assert not d.baseline_only and d.seconds == 10.0
    assert delta_of(d, "vllm:generation_tokens_total") == 1998.0
    assert r.restarts == []  # a new engine, not a restart
    gen = r.stats.scopes["agg"].metrics["generation_tokens_total"]["delta"]
    assert gen == (1998 - 25) + 1998


def test_new_engine_without_proof_of_a_late_start_is_only_a_baseline() -> None:
    state = FleetState(clock_skew=1.0)
    parsers: dict[str, Parser] = {}
    _poll(state, parsers, {"server0": LOAD}, 0.0)
    for name, start in (("early", WALL - 100.0), ("skew", WALL + 0.5)):
        r = _poll(state, parsers, {"server0": AFTER, name: _started_at(AFTER, start)}, 10.0)
        assert r.deltas[EngineId(name, "0")].baseline_only
        assert "generation_tokens_total:rate" not in r.stats.engine(f"{name}.0")
    # multiprocess mode: no start time at all -> a baseline
    r = _poll(state, parsers, {"server0": AFTER, "dp": DP_LOAD}, 20.0)
    assert (
        r.deltas[EngineId("dp", "0")].baseline_only and r.deltas[EngineId("dp", "1")].baseline_only
    )


def test_baselines_never_corrupted_by_a_failed_parse() -> None:
    from fleetscope.exposition import ExpositionError

    state = FleetState()
    parsers: dict[str, Parser] = {}
    _poll(state, parsers, {"server0": LOAD}, 0.0)
    with pytest.raises(ExpositionError):
        # (a NaN counter, once the example here, now only invalidates its series: see
        # test_nan_counter_scrape_keeps_the_baseline_and_the_next_delta_is_exact)
        parsers["server0"].parse(AFTER[:-3])
    r = _poll(state, parsers, {"server0": AFTER}, 10.0)
    assert delta_of(r.deltas[EngineId("server0", "0")], "vllm:generation_tokens_total") == 1998 - 25


def test_aggregate_after_differencing_per_engine() -> None:
    """Two engines, one reset: the scope delta is the sum of per-engine deltas, not the
    difference of summed values (which would be negative here)."""
    state = FleetState()
    parsers: dict[str, Parser] = {}
    _poll(state, parsers, {"server0": DP_LOAD}, 0.0)
    cur = set_values(DP_LOAD, GEN, 10.0)  # engine 0 reset: 308 -> 10
    cur = set_values(cur, r'^vllm:generation_tokens_total\{engine="1"', 277.0)
    r = _poll(state, parsers, {"server0": cur}, 5.0)
    assert r.stats.scopes["agg"].metrics["generation_tokens_total"]["delta"] == 10.0 + 10.0
    summed_before = sum(sample_values(DP_LOAD, r"^vllm:generation_tokens_total\{"))
    summed_after = sum(sample_values(cur, r"^vllm:generation_tokens_total\{"))
    assert summed_after - summed_before < 0  # what aggregating first would report
