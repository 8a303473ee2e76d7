"""Shared test helpers: where the real captures live, body editing, reference implementations.

The captures in ``tests/data/fixtures`` are never edited; tests that need a different state edit the
text in memory with :func:`set_values` / :func:`drop_lines`.

``promql_bucket_quantile`` is an independent, straight transcription of PromQL's classic
``histogram_quantile`` rules (``bucketQuantile`` in ``promql/quantile.go``), written without
looking at fleetscope's implementation, so the two can be compared.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository
DATA = TESTS / "data"  # every test's data, versioned with the tests (provenance in READMEs)
# real vLLM 0.32 and Ray 2.60 captures
FIXTURES = DATA / "fixtures"

# a simulated KV cache small enough to fill up (256 blocks of 16 tokens) with long outputs: KV
# pressure, and preemptions by the dozen every few seconds
KV_PRESSURE_LOAD = dict(
    arrival_rate=6.0,
    num_gpu_blocks=256,
    prompt_tokens_median=32.0,
    output_tokens_median=200.0,
    output_tokens_sigma=0.1,
    max_tokens_choices=(480,),
)
VLLM_DIR = FIXTURES / "vllm-0.32.0-cpu"
RAY_DIR = FIXTURES / "ray-2.60-vllm-0.32"
ALL_FIXTURES = sorted([*VLLM_DIR.glob("*.prom"), *RAY_DIR.glob("*.prom")])


def fixture_text(name: str) -> str:
    """A capture's body by file name (searched in both fixture folders)."""
    for d in (VLLM_DIR, RAY_DIR):
        p = d / name
        if p.exists():
            return p.read_text(encoding="utf-8")
    raise FileNotFoundError(name)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    assert FIXTURES.is_dir(), f"fixtures not found at {FIXTURES}"
    return FIXTURES


# --------------------------------------------------------------------------- body editing


def _split_sample(line: str) -> tuple[str, str]:
    head, _, value = line.rpartition(" ")
    return head, value


def set_values(body: str, pattern: str, fn: Callable[[float], float] | float) -> str:
    """Replace the value of every sample line whose text before the value matches ``pattern``
    (a regex searched in the line head). ``fn`` maps the old value to the new one."""
    rx = re.compile(pattern)
    out = []
    hits = 0
    for line in body.split("\n"):
        if line and not line.startswith("#"):
            head, value = _split_sample(line)
            if rx.search(head):
                new = fn(float(value)) if callable(fn) else fn
                line = f"{head} {new!r}" if not isinstance(new, str) else f"{head} {new}"
                hits += 1
        out.append(line)
    assert hits, f"no sample line matches {pattern!r}"
    return "\n".join(out)


def drop_lines(body: str, pattern: str) -> str:
    """Remove every sample line whose head matches ``pattern``."""
    rx = re.compile(pattern)
    out = []
    hits = 0
    for line in body.split("\n"):
        if line and not line.startswith("#") and rx.search(_split_sample(line)[0]):
            hits += 1
            continue
        out.append(line)
    assert hits, f"no sample line matches {pattern!r}"
    return "\n".join(out)


def sample_values(body: str, pattern: str) -> list[float]:
    """Values of the sample lines whose head matches ``pattern``, in body order."""
    rx = re.compile(pattern)
    vals = []
    for line in body.split("\n"):
        if line and not line.startswith("#"):
            head, value = _split_sample(line)
            if rx.search(head):
                vals.append(float(value))
    return vals


def sample_value(body: str, pattern: str) -> float:
    vals = sample_values(body, pattern)
    assert len(vals) == 1, (pattern, vals)
    return vals[0]


_LE_RE = re.compile(r'le="([^"]*)"')


def bucket_values(body: str, family: str, extra: str = "") -> list[tuple[float, float]]:
    """[(le, cumulative count)] of one histogram child, read straight from the text."""
    out = []
    for line in body.split("\n"):
        if line.startswith(family + "_bucket{") and extra in line:
            head, value = _split_sample(line)
            m = _LE_RE.search(head)
            assert m
            out.append((float(m.group(1)), float(value)))
    assert out, family
    return out


# --------------------------------------------------------------------------- PromQL reference


def _go_div(a: float, b: float) -> float:
    """IEEE division as Go does it (no ZeroDivisionError)."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def promql_bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """PromQL ``histogram_quantile`` over classic buckets ``[(le, cumulative count)]``.

    The rules, in Prometheus' order:
    q NaN -> NaN, q < 0 -> -Inf, q > 1 -> +Inf; sort by bound; the highest bound must be +Inf
    (else NaN); merge equal bounds by adding their counts; ignore float precision errors
    (a count within a relative 1e-12 of the last kept count takes that count); force a
    monotonic envelope (running maximum); fewer than 2 buckets or 0 observations -> NaN;
    rank = q * observations; the first finite bucket whose count reaches the rank holds it;
    a rank in +Inf -> the highest finite bound; the lowest bucket interpolates from 0 when its
    bound is positive (else its bound is the answer); linear interpolation inside the bucket.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda bc: bc[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    bounds: list[float] = []
    counts: list[float] = []
    for le, group in itertools.groupby(ordered, key=lambda bc: bc[0]):
        bounds.append(le)
        total = 0.0
        for _, c in group:
            total += c
        counts.append(total)
    kept = counts[0]
    for i in range(1, len(counts)):
        c = counts[i]
        diff = abs(c - kept)
        if diff == 0:
            continue
        if _go_div(diff, c) <= 1e-12:
            counts[i] = kept
        else:
            kept = c
    counts = list(itertools.accumulate(counts, max))
    if len(counts) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    last = len(counts) - 1
    b = bisect.bisect_left(counts, rank, 0, last)  # first finite bucket with count >= rank
    if b == last:
        return bounds[last - 1]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    lo = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else counts[b - 1]
    return lo + (bounds[b] - lo) * _go_div(rank - below, counts[b] - below)


# ``isolation``: run a test module in both collector modes, in-process and with the work in a
# child process (``pytestmark = pytest.mark.usefixtures("isolation")``). In ``process`` mode
# every ``Collector(...)`` the test builds without an explicit isolation runs in a child.
@pytest.fixture(params=["inline", "process"])
def isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "process":
        import fleetscope.collector.process as iso

        def every_collector(endpoints: Sequence[object], options: Mapping[str, Any]) -> bool:
            cfg = options.get("config")
            explicit = options.get("isolation") or (cfg.isolation if cfg is not None else None)
            return explicit in (None, "process", "auto")

        monkeypatch.setattr(iso, "wants_process", every_collector)
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``inline_only`` tests read in-process internals: no ``[process]`` variant of them."""
    keep = []
    for item in items:
        params = getattr(item, "callspec", None)
        mode = params.params.get("isolation") if params is not None else None
        if mode == "process" and item.get_closest_marker("inline_only") is not None:
            continue
        keep.append(item)
    items[:] = keep
