"""``MultiprocessSource``: a ``PROMETHEUS_MULTIPROC_DIR`` read in this process.

* the merge is prometheus_client's: ``MultiProcessCollector`` over the same files gives the same
  families and samples, in every gauge mode, with processes alive, exited, and marked dead;
* a collector on the directory logs the keys a collector scraping a ``MultiProcessCollector``
  registry over HTTP logs (values too, except those that depend on the moment of the read);
* a worker that exits never takes its counts away, even when its files are removed; a worker
  that appears adds exactly what it records; a file replaced at the same path is a new file;
* a torn, cut-short or misnamed file is a warning naming the file, never an exception, and its
  last good values stand in for it; an empty file is skipped silently; a directory that does
  not exist yet is a failed scrape until it does;
* ``fleetscope watch --multiproc-dir DIR`` reads it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

import fleetscope as fs
from fleetscope.collector.core import Collector
from fleetscope.exposition import Exposition, parse
from fleetscope.sources.http.source import HttpSource
from fleetscope.sources.multiproc import MultiprocessSource
from support.loopback import LoopbackServer
from support.multiproc import (
    GAUGE_MODES,
    Worker,
    counter_rows,
    multiprocess_collector,
    prometheus_clients_merge,
    write_file,
)
from support.paths import ROOT

CLOCK = re.compile(r":rate|latency_seconds|poll_seconds|active_seconds")
TOKENS = "inference/agg/generation_tokens_total/delta"


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.close()


Normal = tuple[str, str, list[tuple[str, list[tuple[str, str]], float]]]


def _normal(metrics: list[Metric]) -> list[Normal]:
    """Families and their samples, order-free (the collector's file order is the OS's)."""
    out: list[Normal] = []
    for m in metrics:
        samples = sorted((s.name, sorted(s.labels.items()), s.value) for s in m.samples)
        out.append((m.name, m.type, samples))
    return sorted(out)


def _values(expo: Exposition) -> dict[str, dict[str, float]]:
    snaps = {label: expo[label] for label in expo}
    return {
        label: dict(zip(s.layout.slot_ids, s.data.tolist(), strict=True))
        for label, s in snaps.items()
    }


def test_the_merge_is_prometheus_clients(tmp_path: Path, workers: list[Worker]) -> None:
    """Three processes: alive, exited, exited and marked dead (its live* gauges removed)."""
    for i in range(3):
        w = Worker(tmp_path)
        workers.append(w)
        for engine in ("0", "1"):
            w.do(engine=engine, tokens=10 * i + 1, prompt=5, ttft=[0.05 * (i + 1), 0.5, 50.0])
            w.do(engine=engine, running=i, gauge=float(i * 2 + int(engine)))
    workers[1].exit(mark_dead=False)
    workers[2].exit(mark_dead=True)
    source = MultiprocessSource(tmp_path)
    ours = source.files.read()
    theirs = prometheus_clients_merge(tmp_path)
    assert _normal(ours) == _normal(theirs)
    # the same files in the same (directory) order: the same families and samples, in order
    assert [(m.name, m.type, m.samples) for m in ours] == [
        (m.name, m.type, m.samples) for m in theirs
    ]
    names = {m.name for m in ours}
    assert {f"vllm:test_gauge_{m}" for m in GAUGE_MODES} <= names
    assert {"vllm:generation_tokens", "vllm:time_to_first_token_seconds"} <= names
    live = next(m for m in ours if m.name == "vllm:test_gauge_liveall")
    assert {s.labels["pid"] for s in live.samples} == {str(workers[0].pid), str(workers[1].pid)}
    assert source.files.unreadable == set()


def _http_twin(directory: Path) -> tuple[LoopbackServer, CollectorRegistry]:
    reg = CollectorRegistry()
    multiprocess_collector(reg, directory)
    return LoopbackServer({"/metrics": lambda _r: generate_latest(reg)}), reg


async def test_keys_equal_an_http_scrape_of_the_directory(
    tmp_path: Path, workers: list[Worker]
) -> None:
    workers += [Worker(tmp_path), Worker(tmp_path)]
    for w in workers:  # two API server processes, each serving both engines' requests
        for engine in ("0", "1"):
            w.do(engine=engine, tokens=3, prompt=7, ttft=[0.05], running=1, gauge=1.0)
    server, reg = _http_twin(tmp_path)
    with server:
        source = MultiprocessSource(tmp_path)
        ours = Collector(source=source, interval=3600)
        http = HttpSource([server.url], discover_roles=False, fetch_model_info=False)
        theirs = Collector(source=http, interval=3600)
        views = [(await ours.poll(), await theirs.poll())]
        workers[0].do(engine="0", tokens=40, ttft=[0.5, 5.0], running=2)
        workers[1].do(engine="1", tokens=2, prompt=100, ttft=[0.005])
        views.append((await ours.poll(), await theirs.poll()))
        expo = source.read()[0]
        await ours.stop()
        await theirs.stop()
    assert _values(expo) == _values(parse(generate_latest(reg)))
    for a, b in views:
        assert set(a.keys) == set(b.keys) and set(a.engines) == {"server0.0", "server0.1"}
        assert [k for k in a.keys if a.keys[k] != b.keys[k] and not CLOCK.search(k)] == []
    k = views[-1][0].keys
    assert k[TOKENS] == 42 and k["inference/agg/time_to_first_token_seconds/delta"] == 3
    assert views[-1][0].engines["server0.0"].running == 2  # mostrecent: the latest write wins


async def test_workers_that_exit_keep_their_counts_and_new_ones_add(
    tmp_path: Path, workers: list[Worker]
) -> None:
    a, b = Worker(tmp_path), Worker(tmp_path)
    workers += [a, b]
    a.do(tokens=100, gauge=1.0)
    b.do(tokens=10, gauge=2.0)
    collector = Collector(source=fs.MultiprocessSource(tmp_path), interval=3600)
    first = await collector.poll()
    assert first.keys["inference/server0.0/generation_tokens_total"] == 110

    a.exit(mark_dead=True)  # its live gauges go, its counters stay
    after_exit = await collector.poll()
    assert after_exit.keys[TOKENS] == 0
    assert after_exit.keys["inference/server0.0/test_gauge_livesum"] == 2.0

    for f in tmp_path.glob(f"*_{a.pid}.db"):  # its files removed too
        f.unlink()
    removed = await collector.poll()
    assert removed.keys[TOKENS] == 0
    assert removed.keys["inference/server0.0/generation_tokens_total"] == 110
    assert removed.keys["inference/server0.0/test_gauge_sum"] == 2.0  # a's gauges are gone

    c = Worker(tmp_path)
    workers.append(c)
    c.do(tokens=7)
    b.do(tokens=1)
    joined = await collector.poll()
    await collector.stop()
    assert joined.keys[TOKENS] == 8
    assert joined.keys["inference/server0.0/generation_tokens_total"] == 118
    assert joined.keys["inference/agg/scrape_failures"] == 0


async def test_a_file_replaced_at_the_same_path_is_a_new_file(tmp_path: Path) -> None:
    write_file(tmp_path, "counter_7.db", counter_rows(50.0))
    collector = Collector(source=MultiprocessSource(tmp_path), interval=3600)
    window = collector.window("w")
    await window.astart()
    # pid 7 exits, another process gets pid 7 (a new file, maybe with the old inode number)
    os.unlink(tmp_path / "counter_7.db")
    write_file(tmp_path, "counter_7.db", counter_rows(3.0))
    keys = await window.astop()
    view = collector.last
    await collector.stop()
    assert view is not None
    assert view.keys["inference/server0.0/generation_tokens_total"] == 53
    assert keys["inference/w/agg/generation_tokens_total/delta"] == 3
    assert keys["inference/w/engine_restarts"] == 0


def _cut_short(path: Path) -> None:
    data = path.read_bytes()
    used = int.from_bytes(data[:4], "little")
    path.write_bytes(data[: used - 20])


def _garbage_key(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[12:16] = b"\xff\xfe{]"  # inside the first entry's key: not UTF-8, not JSON
    path.write_bytes(bytes(data))


def _header_only(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:3])


def _runs_backwards(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = (-100).to_bytes(4, "little", signed=True)  # a length that moves the reader back
    path.write_bytes(bytes(data))


FAULTS = {
    "cut_short": _cut_short,
    "garbage_key": _garbage_key,
    "header_only": _header_only,
    "runs_backwards": _runs_backwards,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_torn_file_is_a_warning_naming_it(
    tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(tmp_path, "counter_1.db", counter_rows(100.0))
    torn = write_file(tmp_path, "counter_2.db", counter_rows(20.0, engine="1"))
    source = MultiprocessSource(tmp_path, warn_interval=0.0)
    collector = Collector(source=source, interval=3600)
    await collector.poll()
    write_file(tmp_path, "counter_1.db", counter_rows(105.0))
    FAULTS[fault](torn)
    caplog.set_level(logging.WARNING, logger="fleetscope")
    view = await collector.poll()
    assert str(torn) in caplog.text and "unreadable" in caplog.text, caplog.text
    assert source.files.unreadable == {str(torn)}
    assert view.keys[TOKENS] == 5  # the torn file's last good values stand in for it
    assert view.keys["inference/server0.1/generation_tokens_total"] == 20
    assert view.keys["inference/agg/scrape_failures"] == 0

    torn.unlink()  # a new process writes it afresh
    write_file(tmp_path, "counter_2.db", counter_rows(4.0, engine="1"))
    healed = await collector.poll()
    await collector.stop()
    assert source.files.unreadable == set()
    assert healed.keys["inference/server0.1/generation_tokens_total"] == 24


async def test_a_file_never_read_is_left_out_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(tmp_path, "counter_1.db", counter_rows(100.0))
    (tmp_path / "counter_2.db").write_bytes(b"\x00\x10\x00\x00\x00\x00\x00\x00garbage")
    (tmp_path / "gauge_3.db").write_bytes(b"")  # no mode in its name
    (tmp_path / "counter_4.db").write_bytes(b"")  # being created: silently skipped
    (tmp_path / "notes.txt").write_text("not a metrics file")
    caplog.set_level(logging.WARNING, logger="fleetscope")
    source = MultiprocessSource(tmp_path)
    [r] = await source.scrape()
    await source.aclose()
    assert r.ok and r.exposition is not None
    assert r.exposition["0"].data.tolist().count(100.0) == 1
    for name in ("counter_2.db", "gauge_3.db"):
        assert str(tmp_path / name) in caplog.text
    assert "counter_4.db" not in caplog.text and "notes.txt" not in caplog.text
    assert source.files.unreadable == {str(tmp_path / "counter_2.db"), str(tmp_path / "gauge_3.db")}


async def test_a_directory_that_does_not_exist_yet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR"):
        MultiprocessSource()
    later = tmp_path / "later"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(later))
    source = MultiprocessSource(warn_interval=0.0)  # the variable's directory
    caplog.set_level(logging.WARNING, logger="fleetscope")
    [missing] = await source.scrape()
    assert not missing.ok and missing.error is not None and str(later) in missing.error
    assert str(later) in caplog.text
    later.mkdir()
    [empty] = await source.scrape()
    assert not empty.ok  # no engine yet
    write_file(later, "counter_1.db", counter_rows(1.0))
    [r] = await source.scrape()
    await source.aclose()
    assert r.ok and r.engine_kind == "vllm"


def test_watch_reads_a_multiprocess_directory(tmp_path: Path, workers: list[Worker]) -> None:
    (tmp_path / "dir").mkdir()
    w = Worker(tmp_path / "dir")
    workers.append(w)
    w.do(tokens=5, ttft=[0.05], running=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "fleetscope.cli", "watch", "--multiproc-dir"]
    cmd += [str(tmp_path / "dir"), "--once", "--json", "--interval", "0.2"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    keys = json.loads(p.stdout)
    assert keys["inference/agg/engines_reporting"] == 1
    assert keys["inference/server0.0/generation_tokens_total"] == 5
    bad = subprocess.run(
        [*cmd[:5], str(tmp_path / "dir"), "http://x:8000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "--multiproc-dir" in bad.stderr


async def test_sglang_schedulers_files(tmp_path: Path) -> None:
    """SGLang's schedulers (one per DP replica) write multiprocess files too: its engines are
    the ``dp_rank`` values, the engine kind is SGLang's."""
    for dp in ("0", "1"):
        labels = {"model_name": "m", "dp_rank": dp, "tp_rank": "0", "engine_type": "unified"}
        rows = [("sglang:generation_tokens", "sglang:generation_tokens_total", labels, 10.0, 0.0)]
        write_file(tmp_path, f"counter_7{dp}.db", rows)
    source = MultiprocessSource(tmp_path)
    collector = Collector(source=source, interval=3600)
    view = await collector.poll()
    await collector.stop()
    assert view.result.scrapes[0].engine_kind == "sglang"
    assert set(view.engines) == {"server0.0", "server0.1"}
    assert view.keys["inference/agg/generation_tokens_total/sum"] == 20
