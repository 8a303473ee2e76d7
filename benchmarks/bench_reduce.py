"""One poll of a 1,024-engine fleet: deltas + reduce_poll + keys (prints; not a test).

The fleet is 512 endpoints serving the real ``dp2_load.prom`` layout (2 engines each), with
per-endpoint perturbed values: a previous and a current body per endpoint, parsed by that
endpoint's own ``Parser`` as the collector does. Timed (median over >= 7 runs, one core):

* deltas: ``Baselines.advance`` for every engine (and the endpoint rows);
* ``reduce_poll`` over the 1,024 engines (scopes: agg, prefill, decode);
* keys: ``poll_keys`` under the default key budget;
* the whole poll through ``FleetState.observe`` (deltas + reduce + keys + health keys);
* the engine-time breakdown's classes of the poll's intervals (``PhaseClassifier.classify``),
  and the window sums (``WindowSet.attribute``: the run's ``combined`` label and one window).

Memory: the state kept between polls for 1,024 engines (baselines, parsers' templates and
layouts), measured with tracemalloc, and the process' peak RSS. Targets: < 1 s per poll,
< 100 MB of state.

    python benchmarks/bench_reduce.py [--runs 7] [--endpoints 512]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fleetscope.exposition import Exposition, Parser
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.fleet.state import FleetState
from fleetscope.identity import Role
from fleetscope.keys import KeyOptions, poll_keys
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.baselines import Baselines
from fleetscope.stats.breakdown import PhaseClassifier
from fleetscope.stats.reduce import EngineInput, reduce_poll
from fleetscope.stats.windows import WindowSet

_HERE = Path(__file__).resolve()
FIXTURES = _HERE.parents[1] / "tests" / "data" / "fixtures"
WALL = 1_795_970_000.0
TARGET_SECONDS = 1.0
TARGET_MB = 100.0


def make_bodies(n_endpoints: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    """(previous, current) dp2 bodies per endpoint: every value scaled per engine, current
    values of counters/buckets grown, gauges moved."""
    text = (FIXTURES / "vllm-0.32.0-cpu" / "dp2_load.prom").read_text()
    lines = text.split("\n")
    rng = np.random.default_rng(seed)
    parsed: list[tuple[str, float | None, int]] = []  # (line head, value or None, engine)
    for ln in lines:
        if ln and ln[0] != "#":
            head, _, value = ln.rpartition(" ")
            eng = 1 if 'engine="1"' in head else 0
            parsed.append((head, float(value), eng))
        else:
            parsed.append((ln, None, 0))
    out: list[tuple[bytes, bytes]] = []
    for _ in range(n_endpoints):
        scale = rng.uniform(1.0, 3.0, size=2)
        grow = rng.uniform(1.05, 1.5, size=2)
        prev: list[str] = []
        cur: list[str] = []
        for head, v, eng in parsed:
            if v is None:
                prev.append(head)
                cur.append(head)
                continue
            a = v * float(scale[eng])
            prev.append(f"{head} {a!r}")
            cur.append(f"{head} {a * float(grow[eng])!r}")
        out.append(("\n".join(prev).encode(), "\n".join(cur).encode()))
    return out


def role_of(i: int) -> Role:
    return "prefill" if i % 4 == 0 else "decode"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--endpoints", type=int, default=512)
    args = ap.parse_args(argv)
    runs = max(7, args.runs)
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
        core = "pinned to one core"
    except (AttributeError, OSError):
        core = "not pinned"
    n_ep = args.endpoints

    t0 = time.perf_counter()
    bodies = make_bodies(n_ep)
    names = [f"{role_of(i)}{i}" for i in range(n_ep)]
    roles = [role_of(i) for i in range(n_ep)]

    # ---- setup, and the memory of the state kept between polls (tracemalloc): one parser
    # per endpoint (templates, layouts) and a FleetState after two polls (baselines)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    parsers = [Parser() for _ in range(n_ep)]
    prev = [p.parse(b, time=0.0, wall_time=WALL) for p, (b, _) in zip(parsers, bodies, strict=True)]
    cur = [
        p.parse(b, time=5.0, wall_time=WALL + 5) for p, (_, b) in zip(parsers, bodies, strict=True)
    ]
    state = FleetState()
    for t, expos in ((0.0, prev), (5.0, cur)):
        state.observe(
            [
                ScrapeResult(n, e, t, WALL + t, role=r)
                for n, e, r in zip(names, expos, roles, strict=True)
            ]
        )
    gc.collect()
    with_parsers = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    setup = time.perf_counter() - t0
    n_engines = sum(len(e) for e in cur)
    mb = 1024 * 1024
    body_mb = sum(len(a) + len(b) for a, b in bodies) / mb
    print(
        f"python {sys.version.split()[0]}; {core}; {n_ep} endpoints x dp2 = {n_engines} engines; "
        f"medians over {runs} runs"
    )
    print(
        f"  setup: {2 * n_ep} parses ({sum(p.full_parses for p in parsers)} full: one per body "
        f"shape, templates are shared) + 2 polls: {setup:.1f} s (under tracemalloc)"
    )

    def rows(expos: list[Exposition]) -> Iterator[tuple[str, EngineSnapshot, bool, Role]]:
        for name, role, expo in zip(names, roles, expos, strict=True):
            for label, snap in expo.items():
                yield f"{name}.{label}", snap, True, role
            if expo.endpoint is not None:
                yield name, expo.endpoint, False, role

    prev_rows = list(rows(prev))
    cur_rows = list(rows(cur))

    def primed() -> Baselines:
        b = Baselines()
        for eid, snap, _, _ in prev_rows:
            b.advance(eid, snap)
        return b

    t_delta, t_reduce, t_keys, n_keys = [], [], [], 0
    for _ in range(runs):
        b = primed()
        gc.collect()
        t = time.perf_counter()
        inputs = [
            EngineInput(eid, b.advance(eid, snap), role, (), is_engine)
            for eid, snap, is_engine, role in cur_rows
        ]
        t1 = time.perf_counter()
        stats = reduce_poll(inputs)
        t2 = time.perf_counter()
        keys = poll_keys(stats, KeyOptions())
        t3 = time.perf_counter()
        t_delta.append(t1 - t)
        t_reduce.append(t2 - t1)
        t_keys.append(t3 - t2)
        n_keys = len(keys)

    t_observe = []
    for _ in range(runs):
        st = FleetState()
        st.observe(
            [
                ScrapeResult(n, e, 0.0, WALL, role=r)
                for n, e, r in zip(names, prev, roles, strict=True)
            ]
        )
        scrapes = [
            ScrapeResult(n, e, 5.0, WALL + 5, role=r)
            for n, e, r in zip(names, cur, roles, strict=True)
        ]
        gc.collect()
        t = time.perf_counter()
        res = st.observe(scrapes)
        t_observe.append(time.perf_counter() - t)
    obs_keys = len(res.keys)

    # window attribution: the run's ``combined`` label and one open window get every poll's
    # per-engine deltas (the hot path of windows and the run summary)
    # and the engine-time breakdown's classes of the poll's intervals (docs/rules.md §3.13)
    t_attr, t_class = [], []
    held = [False] * len(res.inputs)
    for _ in range(runs):
        ws = WindowSet()
        ws.start("train", 0.0)
        classifier = PhaseClassifier()
        phases = classifier.classify(res.inputs, held)
        ws.attribute(res.inputs, now=5.0, phases=phases)  # the sums exist: a steady-state poll
        gc.collect()
        t = time.perf_counter()
        phases = classifier.classify(res.inputs, held)
        t1 = time.perf_counter()
        ws.attribute(res.inputs, now=10.0, phases=phases)
        t_attr.append(time.perf_counter() - t1)
        t_class.append(t1 - t)

    med = statistics.median
    total = med(t_delta) + med(t_reduce) + med(t_keys)
    obs = med(t_observe)
    ok_t = total < TARGET_SECONDS and obs < TARGET_SECONDS
    ok_m = with_parsers / mb < TARGET_MB

    def verdict(ok: bool) -> str:
        return "OK" if ok else "MISSED"

    target_t = f"target < {TARGET_SECONDS:g} s"
    rows_out = [
        (f"deltas (Baselines.advance, {len(cur_rows)} rows)", med(t_delta), ""),
        ("reduce_poll", med(t_reduce), ""),
        (f"poll_keys ({n_keys} keys)", med(t_keys), ""),
        ("deltas + reduce + keys", total, f"({target_t}: {verdict(total < TARGET_SECONDS)})"),
        (
            f"FleetState.observe, whole poll ({obs_keys} keys)",
            obs,
            f"({target_t}: {verdict(obs < TARGET_SECONDS)})",
        ),
    ]
    rows_out.append(("breakdown: PhaseClassifier.classify", med(t_class), ""))
    rows_out.append(("windows.attribute (combined + 1 window)", med(t_attr), ""))
    for label, sec, note in rows_out:
        print(f"  {label:<46} {sec * 1e3:8.1f} ms   {note}")
    print(f"  {'per engine (whole poll)':<46} {obs / n_engines * 1e6:8.1f} us")
    print(f"\n  state for {n_engines} engines after 2 polls (tracemalloc; input bodies excluded):")
    label = f"{n_ep} parsers (templates) + FleetState (baselines)"
    note = f"(target < {TARGET_MB:g} MB: {verdict(ok_m)})"
    print(f"  {label:<46} {with_parsers / mb:8.1f} MB   {note}")
    print(f"  {'(input bodies, not state)':<46} {body_mb:8.1f} MB")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  {'peak RSS of this process (bodies included)':<46} {rss:8.1f} MB")
    print("\nall targets met" if ok_t and ok_m else "\nTARGET MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
