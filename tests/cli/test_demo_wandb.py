"""``fleetscope demo`` end to end, W&B offline with no API key, read back from W&B's own files.

The demo runs as a user would run it (a subprocess, HOME in a temporary folder, no key, no
network). Its W&B run is then read back with ``python -m wandb leet inspect RUN --json`` (the
``.wandb`` transaction log, one JSON object per record; see test_sinks_jsonl_wandb.py) and
compared with the JSONL sink of the same run: same polls on the same ``inference/step`` axis;
W&B has the compact key set (docs/sinks.md: <= 1,500 keys a row, <= 3,000 in the run), the
JSONL the full one, with the same values; W&B's run summary is the compact subset of the JSONL's.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def same(a: Any, b: Any) -> bool:
    """W&B writes non-finite floats as strings, JSONL as null; everything else is exact."""
    if isinstance(a, str) and a in NONFINITE:
        return b is None
    return bool(a == b)


def leet_records(path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


rate_key = "inference/agg/generation_tokens_total:rate/sum"


def test_demo_offline_wandb_matches_jsonl(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from fleetscope.sinks.jsonl import read_jsonl

    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "demo-out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.pop("NETRC", None)
    env.update(
        HOME=str(home),  # no ~/.netrc, no ~/.config/wandb: no key anywhere
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path / "wandb-dir"),
        PYTHONUNBUFFERED="1",
    )
    # the demo runs in tmp_path: this checkout's src as an absolute path (a relative
    # PYTHONPATH=src would silently run whatever fleetscope is installed)
    src = ROOT / "src"
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(src),
            *(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
        ]
    )
    script = Path(sys.executable).with_name("fleetscope")  # the installed entry point
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fleetscope.cli"]
    args = ["demo", "--duration", "12", "--interval", "1", "--out", str(out), "--no-tui"]
    proc = subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=400,  # a bound for a loaded machine
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = proc.stdout[proc.stdout.rfind("fleetscope demo: done") :]
    assert report, proc.stdout[-3000:]

    # the report says where the results are, with paths that can be copied as printed
    jsonl = out / "polls.jsonl"
    assert str(jsonl) in report
    m = re.search(r"W&B run files: (\S+)", report)
    assert m, report
    run_dir = Path(m.group(1))
    assert run_dir.is_dir() and run_dir.name.startswith("offline-run-"), run_dir
    assert run_dir.parent == out / "wandb", run_dir  # OUT/wandb/offline-run-*, not wandb/wandb
    assert f"wandb sync {run_dir}" in report
    assert "run_status: success" in report
    assert not list(home.rglob("*.netrc")) and "api_key" not in proc.stderr.lower()

    polls, jsonl_summary = read_jsonl(jsonl)
    summary: dict[str, Any] = jsonl_summary  # JSON scalars, compared with numbers below
    assert len(polls) >= 8
    # the closing line counts what the summary and the JSONL count (the final poll included)
    assert f"polls: {len(polls)} " in report, report
    assert summary["inference_summary/combined/polls"] == len(polls)
    # no row shows a fleet rate over a sliver (docs/rules.md §3 item 12): a row with rates
    # comes at least half an interval (0.5 s) after the previous one that had them
    rated = [p["wall_time"] for p in polls if rate_key in p["metrics"]]
    gaps = [b - a for a, b in itertools.pairwise(rated)]
    assert len(rated) >= 6 and min(gaps) > 0.4, gaps
    records = leet_records(run_dir, env)
    kinds = [r["type"] for r in records]
    assert kinds.count("exit") == 1
    assert next(r for r in records if r["type"] == "exit")["exit"].get("exit_code", 0) == 0

    # history: one W&B row per JSONL line, on the same inference/step axis, same values
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [r["inference/step"] for r in rows] == [p["step"] for p in polls]
    assert [r["_step"] for r in rows] == list(range(len(rows)))  # W&B's own axis untouched
    distinct: set[str] = set()
    for row, poll in zip(rows, polls, strict=True):
        assert row["inference/wall_time"] == poll["wall_time"]
        mine = {k: v for k, v in row.items() if not k.startswith("_")}
        del mine["inference/step"], mine["inference/wall_time"]
        theirs = {k: v for k, v in poll["metrics"].items() if not isinstance(v, str)}
        # the compact key set (WandbSink's default): a subset of the full one, same values
        assert mine.keys() <= theirs.keys(), poll["step"]
        assert len(mine) <= 1500, (poll["step"], len(mine))
        distinct |= mine.keys()
        bad = [k for k in mine if not same(mine[k], theirs[k])]
        assert not bad, (poll["step"], [(k, mine[k], theirs[k]) for k in bad[:5]])
        for k in ("inference/agg/engines_reporting", "inference/health/generation_stalled"):
            assert k in mine, (poll["step"], k)
    assert len(distinct) <= 3000, len(distinct)
    step_defs = [r["metric"] for r in records if r["type"] == "metric"]
    assert any(
        d.get("glob_name") == "inference/*" and d.get("step_metric") == "inference/step"
        for d in step_defs
    )

    # the run summary: W&B's (summary updates merged in log order) holds the JSONL one
    wandb_summary: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            wandb_summary.update(r["summary"].get("update", {}))
            for k in r["summary"].get("remove", None) or ():
                wandb_summary.pop(k, None)
    key = "inference_summary/combined/agg/generation_tokens_total/delta"
    assert summary[key] > 0
    assert wandb_summary[key] == summary[key]
    assert wandb_summary["run_status"] == summary["run_status"] == "success"
    # W&B's is the compact subset of the JSONL summary, with the same values
    ours = [k for k in wandb_summary if k.startswith("inference_summary/")]
    assert ours and set(ours) <= summary.keys()
    bad = [k for k in ours if not same(wandb_summary[k], summary[k])]
    assert not bad, bad[:5]
    for label in ("train", "eval", "idle"):
        gen = summary[f"inference_summary/{label}/agg/generation_tokens_total/delta"]
        assert gen > 0, (label, gen)  # the demo polls until each part of the run saw tokens
    parts = sum(
        summary[f"inference_summary/{label}/agg/generation_tokens_total/delta"]
        for label in ("train", "eval", "idle")
    )
    assert parts == summary[key]

    # the demo's fault shows: decode0.0 stalls in the eval window
    assert any(
        p["metrics"].get("inference/decode/generation_tokens_total:rate/min") == 0 for p in polls
    )
    # ... and health names it: one engine stalled (and none before the fault)
    stalled = [p["metrics"]["inference/health/generation_stalled"] for p in polls]
    assert 1.0 in stalled and set(stalled) <= {0.0, 1.0}, stalled
    assert "decode0.0: " in proc.stdout + proc.stderr and "no token for" in proc.stderr
