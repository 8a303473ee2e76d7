"""``promtool`` on the rules ``fleetscope alerts`` writes: ``check rules`` on every variant the
command can write, ``test rules`` on the unit tests in ``tests/dashboards/promtool/``.

Each ``*.test.yml`` names the rule file it tests (``rule_files``); :data:`RULE_FILES` says what
options write it. The test files give each expected alert's labels and ``summary`` (a rendered
template); this test fills in the constant ``description`` and ``runbook`` annotations from
:data:`fleetscope.dashboards.alerts.ALERTS`, so the runbooks are written in one place.

``promtool`` comes with Prometheus (Debian: ``apt-get install prometheus``): when it is missing
these tests fail, they are never skipped.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.dashboards.alerts import (
    ALERTS,
    DEFAULT_VERSIONS,
    SLO_ALERT,
    SLO_DOC,
    AlertOptions,
    parse_slo,
    rules_yaml,
)
from fleetscope.health import HealthThresholds
from support.prom import find_promtool_binary

HERE = Path(__file__).parent / "promtool"
VLLM = {"vllm": DEFAULT_VERSIONS["vllm"]}
SGLANG = {"sglang": DEFAULT_VERSIONS["sglang"]}

#: the rule files the unit tests name, and the options that write them
RULE_FILES: dict[str, AlertOptions] = {
    "vllm.rules.yml": AlertOptions(versions=VLLM),
    "sglang.rules.yml": AlertOptions(versions=SGLANG),
    "both.rules.yml": AlertOptions(),
    "slo.rules.yml": AlertOptions(
        slos=(parse_slo("e2e:0.99<10s"),), thresholds=HealthThresholds(), rate_window=60.0
    ),
    "slo-vllm.rules.yml": AlertOptions(versions=VLLM, slos=(parse_slo("ttft:0.99<2.5s"),)),
}
TEST_FILES = sorted(HERE.glob("*.test.yml"))


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_promtool_binary(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def with_annotations(test: dict[str, Any]) -> dict[str, Any]:
    """The unit test with each expected alert's description and runbook filled in."""
    for case in test.get("tests", []):
        for check in case.get("alert_rule_test", []):
            name = check["alertname"]
            doc = SLO_DOC if name == SLO_ALERT else ALERTS[name]
            for alert in check.get("exp_alerts") or []:
                notes = alert.setdefault("exp_annotations", {})
                notes.setdefault("description", doc.meaning)
                notes.setdefault("runbook", doc.runbook)
    return test


def test_every_test_file_names_a_known_rule_file() -> None:
    assert len(TEST_FILES) >= 4
    for path in TEST_FILES:
        test = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert set(test["rule_files"]) <= set(RULE_FILES), path.name


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_promtool_unit_tests(path: Path, tmp_path: Path) -> None:
    test = with_annotations(yaml.safe_load(path.read_text(encoding="utf-8")))
    for name in test["rule_files"]:
        (tmp_path / name).write_text(rules_yaml(RULE_FILES[name]), encoding="utf-8")
    (tmp_path / path.name).write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    out = promtool("test", "rules", path.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------------------- every variant

ENGINES = {"vllm": VLLM, "sglang": SGLANG, "both": dict(DEFAULT_VERSIONS)}
PREFIXES = (None, "vllm:", "vllm_")
SLOS = {
    "vllm": ("ttft:0.99<2.5s", "itl:0.95<0.1s", "tpot:0.9<0.05s", "e2e:0.99<10s"),
    "sglang": ("ttft:0.99<2s", "itl:0.95<0.1s", "tpot:0.9<0.04s", "e2e:0.99<10s"),
    "both": ("ttft:0.99<10s", "tpot:0.9<0.1s", "e2e:0.99<10s"),
}


def variants() -> list[tuple[str, AlertOptions, str]]:
    """Every kind of file the command writes: each engine set, naming style, with and without
    objectives, another role label and scrape interval, in both formats."""
    out = []
    for (engines, versions), prefix, slo in itertools.product(
        ENGINES.items(), PREFIXES, (False, True)
    ):
        options = AlertOptions(
            versions=versions,
            metric_prefix=prefix,
            slos=tuple(parse_slo(s) for s in SLOS[engines]) if slo else (),
            role_label="tier" if slo else "role",
            scrape_interval=30.0 if slo else 15.0,
        )
        for fmt in ("rules", "prometheusrule"):
            out.append(
                (f"{engines}-{prefix or 'any'}-{'slo' if slo else 'plain'}-{fmt}", options, fmt)
            )
    return out


def test_promtool_checks_every_variant(tmp_path: Path) -> None:
    names = []
    for name, options, fmt in variants():
        text = rules_yaml(options, "prometheusrule" if fmt == "prometheusrule" else "rules")
        if fmt == "prometheusrule":  # promtool reads rule files: the resource's spec is one
            resource = yaml.safe_load(text)
            assert resource["kind"] == "PrometheusRule"
            assert resource["spec"] == yaml.safe_load(rules_yaml(options))
            text = yaml.safe_dump(resource["spec"], sort_keys=False)
        (tmp_path / f"{name}.yml").write_text(text, encoding="utf-8")
        names.append(f"{name}.yml")
    assert len(names) == 36
    out = promtool("check", "rules", *names, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(names), out.stdout
