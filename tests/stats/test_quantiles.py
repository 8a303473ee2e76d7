"""Histogram quantiles (docs/rules.md §3.5) against an independent transcription of PromQL's rules.

``promql_bucket_quantile`` (support/promql.py) is the reference; ``bucket_quantile`` must agree
with it on random bucket sets (unsorted, duplicated bounds, float noise, non-monotonic counts)
and on every edge case by name. Pooling across engines uses the intersection of bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetscope.stats.quantiles import (
    bucket_quantile,
    pool_buckets,
    pooled_quantiles,
    shared_bounds,
)
from support.promql import promql_bucket_quantile

INF = math.inf
# vLLM's real layouts: request_prompt_tokens with max_model_len 512 and 1024 (1-2-5 buckets)
PROMPT_512 = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, INF)
PROMPT_1024 = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, INF)
TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, INF,
)  # fmt: skip


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def ours(q: float, buckets: list[tuple[float, float]]) -> float:
    return bucket_quantile(q, [b for b, _ in buckets], [c for _, c in buckets])


# --------------------------------------------------------------------------- strategies

finite_bounds = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=64)
# exact binary fractions: sums of equal-bound counts do not depend on the order of addition
# (Prometheus sorts with an unstable sort, so that order is unspecified); float noise is
# exercised by `cumulative_buckets`, which has no duplicated bounds
counts = st.integers(0, 4 * 10**9).map(lambda k: k / 4)
quantile_arg = st.one_of(
    st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0, -0.1, 1.1, math.nan]),
    st.floats(min_value=0, max_value=1),
)


@st.composite
def raw_buckets(draw: st.DrawFn) -> list[tuple[float, float]]:
    """Arbitrary classic buckets: unsorted, duplicated bounds, zeros, non-monotonic counts,
    sometimes no +Inf bucket."""
    n = draw(st.integers(0, 12))
    bounds = draw(st.lists(st.one_of(finite_bounds, st.sampled_from([0.0, 1.0, 5.0])), max_size=n))
    if draw(st.booleans()) or not bounds:
        bounds.append(INF)
        if draw(st.booleans()):
            bounds.append(INF)  # a duplicated +Inf is coalesced
    cs = draw(st.lists(counts, min_size=len(bounds), max_size=len(bounds)))
    pairs = list(zip(bounds, cs, strict=True))
    return draw(st.permutations(pairs))


@st.composite
def cumulative_buckets(draw: st.DrawFn) -> list[tuple[float, float]]:
    """Well-formed cumulative buckets, optionally with float noise of ~1e-13 relative."""
    bounds = [*sorted(set(draw(st.lists(finite_bounds, min_size=1, max_size=10)))), INF]
    per_bucket = draw(st.lists(st.integers(0, 1000), min_size=len(bounds), max_size=len(bounds)))
    cum = list(np.cumsum(per_bucket).astype(float))
    if draw(st.booleans()):  # rates of buckets: floats with tiny precision errors
        scale = draw(st.floats(min_value=1e-3, max_value=10))
        noise = draw(
            st.lists(
                st.sampled_from([0.0, 1e-13, -1e-13, 5e-13, -5e-13, 2e-12]),
                min_size=len(cum),
                max_size=len(cum),
            )
        )
        cum = [c * scale * (1 + e) for c, e in zip(cum, noise, strict=True)]
    return list(zip(bounds, cum, strict=True))


# --------------------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_buckets(), quantile_arg)
@example([(1.0, 10.0), (2.0, 5.0), (INF, 10.0 * (1 + 1e-13))], 1.0)
@example([(1.0, 0.0), (INF, 0.0)], 0.5)
@example([(1.0, 0.0), (2.0, 4.0), (INF, 4.0)], 0.0)
@example([(-1.0, 3.0), (INF, 4.0)], 0.5)
@example([(INF, 4.0)], 0.5)
def test_random_buckets_match_promql_reference(
    buckets: list[tuple[float, float]], q: float
) -> None:
    assert same(ours(q, buckets), promql_bucket_quantile(q, buckets))


@settings(max_examples=100, deadline=None)
@given(cumulative_buckets(), quantile_arg)
def test_cumulative_buckets_with_float_noise_match_promql_reference(
    buckets: list[tuple[float, float]], q: float
) -> None:
    assert same(ours(q, buckets), promql_bucket_quantile(q, buckets))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=len(TTFT), max_size=len(TTFT)))
def test_vllm_ttft_layout_matches_promql_reference(per_bucket: list[int]) -> None:
    cum = np.cumsum(per_bucket).astype(float)
    buckets = list(zip(TTFT, cum, strict=True))
    for q in (0.5, 0.9, 0.99):
        assert same(ours(q, buckets), promql_bucket_quantile(q, buckets))


# --------------------------------------------------------------------------- edge cases


def test_rank_in_inf_bucket_returns_highest_finite_bound() -> None:
    # 10 observations, 9 of them above the last finite bound: p50/p90/p99 are all in +Inf
    buckets = [(0.1, 1.0), (0.5, 1.0), (INF, 10.0)]
    for q in (0.5, 0.9, 0.99):
        assert ours(q, buckets) == 0.5 == promql_bucket_quantile(q, buckets)


def test_lowest_bucket_interpolates_from_zero_when_its_bound_is_positive() -> None:
    buckets = [(2.0, 10.0), (4.0, 10.0), (INF, 10.0)]
    assert ours(0.5, buckets) == pytest.approx(1.0)  # half of [0, 2]
    assert ours(0.5, buckets) == promql_bucket_quantile(0.5, buckets)


def test_lowest_bucket_with_non_positive_bound_returns_that_bound() -> None:
    buckets = [(-1.0, 5.0), (3.0, 10.0), (INF, 10.0)]
    assert ours(0.2, buckets) == -1.0 == promql_bucket_quantile(0.2, buckets)
    buckets = [(0.0, 5.0), (3.0, 10.0), (INF, 10.0)]
    assert ours(0.2, buckets) == 0.0


def test_linear_interpolation_inside_a_bucket() -> None:
    buckets = [(1.0, 10.0), (2.0, 30.0), (INF, 30.0)]
    # rank 0.5 * 30 = 15: 5 of the 20 observations in (1, 2]
    assert ours(0.5, buckets) == pytest.approx(1.25)


def test_no_observations_is_nan() -> None:
    assert math.isnan(ours(0.5, [(1.0, 0.0), (INF, 0.0)]))
    assert math.isnan(pooled_quantiles([((1.0, INF), (0.0, 0.0))])[0])


def test_missing_inf_bucket_is_nan() -> None:
    assert math.isnan(ours(0.5, [(1.0, 3.0), (2.0, 4.0)]))


def test_fewer_than_two_buckets_is_nan() -> None:
    assert math.isnan(ours(0.5, [(INF, 4.0)]))
    assert math.isnan(bucket_quantile(0.5, [], []))


def test_quantile_argument_out_of_range() -> None:
    b = [(1.0, 1.0), (INF, 2.0)]
    assert ours(-0.5, b) == -INF
    assert ours(1.5, b) == INF
    assert math.isnan(ours(math.nan, b))


def test_tiny_float_non_monotonicity_is_ignored() -> None:
    # bucket rates computed in floating point: 3.0000000000001 then 3.0 (relative 3e-14)
    noisy = [(1.0, 3.0000000000001), (2.0, 3.0), (INF, 6.0)]
    clean = [(1.0, 3.0), (2.0, 3.0), (INF, 6.0)]
    for q in (0.3, 0.5, 0.99):
        assert ours(q, noisy) == pytest.approx(ours(q, clean), rel=1e-9)
        assert same(ours(q, noisy), promql_bucket_quantile(q, noisy))


def test_non_monotonic_counts_take_the_envelope() -> None:
    buckets = [(1.0, 10.0), (2.0, 4.0), (3.0, 12.0), (INF, 12.0)]
    envelope = [(1.0, 10.0), (2.0, 10.0), (3.0, 12.0), (INF, 12.0)]
    for q in (0.25, 0.5, 0.9):
        assert ours(q, buckets) == ours(q, envelope) == promql_bucket_quantile(q, buckets)


def test_equal_bounds_are_coalesced() -> None:
    split = [(1.0, 2.0), (1.0, 3.0), (2.0, 10.0), (INF, 10.0)]
    merged = [(1.0, 5.0), (2.0, 10.0), (INF, 10.0)]
    assert ours(0.4, split) == ours(0.4, merged) == promql_bucket_quantile(0.4, split)


def test_unsorted_buckets_are_sorted() -> None:
    b = [(INF, 10.0), (2.0, 10.0), (1.0, 5.0)]
    assert ours(0.5, b) == pytest.approx(1.0)


# --------------------------------------------------------------------------- pooling


def test_identical_layouts_pool_to_promql_sum_by_le() -> None:
    a = [0, 1, 3, 7, 7, 9, 9, 9, 9, 12]
    b = [1, 1, 1, 2, 8, 8, 9, 10, 11, 11]
    pooled_bounds, pooled = pool_buckets([(PROMPT_512, a), (PROMPT_512, b)])
    assert pooled_bounds == PROMPT_512
    summed = [(le, x + y) for le, x, y in zip(PROMPT_512, a, b, strict=True)]
    assert list(pooled) == [c for _, c in summed]
    for q, got in zip(
        (0.5, 0.9, 0.99), pooled_quantiles([(PROMPT_512, a), (PROMPT_512, b)]), strict=True
    ):
        assert got == promql_bucket_quantile(q, summed)


def test_mixed_bucket_layouts_pool_on_the_intersection_not_the_union() -> None:
    """docs/rules.md §3.5: two servers, max_model_len 512 and 1024. The 512 one sees 100 prompts of
    505 tokens (above its last finite bound, 500); the 1024 one sees 100 prompts of 400.
    Every prompt is <= 512 tokens."""

    def cumulative(bounds: Sequence[float], observations: Sequence[float]) -> list[float]:
        return [float(sum(1 for x in observations if x <= le)) for le in bounds]

    obs_a, obs_b = [505.0] * 100, [400.0] * 100
    a = cumulative(PROMPT_512, obs_a)
    b = cumulative(PROMPT_1024, obs_b)

    bounds, pooled = pool_buckets([(PROMPT_512, a), (PROMPT_1024, b)])
    assert bounds == PROMPT_512 == shared_bounds([PROMPT_512, PROMPT_1024])
    # exact at every shared bound: the true number of observations <= le
    assert list(pooled) == cumulative(bounds, obs_a + obs_b)
    p50, p90, p99 = pooled_quantiles([(PROMPT_512, a), (PROMPT_1024, b)])
    assert (p50, p90, p99) == (
        promql_bucket_quantile(0.5, list(zip(bounds, pooled, strict=True))),
        500.0,
        500.0,
    )

    # what `sum by (le)` over the union does: the count at le=1000 misses the 512 server
    union: dict[float, float] = {}
    for bs, cs in ((PROMPT_512, a), (PROMPT_1024, b)):
        for le, c in zip(bs, cs, strict=True):
            union[le] = union.get(le, 0.0) + c
    assert union[1000.0] == 100.0  # but all 200 prompts are <= 1000: wrong
    assert cumulative([1000.0], obs_a + obs_b) == [200.0]
    # ... and PromQL reports p99 = 1000 for prompts that never exceed 512 tokens
    assert promql_bucket_quantile(0.99, list(union.items())) == 1000.0
    assert p99 == 500.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(PROMPT_1024[:-1]), unique=True).map(
                lambda bs: (*sorted(bs), INF)
            ),
            st.lists(st.floats(min_value=0, max_value=2000, allow_nan=False), max_size=40),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_pooled_counts_are_exact_at_every_shared_bound(
    engines: list[tuple[tuple[float, ...], list[float]]],
) -> None:
    """Random engines with random layouts: the pooled cumulative count at each shared bound is
    the true number of observations (of all engines) at or below it."""
    hists: list[tuple[tuple[float, ...], list[float]]] = []
    everything: list[float] = []
    for bounds, obs in engines:
        hists.append((bounds, [float(sum(1 for x in obs if x <= le)) for le in bounds]))
        everything.extend(obs)
    bounds, pooled = pool_buckets(hists)
    assert bounds[-1] == INF
    assert list(pooled) == [float(sum(1 for x in everything if x <= le)) for le in bounds]
    for q, got in zip((0.5, 0.9, 0.99), pooled_quantiles(hists), strict=True):
        assert same(got, promql_bucket_quantile(q, list(zip(bounds, pooled, strict=True))))


def test_unknown_bucket_deltas_drop_that_bound_of_that_engine_only() -> None:
    # engine b's delta at le=2 is unknown (NaN): the pooled layout skips le=2
    a = ((1.0, 2.0, 4.0, INF), [1.0, 2.0, 3.0, 4.0])
    b = ((1.0, 2.0, 4.0, INF), [0.0, math.nan, 5.0, 6.0])
    bounds, pooled = pool_buckets([a, b])
    assert bounds == (1.0, 4.0, INF)
    assert list(pooled) == [1.0, 8.0, 10.0]


def test_pool_of_nothing_is_empty() -> None:
    bounds, pooled = pool_buckets([])
    assert bounds == () and len(pooled) == 0
