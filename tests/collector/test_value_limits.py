"""Values at the limits over the real HTTP stack (docs/bad-data.md §13, docs/rules.md §3.9): a
loopback server serves crafted bodies to a real ``Collector``, polled by hand.

* a histogram whose ``le`` is not a number, or whose cumulative bucket counts decrease (beyond
  float noise), is invalid for that scrape: warned, counted in ``invalid_series``, its baseline
  kept, nothing of it in a delta or a quantile; float noise stays accepted;
* a sum past float64 (~1.8e308) is not reported as a number: its key is left out, a warning
  names it, and numpy prints nothing (warnings are errors in this suite);
* counter sums past 2**53 are rounded: a warning says so, once.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import AsyncIterator, Callable

import pytest

from fleetscope import Collector, Endpoint, EngineId, FleetView
from support.bodies import sample_value, set_values
from support.loopback import LoopbackServer
from support.paths import fixture_text

LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
TTFT = "vllm:time_to_first_token_seconds"
TTFT_KEY = "time_to_first_token_seconds"
GEN = r'^vllm:generation_tokens_total\{engine="0"'
BUCKET = r'^vllm:time_to_first_token_seconds_bucket\{engine="0",le="{le}"'
COUNT = r"^vllm:time_to_first_token_seconds_count\{"
INVALID = "inference/agg/invalid_series"


class Rig:
    def __init__(
        self, server: LoopbackServer, collector: Collector, caplog: pytest.LogCaptureFixture
    ) -> None:
        self.server, self.collector, self.caplog = server, collector, caplog

    async def poll(self, body: str) -> FleetView:
        """Serve ``body``, poll once; ``caplog`` then holds this poll's records only. Any
        Python warning (a numpy RuntimeWarning) fails the test."""
        self.server.routes["/metrics"] = body.encode()
        self.caplog.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            view = await self.collector.poll()
        assert [str(w.message) for w in seen] == []
        assert view.keys["inference/agg/scrape_failures"] == 0
        return view

    def warnings(self, *subjects: str) -> list[str]:
        return [
            r.getMessage()
            for r in self.caplog.records
            if r.name.startswith("fleetscope")
            and r.levelno >= logging.WARNING
            and all(s in r.getMessage() for s in subjects)
        ]


@contextlib.asynccontextmanager
async def rig(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Rig]:
    caplog.set_level(logging.WARNING, logger="fleetscope")
    with LoopbackServer({"/metrics": b""}) as server:
        collector = Collector(
            [Endpoint(server.url, "bad")],
            interval=3600.0,
            timeout=2.0,
            fetch_model_info=False,
            discover_roles=False,
        )
        try:
            yield Rig(server, collector, caplog)
        finally:
            await collector.stop(timeout=5.0)


def _bucket(le: str) -> str:
    return BUCKET.replace("{le}", re.escape(le))


def _with_le(body: str, old: str, new: str) -> str:
    line = f'{TTFT}_bucket{{engine="0",le="{old}",'
    assert line in body
    return body.replace(line, f'{TTFT}_bucket{{engine="0",le="{new}",')


def _decreasing(body: str) -> str:
    # le=0.25 below le=0.1 (43): a cumulative count cannot drop as the bound grows
    return set_values(body, _bucket("0.25"), 40.0)


BAD_HISTOGRAMS: dict[str, tuple[Callable[[str], str], str]] = {
    "le_nan": (lambda b: _with_le(b, "0.1", "NaN"), "bad le"),
    "le_unparsable": (lambda b: _with_le(b, "0.1", "0.1s"), "bad le"),
    "buckets_decrease": (_decreasing, "buckets decrease"),
}


@pytest.mark.parametrize("case", list(BAD_HISTOGRAMS))
async def test_http_bad_le_or_decreasing_buckets_invalidate_that_histogram(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    edit, reason = BAD_HISTOGRAMS[case]
    async with rig(caplog) as r:
        await r.poll(LOAD)
        v = await r.poll(edit(AFTER))
        # the histogram is invalid for this scrape: counted, warned (endpoint, family, why)
        assert v.keys[INVALID] == 1
        assert r.warnings("bad.0", TTFT, reason), r.warnings()
        d = v.result.deltas[EngineId("bad", "0")]
        assert not any(sid.startswith(TTFT) for sid in d.layout.slot_ids)
        assert not [k for k in v.keys if TTFT_KEY in k]  # no delta, rate, mean or quantile
        # the rest of the body is valid and exact
        gen = sample_value(AFTER, GEN) - sample_value(LOAD, GEN)
        assert v.keys["inference/agg/generation_tokens_total/delta"] == gen
        # its baseline was kept: the next valid body counts from the last valid one
        v = await r.poll(AFTER)
        assert v.keys[INVALID] == 0
        want = sample_value(AFTER, COUNT) - sample_value(LOAD, COUNT)
        assert v.keys[f"inference/agg/{TTFT_KEY}/delta"] == want
        assert f"inference/agg/{TTFT_KEY}/p50" in v.keys


async def test_http_float_noise_in_buckets_stays_valid(caplog: pytest.LogCaptureFixture) -> None:
    """PromQL's tolerance: a bucket 5e-13 (relative) below the one before it is float noise."""
    noisy = set_values(AFTER, _bucket("0.25"), 43.0 * (1 - 5e-13))
    assert sample_value(noisy, _bucket("0.25")) < sample_value(noisy, _bucket("0.1"))
    async with rig(caplog) as r:
        await r.poll(LOAD)
        v = await r.poll(noisy)
        assert v.keys[INVALID] == 0
        assert not r.warnings(TTFT)
        assert f"inference/agg/{TTFT_KEY}/p50" in v.keys


def _two_engines(gen: float, prompt: float) -> str:
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {gen!r}\n'
        f'vllm:generation_tokens_total{{engine="1"}} {gen!r}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt!r}\n'
        f'vllm:prompt_tokens_total{{engine="1"}} {prompt!r}\n'
    )


async def test_http_a_sum_past_float64_is_left_out_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each engine's 1.5e308 is finite; their sum is not: the fleet's total and increase are
    left out (never inf, never a numpy warning) and named, the other keys stay exact."""
    async with rig(caplog) as r:
        await r.poll(_two_engines(0.0, 10.0))
        v = await r.poll(_two_engines(1.5e308, 25.0))
        assert "inference/agg/generation_tokens_total/delta" not in v.keys
        assert "inference/agg/generation_tokens_total/sum" not in v.keys
        # (their mean and median too: numpy's mean sums first)
        named = "agg/generation_tokens_total (sum, mean, median, delta)"
        assert r.warnings("poll", "not finite", named), r.warnings()
        assert v.keys["inference/agg/prompt_tokens_total/delta"] == 30.0
        assert v.keys["inference/agg/generation_tokens_total/max"] == 1.5e308
        assert all(x == x and abs(x) != float("inf") for x in v.keys.values())
        summary = r.collector.summary()
        assert "inference_summary/combined/agg/generation_tokens_total/delta" not in summary
        assert summary["inference_summary/combined/agg/prompt_tokens_total/delta"] == 30.0
        assert r.warnings("run summary combined", named), r.warnings()


def _children(value: float, prompt: float) -> str:
    # two children that differ only by a label fleetscope does not keep: summed into one series
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="a"}} {value!r}\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="b"}} {value!r}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt!r}\n'
    )


async def test_http_children_summed_past_float64_are_an_invalid_series(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with rig(caplog) as r:
        await r.poll(_children(1.0, 10.0))
        v = await r.poll(_children(1e308, 12.0))
        assert v.keys[INVALID] == 1
        assert r.warnings("bad.0", "vllm:generation_tokens_total", "sum overflows")
        d = v.result.deltas[EngineId("bad", "0")]
        assert "vllm:generation_tokens_total" not in d.layout.index
        assert v.keys["inference/agg/prompt_tokens_total/delta"] == 2.0
        # the baseline was kept: back under the limit, the increase is exact from 1 + 1
        v = await r.poll(_children(3.0, 15.0))
        assert v.keys[INVALID] == 0
        assert v.keys["inference/agg/generation_tokens_total/delta"] == 4.0


async def test_http_counter_sums_past_2_53_are_flagged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two engines' 5e15 tokens each: the fleet's 1e16 is past 2**53, where float64 sums stop
    being exact integers. Still reported (it is a number), and said once."""
    async with rig(caplog) as r:
        v = await r.poll(_two_engines(5e15 + 2, 1.0))
        assert v.keys["inference/agg/generation_tokens_total/sum"] == 1e16 + 4
        assert r.warnings("poll", "2**53", "agg/generation_tokens_total (sum)"), r.warnings()
        assert not r.warnings("prompt_tokens")
        v = await r.poll(_two_engines(5e15 + 4, 1.0))
        assert v.keys["inference/agg/generation_tokens_total/delta"] == 4.0
        assert not r.warnings("2**53")
