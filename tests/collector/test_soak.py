"""A long-run soak (docs/rules.md §3.8-3.10, docs/bad-data.md): a few hundred polls of a simulated
fleet over real loopback HTTP, with train/eval windows (pause/resume too) and every fault the
collector claims to survive: restarts with evidence, a kill -9 (work after the last scrape never
exported), a late server that answers 503 first, churned engine labels, NaN samples, a hostile
server's ``+Inf`` / ``-5`` counters, failed scrapes.

The fleet is stepped by hand between polls (frozen steps: no ``step_interval``), so an oracle
(:class:`Oracle`) can replay, per engine and per counter family, what each poll's deltas must
be: the increase of the simulator's never-reset ground truth since the last scrape where that
series was valid, given to the labels the collector attributes that poll to (the windows active
*before* a boundary's action: a start / resume boundary's deltas are idle's, a pause / stop
boundary's are the window's). A restart moves the oracle's baseline to the truth at that moment
(the new process counts from 0; what the old one counted after its last scrape is lost).
Every window and run label is then compared with the oracle, per engine, to the token.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from fleetscope.collector.core import Collector
from fleetscope.identity import EngineId
from fleetscope.sources.http.source import Endpoint
from fleetscope.stats.accumulate import Accumulator
from fleetscope.stats.engine_sum import EngineSum
from fleetscope_sim import FleetServer, SimEngine, SimFleet
from support.loopback import LoopbackServer
from support.simclock import keep_clock_ahead

FAMILIES = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
)
KEYS = {  # fleetscope's metric name per family
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:request_success_total": "request_success_total",
}
GEN = "vllm:generation_tokens_total"


# --------------------------------------------------------------------------- loopback servers


class _Loopback:
    """A :class:`~support.loopback.LoopbackServer` answering /metrics with ``self.render()``."""

    def __init__(self) -> None:
        self.server = LoopbackServer({"/metrics": lambda request: self.render()})
        self.url = self.server.url

    def render(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        self.server.close()


class Churning(_Loopback):
    """Its engine label changes every scrape (as in tests/collector/test_trainer_safety.py)."""

    def __init__(self) -> None:
        self.n = 0
        super().__init__()

    def render(self) -> str:
        self.n += 1
        return (
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="{self.n}"}} {self.n}.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="{self.n}"}} 1.0\n'
        )


class Hostile(_Loopback):
    """One engine whose counters the test drives (``tick``); ``bad`` replaces the generation
    counter's sample with a bad value (``+Inf``, ``-5``) while set."""

    def __init__(self) -> None:
        self.k = 1
        self.bad: str | None = None
        super().__init__()

    def tick(self) -> None:
        self.k += 1

    def truth(self) -> dict[str, float]:
        return {GEN: 10.0 * self.k, "vllm:prompt_tokens_total": 7.0 * self.k,
                "vllm:request_success_total": 1.0 * self.k}  # fmt: skip

    def render(self) -> str:
        t = self.truth()
        gen = self.bad if self.bad is not None else f"{t[GEN]}"
        return (
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} '
            f"{t['vllm:prompt_tokens_total']}\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} '
            f"{t['vllm:request_success_total']}\n"
        )


# --------------------------------------------------------------------------- the oracle


def truth_totals(engine: SimEngine) -> Callable[[], dict[str, float]]:
    """The engine's ground-truth totals of ``FAMILIES``, read when called."""
    return lambda: {f: engine.truth.counter(f) for f in FAMILIES}


@dataclass
class Oracle:
    """Per target (a window instance ``train#1``, a run label ``run:idle``) and engine, the
    exact totals the collector must report."""

    sources: dict[str, Callable[[], dict[str, float]]] = field(default_factory=dict)
    last: dict[str, dict[str, float]] = field(default_factory=dict)
    sums: dict[tuple[str, str], dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: dict.fromkeys(FAMILIES, 0.0))
    )
    unseen: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def restart(self, eid: str) -> None:
        """The engine's process restarts now: it counts from 0 = the truth at this moment."""
        now = self.sources[eid]()
        if eid in self.last:
            self.unseen[eid] += sum(now[f] - self.last[eid][f] for f in (GEN,))
        self.last[eid] = dict(now)

    def poll(self, targets: list[str], ok: set[str], invalid: dict[str, set[str]]) -> None:
        """One poll: engines in ``ok`` answered; ``invalid[eid]``: families left out."""
        for eid, src in self.sources.items():
            if eid not in ok:
                continue
            now = src()
            if eid not in self.last:  # its first scrape: a baseline
                self.last[eid] = {f: now[f] for f in FAMILIES if f not in invalid.get(eid, ())}
                continue
            for f in FAMILIES:
                if f in invalid.get(eid, ()):
                    continue  # left out: carried to its next valid scrape
                if f not in self.last[eid]:
                    self.last[eid][f] = now[f]
                    continue
                inc = now[f] - self.last[eid][f]
                for t in (*targets, "run:combined"):
                    self.sums[(t, eid)][f] += inc
                self.last[eid][f] = now[f]


def engine_totals(row: EngineSum) -> dict[str, float]:
    """A window's / run label's totals of one engine row, per family (every child, and the
    children retired from the current layout)."""
    out = dict.fromkeys(FAMILIES, 0.0)
    for fam in FAMILIES:
        base = fam.removesuffix("_total")
        out[fam] += sum(float(row.delta[s.slot]) for s in row.layout.counters if s.name == base)
        for sid, vals in row.retired.items():
            if sid.split("{")[0] in (fam, base):
                out[fam] += vals[0]
    return out


def window_engine_coverage(acc: Accumulator, eid: str) -> float:
    """A window's coverage of one engine, as ``Accumulator.coverage`` computes it for the whole
    window: engine-seconds observed (``covered``, a restart's unseen tail excluded) over the
    engine-seconds it should have been covered from boundary to boundary (``expected``)."""
    want = acc.expected.get(eid, 0.0)
    got = min(acc.engines[eid].covered, want) if eid in acc.engines else 0.0
    return 1.0 if want <= 0 else got / want


def run_engine_coverage(acc: Accumulator, eid: str) -> float:
    """A run label's coverage of one engine: run labels have no boundaries (``expected`` is
    empty), so ``coverage()`` compares what the deltas observed with what they spanned;
    ``covered == spanned`` is exactly "nothing lost"."""
    row = acc.engines[eid]
    return 1.0 if row.spanned <= 0 else row.covered / row.spanned


# --------------------------------------------------------------------------- the soak


@dataclass
class Soak:
    fleet: SimFleet
    server: FleetServer
    hostile: Hostile
    churn: Churning
    c: Collector
    oracle: Oracle
    active: list[str] = field(default_factory=list)  # window instances active now
    run_label: str = "idle"
    failing: set[str] = field(default_factory=set)  # endpoints answering errors this poll
    invalid: dict[str, set[str]] = field(default_factory=dict)
    polls: int = 0
    windows: dict[str, object] = field(default_factory=dict)  # instance -> fleetscope Window
    keys: dict[str, dict[str, float]] = field(default_factory=dict)  # instance -> its stop keys
    watched: set[str] = field(default_factory=set)  # endpoints the collector scrapes
    invalid_seen: list[float] = field(default_factory=list)  # invalid_series, per poll
    invalid_expected: list[float] = field(default_factory=list)
    churny_baselines: list[int] = field(default_factory=list)

    def ok_engines(self) -> set[str]:
        out: set[str] = set()
        for ep in self.fleet.endpoints:
            if ep.name in self.watched and ep.name not in self.failing:
                out.update(e.engine_id for e in ep.engines)
        out.add("hostile.0")
        return out

    def _targets(self) -> list[str]:
        return [*self.active, f"run:{self.run_label}"]

    def step(self, dt: float = 1.0) -> None:
        # dated after every scrape so far, even if the polls were slower than the steps
        keep_clock_ahead(self.fleet)
        self.fleet.step(dt)
        self.hostile.tick()

    async def poll(self) -> None:
        targets, ok = self._targets(), self.ok_engines()
        view = await self.c.poll()
        self.polls += 1
        self.invalid_seen.append(view.keys.get("inference/agg/invalid_series", 0.0))
        self.invalid_expected.append(float(sum(len(v) for v in self.invalid.values())))
        self.oracle.poll(targets, ok, self.invalid)

    async def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.step()
            await self.poll()

    async def boundary(self, action: str, label: str, instance: str) -> None:
        self.step()
        targets, ok = self._targets(), self.ok_engines()
        w = self.c.window(label)
        keys = await getattr(w, f"a{action}")()
        self.polls += 1
        self.oracle.poll(targets, ok, self.invalid)
        if action in ("start", "resume"):
            self.windows[instance] = self.c.windows.active[label]
            self.active.append(instance)
            self.run_label = label
        else:
            self.active.remove(instance)
            self.run_label = "idle"
            if action == "stop":
                self.keys[instance] = keys


async def run_soak() -> tuple[Soak, dict[str, Any], list[int], list[int]]:
    # the simulated wall clock runs 1 s per poll and is kept ahead of the real one (every
    # step, however slow the polls: support/simclock.py): a process (re)started by the test
    # shows a start time after our previous poll, which is the collector's evidence of a late
    # start (fleet.py: ``start > previous poll + clock skew``); a restarted process' observed
    # life (wall - start, clamped at 0) is then 0: coverage < 1
    fleet = SimFleet(seed=11, wall_start=time.time(), record_observations=False)
    fleet.add_endpoint(role=None, dp=1)  # server0: single-process, whole-server restart
    fleet.add_endpoint(role="prefill", dp=2)  # prefill0: multiprocess, one engine restarts
    fleet.add_endpoint(role="decode", dp=2)  # decode0: multiprocess, NaN samples, a 500
    fleet.add_endpoint(role="decode", dp=1)  # decode1: single-process, kill -9
    fleet.step(4.0)
    hostile, churn = Hostile(), Churning()
    server = FleetServer(fleet).start()  # no step_interval: frozen between steps
    try:
        eps = [
            Endpoint(url, name=ep.name, role=ep.role)
            for url, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        c = Collector(
            [*eps, Endpoint(hostile.url, name="hostile")],
            interval=3600,
            timeout=5.0,
            fetch_model_info=False,
            verify=False,
            discover_roles=False,
            max_engines_per_endpoint=4,
        )
        oracle = Oracle()
        for e in fleet.engines():
            oracle.sources[e.engine_id] = truth_totals(e)
        oracle.sources["hostile.0"] = hostile.truth
        s = Soak(fleet, server, hostile, churn, c, oracle)
        s.watched = {ep.name for ep in fleet.endpoints}
        sizes: list[int] = []
        mem: list[int] = []
        try:
            await s.poll()  # baselines
            await s.tick(20)  # idle

            # train#1: a failed scrape and NaN samples in the middle: nothing lost
            await s.boundary("start", "train", "train#1")
            await s.tick(8)
            s.step()
            fleet.endpoint("decode0").set_http_error(500)
            s.failing = {"decode0"}
            await s.poll()
            fleet.endpoint("decode0").clear_faults()
            s.failing = set()
            await s.tick(5)
            fleet.endpoint("decode0").set_nan_values()
            s.invalid = {e.engine_id: {GEN} for e in fleet.endpoint("decode0").engines}
            await s.tick(4)
            fleet.endpoint("decode0").clear_faults()
            s.invalid = {}
            await s.tick(6)
            await s.boundary("stop", "train", "train#1")

            # idle: the hostile server's bad counters
            await s.tick(5)
            for bad in ("+Inf", "+Inf", "-5", "-5", "+Inf"):
                hostile.bad = bad
                s.invalid = {"hostile.0": {GEN}}
                await s.tick()
            hostile.bad, s.invalid = None, {}
            await s.tick(5)

            # eval#1: a server joins late, answering 503 until its process is up
            await s.boundary("start", "eval", "eval#1")
            await s.tick(3)
            late = fleet.add_endpoint(role="decode", dp=1, name="late0")
            late.set_http_error(503)
            [url] = server.serve_new_endpoints()
            c.add_endpoints(Endpoint(url, name="late0", role="decode"))
            s.watched.add("late0")
            s.failing = {"late0"}
            for e in late.engines:
                oracle.sources[e.engine_id] = truth_totals(e)
            await s.tick(4)
            keep_clock_ahead(fleet)  # dated after our last poll, however long it took
            late.restart()  # its process starts now, after it joined: counted from 0
            for e in late.engines:
                oracle.restart(e.engine_id)
            oracle.unseen.clear()
            late.clear_faults()
            s.failing = set()
            await s.tick(10)
            await s.boundary("stop", "eval", "eval#1")

            # churned labels from here on
            await s.tick(3)
            c.add_endpoints(Endpoint(churn.url, name="churny"))
            await s.tick(6)

            # train#2 (paused once): restarts with evidence right after a scrape
            await s.boundary("start", "train", "train#2")
            await s.tick(5)
            tracemalloc.start()
            keep_clock_ahead(fleet)
            fleet.endpoint("server0").restart()  # single-process: process start moves
            oracle.restart("server0.0")
            await s.tick(5)
            fleet.endpoint("prefill0").restart_engine(1)  # multiprocess: counters drop
            oracle.restart("prefill0.1")
            await s.tick(5)
            await s.boundary("pause", "train", "train#2")
            await s.tick(5)
            await s.boundary("resume", "train", "train#2b")
            for i in range(50):
                await s.tick()
                if i % 10 == 0:
                    sizes.append(len(json.dumps(c.state_dict())))
                    s.churny_baselines.append(
                        sum(
                            1
                            for e in c.state.baselines.engines()
                            if getattr(e, "endpoint", 0) == "churny"
                        )
                    )
                if i in (9, 49):
                    gc.collect()
                    mem.append(fleetscope_bytes(tracemalloc.take_snapshot()))
            tracemalloc.stop()
            await s.boundary("stop", "train", "train#2b")
            s.keys["train#2"] = s.keys["train#2b"]
            c.remove_endpoints("churny")
            await s.tick(5)

            # eval#2: a kill -9: decode1 works after our last scrape, then restarts
            await s.boundary("start", "eval", "eval#2")
            await s.tick(5)
            s.step(0.5)  # never exported to anyone
            keep_clock_ahead(fleet)  # the restart is dated after our last scrape
            fleet.endpoint("decode1").restart()
            oracle.restart("decode1.0")
            await s.tick(8)
            await s.boundary("stop", "eval", "eval#2")

            # eval#3: nothing happens
            await s.tick(5)
            await s.boundary("start", "eval", "eval#3")
            await s.tick(25)
            await s.boundary("stop", "eval", "eval#3")
            await s.tick(10)
            await c.stop()
        except BaseException:
            await c.stop(timeout=5)
            raise
        return s, c.summary(), sizes, mem
    finally:
        server.stop()
        hostile.close()
        churn.close()


def fleetscope_bytes(snap: tracemalloc.Snapshot) -> int:
    """Bytes held by blocks allocated in fleetscope's own code (not the simulator's)."""
    snap = snap.filter_traces(
        [
            tracemalloc.Filter(True, "*fleetscope*"),
            tracemalloc.Filter(False, "*simulate*"),
            tracemalloc.Filter(False, "*test_soak*"),
        ]
    )
    return sum(st.size for st in snap.statistics("filename"))


_CACHE: dict[str, object] = {}


async def soak() -> tuple[Soak, dict[str, Any], list[int], list[int]]:
    """One soak run shared by the assertions below (run once per test session)."""
    if "run" not in _CACHE:
        t0 = time.monotonic()
        _CACHE["run"] = await run_soak()
        _CACHE["seconds"] = time.monotonic() - t0
    return _CACHE["run"]  # type: ignore[return-value]


def sim_engines(s: Soak) -> list[str]:
    return [e.engine_id for e in s.fleet.engines()] + ["hostile.0"]


async def test_soak_windows_and_run_labels_equal_ground_truth_per_engine() -> None:
    s, summary, _, _ = await soak()
    assert s.polls > 220
    o = s.oracle
    assert o.unseen["decode1.0"] > 0  # the kill -9 really lost work
    # every fault really happened inside its window, with real load around it
    for name, eid in (("eval#1", "late0.0"), ("train#2", "server0.0"), ("train#2b", "server0.0"),
                      ("train#2", "prefill0.1"), ("eval#2", "decode1.0"), ("train#1", "decode0.1"),
                      ("idle", "hostile.0")):  # fmt: skip
        target = f"run:{name}" if name == "idle" else name
        assert o.sums[(target, eid)][GEN] > 0, (name, eid)
    # window instances (train#2 is two active spans of one window: train#2 and train#2b)
    wins = {"train#1": ["train#1"], "eval#1": ["eval#1"], "train#2": ["train#2", "train#2b"],
            "eval#2": ["eval#2"], "eval#3": ["eval#3"]}  # fmt: skip
    checked = 0
    for name, parts in wins.items():
        acc = s.windows[parts[-1]].acc  # type: ignore[attr-defined]
        for eid in sim_engines(s):
            want = dict.fromkeys(FAMILIES, 0.0)
            for p in parts:
                for f, v in o.sums.get((p, eid), {}).items():
                    want[f] += v
            if eid not in acc.engines:  # not watched during that window: nothing expected
                assert not any(want.values()), (name, eid)
                continue
            got = engine_totals(acc.engines[eid])
            # exact for every engine: covered (coverage 1.0) or not (a restart: the new
            # process' counts from 0 are exact; only the kill -9 tail is missing, and the
            # oracle leaves it out too)
            assert got == want, (name, eid)
            checked += 1
        agg = s.keys[name][f"inference/{name.split('#')[0]}/agg/generation_tokens_total/delta"]
        assert agg == sum(
            sum(o.sums.get((p, eid), {}).get(GEN, 0.0) for p in parts) for eid in sim_engines(s)
        ), name
    for label in ("idle", "train", "eval", "combined"):
        acc = s.c.windows.run[label]
        for eid in sim_engines(s):
            want = o.sums.get((f"run:{label}", eid), dict.fromkeys(FAMILIES, 0.0))
            assert engine_totals(acc.engines[eid]) == want, (label, eid)
            checked += 1
        for f in FAMILIES:
            key = f"inference_summary/{label}/agg/{KEYS[f]}/delta"
            want_total = sum(
                o.sums.get((f"run:{label}", e), {}).get(f, 0.0) for e in sim_engines(s)
            )
            assert summary[key] == want_total, key
    assert checked > 50
    # idle + train + eval = combined, exactly
    for f in FAMILIES:
        by_label = [summary[f"inference_summary/{lab}/agg/{KEYS[f]}/delta"] for lab in
                    ("idle", "train", "eval")]  # fmt: skip
        assert sum(by_label) == summary[f"inference_summary/combined/agg/{KEYS[f]}/delta"]
    assert summary["inference_summary/combined/agg/generation_tokens_total/delta"] > 10_000


async def test_soak_coverage_is_below_one_exactly_where_counts_were_unobservable() -> None:
    s, summary, _, _ = await soak()
    k = s.keys
    # nothing lost: a failed scrape and NaN samples inside (train#1), nothing at all (eval#3);
    # a late server whose process started after it joined (eval#1): see the test below
    assert k["train#1"]["inference/train/coverage"] == 1.0
    assert k["train#1"]["inference/train/failed_scrapes"] == 1
    assert k["eval#3"]["inference/eval/coverage"] == 1.0
    # the kill -9 (eval#2): decode1's old process counted after its last scrape (the oracle
    # saw those counts lost), and its new process' start time says it started after that scrape
    assert s.oracle.unseen["decode1.0"] > 0
    assert k["eval#2"]["inference/eval/coverage"] < 1.0
    assert k["eval#2"]["inference/eval/restarts_unseen_tail"] >= 1
    # per engine
    for name, low in (("eval#2", {"decode1.0"}), ("eval#3", set()), ("train#1", set()),
                      ("eval#1", set())):  # fmt: skip
        acc = s.windows[name].acc  # type: ignore[attr-defined]
        for eid in sim_engines(s):
            if eid not in acc.engines:
                continue
            cov = window_engine_coverage(acc, eid)
            assert (cov < 1.0) == (eid in low), (name, eid, cov)
    # train#2: restarts with evidence. The collector cannot know that nothing ran between our
    # scrape and the restart, so a process restart always marks its tail unseen (bad-data §7)
    # and the restarted engines' coverage is < 1 (their totals are still exact, see above);
    # churned labels are seen once each: never covered. The others: 1.0.
    acc = s.windows["train#2b"].acc  # type: ignore[attr-defined]
    assert k["train#2"]["inference/train/coverage"] < 1.0
    for eid in sim_engines(s):
        if eid in acc.engines:
            cov = window_engine_coverage(acc, eid)
            assert (cov < 1.0) == (eid in {"server0.0", "prefill0.1"}), ("train#2", eid, cov)
    # the run: per engine, covered == spanned unless the engine restarted
    run = s.c.windows.run["combined"]
    for eid in sim_engines(s):
        cov = run_engine_coverage(run, eid)
        assert (cov < 1.0) == (eid in {"server0.0", "prefill0.1", "decode1.0"}), (eid, cov)
    assert summary["inference_summary/combined/coverage"] < 1.0


async def test_soak_bad_samples_are_left_out_and_memory_stays_bounded() -> None:
    s, summary, sizes, mem = await soak()
    # the bad series were reported in the polls that had them (one per engine and series:
    # decode0's two engines' NaN, the hostile +Inf / -5) and nowhere else; the neighbours'
    # totals, and the bad series' own totals once valid again, are exact (the first test)
    assert s.invalid_seen == s.invalid_expected
    assert sum(s.invalid_seen) == 2 * 4 + 5
    assert summary["inference_summary/combined/agg/generation_tokens_total/delta"] > 0
    # churn: baselines per endpoint bounded, state_dict and traced memory stop growing
    per_endpoint: dict[str, int] = defaultdict(int)
    # the collector's baselines are keyed by EngineId (Baselines.engines() says list[str])
    for e in cast("list[EngineId]", s.c.state.baselines.engines()):
        if getattr(e, "label", None) is not None:
            per_endpoint[e.endpoint] += 1
    assert "churny" not in per_endpoint  # removed: its baselines dropped
    assert max(per_endpoint.values()) <= 2  # the real engines (dp <= 2)
    assert s.churny_baselines and max(s.churny_baselines) <= 4  # while it churned
    rows = [e for e in s.c.windows.run["combined"].engines if str(e).startswith("churny")]
    assert len(rows) <= 5 and EngineId("churny", "evicted") in rows
    assert s.churn.n >= 50  # labels really churned: one new engine per scrape
    assert sizes[-1] < 1.05 * sizes[0], sizes
    assert mem[1] - mem[0] < 2**20, mem  # < 1 MiB over 40 polls of churn
    print(f"soak: {s.polls} polls in {_CACHE['seconds']:.1f} s; state_dict {sizes}")


async def test_soak_window_with_a_late_server_is_fully_covered() -> None:
    """eval#1: a server joins late (503 until its process is up, then counted from 0): its
    engine is covered from its start, nothing was lost, the window's coverage is 1.0."""
    s, _, _, _ = await soak()
    acc = s.windows["eval#1"].acc  # type: ignore[attr-defined]
    assert window_engine_coverage(acc, "late0.0") == 1.0  # per engine: fine
    assert s.keys["eval#1"]["inference/eval/coverage"] == 1.0


async def test_late_single_process_server_in_a_window_minimal() -> None:
    """The minimal repro of the bug above: one server, a window, a second single-process
    server (it has an engine-less row of its own series) that joins with 503 and starts."""
    fleet = SimFleet(seed=2, wall_start=time.time(), record_observations=False)
    fleet.add_endpoint(dp=1)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, timeout=5.0, fetch_model_info=False)
        try:
            await c.poll()
            w = c.window("eval")
            await w.astart()
            late = fleet.add_endpoint(dp=1, name="late")
            late.set_http_error(503)
            [url] = server.serve_new_endpoints()
            c.add_endpoints(Endpoint(url, name="late"))
            fleet.step(1.0)
            await c.poll()  # 503
            keep_clock_ahead(fleet)  # dated after that poll, however long it took
            late.restart()  # its process starts after it joined
            late.clear_faults()
            fleet.step(1.0)
            await c.poll()  # counted from 0
            fleet.step(1.0)
            keys = await w.astop()
            acc = c.windows.run["eval"]
        finally:
            await c.stop()
    assert "late" not in acc.expected, acc.expected  # the endpoint's own row: not an engine
    assert keys["inference/eval/coverage"] == 1.0
