"""The family table (``fleetscope.catalog.FAMILIES``) against the recorded family lists and
bodies: every family vLLM 0.32/0.33 and SGLang 0.5.23 define is in it, every mapping keeps type
and unit, and every family in every recorded body is either mapped or passed through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetscope import catalog
from fleetscope.catalog import FAMILIES, FAMILY_BY_NAME, canonical_family
from fleetscope.exposition import Exposition, parse
from support.paths import DATA

DATA = DATA
SG_FAMILIES = json.loads((DATA / "sglang-0.5.23" / "families.json").read_text())
VLLM_FAMILIES = json.loads((DATA / "vllm-families" / "families.json").read_text())
BODIES = sorted(
    p for p in DATA.rglob("*") if p.suffix == ".prom" or p.name.endswith(".openmetrics.txt")
)


def base(name: str, typ: str) -> str:
    return name[:-6] if typ == "counter" and name.endswith("_total") else name


def unit(u: str) -> str:
    u = u.split()[0] if u else ""
    return {"s": "seconds", "ratio": "ratio"}.get(u, u)


def test_table_is_one_row_per_family() -> None:
    assert len(FAMILY_BY_NAME) == len(FAMILIES)
    for f in FAMILIES:
        assert f.engine in ("vllm", "sglang") and f.name.startswith(f.engine + ":")
        assert f.type in ("counter", "gauge", "histogram", "summary"), f
        assert set(f.breakdown.split()) <= set(f.labels.split()), f
        assert not (f.rename and f.fallback)


def test_every_defined_family_is_in_the_table() -> None:
    for e in SG_FAMILIES:
        f = FAMILY_BY_NAME[base(e["name"], e["type"])]
        assert f.engine == "sglang" and f.type == e["type"]
    for fams in VLLM_FAMILIES.values():
        for e in fams:
            f = FAMILY_BY_NAME[base(e["name"], e["type"])]
            assert f.type == e["type"] and f.deprecated == bool(e["deprecated_by"]), f
    new = {e["name"] for e in VLLM_FAMILIES["0.33.0"]} - {
        e["name"] for e in VLLM_FAMILIES["0.32.0"]
    }
    assert len(new) == 12
    assert {f.name for f in FAMILIES if f.first == "0.33.0"} == {base(n, "counter") for n in new}


def test_mappings_keep_type_and_unit() -> None:
    for f in FAMILIES:
        if f.canonical is None:
            continue
        target = FAMILY_BY_NAME[f.canonical]
        assert target.canonical is None, f  # one step
        assert target.type == f.type, f
        # vLLM declares no unit for its preemption count (events of one request each)
        same = unit(target.unit) == unit(f.unit) or (target.name, target.unit) == (
            "vllm:num_preemptions",
            "",
        )
        assert same, (f.name, f.unit, target.unit)
        if f.engine == "sglang" and target.engine == "vllm":
            assert not target.deprecated


def test_deprecated_kv_offload_families_keep_their_names_and_transfer_type() -> None:
    for name in (
        "vllm:kv_offload_total_bytes",
        "vllm:kv_offload_total_time",
        "vllm:kv_offload_size",
    ):
        f = FAMILY_BY_NAME[name]
        assert (
            f.deprecated and f.canonical is None and f.label_roles()["transfer_type"] == "breakdown"
        )
        assert canonical_family(name) == (name, False)


def test_sglang_label_roles() -> None:
    roles = FAMILY_BY_NAME["sglang:realtime_tokens"].label_roles()
    assert roles["dp_rank"] == "identity" and roles["tp_rank"] == "rank"
    assert roles["mode"] == "breakdown" and roles["model_name"] == "summed"
    assert FAMILY_BY_NAME["sglang:time_to_first_token_seconds"].label_roles()["is_streaming"] == (
        "summed"
    )
    # ITL is not mapped (its _count counts tokens, vLLM's counts engine steps)
    assert canonical_family("sglang:inter_token_latency_seconds") == (
        "sglang:inter_token_latency_seconds",
        False,
    )
    # Ray's rewriting reaches the same mapping
    assert canonical_family("ray_sglang_num_running_reqs")[0] == "vllm:num_requests_running"


def test_ratio_specs_name_families_of_the_table() -> None:
    names = {catalog.FAMILY_BY_NAME[f].parsed_name for f in catalog.FAMILY_BY_NAME}
    metrics = {n.split(":", 1)[1] for n in names}
    for spec in catalog.RATIOS:
        assert spec.numerator[0] in metrics and spec.denominator[0] in metrics, spec
        assert all(f in metrics for f in spec.numerator_plus), spec


def _parsed_families(expo: Exposition) -> set[str]:
    out: set[str] = set()
    snaps = [*expo.values(), *([expo.endpoint] if expo.endpoint is not None else [])]
    for sn in snaps:
        lay = sn.layout
        out.update(c.name for c in lay.counters)
        out.update(g.name for g in lay.gauges)
        out.update(h.name for h in lay.histograms)
        out.update(lay.info)
    return out


def _exposed_families(text: str) -> dict[str, str]:
    """family -> type, for every TYPE'd family with at least one sample in the body."""
    types: dict[str, str] = {}
    names: set[str] = set()
    for ln in text.split("\n"):
        if ln.startswith("# TYPE "):
            _, _, fam, typ = ln.split()
            types[fam] = typ
        elif ln and ln[0] != "#":
            names.add(ln.split("{", 1)[0].split(" ", 1)[0].replace(":", "_"))
    sfx = ("", "_total", "_bucket", "_count", "_sum", "_info")
    return {
        f: t
        for f, t in types.items()
        if any(f.replace(":", "_") + s in names for s in sfx) and not f.endswith("_created")
    }


@pytest.mark.parametrize("path", BODIES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_family_in_the_recorded_bodies_is_mapped_or_passed_through(path: Path) -> None:
    text = path.read_text()
    expo = parse(text)
    parsed = _parsed_families(expo)
    for fam, typ in _exposed_families(text).items():
        b = base(fam, typ)
        if (
            typ in ("gauge", "untyped")
            and fam.startswith("ray_")
            and b + "_total" in (_exposed_families(text))
        ):
            continue  # Ray's bare copy of a counter: the `_total` one is counted
        name = canonical_family(b)[0]
        if typ in ("info",) or (typ in ("gauge", "untyped") and b.endswith("_info")):
            name = name if name.endswith("_info") else name + "_info"
        assert name in parsed, (fam, name)
        if name in catalog.RENAMES.values() and b in catalog.RENAMES:
            # a mapped family is never also kept under its exposed name (unless superseded and
            # kept on purpose: sglang:token_usage next to full_token_usage)
            assert b not in parsed or b in catalog.KEEP_OWN_NAME


def test_sglang_body_labels_are_in_the_table() -> None:
    truth = json.loads((DATA / "sglang-0.5.23" / "truth.json").read_text())
    for case in truth.values():
        for kind in ("counters", "gauges", "histograms"):
            for s in case[kind]:
                typ = {"counters": "counter", "gauges": "gauge", "histograms": "histogram"}[kind]
                f = FAMILY_BY_NAME[base(s["name"], typ)]
                # `pid`: added by prometheus_client's multiprocess mode to mode-"all" gauges
                assert set(s["labels"]) - {"pid"} <= set(f.labels.split()), (s["name"], s["labels"])


def test_the_names_every_stage_reads_are_catalog_families_with_sglang_equivalents() -> None:
    """The view, health, the terminal, the keys and the dashboards read metric names from the
    catalog's constants; each names a vLLM family of the table, and each headline one has an
    SGLang family parsed under it (so the same stage reads both engines)."""
    read = {
        catalog.KV_USAGE: "vllm:kv_cache_usage_perc",
        catalog.RUNNING: "vllm:num_requests_running",
        catalog.WAITING: "vllm:num_requests_waiting",
        catalog.GENERATION_TOKENS: "vllm:generation_tokens",
        catalog.PROMPT_TOKENS: "vllm:prompt_tokens",
        catalog.PREEMPTIONS: "vllm:num_preemptions",
        catalog.REQUEST_SUCCESS: "vllm:request_success",
        catalog.TTFT: "vllm:time_to_first_token_seconds",
        catalog.TPOT: "vllm:request_time_per_output_token_seconds",
        catalog.ITL: "vllm:inter_token_latency_seconds",
        catalog.E2E: "vllm:e2e_request_latency_seconds",
    }
    for metric, family in read.items():
        assert catalog.family_of_series("vllm:" + metric) is FAMILY_BY_NAME[family], metric
    sglang = {
        m: catalog.native_name(f, "sglang")
        for m, f in read.items()
        if f != read[catalog.ITL] and f != read[catalog.REQUEST_SUCCESS]
    }
    assert sglang[catalog.RUNNING] == "sglang:num_running_reqs"
    assert sglang[catalog.WAITING] == "sglang:num_queue_reqs"
    assert sglang[catalog.KV_USAGE] == "sglang:full_token_usage"  # not the rounded token_usage
    assert sglang[catalog.PREEMPTIONS] == "sglang:num_retracted_requests"
    for name in sglang.values():
        assert FAMILY_BY_NAME[name].engine == "sglang"
    with pytest.raises(KeyError):  # SGLang's ITL means something else: no equivalent
        catalog.native_name(read[catalog.ITL], "sglang")
    assert catalog.family_of_series("vllm:not_a_family_total") is None


def test_role_evidence_is_in_the_table() -> None:
    """Which families tell an engine's role is table data: SGLang's role label on every family
    that carries it, vLLM's KV-consumer gauge (a decode server); the code reads it from there."""
    assert catalog.SGLANG_ROLE_LABEL == "engine_type"
    assert catalog.KV_CONSUMER_FAMILY == "vllm:num_requests_kv_fetch_by_stage"
    for f in FAMILIES:
        has_label = "engine_type" in f.labels.split()
        if f.engine == "sglang":
            assert f.role_evidence.startswith("label engine_type") == has_label, f.name
    decode = [f.name for f in FAMILIES if f.role_evidence.startswith("decode:")]
    assert decode == [catalog.KV_CONSUMER_FAMILY]
