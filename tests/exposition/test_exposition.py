"""The exposition parser (docs/rules.md §2) against prometheus_client's own parser and writer.

* every real capture: families, types, engines, label breakdowns and values equal what
  ``prometheus_client.parser.text_string_to_metric_families`` reads from the same body, once
  grouped by engine the way docs/rules.md §2 says (breakdown labels kept, other non-identity labels
  summed, ``_created`` kept as reset evidence, Ray's doubled counters counted once);
* random registries written by ``generate_latest`` (0.0.4 and OpenMetrics) round-trip exactly;
* the rules by name: renames, ``iteration_tokens_total``, ``cache_config_info``, NaN;
* fuzzing: garbage, truncated bodies, mutated lines, oversize, non-UTF-8, duplicates give
  ``ExpositionError`` and nothing else, quickly.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client import generate_latest as generate_004
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleetscope.exposition import MAX_BODY_BYTES, Exposition, ExpositionError, Parser, parse
from fleetscope.exposition.snapshot import EngineSnapshot
from support.bodies import drop_lines, sample_value, set_values
from support.paths import ALL_FIXTURES, fixture_text

BREAKDOWN = {"finished_reason", "reason", "source", "position", "sleep_state", "quantile"}
RENAMES = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}

# prometheus_client's OpenMetrics writer has no annotations: its real signature, typed here
generate_openmetrics: Callable[[CollectorRegistry], bytes] = openmetrics_exposition.generate_latest


# --------------------------------------------------------------------------- reference


def _canon(name: str) -> str:
    for ray, cur in (("ray_vllm_", "vllm:"), ("ray_sglang_", "sglang:")):
        if name.startswith(ray):
            name = cur + name[len(ray) :]
    return RENAMES.get(name, name)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sid(name: str, labels: dict[str, str]) -> str:
    """A series id as the text format writes it (values escaped, labels sorted)."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items())) + "}"


def _le(v: str) -> str:
    f = float(v)
    return "+Inf" if f == math.inf else repr(f)


class Reference:
    """What docs/rules.md §2 says a body holds, built from prometheus_client's families."""

    def __init__(self, families: Iterable[Metric], *, ray: bool | None = None) -> None:
        fams = list(families)
        if ray is None:
            ray = any(f.name.startswith(("ray_vllm_", "ray_sglang_")) for f in fams)
        identity = ("ReplicaId", "WorkerId", "engine") if ray else ("engine",)
        by_type: dict[str, set[str]] = defaultdict(set)
        for f in fams:
            by_type[f.type].add(f.name)
        with_created = by_type["counter"] | by_type["histogram"] | by_type["summary"]
        self.values: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.kinds: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.info: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
        for f in fams:
            for s in f.samples:
                labels = dict(s.labels)
                engine = ""
                if labels.get(identity[-1]) is not None and identity[-1] in labels:
                    engine = "/".join(labels[k] for k in identity if labels.get(k))
                kept = {k: v for k, v in labels.items() if k in BREAKDOWN}
                found = _kind_and_sid(f, s, labels, kept, ray, by_type, with_created)
                if found is None:
                    continue  # Ray's OpenCensus copy of a counter
                kind, sid = found
                if kind == "info":
                    # the engine's config: its identity labels are not part of it
                    self.info[engine][sid] = {
                        k: v for k, v in labels.items() if k not in identity and k != "le"
                    }
                self._record(engine, kind, sid, s.value)
        if "" in self.values and len(self.values) == 1:  # no identity at all: one engine
            self.values = {"0": self.values.pop("")}
            self.kinds = {"0": self.kinds.pop("")}
            self.info = {"0": self.info.pop("", {})}

    def _record(self, engine: str, kind: str, sid: str, value: float) -> None:
        if kind == "created":  # children summed into one series keep the earliest
            prev = self.values[engine].get(sid)
            self.values[engine][sid] = value if prev is None else min(prev, value)
        else:
            self.values[engine][sid] += value
        family = sid.split("{", 1)[0]
        if kind == "counter":
            family = family.removesuffix("_total")
        if kind == "histogram":
            family = re.sub(r"_(bucket|sum|count)$", "", family)
        self.kinds[engine][kind].add(family)


def _kind_and_sid(
    f: Metric,
    s: Sample,
    labels: dict[str, str],
    kept: dict[str, str],
    ray: bool,
    by_type: dict[str, set[str]],
    with_created: set[str],
) -> tuple[str, str] | None:
    """A sample's kind and series id by docs/rules.md §2 (None: a sample not counted)."""
    if f.type == "gauge" and f.name.endswith("_created") and (f.name[:-8] in with_created):
        return "created", _sid(_canon(f.name[:-8]) + "_created", kept)
    if f.type == "gauge" and ray and f.name in by_type["counter"]:
        return None  # Ray's OpenCensus copy of a counter
    if f.type == "counter":
        base = _canon(f.name)
        if s.name.endswith("_created"):
            return "created", _sid(base + "_created", kept)
        return "counter", _sid(base + "_total", kept)
    if f.type in ("histogram", "summary"):
        base = _canon(f.name)
        suffix = s.name[len(f.name) :]
        if suffix == "_bucket":
            return "histogram", _sid(base + "_bucket", {**kept, "le": _le(labels["le"])})
        if suffix in ("_sum", "_count", "_created"):
            return ("histogram" if suffix != "_created" else "created"), _sid(base + suffix, kept)
        return "gauge", _sid(base, kept)  # summary quantile
    if f.type == "info" or s.name.endswith("_info"):
        return "info", _canon(s.name)
    return "gauge", _sid(_canon(s.name), kept)


def our_values(snap: EngineSnapshot) -> dict[str, float]:
    return {sid: float(v) for sid, v in zip(snap.layout.slot_ids, snap.data, strict=True)}


def our_kinds(snap: EngineSnapshot) -> dict[str, set[str]]:
    lay = snap.layout
    out = {
        "counter": {c.name for c in lay.counters},
        "gauge": {g.name for g in lay.gauges},
        "histogram": {h.name for h in lay.histograms},
        "info": set(lay.info),
        "created": {c.name for c in lay.counters if c.created >= 0}
        | {h.name for h in lay.histograms if h.created >= 0},
    }
    return {k: v for k, v in out.items() if v}


def assert_same_values(ours: dict[str, float], ref: dict[str, float]) -> None:
    assert set(ours) == set(ref), set(ours) ^ set(ref)
    bad = {
        k: (ours[k], ref[k])
        for k in ref
        if not (ours[k] == ref[k] or (math.isnan(ours[k]) and math.isnan(ref[k])))
    }
    assert not bad, bad


def assert_matches_reference(expo: Exposition, ref: Reference) -> None:
    engines = {k for k in ref.values if k != ""}
    assert set(expo) == engines
    for e in engines:
        assert_same_values(our_values(expo[e]), dict(ref.values[e]))
        ref_kinds = {k: v for k, v in ref.kinds[e].items() if v}
        # `_created` of a counter names the counter's family; in the reference, its base
        ref_kinds["created"] = {
            f.removesuffix("_created") for f in ref_kinds.get("created", set())
        } or set()
        if not ref_kinds["created"]:
            del ref_kinds["created"]
        assert our_kinds(expo[e]) == ref_kinds
        assert {k: dict(v) for k, v in expo[e].info.items()} == ref.info.get(e, {})
    if "" in ref.values:
        assert expo.endpoint is not None
        assert_same_values(our_values(expo.endpoint), dict(ref.values[""]))
    else:
        assert expo.endpoint is None


# --------------------------------------------------------------------------- real captures


@functools.cache
def _client_families(path: Path) -> tuple[Metric, ...]:
    """prometheus_client's parse of a capture (slow: once per file per session)."""
    return tuple(text_string_to_metric_families(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_fixture_matches_prometheus_client_parser(path: Path) -> None:
    body = path.read_text(encoding="utf-8")
    ref = Reference(_client_families(path))
    parser = Parser(share_templates=False)  # a full parse first, whatever ran before
    first = parser.parse(body.encode(), time=1.0, wall_time=2.0)
    assert_matches_reference(first, ref)
    # the same body again takes the template fast path and gives the same values
    second = parser.parse(body, time=3.0, wall_time=4.0)
    assert parser.fast_hits == 1 and parser.full_parses == 1
    assert_matches_reference(second, ref)
    for e in second:
        assert second[e].layout is first[e].layout
        assert second[e].time == 3.0 and second[e].wall_time == 4.0
    # types: exactly the TYPE lines of the body
    declared = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, flags=re.M))
    assert dict(first.types) == declared


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_every_vllm_sample_summed_per_engine_equals_ours(path: Path) -> None:
    """The brief's literal check: every vllm sample value, summed per engine over the labels
    that are neither identity nor breakdown, equals our value."""
    body = path.read_text(encoding="utf-8")
    expo = parse(body)
    ray = "ray_vllm_" in body
    identity = ("ReplicaId", "WorkerId", "engine") if ray else ("engine",)
    sums: dict[tuple[str, str], float] = defaultdict(float)
    counter_names = {f.name for f in _client_families(path) if f.type == "counter"}
    for fam in _client_families(path):
        if not _canon(fam.name).startswith("vllm:"):
            continue
        if ray and fam.type == "gauge" and fam.name in counter_names:
            continue
        for s in fam.samples:
            if "engine" not in s.labels or s.name.endswith("_info"):
                continue
            eng = "/".join(s.labels[k] for k in identity if s.labels.get(k))
            kept = {k: v for k, v in s.labels.items() if k in BREAKDOWN or k == "le"}
            if "le" in kept:
                kept["le"] = _le(kept["le"])
            name = _canon(s.name.removesuffix("_created")) + (
                "_created" if s.name.endswith("_created") else ""
            )
            sums[(eng, _sid(name, kept))] += s.value
    assert sums
    for (eng, sid), v in sums.items():
        assert expo[eng][sid] == v, (eng, sid)


def test_single_engine_capture_facts() -> None:
    after = fixture_text("single_after.prom")
    expo = parse(after)
    assert list(expo) == ["0"]
    snap = expo["0"]
    assert snap.value("vllm:prefix_cache_queries_total") == 15472
    assert snap.value("vllm:prefix_cache_hits_total") == 10368
    # breakdowns stay separate; model_name is summed away
    assert snap.value("vllm:request_success_total", finished_reason="length") == 49
    assert snap.value("vllm:request_success_total", finished_reason="stop") == 1
    assert snap.value("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 10368
    assert snap.value("vllm:engine_sleep_state", sleep_state="awake") == 1
    assert snap.value("vllm:num_requests_waiting_by_reason", reason="capacity") == 0
    assert snap.value("vllm:request_success_total", model_name="tinymodel") is None
    assert snap.process_start == pytest.approx(1.79596670312e09)
    # samples without an engine label belong to the endpoint
    ep = expo.endpoint
    assert ep is not None
    assert ep.value("vllm:admission_rejections_total", reason="max_num_queued_reqs") == 0
    assert ep.value("http_requests_total") == 50  # handlers/methods/status summed
    assert ep.value("process_start_time_seconds") == pytest.approx(1.79596670312e09)
    assert ep.value("http_request_size_bytes_count") == 50  # a summary's count
    assert expo.types["vllm:iteration_tokens_total"] == "histogram"


def test_dp2_capture_engines_and_missing_gauges() -> None:
    idle = parse(fixture_text("dp2_idle.prom"))
    load = parse(fixture_text("dp2_load.prom"))
    assert list(idle) == list(load) == ["0", "1"]
    # multiprocess mode: no `_created`, no process_ families, gauges have no samples when idle
    for e in ("0", "1"):
        assert idle[e].process_start is None and idle[e].start_time is None
        assert idle[e].value("vllm:num_requests_running") is None  # missing, never 0
        assert not idle[e].layout.created_slots.size
    assert load["0"].value("vllm:num_requests_running") == 6
    assert load["1"].value("vllm:num_requests_running") == 2
    assert load["0"].value("vllm:generation_tokens_total") == 308
    assert load["1"].value("vllm:generation_tokens_total") == 267


def test_ray_vllm_capture_uses_worker_identity() -> None:
    expo = parse(fixture_text("ray_vllm_default.prom"))
    (engine,) = list(expo)
    assert engine == "ea26d7d655c30240dc3cea91ba766d625894e49beef7c51648db34c0/0"
    snap = expo[engine]
    # ray_vllm_ names come back as vllm: names
    assert snap.value("vllm:num_requests_running") is not None
    assert any(h.name == "vllm:time_to_first_token_seconds" for h in snap.layout.histograms)
    assert all(not sid.startswith("ray_vllm_") for sid in snap)


# --------------------------------------------------------------------------- named rules


def test_iteration_tokens_total_is_a_histogram() -> None:
    for name in ("single_after.prom", "dp2_load.prom", "ray_vllm_default.prom"):
        expo = parse(fixture_text(name))
        for snap in expo.values():
            lay = snap.layout
            (h,) = [h for h in lay.histograms if h.name == "vllm:iteration_tokens_total"]
            assert h.bounds[-1] == math.inf and len(h.bounds) > 2
            assert h.sum >= 0 and h.count >= 0
            assert "vllm:iteration_tokens_total" not in {c.name for c in lay.counters}
            assert "vllm:iteration_tokens_total" not in {g.name for g in lay.gauges}
    snap = parse(fixture_text("single_after.prom"))["0"]
    assert snap.value("vllm:iteration_tokens_total_count") == 286
    assert snap.value("vllm:iteration_tokens_total_bucket", le="+Inf") == 286


def test_cache_config_info_labels_kept_as_strings() -> None:
    body = fixture_text("single_after.prom")
    line = next(ln for ln in body.split("\n") if ln.startswith("vllm:cache_config_info{"))
    want = dict(re.findall(r'(\w+)="([^"]*)"', line))
    del want["engine"]  # identity, not configuration
    info = parse(body)["0"].info["vllm:cache_config_info"]
    assert dict(info) == want
    assert info["block_size"] == "128" and isinstance(info["block_size"], str)
    assert "num_gpu_blocks" in info


OLD_NAMES_BODY = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 100.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 40.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.5
"""

NEW_NAMES_BODY = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.5
"""


def test_renamed_old_vllm_names_map_to_current_names() -> None:
    snap = parse(OLD_NAMES_BODY)["0"]
    assert snap.value("vllm:kv_cache_usage_perc") == 0.25
    assert snap.value("vllm:prefix_cache_queries_total") == 100
    assert snap.value("vllm:prefix_cache_hits_total") == 40
    assert snap.value("vllm:inter_token_latency_seconds_count") == 4
    assert snap.value("vllm:inter_token_latency_seconds_bucket", le="0.1") == 3
    assert not any("gpu_" in sid or "time_per_output" in sid for sid in snap)
    assert {h.name for h in snap.layout.histograms} == {"vllm:inter_token_latency_seconds"}


def test_renamed_and_current_names_both_exported_are_counted_once() -> None:
    body = OLD_NAMES_BODY + NEW_NAMES_BODY.replace("100.0", "101.0").replace("0.25", "0.5")
    snap = parse(body)["0"]
    # the current name wins; the old copy is not added on top
    assert snap.value("vllm:prefix_cache_queries_total") == 101
    assert snap.value("vllm:prefix_cache_hits_total") == 40
    assert snap.value("vllm:kv_cache_usage_perc") == 0.5
    assert snap.value("vllm:inter_token_latency_seconds_count") == 4
    assert len(snap.layout.counters) == 2
    # and the same holds on the fast path
    p = Parser(share_templates=False)
    p.parse(body)
    again = p.parse(body)
    assert p.fast_hits == 1
    assert again["0"].value("vllm:prefix_cache_queries_total") == 101


def test_ray_opencensus_bare_and_total_counters_counted_once() -> None:
    body = fixture_text("ray_vllm_ocdefault.prom")
    expo = parse(body)
    total = sample_value(body, r"^ray_vllm_generation_tokens_total\{")
    bare = sample_value(body, r"^ray_vllm_generation_tokens\{")
    assert total == bare == 640.0
    values = [s.value("vllm:generation_tokens_total") for s in expo.values()]
    assert [v for v in values if v is not None] == [640.0]  # not 1280
    for snap in expo.values():
        # the bare DEPRECATED copies are not kept as gauges either
        assert not any(g.name == "vllm:generation_tokens" for g in snap.layout.gauges)
        assert all(not sid.startswith("vllm:prompt_tokens{") for sid in snap)
    hits = [s.value("vllm:prefix_cache_hits_total") for s in expo.values()]
    assert [v for v in hits if v is not None] == [4864.0]


def test_nan_in_a_counter_invalidates_that_series_only() -> None:
    """docs/rules.md §3.9 (was: a NaN counter failed the whole scrape): the series is left out
    of that scrape and reported; every other series is valid, on every parse path."""
    body = fixture_text("single_after.prom")
    bad = set_values(body, r"^vllm:generation_tokens_total\{", "NaN")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    sid = "vllm:generation_tokens_total"
    expo = Parser(share_templates=False).parse(bad)
    assert expo["0"].value(sid) is None
    assert sid in expo["0"].invalid
    assert [(i.engine, i.series, i.reason) for i in expo.invalid] == [("0", sid, "NaN")]
    assert expo["0"].value("vllm:prompt_tokens_total") == 15472
    # on the fast path too (a warmed parser), and the template survives
    p = Parser(share_templates=False)
    p.parse(body)
    warm = p.parse(bad)
    assert p.fast_hits == 1 and warm["0"].value(sid) is None
    assert warm["0"].layout is expo["0"].layout
    bucket = set_values(body, r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.1"', "NaN")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    got = p.parse(bucket)
    assert [i.series for i in got.invalid] == ["vllm:time_to_first_token_seconds"]
    assert got["0"].value("vllm:time_to_first_token_seconds_count") is None
    assert p.parse(body)["0"].value("vllm:generation_tokens_total") == 1998


def test_negative_counter_is_an_invalid_series() -> None:
    expo = parse(b'# TYPE vllm:x counter\nvllm:x_total{engine="0"} -1\n')
    assert expo["0"].value("vllm:x_total") is None
    assert [(i.engine, i.series, i.reason) for i in expo.invalid] == [
        ("0", "vllm:x_total", "negative")
    ]


def test_nan_gauge_is_missing_never_zero() -> None:
    body = fixture_text("single_after.prom")
    bad = set_values(body, r"^vllm:kv_cache_usage_perc\{", "NaN")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    parser = Parser(share_templates=False)
    parser.parse(body)  # warm: the NaN body then takes the fast path
    fresh = Parser(share_templates=False).parse(bad)["0"]
    warm = parser.parse(bad)["0"]
    assert parser.fast_hits == 1
    for snap in (fresh, warm):
        v = snap.value("vllm:kv_cache_usage_perc")
        assert v is not None and math.isnan(v)
        assert snap.value("vllm:generation_tokens_total") == 1998


def test_label_values_that_look_like_labels_stay_distinct_series() -> None:
    """Two breakdown labels whose values contain `",source="`: two series, not one sum."""
    body = (
        "# TYPE vllm:x_total counter\n"
        'vllm:x_total{engine="0",finished_reason="a\\",source=\\"b",source="c"} 1.0\n'
        'vllm:x_total{engine="0",finished_reason="a",source="b\\",source=\\"c"} 2.0\n'
    )
    snap = parse(body)["0"]
    assert len(snap) == 2 and len(snap.layout.counters) == 2
    assert snap.value("vllm:x_total", finished_reason='a",source="b', source="c") == 1.0
    assert snap.value("vllm:x_total", finished_reason="a", source='b",source="c') == 2.0


# --------------------------------------------------------------------------- bad input


def test_body_over_the_size_cap_fails() -> None:
    line = b'vllm:x_total{engine="0"} 1.0\n'
    body = b"# TYPE vllm:x_total counter\n" + line * (50_000_000 // len(line) + 1)
    assert len(body) > 50_000_000
    with pytest.raises(ExpositionError, match="cap"):
        Parser().parse(body)
    with pytest.raises(ExpositionError, match="cap"):
        Parser(max_bytes=1000).parse(fixture_text("single_after.prom"))
    assert MAX_BODY_BYTES < 50_000_000


def test_non_utf8_body_fails() -> None:
    body = fixture_text("single_after.prom").encode()
    bad = body.replace(b'model_name="tinymodel"', b'model_name="tiny\xffmodel"', 1)
    with pytest.raises(ExpositionError, match="UTF-8"):
        Parser().parse(bad)
    p = Parser()
    p.parse(body)
    with pytest.raises(ExpositionError, match="UTF-8"):
        p.parse(bad)


def _line_of(body: str, prefix: str) -> int:
    return 1 + next(i for i, ln in enumerate(body.split("\n")) if ln.startswith(prefix))


def test_duplicate_series_fails_with_its_line_number() -> None:
    body = fixture_text("single_after.prom")
    lines = body.split("\n")
    i = _line_of(body, "vllm:num_requests_waiting{") - 1
    j = _line_of(body, "vllm:num_requests_running{") - 1
    # an extra copy of a line
    dup = "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    with pytest.raises(ExpositionError, match="duplicate") as ei:
        Parser().parse(dup)
    assert ei.value.line == i + 2
    # a line replaced by a copy of another (same line count: the fast path's shape)
    swapped = list(lines)
    swapped[i] = lines[j]
    swapped_body = "\n".join(swapped)
    with pytest.raises(ExpositionError, match="duplicate") as ei:
        Parser().parse(swapped_body)
    assert ei.value.line == i + 1
    warm = Parser()
    warm.parse(body)
    with pytest.raises(ExpositionError, match="duplicate") as ei:
        warm.parse(swapped_body)
    assert ei.value.line == i + 1


def test_truncated_body_fails_with_line_number() -> None:
    body = fixture_text("single_after.prom")
    cut = body[: body.index("vllm:generation_tokens_total{") + 20]
    with pytest.raises(ExpositionError, match="truncated") as ei:
        Parser().parse(cut)
    assert ei.value.line == cut.count("\n") + 1


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\n\n",
        b"\x00\x01\x02",
        b"<html><body>502 Bad Gateway</body></html>\n",
        b'vllm:x{engine="0"\n',
        b'vllm:x{engine="0"} one\n',
        b"vllm:x{engine=0} 1\n",
        b"# TYPE vllm:x counter\n# TYPE vllm:x gauge\nvllm:x 1\n",
        b'# TYPE vllm:h histogram\nvllm:h_bucket{engine="0"} 1\n',
        b"vllm:x 1 2 3\n",
        b"vllm:x 1_000\n",
        b'vllm:x{a="1",a="2"} 1\n',
        b"a 1\n# EOF\nb 2\n",
        b"   \n",
    ],
)
def test_garbage_bodies_fail_cleanly(body: bytes) -> None:
    # (a negative counter, once in this list, now invalidates only its series: see
    # test_negative_counter_is_an_invalid_series; so does a bucket whose le is not a number:
    # test_bad_values.py::test_bad_le_or_decreasing_buckets_invalidate_the_histogram_only)
    with pytest.raises(ExpositionError):
        Parser().parse(body)


# --------------------------------------------------------------------------- round trips

_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
label_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(['"', "\\", "\n", " ", "{", "}", ",", "=", "#", "é", "\u2028", "🦙"]),
        st.characters(blacklist_categories=_SURROGATES),
    ),
    max_size=12,
)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)
non_negative = st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e12)


@st.composite
def registries(draw: st.DrawFn, *, colon_names: bool = True) -> CollectorRegistry:
    """A registry of random counters, gauges and histograms with `engine` and other labels."""
    reg = CollectorRegistry()
    prefix = "vllm:" if colon_names else "fleettest_"
    n = draw(st.integers(1, 5))
    for i in range(n):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "info"]))
        extra = draw(
            st.lists(
                st.sampled_from(["finished_reason", "model_name", "source", "handler"]),
                unique=True,
                max_size=2,
            )
        )
        labelnames = ["engine", *extra] if draw(st.booleans()) or not extra else extra
        name = f"{prefix}m{i}"
        m: Counter | Gauge | Histogram | Info
        children = draw(
            st.lists(
                st.tuples(st.sampled_from(["0", "1", "2"]), *[label_text for _ in extra]),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
        if kind == "counter":
            m = Counter(name, "doc", labelnames, registry=reg)
            for ch in children:
                m.labels(*_child(labelnames, extra, ch)).inc(draw(non_negative))
        elif kind == "gauge":
            m = Gauge(name, "doc", labelnames, registry=reg)
            for ch in children:
                v = draw(st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf])))
                m.labels(*_child(labelnames, extra, ch)).set(v)
        elif kind == "histogram":
            bounds = sorted(
                set(draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=6)))
            )
            m = Histogram(name, "doc", labelnames, buckets=bounds, registry=reg)
            for ch in children:
                child = m.labels(*_child(labelnames, extra, ch))
                for x in draw(st.lists(st.floats(-1e7, 1e7, allow_nan=False), max_size=8)):
                    child.observe(x)
        else:
            if "engine" not in labelnames:
                labelnames = ["engine", *extra]
            m = Info(name, "doc", labelnames, registry=reg)
            seen_engines: set[str] = set()
            for ch in children:
                if ch[0] in seen_engines:
                    continue  # one info child per engine
                seen_engines.add(ch[0])
                m.labels(*_child(labelnames, extra, ch)).info(
                    {"block_size": draw(st.sampled_from(["16", "128"])), "kv": draw(label_text)}
                )
    return reg


def _child(labelnames: list[str], extra: list[str], ch: tuple[str, ...]) -> list[str]:
    values = dict(zip(["engine", *extra], ch, strict=True))
    return [values[k] for k in labelnames]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registries())
def test_generate_latest_round_trips_exactly(reg: CollectorRegistry) -> None:
    body = generate_004(reg)
    ref = Reference(reg.collect(), ray=False)
    expo = Parser().parse(body)
    assert_matches_reference(expo, ref)
    # and prometheus_client's own parser agrees with the registry (sanity of the reference)
    assert_matches_reference(expo, Reference(text_string_to_metric_families(body.decode())))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registries(colon_names=False))
def test_openmetrics_round_trips_exactly(reg: CollectorRegistry) -> None:
    body = generate_openmetrics(reg)
    assert body.endswith(b"# EOF\n")
    expo = Parser().parse(body)
    assert_matches_reference(expo, Reference(reg.collect(), ray=False))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registries(), st.randoms(use_true_random=False))
def test_fast_path_equals_full_parse_on_new_values(
    reg: CollectorRegistry, rnd: random.Random
) -> None:
    """Same shape, new values: the warmed parser's fast path gives what a fresh parse gives."""
    body = generate_004(reg).decode()
    warm = Parser(share_templates=False)
    warm.parse(body)
    lines = body.split("\n")
    for k, ln in enumerate(lines):
        if ln and not ln.startswith("#") and rnd.random() < 0.5:
            head, _, v = ln.rpartition(" ")
            if v not in ("NaN", "+Inf", "-Inf"):
                lines[k] = f"{head} {float(v) + rnd.choice([0.0, 1.0, 2.5])!r}"
    body2 = "\n".join(lines)
    a = warm.parse(body2)
    b = Parser(share_templates=False).parse(body2)
    assert warm.fast_hits == 1
    assert set(a) == set(b)
    for e in a:
        np.testing.assert_array_equal(a[e].data, b[e].data)
        assert a[e].layout.slot_ids == b[e].layout.slot_ids


# --------------------------------------------------------------------------- fuzzing

_BASE = fixture_text("single_after.prom")
_DP2 = fixture_text("dp2_load.prom")
_WARM = Parser()
_WARM.parse(_BASE)


def _only_exposition_errors(body: str | bytes, parser: Parser | None = None) -> None:
    """Parse; an ExpositionError is fine, any other exception fails the test."""
    with contextlib.suppress(ExpositionError):
        (parser or Parser()).parse(body)


@settings(max_examples=150, deadline=2000)
@given(st.binary(max_size=400))
def test_fuzz_garbage_bytes(data: bytes) -> None:
    _only_exposition_errors(data)
    _only_exposition_errors(data + b"\n")


@settings(max_examples=100, deadline=2000)
@given(st.text(alphabet='abc{}=",# \\\n\t01.+-eINfa:_', max_size=300))
def test_fuzz_garbage_text_in_the_format_alphabet(text: str) -> None:
    _only_exposition_errors(text)


@settings(max_examples=40, deadline=2000)
@given(st.integers(0, len(_BASE)), st.sampled_from([_BASE, _DP2]))
def test_fuzz_truncated_real_bodies(n: int, body: str) -> None:
    prefix = body[:n]
    _only_exposition_errors(prefix)
    p = Parser()
    p.parse(body)
    _only_exposition_errors(prefix, p)


def test_truncated_at_every_line_end_never_raises_anything_else() -> None:
    ends = [m.end() for m in re.finditer("\n", _BASE)]
    for n in ends[::19]:
        _only_exposition_errors(_BASE[:n])
        _only_exposition_errors(_BASE[: n - 3])


_MUTATIONS: list[Callable[[str, random.Random], str]] = [
    lambda ln, r: ln[: r.randrange(len(ln) + 1)],
    lambda ln, r: ln + r.choice([" ", "}", "{", '"', "\\", " 1", " # x", "\t", "\r"]),
    lambda ln, r: ln.replace('"', "", 1),
    lambda ln, r: ln.replace("=", "", 1),
    lambda ln, r: ln.replace(" ", "", 1),
    lambda ln, r: ln.rpartition(" ")[0] + " " + r.choice(["NaN", "-1", "x", "", "1e999", "+Inf"]),
    lambda ln, r: ln.replace("{", '{le="0.1",', 1),
    lambda ln, r: ln + " 1700000000000",
    lambda ln, r: "",
    lambda ln, r: "# " + ln,
    lambda ln, r: ln.replace("counter", r.choice(["gauge", "histogram", "x", ""]), 1),
    lambda ln, r: ln[::-1],
]


@settings(max_examples=70, deadline=2000)
@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, len(_MUTATIONS) - 1)),
        min_size=1,
        max_size=4,
    ),
    st.randoms(use_true_random=False),
)
def test_fuzz_random_line_mutations(edits: list[tuple[int, int]], rnd: random.Random) -> None:
    lines = _BASE.split("\n")
    for pos, which in edits:
        k = pos % (len(lines) - 1)
        lines[k] = _MUTATIONS[which](lines[k], rnd)
    body = "\n".join(lines)
    _only_exposition_errors(body)
    _only_exposition_errors(body, _WARM)
    # the warmed parser still parses the original body on its fast path afterwards
    again = _WARM.parse(_BASE)
    assert again["0"].value("vllm:generation_tokens_total") == 1998


def test_a_failed_body_does_not_corrupt_the_template() -> None:
    p = Parser()
    p.parse(_BASE)
    for bad in (
        _BASE[:-10],
        drop_lines(_BASE, r"^vllm:num_requests_running\{"),
        set_values(_BASE, r"^vllm:prompt_tokens_total\{", "NaN"),  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
        _BASE.replace(
            'vllm:num_requests_running{engine="0"', 'vllm:num_requests_running{engine="0', 1
        ),
    ):
        _only_exposition_errors(bad, p)
    expo = p.parse(_BASE)
    assert expo["0"].value("vllm:prompt_tokens_total") == 15472


def test_a_series_that_returns_in_place_of_a_blank_line_is_read() -> None:
    """Found by the fuzz test: a body whose series line was blank (the template learns a blank
    line there), then the full body again. The fast path took the returning sample line,
    ``name{labels} value``, for a timestamped skipped line with an empty head, and the series
    vanished from every later scrape of that shape."""
    lines = _BASE.split("\n")
    k = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:generation_tokens_total{"))
    blank = "\n".join([*lines[:k], "", *lines[k + 1 :]])
    word = "\n".join([*lines[:k], "x", *lines[k + 1 :]])
    p = Parser()
    p.parse(_BASE)
    assert p.parse(blank)["0"].value("vllm:generation_tokens_total") is None
    assert p.parse(_BASE)["0"].value("vllm:generation_tokens_total") == 1998
    p.parse(blank)
    with pytest.raises(ExpositionError):  # one word where the template had a blank line
        p.parse(word)


def test_random_fixture_line_shuffles_parse_the_same() -> None:
    """Order of series is free: a shuffled body parses to the same values (full parser)."""
    r = random.Random(7)
    lines = [ln for ln in _DP2.split("\n") if ln]
    r.shuffle(lines)
    shuffled = "\n".join(lines) + "\n"
    a, b = parse(_DP2), parse(shuffled)
    for e in a:
        assert our_values(a[e]) == pytest.approx(our_values(b[e]), nan_ok=True)


# --------------------------------------------------------------------------- shared templates


def test_a_new_parser_starts_from_a_template_of_the_same_shape() -> None:
    """A fleet's endpoints serve line-for-line identical bodies: the second endpoint's first
    body takes the fast path with the first endpoint's template, and parses as a full parse."""
    body = fixture_text("dp2_load.prom")
    other = set_values(body, r"^vllm:generation_tokens_total\{", "12345.0")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    Parser().parse(body)
    newcomer = Parser()
    got = newcomer.parse(other)
    assert (newcomer.fast_hits, newcomer.full_parses) == (1, 0)
    want = Parser(share_templates=False).parse(other)
    assert set(got) == set(want) == {"0", "1"}
    for e in want:
        np.testing.assert_array_equal(got[e].data, want[e].data)
        assert got[e].layout is want[e].layout
    assert got["1"].value("vllm:generation_tokens_total") == 12345.0


def test_a_template_of_another_shape_is_not_used() -> None:
    """Same line count, other label values (engine ids, model): every line's head is checked,
    so the shared template is refused and the body gets its own full parse."""
    body = fixture_text("single_after.prom")
    Parser().parse(body)
    renamed = body.replace('engine="0"', 'engine="7"')
    assert renamed.count("\n") == body.count("\n")
    p = Parser()
    expo = p.parse(renamed)
    assert (p.fast_hits, p.full_parses) == (0, 1)
    assert set(expo) == {"7"}
    assert expo["7"].value("vllm:prompt_tokens_total") == 15472


def test_fast_path_rejects_underscored_values_like_the_full_parser() -> None:
    body = fixture_text("single_after.prom")
    p = Parser()
    p.parse(body)
    bad = set_values(body, r"^vllm:prompt_tokens_total\{", "15_472")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    with pytest.raises(ExpositionError, match="line"):
        p.parse(bad)
    with pytest.raises(ExpositionError):
        Parser(share_templates=False).parse(bad)
