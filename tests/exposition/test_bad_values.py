"""Bad data never reaches the totals (docs/rules.md §3.9-3.10, docs/bad-data.md): one named test
per case, on every parse path, and through the delta bookkeeping.

Inputs are the real captures edited in memory; expected values are read from the text.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetscope.exposition import Exposition, InvalidSeries, Parser
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.identity import EngineId
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.baselines import Baselines
from fleetscope.stats.deltas import engine_delta
from support.bodies import drop_lines, sample_value, set_values
from support.paths import fixture_text

WALL = 1_795_970_000.0
LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
DP_LOAD = fixture_text("dp2_load.prom")
GEN = r'^vllm:generation_tokens_total\{engine="0"'
PROMPT = r'^vllm:prompt_tokens_total\{engine="0"'
GEN_ID = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"


def _paths(good: str, bad: str) -> tuple[Exposition, Exposition, Exposition]:
    """The same bad body through the three parse paths: full parse, a warmed parser's own
    template, and a template shared by another parser."""
    full = Parser(share_templates=False)
    got_full = full.parse(bad, time=1.0, wall_time=WALL + 1)
    own = Parser(share_templates=False)
    own.parse(good)
    got_own = own.parse(bad, time=1.0, wall_time=WALL + 1)
    Parser().parse(good)  # publishes the shape
    shared = Parser()
    got_shared = shared.parse(bad, time=1.0, wall_time=WALL + 1)
    assert (full.full_parses, own.fast_hits, shared.fast_hits) == (1, 1, 1)
    return got_full, got_own, got_shared


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", "-1.0"])
@pytest.mark.parametrize(
    "pattern, series",
    [
        (GEN, GEN_ID),
        (r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.1"', TTFT),
        (r"^vllm:time_to_first_token_seconds_count\{", TTFT),
    ],
)
def test_bad_cumulative_values_are_rejected_the_same_on_every_parse_path(
    value: str, pattern: str, series: str
) -> None:
    bad = set_values(AFTER, pattern, value)  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    reason = {"+Inf": "+Inf", "-Inf": "-Inf", "NaN": "NaN", "-1.0": "negative"}[value]
    results = _paths(AFTER, bad)
    for expo in results:
        assert expo.invalid == (InvalidSeries("0", series, reason),)
        snap = expo["0"]
        assert not any(sid.startswith(series + "_") or sid == series for sid in snap)
        assert snap.value("vllm:prompt_tokens_total") == 15472  # the rest is valid
        assert snap.invalid and all(
            s.startswith(series.removesuffix("_total")) for s in snap.invalid
        )
    a, b, c = results
    assert a["0"].layout is b["0"].layout is c["0"].layout
    np.testing.assert_array_equal(a["0"].data, b["0"].data)
    np.testing.assert_array_equal(a["0"].data, c["0"].data)


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN"])
def test_non_finite_histogram_sum_is_invalid_a_negative_one_is_not(value: str) -> None:
    pat = r"^vllm:time_to_first_token_seconds_sum\{"
    for expo in _paths(AFTER, set_values(AFTER, pat, value)):  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
        assert [i.series for i in expo.invalid] == [TTFT]
    for expo in _paths(AFTER, set_values(AFTER, pat, -2.5)):
        assert expo.invalid == ()
        assert expo["0"].value(TTFT + "_sum") == -2.5


def test_plus_inf_on_a_new_endpoints_first_scrape_is_no_false_restart_nor_a_late_series() -> None:
    b = Baselines()
    p = Parser()
    first = p.parse(set_values(LOAD, GEN, "+Inf"), time=0.0, wall_time=WALL)["0"]  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    assert first.value(GEN_ID) is None
    b.advance("s.0", first)
    d = b.advance("s.0", p.parse(AFTER, time=10.0, wall_time=WALL + 10)["0"])
    assert not d.restarted and d.series_reset == 0 and d.series_new == 0
    # its baseline was unknown: no delta (never its whole value 1998)
    assert math.isnan(d.delta[d.layout.index[GEN_ID]])
    prompt = d.delta[d.layout.index["vllm:prompt_tokens_total"]]
    assert prompt == sample_value(AFTER, PROMPT) - sample_value(LOAD, PROMPT)
    d2 = b.advance("s.0", p.parse(set_values(AFTER, GEN, 2000.0), time=15.0)["0"])
    assert d2.delta[d2.layout.index[GEN_ID]] == 2.0


def _poll(
    state: FleetState, parser: Parser, body: str, t: float, name: str = "server0"
) -> tuple[PollResult, Exposition]:
    expo = parser.parse(body, time=t, wall_time=WALL + t)
    return state.observe([ScrapeResult(name, expo, t, WALL + t)]), expo


def test_nan_counter_scrape_keeps_the_baseline_and_the_next_delta_is_exact() -> None:
    """The NaN scrape is valid for every other series; the next valid value of the bad series
    is compared with its last valid one, and its rate divides by the 10 s that spans."""
    state, p = FleetState(), Parser()
    _poll(state, p, LOAD, 0.0)
    mid_body = set_values(set_values(AFTER, GEN, "NaN"), PROMPT, 15000.0)  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    r1, expo = _poll(state, p, mid_body, 5.0)
    assert expo.invalid == (InvalidSeries("0", GEN_ID, "NaN"),)
    d1 = r1.deltas[EngineId("server0", "0")]
    assert d1.delta[d1.layout.index["vllm:prompt_tokens_total"]] == 15000.0 - sample_value(
        LOAD, PROMPT
    )
    r2, _ = _poll(state, p, AFTER, 10.0)
    d2 = r2.deltas[EngineId("server0", "0")]
    gen = sample_value(AFTER, GEN) - sample_value(LOAD, GEN)
    assert d2.delta[d2.layout.index[GEN_ID]] == gen
    assert d2.span is not None and d2.span[d2.layout.index[GEN_ID]] == 10.0
    assert d2.seconds == 5.0
    per_engine = r2.stats.engine("server0.0")
    assert per_engine["generation_tokens_total:rate"] == pytest.approx(gen / 10.0)
    assert per_engine["prompt_tokens_total:rate"] == pytest.approx((15472 - 15000.0) / 5.0)


def _flip_body(kind: str, x: float, y: float) -> str:
    head = "# TYPE vllm:x counter\n" if kind == "counter" else "# TYPE vllm:x_total gauge\n"
    return (
        head
        + f'vllm:x_total{{engine="0"}} {x}\n'
        + "# TYPE vllm:y counter\n"
        + f'vllm:y_total{{engine="0"}} {y}\n'
    )


def test_a_family_whose_type_flips_gets_no_delta_and_is_reported() -> None:
    """x: counter 400 -> gauge 800 -> counter 800. Aligning by id alone counted 400 (800 - the
    gauge's 400... of another kind); the flip is a fresh baseline: no delta, reported."""
    b, p = Baselines(), Parser()
    b.advance("e", p.parse(_flip_body("counter", 400, 1), time=0.0)["0"])
    d1 = b.advance("e", p.parse(_flip_body("gauge", 400, 2), time=5.0)["0"])
    assert d1.type_changed == ("vllm:x_total",)
    d2 = b.advance("e", p.parse(_flip_body("counter", 800, 3), time=10.0)["0"])
    assert d2.type_changed == ("vllm:x_total",)
    assert math.isnan(d2.delta[d2.layout.index["vllm:x_total"]])  # not 400, not 800
    assert d2.series_new == 0 and not d2.restarted
    assert d2.delta[d2.layout.index["vllm:y_total"]] == 1.0
    d3 = b.advance("e", p.parse(_flip_body("counter", 900, 4), time=15.0)["0"])
    assert d3.type_changed == () and d3.delta[d3.layout.index["vllm:x_total"]] == 100.0


def _stamp(body: str, ts: str, every: int = 1) -> str:
    out = []
    for i, line in enumerate(body.split("\n")):
        if line and not line.startswith("#") and i % every == 0:
            line = f"{line} {ts}"
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("ts, every", [("1700000000000", 1), ("1700000000000", 3)])
def test_sample_timestamps_in_text_0_0_4_parse_on_every_path(ts: str, every: int) -> None:
    stamped = _stamp(AFTER, ts, every)
    want = Parser(share_templates=False).parse(AFTER)["0"]
    p = Parser(share_templates=False)
    first = p.parse(stamped)["0"]
    again = p.parse(_stamp(set_values(AFTER, GEN, 2500.0), ts, every))["0"]
    assert (p.full_parses, p.fast_hits) == (1, 1)
    np.testing.assert_array_equal(first.data, want.data)
    assert first.layout is want.layout
    assert again.value(GEN_ID) == 2500.0
    # a body without timestamps then takes the same template
    assert p.parse(AFTER)["0"].value(GEN_ID) == 1998
    assert p.fast_hits == 2


OPENMETRICS = """# TYPE vllm:x counter
vllm:x_total{{engine="0"}} {x} 1700000000.5
vllm:x_created{{engine="0"}} 1700000000.0 1700000000.5
# TYPE vllm:h histogram
vllm:h_bucket{{engine="0",le="1.0"}} 1 1700000000.5
vllm:h_bucket{{engine="0",le="+Inf"}} 2 1700000000.5
vllm:h_count{{engine="0"}} 2 1700000000.5
vllm:h_sum{{engine="0"}} 3.5 1700000000.5
# EOF
"""


def test_sample_timestamps_in_openmetrics_parse_on_repeated_scrapes() -> None:
    p = Parser(share_templates=False)
    a = p.parse(OPENMETRICS.format(x=12))["0"]
    b = p.parse(OPENMETRICS.format(x=13))["0"]
    assert (p.full_parses, p.fast_hits) == (1, 1)
    assert a.value("vllm:x_total") == 12 and b.value("vllm:x_total") == 13
    assert b.value("vllm:h_count") == 2 and b.value("vllm:h_sum") == 3.5
    d = engine_delta(a, b)
    assert d.delta[d.layout.index["vllm:x_total"]] == 1.0


def _cut_after(body: str, pattern: str) -> str:
    import re

    m = re.search(pattern + r".*\n", body, re.M)
    assert m
    return body[: m.end()]


@pytest.mark.parametrize(
    "cut, reason",
    [
        (r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.1"', "no +Inf bucket"),
        (r'^vllm:time_to_first_token_seconds_bucket\{.*le="\+Inf"', "no _count"),
    ],
)
def test_a_histogram_cut_short_is_left_out_and_reported(cut: str, reason: str) -> None:
    body = _cut_after(AFTER, cut)
    p = Parser(share_templates=False)
    for expo in (p.parse(body), p.parse(body)):
        assert expo.invalid == (InvalidSeries("0", TTFT, reason),)
        assert not any(sid.startswith(TTFT) for sid in expo["0"])
        assert expo["0"].value(GEN_ID) == 1998  # written before the cut
    assert p.fast_hits == 1
    # the next complete body brings the histogram back with an exact delta
    b = Baselines()
    b.advance("e", Parser().parse(LOAD, time=0.0, wall_time=WALL)["0"])
    b.advance("e", Parser().parse(body, time=5.0, wall_time=WALL + 5)["0"])
    d = b.advance("e", Parser().parse(AFTER, time=10.0, wall_time=WALL + 10)["0"])
    cnt = r"^vllm:time_to_first_token_seconds_count\{"
    assert d.delta[d.layout.index[TTFT + "_count"]] == sample_value(AFTER, cnt) - sample_value(
        LOAD, cnt
    )
    assert d.span is not None and d.span[d.layout.index[TTFT + "_count"]] == 10.0


LENGTH_LINES = r'^vllm:request_success_(total|created)\{.*"length"'


def test_late_series_created_before_the_previous_scrape_is_only_a_baseline() -> None:
    prev_body = drop_lines(LOAD, LENGTH_LINES)
    prev = Parser().parse(prev_body, time=0.0, wall_time=WALL)["0"]
    # the capture's `_created` (process start) is long before the previous scrape
    d = engine_delta(prev, Parser().parse(AFTER, time=10.0, wall_time=WALL + 10)["0"])
    sid = 'vllm:request_success_total{finished_reason="length"}'
    assert math.isnan(d.delta[d.layout.index[sid]]) and d.series_new == 0
    # created after the previous scrape (beyond the 1 s skew): its whole value counts
    late = set_values(AFTER, r'^vllm:request_success_created\{.*"length"', WALL + 2.0)
    d = engine_delta(prev, Parser().parse(late, time=10.0, wall_time=WALL + 10)["0"])
    assert d.delta[d.layout.index[sid]] == 49.0 and d.series_new == 1
    # within the skew it is still counted (it may have been created just after the scrape)
    near = set_values(AFTER, r'^vllm:request_success_created\{.*"length"', WALL - 0.5)
    d = engine_delta(prev, Parser().parse(near, time=10.0, wall_time=WALL + 10)["0"])
    assert d.delta[d.layout.index[sid]] == 49.0


def test_restart_observed_seconds_is_the_new_process_life() -> None:
    cur_body = set_values(AFTER, r"^vllm:\w+(_total|_bucket|_count|_sum)\{", lambda v: v * 0.1)
    cur_body = set_values(cur_body, r"^process_start_time_seconds$", WALL + 6.0)
    cur_body = set_values(cur_body, r"^vllm:\w+_created\{", WALL + 6.5)
    prev = Parser().parse(LOAD, time=0.0, wall_time=WALL)["0"]
    d = engine_delta(prev, Parser().parse(cur_body, time=10.0, wall_time=WALL + 10)["0"])
    assert d.restarted and d.tail_unseen
    assert d.observed_seconds == pytest.approx(4.0)
    assert d.seconds == 10.0
    # a plain interval observes everything
    d = engine_delta(prev, Parser().parse(AFTER, time=10.0, wall_time=WALL + 10)["0"])
    assert d.observed_seconds == 10.0 and not d.tail_unseen and not d.restarted


def test_dp_restart_without_start_evidence_needs_two_core_counters_to_drop() -> None:
    """Multiprocess / DP bodies: no `_created`, no process start. One core counter dropping is
    a series reset (test_deltas keeps that); prompt *and* generation tokens dropping is the
    engine's restart, whose unseen tail makes observed_seconds 0."""
    p = Parser()
    prev = p.parse(DP_LOAD, time=0.0, wall_time=WALL)
    body = set_values(DP_LOAD, GEN, 3.0)
    body = set_values(body, PROMPT, 5.0)
    cur = p.parse(body, time=5.0, wall_time=WALL + 5)
    d0 = engine_delta(prev["0"], cur["0"])
    assert d0.restarted and d0.tail_unseen and d0.observed_seconds == 0.0
    assert d0.delta[d0.layout.index[GEN_ID]] == 3.0
    d1 = engine_delta(prev["1"], cur["1"])
    assert not d1.restarted and d1.observed_seconds == 5.0
    one = p.parse(set_values(DP_LOAD, GEN, 3.0), time=5.0, wall_time=WALL + 5)
    d = engine_delta(prev["0"], one["0"])
    assert not d.restarted and d.series_reset == 1 and d.tail_unseen
    assert d.observed_seconds == 5.0


def test_continuity_unknown_keeps_deltas_but_observes_nothing() -> None:
    b, p = Baselines(), Parser()
    b.advance("e", p.parse(LOAD, time=0.0, wall_time=WALL)["0"])
    d = b.advance("e", p.parse(AFTER, time=10.0, wall_time=WALL + 10)["0"], continuity_unknown=True)
    assert d.continuity_unknown and d.observed_seconds == 0.0 and d.seconds == 10.0
    assert d.delta[d.layout.index[GEN_ID]] == sample_value(AFTER, GEN) - sample_value(LOAD, GEN)


def test_a_type_change_never_takes_the_fast_path_also_with_timestamps() -> None:
    """A changed `# TYPE` line is a full parse (a new layout), also in a timestamped body where
    the fast path's second split (value, timestamp) is in use."""
    body = _stamp(_flip_body("counter", 1, 1), "1700000000000")
    p = Parser(share_templates=False)
    p.parse(body)
    p.parse(body)
    assert (p.full_parses, p.fast_hits) == (1, 1)
    expo = p.parse(body.replace("vllm:x counter", "vllm:x_total gauge"))
    assert p.full_parses == 2
    assert any(g.name == "vllm:x_total" for g in expo["0"].layout.gauges)


# ------------------------------------------------------------------ values at the limits (§13)

TTFT_LINE = 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",'
TTFT_025 = r'^vllm:time_to_first_token_seconds_bucket\{engine="0",le="0\.25"'


@pytest.mark.parametrize(
    "le, reason", [("NaN", "bad le"), ("nan", "bad le"), ("0.1s", "bad le"), ("", "bad le")]
)
def test_bad_le_or_decreasing_buckets_invalidate_the_histogram_only(le: str, reason: str) -> None:
    """A bucket bound that is not a number: that histogram is invalid (the scrape failed when
    the le did not parse; NaN was taken as a bound), on the full parse and the fast path."""
    assert TTFT_LINE in AFTER
    bad = AFTER.replace(TTFT_LINE, TTFT_LINE.replace('le="0.1"', f'le="{le}"'))
    p = Parser(share_templates=False)
    for expo in (p.parse(bad), p.parse(bad)):
        assert expo.invalid == (InvalidSeries("0", TTFT, reason),)
        assert not any(sid.startswith(TTFT) for sid in expo["0"])
        assert expo["0"].value(GEN_ID) == 1998
    assert (p.full_parses, p.fast_hits) == (1, 1)


def test_decreasing_buckets_are_invalid_the_same_on_every_parse_path() -> None:
    bad = set_values(AFTER, TTFT_025, 40.0)  # le=0.1 holds 43
    results = _paths(AFTER, bad)
    for expo in results:
        assert expo.invalid == (InvalidSeries("0", TTFT, "buckets decrease"),)
        assert not any(sid.startswith(TTFT) for sid in expo["0"])
        assert expo["0"].value("vllm:prompt_tokens_total") == 15472
    a, b, c = results
    assert a["0"].layout is b["0"].layout is c["0"].layout


@pytest.mark.parametrize("relative", [5e-13, 1e-15])
def test_float_noise_in_cumulative_buckets_is_accepted(relative: float) -> None:
    """PromQL's tolerance (relative 1e-12, as ``histogram_quantile``): float noise, not a
    decrease. The same constant as the quantiles' correction."""
    from fleetscope.exposition._values import BUCKET_TOLERANCE
    from fleetscope.stats.quantiles import PRECISION_TOLERANCE

    assert BUCKET_TOLERANCE == PRECISION_TOLERANCE
    noisy = set_values(AFTER, TTFT_025, 43.0 * (1 - relative))
    for expo in _paths(AFTER, noisy):
        assert expo.invalid == ()
        assert expo["0"].value(TTFT + "_bucket", le="0.25") == 43.0 * (1 - relative)
    # just past the tolerance it is a decrease
    past = set_values(AFTER, TTFT_025, 43.0 * (1 - 3e-12))
    assert [i.reason for i in Parser().parse(past).invalid] == ["buckets decrease"]


def _children(value: float) -> str:
    return (
        "# TYPE vllm:x counter\n"
        f'vllm:x_total{{engine="0",model_name="a"}} {value!r}\n'
        f'vllm:x_total{{engine="0",model_name="b"}} {value!r}\n'
        "# TYPE vllm:y counter\n"
        'vllm:y_total{engine="0"} 5.0\n'
    )


def test_children_summed_past_float64_are_an_invalid_series_on_every_parse_path() -> None:
    """Two children kept as one series (``model_name`` is summed away): each 1e308 is valid,
    their sum is not a number (it was +Inf in the snapshot, a baseline no delta could use)."""
    for expo in _paths(_children(1.0), _children(1e308)):
        assert expo.invalid == (InvalidSeries("0", "vllm:x_total", "sum overflows"),)
        assert expo["0"].value("vllm:x_total") is None
        assert expo["0"].value("vllm:y_total") == 5.0
    assert Parser().parse(_children(8e307))["0"].value("vllm:x_total") == 1.6e308


def test_a_sum_past_float64_is_named_never_inf_nor_a_numpy_warning() -> None:
    """Stats: two engines' finite increases whose sum is not finite. The sum is left out and
    named in ``stats.limits``; no key is inf; numpy warns nothing (warnings are errors here)."""

    def body(v: float) -> str:
        return "# TYPE vllm:x counter\n" + "".join(
            f'vllm:x_total{{engine="{e}"}} {v!r}\n' for e in "01"
        )

    state, p = FleetState(), Parser()
    _poll(state, p, body(0.0), 0.0)
    r, _ = _poll(state, p, body(1.5e308), 10.0)
    assert "inference/agg/x_total/delta" not in r.keys
    assert {"agg/x_total/delta", "agg/x_total/sum"} <= set(r.stats.limits.not_finite)
    assert r.stats.scopes["agg"].metrics["x_total"]["max"] == 1.5e308
    assert r.keys["inference/server0.0/x_total:rate"] == 1.5e307
    assert all(math.isfinite(v) for v in r.keys.values())
    r, _ = _poll(state, p, body(1.5e308), 20.0)
    assert r.keys["inference/agg/x_total/delta"] == 0.0
    # (numpy's mean and median of two sum them first: past float64 too)
    assert set(r.stats.limits.not_finite) == {f"agg/x_total/{s}" for s in ("sum", "mean", "median")}
    assert r.stats.limits.inexact == []
    # past 2**53 a counter sum is still a number, but named: float64 rounds it
    state, p = FleetState(), Parser()
    r, _ = _poll(state, p, body(5e15), 0.0)
    assert r.stats.limits.inexact == ["agg/x_total/sum"]
    assert r.keys["inference/agg/x_total/sum"] == 1e16
