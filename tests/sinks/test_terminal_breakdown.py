"""The terminal shows where the engines' time went (docs/rules.md §3.13): a line per window at
its stop, in every mode, and a table of every run label in the final summary (``watch``'s and
``demo``'s last table)."""

from __future__ import annotations

import io
import re
from typing import Any

from fleetscope.collector.core import Collector
from fleetscope.fleet.state import PollResult
from fleetscope.sinks.terminal import TerminalSink, engine_time_rows, window_lines
from fleetscope.stats.breakdown import PHASES
from fleetscope_sim import LoadProfile, SimFleet
from support.simsource import SimSource


async def run() -> tuple[list[PollResult], dict[str, Any]]:
    """A prefill/decode fleet: an idle ``warmup`` window, a loaded ``train`` window (the decode
    side overloaded); every poll's result and the run summary."""
    fleet = SimFleet(seed=4)
    fleet.add_endpoint(role="prefill", dp=2, load=LoadProfile(arrival_rate=0.0))
    fleet.add_endpoint(role="decode", dp=2, load=LoadProfile(arrival_rate=0.0))
    fleet.step(2.0)
    results: list[PollResult] = []
    c = Collector(source=SimSource(fleet), interval=3600, fetch_model_info=False)

    async def polls(n: int) -> None:
        for _ in range(n):
            fleet.step(1.0)
            results.append((await c.poll()).result)

    await polls(1)
    for label in ("warmup", "train"):
        w = c.window(label)
        await w.astart()
        if label == "train":
            with fleet.lock:
                for e in fleet.endpoint("decode0").engines:
                    e.set_arrival_rate(80.0)
                for e in fleet.endpoint("prefill0").engines:
                    e.set_arrival_rate(2.0)
        await polls(8)
        fleet.step(1.0)
        await w.astop()
        assert c.last is not None
        results.append(c.last.result)  # the stop's row: it carries the window's keys
    await c.stop()
    return results, c.summary()


async def test_a_line_per_window_at_its_stop_in_every_mode() -> None:
    results, _ = await run()
    stops = [r for r in results if window_lines(r.keys)]
    assert len(stops) == 2 and all(r.held for r in stops)
    (warmup,) = window_lines(stops[0].keys)
    assert re.fullmatch(
        r"window warmup: idle 100% busy 0% saturated 0% paused 0% syncing 0% "
        r"of 36 engine-s -> engines_idle",
        warmup,
    ), warmup
    (train,) = window_lines(stops[1].keys)
    assert train.startswith("window train: ") and "-> engines_saturated" in train, train
    assert "tok per busy engine-s" in train
    for live in (None, False, True):  # a pipe (one line per poll), tables, the live view
        out = io.StringIO()
        sink = TerminalSink(file=out, live=live)
        for r in results:
            sink.log_poll(r)
        sink.close()
        text = " ".join(out.getvalue().split())
        assert warmup in text and train in text, (live, text[-2000:])


async def test_the_final_table_names_each_labels_bottleneck_and_side() -> None:
    _, summary = await run()
    rows = {(r.label, r.scope): r for r in engine_time_rows(summary)}
    assert set(rows) >= {
        (label, scope)
        for label in ("warmup", "train", "combined")
        for scope in ("agg", "prefill", "decode")
    }
    for r in rows.values():
        assert abs(sum(r.shares) - 1.0) < 1e-12 and len(r.shares) == len(PHASES)
    assert rows[("warmup", "agg")].verdict == "engines_idle"  # both sides idle: neither
    assert rows[("train", "decode")].verdict == "engines_saturated"
    assert rows[("train", "agg")].verdict.endswith("(decode side)")
    assert rows[("train", "prefill")].shares[0] > 0.5  # the prefill side waits on decode
    out = io.StringIO()
    sink = TerminalSink(file=out, live=False)
    sink.console.width = 200
    sink.log_summary(summary)
    text = out.getvalue()
    assert "where the engines' time went" in text and "engines_saturated" in text
    assert "tok/busy eng-s" in text and "bottleneck" in text
