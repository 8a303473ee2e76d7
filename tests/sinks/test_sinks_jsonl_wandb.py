"""JsonlSink and WandbSink, with W&B runs read back from their own files.

How an offline W&B run is read back (checked on wandb 0.31.0): wandb >= 0.30 ships
``wandb leet inspect PATH --json``, which prints the run's ``.wandb`` transaction log as one
JSON object per record (PATH: the ``.wandb`` file, its run directory, or a wandb directory), e.g.

    {"num":9,"type":"metric","metric":{"name":"inference/step","options":{"defined":true}}}
    {"num":13,"type":"history","history":{"item":{"_step":0,"inference/x":1.5,...},
                                          "step":{"num":0}}}
    {"num":21,"type":"summary","summary":{"update":{"inference/s":"hello"}}}
    {"num":26,"type":"exit","exit":{"exit_code":0}}

``wandb leet inspect PATH --summary --json`` prints one object with the run's ``state``,
``config`` and merged ``summary``. Values come back as JSON numbers (a logged ``3.0`` reads back
as ``3``, so compare with ``==``); NaN/+inf/-inf come back as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``. The Python datastore reader that older answers point to
(``wandb.sdk.internal.datastore``) no longer exists in 0.31, so the leet CLI is the reader here.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetscope.sinks.base import Sink, Value
from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
from fleetscope.sinks.wandb import WandbSink, api_key_configured, resolve_mode
from fleetscope.util.warn import RateLimitedWarner

WANDB_LOGGER = "fleetscope.sinks.wandb"
NONFINITE_STRINGS = {"NaN", "Infinity", "-Infinity"}

POLLS: list[tuple[int, float, dict[str, Any]]] = [
    (
        0,
        1_700_000_000.25,
        {
            "inference/requests_running": 3,
            "inference/kv_cache_usage": 0.125,
            "inference/ttft_p50_s": 1 / 3,
            "inference/model": "llama-3-8b",
            "inference/tokens_total": 2**53 + 1,
            "inference/tiny": -2.5e-300,
        },
    ),
    (
        1,
        1_700_000_001.5,
        {
            "inference/requests_running": 0,
            "inference/kv_cache_usage": 0.0,
            "inference/ttft_p50_s": float("nan"),
            "inference/model": "llama-3-8b",
            "inference/tokens_total": 2**53 + 7,
            "inference/tiny": float("inf"),
        },
    ),
    (
        2,
        1_700_000_002.75,
        {
            "inference/requests_running": 7,
            "inference/kv_cache_usage": 0.875,
            "inference/ttft_p50_s": 0.1 + 0.2,
            "inference/model": "llama-3-8b",
            "inference/tokens_total": 123,
            "inference/tiny": float("-inf"),
        },
    ),
]
SUMMARY_1: dict[str, Value] = {
    "inference/polls": 2,
    "inference/model": "llama-3-8b",
    "inference/p99_s": 0.5,
}
SUMMARY_2: dict[str, Value] = {"inference/polls": 3, "inference/p99_s": 0.123456789}


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline wandb, everything under tmp_path, no key, no network."""
    import wandb  # noqa: F401  # the test extra installs it: fail loudly

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
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def leet_records(path: Path) -> list[dict[str, Any]]:
    """Every record of the run's .wandb log, in order."""
    return [json.loads(line) for line in leet(path).splitlines() if line.strip()]


def leet_summary(path: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(leet(path, "--summary"))
    return summary


def history_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["history"]["item"] for r in records if r["type"] == "history"]


def user_keys(row: dict[str, Any]) -> dict[str, Any]:
    """Drop W&B's own keys (_step, _runtime, _timestamp, _wandb.*)."""
    return {k: v for k, v in row.items() if not k.startswith("_")}


def nonfinite_as_none(d: dict[str, Any]) -> dict[str, Any]:
    """W&B's "NaN"/"Infinity"/"-Infinity" as JsonlSink writes them: null."""
    return {k: None if isinstance(v, str) and v in NONFINITE_STRINGS else v for k, v in d.items()}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


class FakeRun:
    """Duck-typed stand-in for wandb's Run, for failure and payload tests without wandb."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.logged: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.defined: list[tuple[str, dict[str, Any]]] = []
        self.summary: dict[str, Any] = {}
        self.finished = 0

    def define_metric(self, name: str, **kw: Any) -> None:
        self.defined.append((name, kw))

    def log(self, data: dict[str, Any], **kw: Any) -> None:
        if self.fail:
            raise RuntimeError("tracker is down")
        self.logged.append((data, kw))

    def finish(self) -> None:
        self.finished += 1


def write_both(sinks: list[Sink]) -> None:
    for step, wall_time, metrics in POLLS:
        for s in sinks:
            s.log(metrics, step=step, wall_time=wall_time)
    for s in sinks:
        s.log_summary(SUMMARY_1)
        s.log_summary(SUMMARY_2)
    for s in sinks:
        s.close()
        s.close()  # idempotent


# --------------------------------------------------------------------------- W&B, real, offline


def test_wandb_offline_run_reads_back_equal_to_input_and_jsonl(wandb_env: Path) -> None:
    jsonl = JsonlSink(wandb_env / "polls.jsonl")
    sink = WandbSink(project="fleetscope-test", dir=wandb_env, config={"engines": 2})
    assert isinstance(sink, Sink) and isinstance(jsonl, Sink)
    assert sink.owns_run and sink.commit and sink.mode == "offline"
    wandb_file = Path(sink.run.settings.sync_file)
    write_both([sink, jsonl])

    records = leet_records(wandb_file)
    polls, jsonl_summary = read_jsonl(wandb_env / "polls.jsonl")

    # define_metric: the step axis and the glob bound to it.
    metrics = [r["metric"] for r in records if r["type"] == "metric"]
    assert {"name": "inference/step", "options": {"defined": True}} in metrics
    assert any(
        m.get("glob_name") == "inference/*" and m.get("step_metric") == "inference/step"
        for m in metrics
    )

    # History: one row per poll, W&B's _step 0..n-1 (the sink never passed step=).
    rows = history_rows(records)
    assert [r["_step"] for r in rows] == list(range(len(POLLS)))
    assert len(polls) == len(rows) == len(POLLS)
    for (step, wall_time, metrics_in), row, poll in zip(POLLS, rows, polls, strict=True):
        got = user_keys(row)
        numeric_in = {k: v for k, v in metrics_in.items() if not isinstance(v, str)}
        # W&B: exactly the numeric keys, plus the step axis and wall time; strings skipped.
        assert set(got) == set(numeric_in) | {"inference/step", "inference/wall_time"}
        assert got["inference/step"] == step
        assert got["inference/wall_time"] == wall_time
        for k, v in numeric_in.items():
            if math.isfinite(v):
                assert got[k] == v, k
            else:  # non-finite floats come back as W&B's strings
                assert got[k] == {math.inf: "Infinity", -math.inf: "-Infinity"}.get(v, "NaN")
        # JSONL: same step and wall time; all keys (strings too); non-finite as null.
        assert poll["step"] == step and poll["wall_time"] == wall_time
        assert set(poll["metrics"]) == set(metrics_in)
        jsonl_numeric = {k: v for k, v in poll["metrics"].items() if not isinstance(v, str)}
        wandb_numeric = nonfinite_as_none(got)
        del wandb_numeric["inference/step"], wandb_numeric["inference/wall_time"]
        assert wandb_numeric == jsonl_numeric

    # Summary: W&B's merged summary holds what we set (strings too), as does JSONL's.
    expected_summary = {**SUMMARY_1, **SUMMARY_2}
    summary = leet_summary(wandb_file)
    assert summary["state"] == "finished"  # the sink created the run, so close() finished it
    assert summary["config"] == {"engines": 2}
    assert {k: summary["summary"][k] for k in expected_summary} == expected_summary
    assert jsonl_summary == expected_summary
    exits = [r for r in records if r["type"] == "exit"]
    assert len(exits) == 1 and exits[0]["num"] == records[-1]["num"]
    assert exits[0]["exit"]["exit_code"] == 0  # wandb adds `runtime` (seconds) on slow runs


def test_wandb_trainer_owned_run(wandb_env: Path, caplog: pytest.LogCaptureFixture) -> None:
    import wandb

    trainer = wandb.init(project="trainer", dir=wandb_env, reinit="create_new")
    wandb_file = Path(trainer.settings.sync_file)
    sink = WandbSink(run=trainer, history="trainer")  # the single-run mode (companion: see
    # tests/sinks/test_wandb_trainer_run.py)
    assert sink.run is trainer and not sink.owns_run and not sink.commit
    poll = 0
    for global_step in range(3):
        # The usual RL-trainer pattern: explicit step=. A sink that advanced _step between
        # these calls would make W&B drop the trainer's rows.
        trainer.log({"train/loss": 1.0 / (global_step + 1)}, step=global_step)
        for _ in range(2):
            sink.log({"inference/x": 10.0 * poll}, step=poll, wall_time=1e9 + poll)
            poll += 1
    sink.log_summary({"inference/polls": poll})
    sink.close()
    trainer.log({"train/loss": 0.125}, step=3)  # still open: UsageError if finished
    trainer.finish()
    records = leet_records(wandb_file)

    metrics = [r["metric"] for r in records if r["type"] == "metric"]
    assert any(m.get("name") == "inference/step" for m in metrics)
    assert any(
        m.get("glob_name") == "inference/*" and m.get("step_metric") == "inference/step"
        for m in metrics
    )
    rows = history_rows(records)
    # Every trainer row is there at the trainer's step; no row was added by the sink.
    assert [(r["_step"], r["train/loss"]) for r in rows] == [
        (0, 1.0),
        (1, 0.5),
        (2, 1 / 3),
        (3, 0.125),
    ]
    # Polls ride on the trainer's rows: the last poll before each trainer log survives.
    assert [(r.get("inference/step"), r.get("inference/x")) for r in rows] == [
        (1, 10.0),
        (3, 30.0),
        (5, 50.0),
        (None, None),
    ]
    assert leet_summary(wandb_file)["summary"]["inference/polls"] == 6
    assert not [r for r in caplog.records if r.name == WANDB_LOGGER]

    # Tracker trouble: the trainer has finished the run; the sink warns, drops, never raises.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=WANDB_LOGGER):
        late = WandbSink(run=trainer, history="trainer")  # define_metric fails -> warning
        for i in range(5):
            late.log({"inference/x": 1.0}, step=i, wall_time=0.0)
        late.log_summary({"inference/polls": 1})
        late.close()
    messages = [r.getMessage() for r in caplog.records if r.name == WANDB_LOGGER]
    assert len(messages) == 3, messages  # define_metric, log (once, 4 held back), summary
    assert any("define_metric failed" in m and "UsageError" in m for m in messages)
    assert sum("run.log failed" in m for m in messages) == 1
    assert late._warner.suppressed("log") == 4


# --------------------------------------------------------------------------- W&B, no wandb calls


def test_wandb_sink_payload_and_rate_limited_failures(caplog: pytest.LogCaptureFixture) -> None:
    import wandb  # noqa: F401  # the test extra installs it: fail loudly

    run = FakeRun()
    sink = WandbSink(run=run, history="trainer")  # type: ignore[arg-type]  # duck-typed Run
    assert run.defined == [
        ("inference/step", {}),
        ("inference/*", {"step_metric": "inference/step"}),
    ]
    sink.log({"inference/a": 1.5, "inference/name": "x", "inference/n": 2}, step=4, wall_time=9.5)
    assert run.logged == [
        (
            {"inference/a": 1.5, "inference/n": 2, "inference/step": 4, "inference/wall_time": 9.5},
            {"commit": False},  # never step=; trainer-owned run: join the trainer's row
        )
    ]
    sink.log_summary({"inference/name": "x", "inference/p": 0.5})
    assert run.summary == {"inference/name": "x", "inference/p": 0.5}
    sink.close()
    assert run.finished == 0  # not ours to finish

    now = [1000.0]
    bad = FakeRun(fail=True)
    sink = WandbSink(run=bad, commit=True, history="trainer")  # type: ignore[arg-type]  # duck-typed
    sink._warner._clock = lambda: now[0]
    with caplog.at_level(logging.WARNING, logger=WANDB_LOGGER):
        for i in range(10):
            sink.log({"inference/a": 1.0}, step=i, wall_time=0.0)  # must not raise
            now[0] += 5.0  # 10 failures over 50 s: one warning
        now[0] += 20.0  # 60 s after the first: the next one is told, with the count
        sink.log({"inference/a": 1.0}, step=10, wall_time=0.0)
    messages = [r.getMessage() for r in caplog.records if r.name == WANDB_LOGGER]
    assert len(messages) == 2
    assert "run.log failed, dropped poll 0" in messages[0] and "tracker is down" in messages[0]
    assert "dropped poll 10" in messages[1] and "9 similar warning(s) suppressed" in messages[1]


def test_wandb_sink_without_wandb_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'fleetscope\[wandb\]'"):
        WandbSink(run=FakeRun())  # type: ignore[arg-type]  # duck-typed Run


def test_resolve_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_MODE", "WANDB_DISABLED", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc_file = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert not api_key_configured()
    assert resolve_mode(None) == "offline"  # no key anywhere
    assert resolve_mode("disabled") == "disabled"  # explicit wins
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc_file.chmod(0o600)
    assert api_key_configured() and resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert resolve_mode(None) == "offline"  # the netrc entry is for another host
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode(None) == "offline"  # the environment's explicit mode wins
    assert resolve_mode("online") == "online"


# --------------------------------------------------------------------------- JSONL


def test_jsonl_nonfinite_written_as_null_and_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.jsonl"
    sink = JsonlSink(path)
    sink.log(
        {"a": float("nan"), "b": float("inf"), "c": float("-inf"), "d": 1.0, "e": "s"},
        step=0,
        wall_time=float("nan"),
    )
    sink.log_summary({"p": float("inf"), "q": 2})
    text = path.read_text()  # flushed per line: readable before close()
    sink.close()

    def reject(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    lines = [json.loads(line, parse_constant=reject) for line in text.splitlines()]
    assert lines == [
        {
            "step": 0,
            "wall_time": None,
            "metrics": {"a": None, "b": None, "c": None, "d": 1.0, "e": "s"},
        },
        {"summary": {"p": None, "q": 2}},
    ]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    with JsonlSink(path) as sink:
        write_both([sink])
    polls, summary = read_jsonl(path)
    assert [(p["step"], p["wall_time"]) for p in polls] == [(s, w) for s, w, _ in POLLS]
    for (_, _, metrics_in), poll in zip(POLLS, polls, strict=True):
        expected = {k: v if not isinstance(v, float) or math.isfinite(v) else None
                    for k, v in metrics_in.items()}  # fmt: skip
        assert poll["metrics"] == expected
        assert all(
            type(poll["metrics"][k]) is type(v)
            for k, v in metrics_in.items()
            if poll["metrics"][k] is not None
        )
    assert summary == {**SUMMARY_1, **SUMMARY_2}  # per key, the last summary line wins

    # append=True keeps what is there; a torn last line (crash mid-write) is ignored.
    with JsonlSink(path, append=True) as sink:
        sink.log({"x": 1}, step=0, wall_time=5.0)
        sink.log_summary({"inference/polls": 99})
    with path.open("a") as fh:
        fh.write('{"step": 1, "wall_ti')
    polls, summary = read_jsonl(path)
    assert len(polls) == len(POLLS) + 1 and polls[-1]["metrics"] == {"x": 1}
    assert summary["inference/polls"] == 99

    path.write_text('{"step": 0\n{"summary": {}}\n')
    with pytest.raises(ValueError, match=":1: not JSON"):
        read_jsonl(path, strict=True)


def test_read_jsonl_skips_and_reports_a_torn_line_mid_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A torn line mid-file (a disk that was full for a moment, with an older writer) is
    skipped and reported; the lines around it are read."""
    path = tmp_path / "f.jsonl"
    good = '{"step":0,"wall_time":1.0,"metrics":{"a":1}}'
    path.write_text(
        good + "\n" + '{"step":1,"wall_time":2.0,"metr' + "\n"
        '{"step":2,"wall_time":3.0,"metrics":{"a":3}}\n[1]\n{"summary":{"s":1}}\n'
    )
    errors: list[tuple[int, str]] = []
    with caplog.at_level(logging.WARNING, logger="fleetscope.sinks.jsonl"):
        polls, summary = read_jsonl(path, errors=errors)
    assert [p["step"] for p in polls] == [0, 2] and summary == {"s": 1}
    assert [e[0] for e in errors] == [2, 4]
    assert "skipped 2 torn or malformed line(s)" in caplog.text


def test_jsonl_disk_full_mid_line_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that stops half way (ENOSPC after a short write) is cut back: the file holds
    whole lines only, and the next poll after the disk has room again is written whole."""
    import errno
    import os

    path = tmp_path / "f.jsonl"
    sink = JsonlSink(path)
    sink.log({"a": 1}, step=0, wall_time=1.0)
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])  # a short write ...
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with caplog.at_level(logging.WARNING, logger="fleetscope.sinks.jsonl"):
        sink.log({"a": 2, "b": "x" * 1000}, step=1, wall_time=2.0)  # lost, warned
        sink.log({"a": 3}, step=2, wall_time=3.0)  # the disk has room again
        sink.log_summary({"s": 1})
    monkeypatch.undo()
    sink.close()
    assert "No space left" in caplog.text
    text = path.read_text()
    assert text.endswith("\n")
    for line in text.splitlines():
        json.loads(line)  # every line whole
    errors: list[tuple[int, str]] = []
    polls, summary = read_jsonl(path, errors=errors)
    assert errors == [] and [p["step"] for p in polls] == [0, 2] and summary == {"s": 1}


def test_jsonl_append_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text('{"step":0,"wall_time":1.0,"metrics":{"a":1}}\n{"step":1,"wal')
    with JsonlSink(path, append=True) as sink:
        sink.log({"a": 2}, step=1, wall_time=2.0)
    errors: list[tuple[int, str]] = []
    polls, _ = read_jsonl(path, errors=errors)
    assert errors == [] and [p["metrics"]["a"] for p in polls] == [1, 2]


def test_jsonl_log_after_close_warns_not_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JsonlSink(tmp_path / "f.jsonl")
    sink.close()
    with caplog.at_level(logging.WARNING, logger="fleetscope.sinks.jsonl"):
        for i in range(3):
            sink.log({"x": 1.0}, step=i, wall_time=0.0)
    assert len(caplog.records) == 1 and "sink is closed" in caplog.records[0].getMessage()


def test_rate_limited_warner_per_kind() -> None:
    now = [0.0]
    records: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    log = logging.getLogger("fleetscope.test.warn")
    log.addHandler(Handler())
    log.propagate = False
    try:
        w = RateLimitedWarner(log, clock=lambda: now[0], prefix="S: ")
        assert w.warn("a", "one")
        assert w.warn("b", "other kind")
        assert not w.warn("a", "two")
        now[0] = 59.9
        assert not w.warn("a", "three")
        now[0] = 60.0
        assert w.warn("a", "four")
    finally:
        log.propagate = True
        log.handlers.clear()
    assert records == [
        "S: one",
        "S: other kind",
        "S: four (2 similar warning(s) suppressed in the last 60 s)",
    ]


def test_wandb_alerts_for_health_events(wandb_env: Path) -> None:
    """Health events become W&B alerts when enabled: once per condition and engine per
    interval (read back from the offline run), never when disabled."""
    from fleetscope.health import HealthEvent

    stalled = HealthEvent("generation_stalled", "decode0.0", 4.0, "decode0.0: no token for 5 s")
    full = HealthEvent("kv_cache_near_full", "server1.1", 0.99, "server1.1: KV cache 99% full")
    sink = WandbSink(project="alerts", alerts=True, alert_interval=600)
    sink.log_events([stalled])
    sink.log_events([stalled, full])  # the stall again within the interval: not re-sent
    wandb_file = Path(sink.run.settings.sync_file)
    sink.close()
    alerts = [r["alert"] for r in leet_records(wandb_file) if r["type"] == "alert"]
    assert [a["title"] for a in alerts] == [
        "fleetscope: generation_stalled on decode0.0",
        "fleetscope: kv_cache_near_full on server1.1",
    ]
    assert alerts[0]["text"] == stalled.message and alerts[0]["level"] == "WARN"

    quiet = WandbSink(project="alerts")  # alerts are opt-in
    quiet.log_events([stalled])
    quiet_file = Path(quiet.run.settings.sync_file)
    quiet.close()
    assert not [r for r in leet_records(quiet_file) if r["type"] == "alert"]
