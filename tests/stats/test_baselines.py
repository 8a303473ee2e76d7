"""``Baselines.advance_many`` (one matrix per layout) gives exactly the deltas of ``advance``
called engine by engine, whatever happens to the engines: steady growth, a series reset, a
process restart (start time moved, or counters dropped without one), an invalid value, a
series that disappears and returns, a refused connection, a new engine."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from fleetscope.exposition import Parser
from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.stats.baselines import BATCH_MIN, Advance, Baselines
from fleetscope.stats.deltas import EngineDelta
from support.bodies import drop_lines, set_values
from support.paths import fixture_text

WALL = 1_795_970_000.0
BODIES = [fixture_text(n) for n in ("single_idle.prom", "single_load.prom", "single_after.prom")]
GEN = r'^vllm:generation_tokens_total\{engine="0"'
PROMPT = r'^vllm:prompt_tokens_total\{engine="0"'
START = r"^process_start_time_seconds"
QUEUE = r"^vllm:request_queue_time_seconds_(bucket|count|sum)\{"


def grown(body: str, k: int) -> str:
    """The body after ``k`` more steps of load: every counter-like sample grew."""
    body = set_values(body, GEN, lambda v: v + 7.0 * k)
    return set_values(body, PROMPT, lambda v: v + 11.0 * k)


def event(body: str, kind: str, k: int) -> str:
    if kind == "reset":  # one series restarted from 0
        return set_values(body, GEN, 1.0)
    if kind == "restart":  # the process restarted: start time moved, counters from ~0
        body = set_values(body, START, lambda v: v + 1000.0 + k)
        return set_values(body, PROMPT, 3.0)
    if kind == "drop":  # no start-time evidence: core counters dropped
        return set_values(set_values(body, GEN, 2.0), PROMPT, 2.0)
    if kind == "invalid":
        return set_values(body, GEN, "NaN")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    if kind == "missing":  # a histogram blinks out
        return drop_lines(body, QUEUE)
    return body


def same(a: EngineDelta, b: EngineDelta) -> bool:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or not np.array_equal(x, y, equal_nan=True):
                return False
        elif f.name != "current" and x != y:
            return False
    return a.current is b.current


@pytest.mark.parametrize("seed", range(6))
def test_advance_many_equals_advance_engine_by_engine(seed: int) -> None:
    rng = random.Random(seed)
    engines = [f"server{i}.0" for i in range(3 * BATCH_MIN)]
    one, many = Baselines(), Baselines()
    parsers = {e: Parser() for e in engines}  # one per endpoint, as the HTTP source has
    kinds = ["none"] * 6 + ["reset", "restart", "drop", "invalid", "missing"]
    base = {e: rng.choice(BODIES) for e in engines}
    rows = 0
    real_batch = many._batch

    def counting(lay: EngineLayout, items: list[Advance]) -> list[EngineDelta | None]:
        nonlocal rows
        out = real_batch(lay, items)
        rows += sum(d is not None for d in out)
        return out

    many._batch = counting  # type: ignore[method-assign]
    for k in range(1, 9):
        items: list[Advance] = []
        for e in engines:
            if rng.random() < 0.15 and k > 1:
                continue  # a failed scrape: its baseline waits
            body = event(grown(base[e], k), rng.choice(kinds), k)
            snap = parsers[e].parse(body, time=10.0 * k, wall_time=WALL + 10.0 * k)["0"]
            unknown = rng.random() < 0.1
            interval = 10.0 if rng.random() < 0.1 else None
            items.append(Advance(e, snap, interval, unknown))
        if k == 5:
            fresh = "server99.0"  # a new engine joins
            snap = Parser().parse(grown(BODIES[1], k), time=50.0, wall_time=WALL + 50.0)["0"]
            items.append(Advance(fresh, snap, None, False))
        want = [
            one.advance(
                it.engine_id,
                it.snapshot,
                new_engine_interval=it.new_engine_interval,
                continuity_unknown=it.continuity_unknown,
            )
            for it in items
        ]
        got = many.advance_many(items)
        assert len(got) == len(want)
        for it, g, w in zip(items, got, want, strict=True):
            assert same(g, w), (k, it.engine_id)
            assert one.engines() == many.engines()
        for e in one.engines():
            assert one.last(e) is many.last(e)
    assert rows >= 10  # the matrix path really ran (and the per-engine one for the rest)


def test_a_restart_of_one_row_doubts_the_start_less_rows_of_its_server() -> None:
    """``share_restarts``: DP engines (no start time) share their server's process. When one
    restarts, the others' intervals are doubted (not counted from 0); rows of another server,
    rows with a start time of their own, and first scrapes are left alone."""
    from fleetscope.identity import EngineId
    from fleetscope.stats.baselines import share_restarts

    p = Parser()
    load = fixture_text("dp2_load.prom")
    gen1 = r'^vllm:generation_tokens_total\{engine="1"'
    after = set_values(load, gen1, lambda v: v + 7.0)  # engine 1 grew
    dropped = set_values(set_values(after, GEN, 1.0), PROMPT, 1.0)  # engine 0 restarted
    b = Baselines()
    rows, items = [], []
    for server, cur in (("a", dropped), ("b", after)):
        prev_e = p.parse(load, time=0.0, wall_time=WALL)
        cur_e = p.parse(cur, time=10.0, wall_time=WALL + 10)
        for label in ("0", "1"):
            eid = EngineId(server, label)
            b.advance(eid, prev_e[label])
            rows.append((eid, cur_e[label]))
            items.append(Advance(eid, cur_e[label]))
    single = Parser().parse(fixture_text("single_after.prom"), time=10.0, wall_time=WALL + 10)
    rows.append((EngineId("a", "x"), single["0"]))  # a row of server a with a start time
    items.append(Advance(EngineId("a", "x"), single["0"]))  # its first scrape: a baseline
    deltas = share_restarts(rows, b.advance_many(items))
    by = {str(eid): d for (eid, _), d in zip(rows, deltas, strict=True)}
    assert by["a.0"].restarted and not by["a.0"].continuity_unknown
    assert by["a.1"].continuity_unknown and by["a.1"].observed_seconds == 0.0
    assert not by["a.1"].restarted  # its counts stand: only the interval is doubted
    assert not any(by[e].continuity_unknown for e in ("b.0", "b.1", "a.x"))
    assert by["a.x"].baseline_only
