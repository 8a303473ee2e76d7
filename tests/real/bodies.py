"""An independent reader of Prometheus text bodies, for checking fleetscope against real vLLM.

Deliberately not fleetscope's parser: the real end-to-end tests compare fleetscope's numbers
with numbers read straight from the bodies, so the reference must not share its code. It reads
what prometheus_client writes (text 0.0.4, and OpenMetrics' sample lines), nothing more clever.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if m is None:
            raise ValueError(f"bad labels: {text!r}")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


@functools.lru_cache(maxsize=64)
def samples(body: str) -> tuple[Sample, ...]:
    """Every sample line of a body (cached: the tests read the same bodies many times)."""
    out = []
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            raise ValueError(f"bad sample line: {line!r}")
        out.append(Sample(m.group(1), _labels(m.group(2) or ""), float(m.group(3))))
    return tuple(out)


def types(body: str) -> dict[str, str]:
    """Family (base name) -> type, from the ``# TYPE`` lines.

    prometheus_client's text format 0.0.4 names a counter's TYPE line after its sample
    (``# TYPE vllm:prompt_tokens_total counter``) and gives each ``_created`` sample a TYPE line
    of its own (``# TYPE vllm:prompt_tokens_created gauge``); OpenMetrics uses the base name.
    Both come out as ``{"vllm:prompt_tokens": "counter"}`` here.
    """
    out = {}
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, typ = line.split(" ", 3)
            if typ == "counter" and fam.endswith("_total"):
                fam = fam[: -len("_total")]
            elif typ == "gauge" and fam.endswith("_created"):
                continue
            out[fam] = typ
    return out


def total(body: str, name: str, **match: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``match`` (0 if there are none)."""
    return sum(
        s.value
        for s in samples(body)
        if s.name == name and all(s.labels.get(k) == v for k, v in match.items())
    )


def present(body: str, name: str) -> bool:
    return any(s.name == name for s in samples(body))


def engines(body: str) -> set[str]:
    return {
        s.labels["engine"]
        for s in samples(body)
        if s.name.startswith("vllm:") and "engine" in s.labels
    }


def by_engine(body: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples(body):
        if s.name == name:
            e = s.labels.get("engine", "")
            out[e] = out.get(e, 0.0) + s.value
    return out


def counter_families(body: str) -> list[str]:
    return [f for f, t in types(body).items() if t == "counter" and f.startswith("vllm:")]


def histogram_families(body: str) -> list[str]:
    return [f for f, t in types(body).items() if t == "histogram" and f.startswith("vllm:")]


def buckets(body: str, family: str, **match: str) -> dict[float, float]:
    """le -> cumulative count, summed over the children whose labels include ``match``."""
    out: dict[float, float] = {}
    for s in samples(body):
        if s.name == family + "_bucket" and all(s.labels.get(k) == v for k, v in match.items()):
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out


def bucket_delta(after: str, before: str, family: str, **match: str) -> list[tuple[float, float]]:
    """[(le, Δ cumulative count)] between two bodies; a bucket missing before counts from 0."""
    a = buckets(after, family, **match)
    b = buckets(before, family, **match)
    return sorted((le, a[le] - b.get(le, 0.0)) for le in a)


def finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)
