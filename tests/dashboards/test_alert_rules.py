"""The rules ``fleetscope alerts`` writes (fleetscope.dashboards.alerts), without Prometheus:
checked against the catalog (a typo or a removed name is a build error), the SLO objectives and
their bucket bounds, the ``for:`` durations, the YAML both formats are written in, and the bucket
table against its evidence. promtool runs them in test_alert_promtool.py, a real Prometheus
against fleetscope's HealthMonitor in test_alert_parity.py."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import yaml

from fleetscope import catalog
from fleetscope.dashboards import _alert_promql
from fleetscope.dashboards.alerts import (
    ALERTS,
    DEFAULT_VERSIONS,
    DIFFERENCES,
    SLO_ALERT,
    AlertOptions,
    RuleError,
    alert_names,
    parse_slo,
    rule_groups,
    rules_yaml,
    slo_problem,
)
from fleetscope.health import CONDITIONS, HealthThresholds
from support.paths import ROOT

VLLM = {"vllm": DEFAULT_VERSIONS["vllm"]}
SGLANG = {"sglang": DEFAULT_VERSIONS["sglang"]}
EVERY = AlertOptions(slos=(parse_slo("ttft:0.99<10s"), parse_slo("e2e:0.95<20s")))
NAME_RE = re.compile(r'(vllm|sglang)(?:\[:_\]|[:_])([a-z0-9_]+)"?')
RECORDED_RE = re.compile(r"\b(fleetscope_[a-z]+:[a-z0-9_:]+)")


def rules(options: AlertOptions) -> list[dict[str, Any]]:
    return [r for g in rule_groups(options) for r in g["rules"]]


# ------------------------------------------------------------------------------- the catalog


@pytest.mark.parametrize("versions", [VLLM, SGLANG, dict(DEFAULT_VERSIONS)], ids=str)
@pytest.mark.parametrize("prefix", [None, "vllm:", "vllm_"])
def test_every_name_a_rule_reads_is_a_catalog_family(
    versions: dict[str, str], prefix: str | None
) -> None:
    """Read back from the written expressions (not from the builder): every engine series is a
    catalog family of an engine the rules target, every recorded series is recorded."""
    options = dataclasses.replace(EVERY, versions=versions, metric_prefix=prefix)
    if "vllm" not in versions or "sglang" not in versions:
        options = dataclasses.replace(options, slos=(parse_slo("e2e:0.99<10s"),))
    recorded = {r["record"] for r in rules(options) if "record" in r}
    seen = set()
    for rule in rules(options):
        for engine, name in NAME_RE.findall(rule["expr"]):
            family = catalog.family_of_series(f"{engine}:{name}")
            assert family is not None, (engine, name, rule["expr"])
            assert family.engine in versions, family
            seen.add(family.name)
        for name in RECORDED_RE.findall(rule["expr"]):
            assert name in recorded, (name, rule.get("record") or rule.get("alert"))
    assert len(seen) >= (14 if len(versions) == 2 else 8), seen


def test_a_typo_is_a_build_error() -> None:
    target = EVERY.target
    with pytest.raises(RuleError, match="vllm:num_requests_runing"):
        _alert_promql.Series(target, "vllm:num_requests_runing")
    s = _alert_promql.Series(target, "sglang:realtime_tokens", "_total")
    with pytest.raises(RuleError, match="mdoe"):
        s.sel(eq={"mdoe": "decode"})
    with pytest.raises(RuleError, match="le"):  # a counter has no buckets
        s.sel(match={"le": "1"})


def test_a_family_removed_from_the_catalog_is_a_build_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = dict(catalog.FAMILY_BY_NAME)
    del table["vllm:num_preemptions"]
    monkeypatch.setattr(catalog, "FAMILY_BY_NAME", table)
    with pytest.raises(RuleError, match="vllm:num_preemptions"):
        rule_groups(AlertOptions(versions=VLLM))
    rule_groups(AlertOptions(versions=SGLANG))  # SGLang's retractions are another family


def test_a_family_outside_the_targeted_version_is_a_build_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family the table says an engine version no longer (or not yet) has is refused for
    that version, and for that version only."""
    table = dict(catalog.FAMILY_BY_NAME)
    table["sglang:num_queue_reqs"] = dataclasses.replace(
        table["sglang:num_queue_reqs"], last="0.5.20"
    )
    monkeypatch.setattr(catalog, "FAMILY_BY_NAME", table)
    with pytest.raises(RuleError, match=r"sglang:num_queue_reqs is not in sglang 0\.5\.23"):
        rule_groups(AlertOptions(versions=SGLANG))
    rule_groups(AlertOptions(versions={"sglang": "0.5.20"}))
    rule_groups(AlertOptions(versions=VLLM))


def test_a_label_the_family_lacks_is_a_build_error(monkeypatch: pytest.MonkeyPatch) -> None:
    table = dict(catalog.FAMILY_BY_NAME)
    fam = table["vllm:num_requests_running"]
    table[fam.name] = dataclasses.replace(fam, labels="model_name")  # no engine label
    monkeypatch.setattr(catalog, "FAMILY_BY_NAME", table)
    with pytest.raises(RuleError, match="engine"):
        rule_groups(AlertOptions(versions=VLLM))


# ------------------------------------------------------------------------------- the alerts


def test_alert_names_labels_and_annotations() -> None:
    health = [
        "FleetscopeGenerationStalled",
        "FleetscopeKvCacheNearFull",
        "FleetscopeQueueGrowing",
        "FleetscopePreemptionBurst",
        "FleetscopeEngineOutlier",
        "FleetscopeTargetDown",
    ]
    assert alert_names(AlertOptions(versions=VLLM)) == [*health, "FleetscopeEngineAsleep"]
    assert alert_names(AlertOptions(versions=SGLANG)) == health  # SGLang has no sleep state
    assert alert_names(EVERY) == [*health, "FleetscopeEngineAsleep", SLO_ALERT]
    for rule in rules(EVERY):
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["labels"]["condition"] in (*CONDITIONS, "slo")
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}
    # every HealthMonitor condition an exposition shows has its alert
    shown = {ALERTS[n].condition for n in [*health, "FleetscopeEngineAsleep"]}
    assert set(CONDITIONS) - shown == {"stale_version"}  # versions are in no series


STALL, KV, QUEUE = (
    "FleetscopeGenerationStalled",
    "FleetscopeKvCacheNearFull",
    "FleetscopeQueueGrowing",
)
OUTLIER, ASLEEP = "FleetscopeEngineOutlier", "FleetscopeEngineAsleep"


@pytest.mark.parametrize(
    ("scrape", "expect"),
    [
        # stall 30 s, KV 10 s and 2 polls, queue 20 s and 4 polls, outlier 30 s, asleep 60 s
        (15.0, {STALL: "15s", KV: "15s", QUEUE: "45s", OUTLIER: "15s", ASLEEP: "45s"}),
        (5.0, {STALL: "25s", KV: "5s", QUEUE: "15s", OUTLIER: "25s", ASLEEP: "55s"}),
        (0.5, {STALL: "29500ms", KV: "9500ms", QUEUE: "19500ms", ASLEEP: "59500ms"}),
        (60.0, {STALL: "0s", KV: "1m", QUEUE: "3m", OUTLIER: "0s", ASLEEP: "0s"}),
    ],
)
def test_for_is_the_threshold_less_one_scrape(scrape: float, expect: dict[str, str]) -> None:
    options = AlertOptions(scrape_interval=scrape)
    fors = {r["alert"]: r.get("for", "0s") for r in rules(options) if "alert" in r}
    assert {name: fors[name] for name in expect} == expect
    assert fors["FleetscopePreemptionBurst"] == fors["FleetscopeTargetDown"] == "0s"
    health = rule_groups(options)[0]
    assert health["name"] == "fleetscope-health"
    assert health["interval"] == _alert_promql.duration(scrape)


def test_thresholds_and_options_reach_the_rules() -> None:
    th = HealthThresholds(kv_full=0.9, preemption_burst=25, outlier_fraction=0.5)
    options = AlertOptions(thresholds=th, role_label="tier", metric_prefix="vllm_")
    text = rules_yaml(options)
    assert "kv_cache_usage_perc >= 0.9\n" in text
    assert "num_preemptions:idelta >= 25\n" in text
    assert "(0.5 * fleetscope_role:" in text
    assert 'tier!="prefill"' in text
    for rule in rules(options):  # the role label is "tier" everywhere
        assert re.search(r"(?<![_a-z])role(?![_a-z])", rule["expr"]) is None, rule["expr"]
    assert "vllm_num_requests_running" in text and "sglang_num_running_reqs" in text
    assert "__name__" not in text.split("groups:", 1)[1].split("fleetscope-fleet")[0]


def test_bad_options_are_refused() -> None:
    bad: list[dict[str, Any]] = [
        {"metric_prefix": "sglang:"},
        {"role_label": "engine"},
        {"role_label": "1role"},
        {"versions": {}},
        {"versions": {"tgi": "1.0"}},
        {"scrape_interval": 0.0},
    ]
    for kw in bad:
        with pytest.raises(RuleError):
            AlertOptions(**kw)


# ------------------------------------------------------------------------------- SLOs


def test_parse_slo() -> None:
    slo = parse_slo("ttft:0.99<2.5s")
    assert (slo.sli, slo.objective, slo.threshold, slo.name) == (
        "ttft",
        0.99,
        2.5,
        "ttft:0.99<2.5s",
    )
    assert parse_slo("itl:0.9<50ms").threshold == pytest.approx(0.05)
    for bad, says in (
        ("ttft:0.99", "expected"),
        ("ttft<2.5s", "expected"),
        ("latency:0.99<2s", "not an SLI"),
        ("ttft:1<2s", "between 0 and 1"),
        ("ttft:0<2s", "between 0 and 1"),
        ("ttft:0.99<0s", "positive"),
        ("ttft:0.9.9<2s", "expected"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_slo(bad)


def test_an_slo_threshold_must_be_a_bucket_bound_of_every_engine() -> None:
    both = AlertOptions().target
    assert slo_problem(parse_slo("ttft:0.99<10s"), both) is None  # a bound of both engines
    problem = slo_problem(parse_slo("ttft:0.99<2.5s"), both)  # vLLM's, not SGLang's
    assert problem == (
        "--slo ttft:0.99<2.5s: 2.5s is not a bucket bound of sglang:time_to_first_token_seconds "
        "in sglang 0.5.23; the nearest are 2s and 4s"
    )
    vllm = AlertOptions(versions=VLLM).target
    assert slo_problem(parse_slo("ttft:0.99<2.5s"), vllm) is None
    assert "the smallest is 0.001s" in str(slo_problem(parse_slo("ttft:0.9<0.0001s"), vllm))
    assert "the largest is 7680s" in str(slo_problem(parse_slo("e2e:0.9<9000s"), vllm))
    old = AlertOptions(versions={"vllm": "0.31.0"}).target
    assert "does not know the buckets" in str(slo_problem(parse_slo("ttft:0.9<2.5s"), old))
    assert "not pooled" in str(slo_problem(parse_slo("itl:0.9<0.1s"), both))
    with pytest.raises(RuleError, match="nearest are 2s and 4s"):
        rule_groups(AlertOptions(slos=(parse_slo("ttft:0.99<2.5s"),)))


def test_bucket_table_matches_the_engines_sources() -> None:
    """catalog.bucket_bounds against the families extracted from vLLM's and SGLang's source."""
    vllm = json.loads((ROOT / "tests/data/vllm-families/families.json").read_text())
    sglang = json.loads((ROOT / "tests/data/sglang-0.5.23/families.json").read_text())
    checked = 0
    for version, families in [*vllm.items(), ("0.5.23", sglang)]:
        for fam in families:
            bounds = catalog.bucket_bounds(fam["name"], version)
            if bounds is not None:
                assert bounds == tuple(fam["buckets"]), fam["name"]
                checked += 1
    assert checked == 2 * 4 + 4
    assert catalog.bucket_bounds("vllm:time_to_first_token_seconds", "0.31.0") is None
    assert catalog.bucket_bounds("vllm:time_to_first_token_seconds", "0.40.0") is not None


# ------------------------------------------------------------------------------- YAML


@pytest.mark.parametrize("options", [AlertOptions(), EVERY, AlertOptions(versions=SGLANG)])
def test_yaml_is_the_groups(options: AlertOptions) -> None:
    text = rules_yaml(options)
    assert text.startswith("# Generated by `fleetscope alerts`")
    assert yaml.safe_load(text) == {"groups": rule_groups(options)}
    resource = yaml.safe_load(
        rules_yaml(options, "prometheusrule", namespace="mon", labels={"release": "prom"})
    )
    assert resource == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "fleetscope", "namespace": "mon", "labels": {"release": "prom"}},
        "spec": {"groups": rule_groups(options)},
    }


def test_docs_describe_every_alert_with_its_runbook() -> None:
    doc = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    for name, entry in ALERTS.items():
        assert f"### {name}" in doc, name
        assert entry.runbook in " ".join(doc.split()), name
    assert f"### {SLO_ALERT}" in doc
    for name in DIFFERENCES:  # where Prometheus must judge otherwise, said in the docs
        assert f"- **{name}**" in doc, name
