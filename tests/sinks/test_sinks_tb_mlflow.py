"""TensorBoardSink and MlflowSink, read back with TensorBoard's and MLflow's own readers.

A real Collector watches a simulated fleet (a prefill and a decode server with two engines
each, on loopback) with a JsonlSink, a TensorBoardSink and an MlflowSink side by side, through
polls, a ``train`` window and the final run summary. Every value that TensorBoard's
``EventAccumulator`` and ``MlflowClient`` read back must equal the JSONL sink's (TensorBoard:
to float32).

MLflow store: a local ``file:`` URI in tmp_path. MLflow 3.x refuses the file store unless
``MLFLOW_ALLOW_FILE_STORE=true`` (it is in "maintenance mode"; sqlite is the recommended local
backend), so the tests set that variable. The file store's ``get_metric_history`` walks every
metric file of the run per call (~0.3 s at 1,500 keys here), so full histories are compared
for a sample of keys and the latest value (``get_run().data.metrics``) for every key.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow  # noqa: F401  # installed by the test extra: a missing one must fail loudly
import numpy as np
import pytest
import tensorboard  # type: ignore[import-untyped]  # noqa: F401  # no stubs, no py.typed
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import _validate_metric_name
from tensorboard.backend.event_processing import (  # type: ignore[import-untyped]  # no stubs
    event_accumulator as ea,
)
from tensorboard.util import tensor_util  # type: ignore[import-untyped]  # no stubs

from fleetscope.collector.core import Collector
from fleetscope.sinks.base import Sink
from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
from fleetscope.sinks.mlflow import MAX_METRICS_PER_BATCH, MlflowSink, mlflow_key
from fleetscope.sinks.tensorboard import SUMMARY_PREFIX, TensorBoardSink
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet

ML_LOGGER = "fleetscope.sinks.mlflow"
TB_LOGGER = "fleetscope.sinks.tensorboard"


@dataclass
class Scenario:
    tmp: Path
    polls: list[dict[str, Any]]
    summary: dict[str, Any]
    tb_dir: Path
    ml_uri: str
    run_id: str
    batch_sizes: list[int]
    tb: Any = None  # the EventAccumulator, loaded once


async def _drive(fleet: SimFleet, server: FleetServer, sinks: list[Sink]) -> None:
    endpoints = [
        Endpoint(url, role=ep.role) for url, ep in zip(server.urls, fleet.endpoints, strict=True)
    ]
    collector = Collector(endpoints, interval=3600, sinks=sinks)
    await collector.poll()
    fleet.step(2.0)
    train = collector.window("train")
    await train.astart()  # a poll
    fleet.step(2.0)
    await train.astop()  # a poll, then the window's keys at the same step
    fleet.step(2.0)
    await collector.poll()
    fleet.step(2.0)
    await collector.stop()  # a last poll, the run summary, sinks closed


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    tmp = tmp_path_factory.mktemp("tb_mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        ml_uri = (tmp / "mlruns").as_uri()
        fleet = SimFleet.build(2, dp=2, roles=["prefill", "decode"], seed=7)
        fleet.step(3.0)
        jsonl = JsonlSink(tmp / "polls.jsonl")
        tb = TensorBoardSink(tmp / "tb")
        ml = MlflowSink(ml_uri, experiment="fleetscope-test", run_name="e2e")
        batch_sizes: list[int] = []
        real_log_batch = ml.client.log_batch

        def spy(
            run_id: str,
            metrics: Sequence[Metric] = (),
            params: Sequence[Param] = (),
            tags: Sequence[RunTag] = (),
            **kw: Any,
        ) -> object:
            batch_sizes.append(len(metrics) + len(tags))
            return real_log_batch(run_id, metrics=metrics, params=params, tags=tags, **kw)

        mp.setattr(ml.client, "log_batch", spy)
        with FleetServer(fleet) as server:
            asyncio.run(_drive(fleet, server, [jsonl, tb, ml]))
        polls, summary = read_jsonl(tmp / "polls.jsonl")
        acc = ea.EventAccumulator(str(tmp / "tb"), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        yield Scenario(
            tmp, polls, summary, tmp / "tb", ml_uri, ml.run_id, batch_sizes, acc.Reload()
        )


def _history(polls: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """key -> [(step, wall_time, value)] in the order the sinks received them."""
    out: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for p in polls:
        for k, v in p["metrics"].items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[k].append((p["step"], p["wall_time"], v))
    return out


def test_scenario_is_big_enough(scenario: Scenario) -> None:
    """The scenario exercises what it should: >1,000 keys a poll, labels, roles, windows."""
    sizes = [len(p["metrics"]) for p in scenario.polls]
    assert len(scenario.polls) >= 5 and max(sizes) > MAX_METRICS_PER_BATCH
    keys = set(_history(scenario.polls))
    assert any("{" in k for k in keys)
    assert any(k.startswith("inference/decode/") for k in keys)
    assert any(k.startswith("inference/train/") for k in keys)
    assert scenario.summary["run_status"] == "success"
    assert len(scenario.summary) > 100


def test_tensorboard_reads_back_every_poll(scenario: Scenario) -> None:
    acc = scenario.tb
    hist = _history(scenario.polls)
    scalar_tags = set(acc.Tags()["scalars"])
    numeric_summary = {k: v for k, v in scenario.summary.items() if not isinstance(v, str)}
    assert scalar_tags == set(hist) | {SUMMARY_PREFIX + k for k in numeric_summary}
    for key, expected in hist.items():
        got = acc.Scalars(key)
        assert [(e.step, e.wall_time) for e in got] == [(s, w) for s, w, _ in expected], key
        np.testing.assert_array_equal(
            np.array([e.value for e in got], dtype=np.float32),
            np.array([v for _, _, v in expected], dtype=np.float32),
            err_msg=key,
        )


def test_tensorboard_summary(scenario: Scenario) -> None:
    acc = scenario.tb
    last_step = max(p["step"] for p in scenario.polls)
    for key, v in scenario.summary.items():
        tag = SUMMARY_PREFIX + key
        if isinstance(v, str):
            (t,) = acc.Tensors(tag)
            assert t.step == last_step
            assert tensor_util.make_ndarray(t.tensor_proto).item().decode() == v
        else:
            (e,) = acc.Scalars(tag)
            assert e.step == last_step
            assert e.value == pytest.approx(v, rel=1e-6, abs=1e-30), key
            assert np.float32(e.value) == np.float32(v), key
    strings = sorted(SUMMARY_PREFIX + k for k, v in scenario.summary.items() if isinstance(v, str))
    assert "summary/run_status" in strings  # and each endpoint's engine kind and version
    assert sorted(acc.Tags()["tensors"]) == strings


def test_mlflow_latest_values_and_summary(scenario: Scenario) -> None:
    client = MlflowClient(tracking_uri=scenario.ml_uri)
    run = client.get_run(scenario.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "e2e"
    assert client.get_experiment(run.info.experiment_id).name == "fleetscope-test"
    hist = _history(scenario.polls)
    metrics = run.data.metrics
    numeric_summary = {k: v for k, v in scenario.summary.items() if not isinstance(v, str)}
    expected = {mlflow_key(k): h[-1][2] for k, h in hist.items()}
    expected.update({mlflow_key(k): v for k, v in numeric_summary.items()})
    assert len(expected) == len(hist) + len(numeric_summary)  # no two keys share a name
    assert metrics == expected  # exact: float64 through and back
    assert run.data.tags["run_status"] == "success"
    # the label rule, on a key the collector really emits
    assert any(
        k.startswith("inference/agg/request_success_total{finished_reason=length}") for k in hist
    )
    assert "inference/agg/request_success_total.finished_reason.length:rate/sum" in metrics
    assert not any(c in k for k in metrics for c in '{}=,"')


def test_mlflow_histories(scenario: Scenario) -> None:
    client = MlflowClient(tracking_uri=scenario.ml_uri)
    hist = _history(scenario.polls)
    keys = sorted(hist)
    sample = [k for k in keys if "{" in k][:2]
    sample += [k for k in keys if k.startswith("inference/train/")][:1]
    sample += ["inference/decode/generation_tokens_total:rate/min"]
    sample += ["inference/agg/engines_reporting", "inference/decode0.1/num_requests_running"]
    sample += random.Random(5).sample(keys, 2)
    for key in sample:
        got = sorted(
            (m.step, m.timestamp, m.value)
            for m in client.get_metric_history(scenario.run_id, mlflow_key(key))
        )
        want = [(s, round(w * 1000), v) for s, w, v in hist[key]]
        assert got == want, key


def test_mlflow_batches(scenario: Scenario) -> None:
    assert scenario.batch_sizes and max(scenario.batch_sizes) <= MAX_METRICS_PER_BATCH
    per_poll = [
        sum(1 for v in p["metrics"].values() if not isinstance(v, str)) for p in scenario.polls
    ]
    numeric_summary = sum(1 for v in scenario.summary.values() if not isinstance(v, str))
    tags = sum(1 for v in scenario.summary.values() if isinstance(v, str))  # run_status, ...
    assert sum(scenario.batch_sizes) == sum(per_poll) + numeric_summary + tags


# --------------------------------------------------------------------------- key rule


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (
            "request_success_total{finished_reason=length}",
            "request_success_total.finished_reason.length",
        ),
        (
            "inference/agg/request_success_total{finished_reason=length}:rate/sum",
            "inference/agg/request_success_total.finished_reason.length:rate/sum",
        ),
        ('x{a="1",b="2"}/sum', "x.a.1.b.2/sum"),
        (
            "inference/decode0.1/generation_tokens_total:rate",
            "inference/decode0.1/generation_tokens_total:rate",
        ),
        ("/a//b/./../c/", "a/b/_/__/c"),
        ("tok/s (héllo)", "tok/s _h_llo_"),
        ("", "_"),
    ],
)
def test_mlflow_key_rule(key: str, name: str) -> None:
    assert mlflow_key(key) == name
    _validate_metric_name(name)  # type: ignore[no-untyped-call]  # MLflow's own check (untyped)
    assert mlflow_key(name) == name  # valid names are left alone


def test_mlflow_key_long() -> None:
    a, b = "k/" + "x" * 300, "k/" + "x" * 299 + "y"
    na, nb = mlflow_key(a), mlflow_key(b)
    assert len(na) == len(nb) == 250 and na != nb
    assert na[:241] == a[:241]
    _validate_metric_name(na)  # type: ignore[no-untyped-call]  # MLflow's check, untyped


# --------------------------------------------------------------------------- unit behaviour


@pytest.fixture
def file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def test_mlflow_clash_strings_existing_run_and_failed(
    file_store: str, caplog: pytest.LogCaptureFixture
) -> None:
    owner = MlflowSink(file_store, experiment="e", run_name="trainer")
    sink = MlflowSink(file_store, run_id=owner.run_id)
    assert not sink.owns_run and isinstance(sink, Sink)
    with caplog.at_level(logging.WARNING, logger=ML_LOGGER):
        sink.log(
            {"a{x=y}": 1.0, "a.x.y": 2.0, "flag": True, "model": "m", "n": 3},
            step=4,
            wall_time=1_700_000_000.5,
        )
    assert "both map to" in caplog.text
    sink.log_summary({"total": 7, "run_status": "failed"})
    sink.close()
    sink.close()  # idempotent
    client = MlflowClient(tracking_uri=file_store)
    run = client.get_run(owner.run_id)
    assert run.info.status == "RUNNING"  # not ours to end
    m = run.data.metrics
    clash = [k for k in m if k.startswith("a.x.y-")]
    assert m["a.x.y"] == 1.0 and len(clash) == 1 and m[clash[0]] == 2.0
    assert m["flag"] == 1.0 and m["n"] == 3.0 and "model" not in m
    assert m["total"] == 7.0 and run.data.tags["run_status"] == "failed"
    (total,) = client.get_metric_history(owner.run_id, "total")
    assert total.step == 4
    owner.log_summary({"run_status": "failed"})
    owner.close()
    assert client.get_run(owner.run_id).info.status == "FAILED"


def test_mlflow_summary_republished_wins(file_store: str) -> None:
    sink = MlflowSink(file_store)
    sink.log({"x": 1.0}, step=0, wall_time=1.0)
    sink.log_summary({"s": 5.0})
    sink.log_summary({"s": 1.0})  # same step, same millisecond maybe: the later one must win
    sink.close()
    assert MlflowClient(tracking_uri=file_store).get_run(sink.run_id).data.metrics["s"] == 1.0


def test_mlflow_trouble_never_raises(
    file_store: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sink = MlflowSink(file_store, retry_after=3600)
    calls: list[int] = []

    def broken(
        run_id: str,
        metrics: Sequence[Metric] = (),
        params: Sequence[Param] = (),
        tags: Sequence[RunTag] = (),
        **kw: Any,
    ) -> None:
        calls.append(len(metrics))
        raise ConnectionError("tracking server down")

    monkeypatch.setattr(sink.client, "log_batch", broken)
    keys = {f"k{i}": float(i) for i in range(2500)}
    with caplog.at_level(logging.WARNING, logger=ML_LOGGER):
        sink.log(keys, step=0, wall_time=1.0)  # first batch fails: the rest of the poll dropped
        assert calls == [1000]
        sink.log(keys, step=1, wall_time=2.0)  # paused: not even tried
        sink.log(keys, step=2, wall_time=3.0)
        assert calls == [1000]
        sink.log_summary({"s": 1.0, "run_status": "success"})  # the summary is always tried
        assert calls == [1000, 1]
    assert caplog.text.count("log_batch failed") == 1  # rate-limited
    monkeypatch.setattr(
        sink.client, "set_terminated", lambda *a, **k: (_ for _ in ()).throw(OSError("x"))
    )
    sink.close()
    sink.log(keys, step=3, wall_time=4.0)  # after close: a warning, no raise
    sink.log_summary({"s": 2.0})


def test_tensorboard_trouble_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    assert isinstance(sink, Sink)
    sink.log({"a": 1.5, "flag": True, "name": "skipped", "big": 1e300}, step=0, wall_time=10.0)

    class Broken:
        _file_name = "x"

        def add_event(self, event: object) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            raise OSError("disk full")

    real, sink._writer = sink._writer, Broken()
    with caplog.at_level(logging.WARNING, logger=TB_LOGGER):
        sink.log({"a": 2.0}, step=1, wall_time=11.0)
        sink.close()
        sink.close()
        sink.log({"a": 3.0}, step=2, wall_time=12.0)
        sink.log_summary({"s": 1.0})
    assert "disk full" in caplog.text and "sink is closed" in caplog.text
    real.close()
    acc = ea.EventAccumulator(str(tmp_path / "tb"), size_guidance={ea.SCALARS: 0}).Reload()
    assert sorted(acc.Tags()["scalars"]) == ["a", "big", "flag"]
    assert [(e.step, e.value) for e in acc.Scalars("a")] == [(0, 1.5)]
    assert acc.Scalars("flag")[0].value == 1.0
    assert acc.Scalars("big")[0].value == float("inf")  # beyond float32
