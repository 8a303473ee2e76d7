"""``WandbSink(run=trainer_run)``: every poll kept, and no trainer row ever dropped or moved,
whether the trainer logs with ``step=`` or without. Both offline runs are read back with
``wandb leet inspect`` (see tests/sinks/test_sinks_jsonl_wandb.py for the record format).

Eight polls between three trainer steps: the old sink (``commit=False`` into the trainer's
row) kept two or three of them; the companion run keeps all eight, in rows of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetscope.sinks.wandb import WandbSink


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import wandb  # noqa: F401

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return tmp_path


def leet(path: Path, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(path), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in leet(path).splitlines() if x.strip()]


def rows(path: Path) -> list[dict[str, Any]]:
    return [r["history"]["item"] for r in records(path) if r["type"] == "history"]


# trainer step -> polls logged after it (8 polls between/after 3 trainer steps)
PLAN = {0: 3, 1: 2, 2: 3}


@pytest.mark.parametrize("style", ["explicit_step", "no_step"])
def test_every_poll_kept_and_no_trainer_row_lost(wandb_env: Path, style: str) -> None:
    import wandb

    trainer = wandb.init(project="rl", name="trainer", dir=wandb_env, reinit="create_new")
    trainer_file = Path(trainer.settings.sync_file)
    sink = WandbSink(run=trainer)
    assert sink.run is trainer and not sink.owns_run and sink.history_run is not trainer
    companion_file = Path(sink.history_run.settings.sync_file)
    poll = 0
    train_steps = [0, 10, 20] if style == "explicit_step" else [0, 1, 2]
    for i, global_step in enumerate(train_steps):
        if style == "explicit_step":
            trainer.log({"train/loss": 1.0 / (i + 1)}, step=global_step)
        else:
            trainer.log({"train/loss": 1.0 / (i + 1)})
        if i == 1:
            sink.on_window_start("train")
        for _ in range(PLAN[i]):
            keys = {"inference/agg/x": 10.0 * poll}
            if i == 1 and poll == 4:  # the poll that stopped the "train" window
                keys["inference/train/agg/tokens/delta"] = 123.0
            sink.log(keys, step=poll, wall_time=1e9 + poll)
            poll += 1
    assert poll == 8
    sink.log_summary({"inference_summary/combined/agg/tokens/delta": 456.0, "run_status": "x"})
    sink.close()
    last = 30 if style == "explicit_step" else None
    if last is None:
        trainer.log({"train/loss": 0.125})  # still open: the sink left it alone
    else:
        trainer.log({"train/loss": 0.125}, step=last)
    trainer.finish()

    # the trainer's run: every trainer row, at the trainer's steps; no poll row
    t_rows = rows(trainer_file)
    expected_steps = [*train_steps, 30 if style == "explicit_step" else 3]
    assert [r["_step"] for r in t_rows] == expected_steps
    assert [r["train/loss"] for r in t_rows] == [1.0, 0.5, 1 / 3, 0.125]
    assert not any("inference/agg/x" in r for r in t_rows)
    # the window's keys ride in a trainer row, never one of their own: with step=, the row of
    # the step during which the window stopped (still pending); without, the trainer's next
    # row (run.log() without step= commits its row at once)
    windows = [r.get("inference/train/agg/tokens/delta") for r in t_rows]
    if style == "explicit_step":
        assert windows == [None, 123, None, None]
    else:
        assert windows == [None, None, 123, None]
    t_summary = json.loads(leet(trainer_file, "--summary"))
    assert t_summary["summary"]["inference_summary/combined/agg/tokens/delta"] == 456
    companion_id = t_summary["summary"]["fleetscope/history_run_id"]
    assert companion_id == sink.history_run.id

    # the companion run: one row per poll, all eight, on inference/step
    c_rows = rows(companion_file)
    assert [r["inference/step"] for r in c_rows] == list(range(8))
    assert [r["inference/agg/x"] for r in c_rows] == [10.0 * p for p in range(8)]
    c = json.loads(leet(companion_file, "--summary"))
    assert c["state"] == "finished"
    assert c["summary"]["inference_summary/combined/agg/tokens/delta"] == 456
    assert c["config"]["fleetscope/trainer_run_id"] == trainer.id
    info = [r for r in records(companion_file) if r["type"] == "run"]
    assert info, "no run record"
    run = info[0]["run"]
    assert run.get("run_group", run.get("group")) == trainer.id, sorted(run)
    assert run.get("job_type") == "fleetscope", sorted(run)
