"""``fleetscope alerts``: the rules on stdout or in a file, both formats, the threshold options,
and every bad value refused as a usage error (usage line + one line, exit code 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetscope.cli import main
from fleetscope.dashboards.alerts import AlertOptions, parse_slo, rule_groups
from fleetscope.health import HealthThresholds


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(["alerts", *args])
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_rules_on_stdout_are_the_default_groups(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    assert yaml.safe_load(out) == {"groups": rule_groups(AlertOptions())}


def test_options_reach_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--engines", "vllm", "--engine-version", "vllm=0.32.0", "--scrape-interval", "5",
        "--rate-window", "60", "--metric-prefix", "vllm:", "--role-label", "tier",
        "--stall-seconds", "20", "--outlier-seconds", "40", "--paused-seconds", "90",
        "--kv-full", "0.9", "--kv-seconds", "15", "--queue-seconds", "30",
        "--preemption-burst", "20", "--outlier-fraction", "0.3", "--slo", "ttft:0.99<2.5s",
        "--slo", "e2e:0.95<20s",
    )  # fmt: skip
    assert code == 0
    th = HealthThresholds(
        stall_seconds=20, outlier_seconds=40, paused_seconds=90, kv_full=0.9, kv_seconds=15,
        queue_seconds=30, preemption_burst=20, outlier_fraction=0.3,
    )  # fmt: skip
    options = AlertOptions(
        thresholds=th,
        versions={"vllm": "0.32.0"},
        scrape_interval=5,
        rate_window=60,
        metric_prefix="vllm:",
        role_label="tier",
        slos=(parse_slo("ttft:0.99<2.5s"), parse_slo("e2e:0.95<20s")),
    )
    assert yaml.safe_load(out) == {"groups": rule_groups(options)}


def test_prometheusrule_into_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "rules.yaml"
    code, out, err = run(
        capsys, "--out", str(out_file), "--format", "prometheusrule", "--name", "fleet-rules",
        "--namespace", "monitoring", "--crd-label", "release=prom", "--crd-label", "team=rl",
    )  # fmt: skip
    assert code == 0 and out == "" and err.strip() == f"wrote {out_file}"
    resource = yaml.safe_load(out_file.read_text(encoding="utf-8"))
    assert resource["kind"] == "PrometheusRule"
    assert resource["metadata"] == {
        "name": "fleet-rules",
        "namespace": "monitoring",
        "labels": {"release": "prom", "team": "rl"},
    }
    assert resource["spec"]["groups"] == rule_groups(AlertOptions())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--slo", "ttft:0.99<2.3s"], "not a bucket bound of vllm:time_to_first_token_seconds"),
        (["--slo", "ttft:0.99<2.3s"], "the nearest are 1s and 2.5s"),
        (["--slo", "ttft:0.99<2.5s"], "sglang 0.5.23; the nearest are 2s and 4s"),
        (["--slo", "itl:0.99<0.1s"], "give --engines vllm or --engines sglang"),
        (["--slo", "ttft<2s"], "expected SLI:OBJECTIVE<THRESHOLD"),
        (["--slo", "ttft:1.5<2s"], "between 0 and 1"),
        (
            ["--engines", "vllm", "--engine-version", "vllm=0.31.0", "--slo", "ttft:0.9<1s"],
            "does not know the buckets",
        ),
        (["--engines", "vllm", "--engine-version", "sglang=0.5.23"], "--engines is vllm"),
        (["--engine-version", "0.32.0"], "expected KEY=VALUE"),
        (["--kv-full", "1.5"], "must be at most 1"),
        (["--outlier-fraction", "0"], "must be a positive number"),
        (["--scrape-interval", "0"], "must be a positive number"),
        (["--stall-seconds", "soon"], "expected a number"),
        (["--metric-prefix", "sglang:"], "invalid choice"),
        (["--role-label", "engine"], "a label the rules use"),
        (["--format", "json"], "invalid choice"),
        (["--crd-label", "release"], "expected KEY=VALUE"),
    ],
)
def test_bad_values_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "", err
    assert len(lines) == 2 and lines[0] == "usage: fleetscope alerts [options]", err
    assert says in lines[1], err


def test_an_unwritable_out_is_a_failure(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "--out", str(tmp_path / "no" / "such" / "dir.yml"))
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "cannot write --out" in err


def test_watch_and_alerts_share_the_threshold_flags() -> None:
    """One declaration (cli/_health_flags.py): the same flags reach ``HealthThresholds`` in
    both commands; ``--stale-seconds`` is ``watch``'s alone (no rule uses it)."""
    from fleetscope.cli import build_parser
    from fleetscope.cli._health_flags import health_thresholds
    from fleetscope.health import HealthThresholds

    parser = build_parser()
    flags = ["--stall-seconds", "12", "--kv-full", "0.8", "--preemption-burst", "3"]
    watch = parser.parse_args(["watch", "http://127.0.0.1:1", *flags, "--stale-seconds", "7"])
    alerts = parser.parse_args(["alerts", *flags])
    for args, stale in ((watch, 7.0), (alerts, HealthThresholds().stale_seconds)):
        t = health_thresholds(args)
        assert (t.stall_seconds, t.kv_full, t.preemption_burst) == (12.0, 0.8, 3.0)
        assert t.stale_seconds == stale
    with pytest.raises(SystemExit):
        parser.parse_args(["alerts", "--stale-seconds", "7"])
