"""The RL part of the real vLLM scenario (docs/rl-lifecycle.md), after the main one.

A fresh collector (``rl_probes=True``, ``server0`` in role ``prefill``, ``server1`` in role
``decode``) watches both servers while the load generator runs against them; the test itself
drives vLLM's RL routes and times every call:

1. ``default`` is announced (vLLM's initial version);
2. ``POST /pause?mode=keep`` on ``server0`` while it has requests running; polls during the
   pause; ``POST /resume``;
3. ``POST /sleep?level=1`` on ``server1`` (DP=2: both engines; on CPU this only pauses the
   scheduler, but ``engine_sleep_state`` says asleep); polls; ``POST /wake_up``;
4. window ``rollout`` starts (bodies fetched just before), around steps 5-6;
5. ``weight_sync("step-1")``: ``POST /update_weight_version {"new_version":"step-1"}`` on
   ``server0`` only: ``server1`` (2 engines) misses it; a second, small load on ``server1``
   only, and once its tokens grow the ``skew`` poll (``server1`` generates stale tokens);
6. ``weight_sync("step-2")`` on ``server0``: the weight-transfer sequence that works without a
   GPU (``ipc`` backend, ``--weight-transfer-config``): ``/pause``,
   ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights`` with an
   empty chunk, ``/finish_weight_update {"weight_version":"step-2"}``, ``/resume``; then
   ``server1`` gets ``step-2`` too and a last poll shows no skew; the window stops (bodies
   fetched just after).

Every poll's view (boundary polls too) with what the test knows each endpoint served then, every
HTTP call (status, answer, monotonic start/end), the monotonic time just before entering and
just after leaving each weight sync, and the bodies (``/metrics`` and ``/weight_info``) after
each phase are kept for the tests. A poll that must see every endpoint's version (``skew``,
``fresh``) is repeated until it does: a probe that missed its deadline on a loaded machine
leaves a version unknown (those polls are kept as ``settle``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from fleetscope.identity import Role

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = ROOT / "scripts" / "real_vllm" / "loadgen.py"
EMPTY_CHUNK: dict[str, dict[str, list[Any]]] = {
    "update_info": {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}
}
PAUSE_POLLS = 3  # polls while paused / asleep, about 1 s apart
ROLES: dict[str, Role] = {"server0": "prefill", "server1": "decode"}
WINDOW = "rollout"
VERSIONS = ("default", "step-1", "step-2")  # announced in this order


@dataclass
class Call:
    server: str
    method: str
    path: str
    status: int
    answer: Any
    t0: float  # monotonic, sent
    t1: float  # monotonic, answered


@dataclass
class RLRun:
    urls: dict[str, str]
    calls: list[Call] = field(default_factory=list)
    views: list[tuple[str, Any]] = field(default_factory=list)  # (phase, FleetView)
    # per view (same index): (the policy announced then, {server: the version the test set})
    truth: list[tuple[str | None, dict[str, str]]] = field(default_factory=list)
    syncs: dict[str, dict[str, float]] = field(default_factory=dict)
    # version -> monotonic time just before entering / just after leaving its weight_sync
    sync_walls: dict[str, tuple[float, float]] = field(default_factory=dict)
    window: dict[str, float] = field(default_factory=dict)  # the window's keys at its stop
    bodies: dict[str, dict[str, str]] = field(default_factory=dict)  # phase -> server -> text
    weight_info: dict[str, dict[str, str]] = field(default_factory=dict)  # phase -> server -> v
    served_at: dict[str, dict[str, str]] = field(default_factory=dict)  # the test's, per phase
    summary: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    load2: dict[str, Any] = field(default_factory=dict)  # the second load (server1, skew)
    t_promql: float = 0.0  # a Prometheus scrape after the last RL call (Unix time)

    def call(self, server: str, path: str, index: int = 0) -> Call:
        """The ``index``-th call of ``path`` to ``server`` (``/pause`` is called twice)."""
        return [c for c in self.calls if c.server == server and c.path == path][index]

    def phase(self, name: str) -> list[Any]:
        return [v for p, v in self.views if p == name]

    def span(self, first: str, last: str) -> list[int]:
        """Indices of the views from the (only) ``first`` phase to the ``last`` one, inclusive."""
        names = [p for p, _ in self.views]
        return list(range(names.index(first), names.index(last) + 1))


class _Driver:
    """The test's side: HTTP calls to the servers (recorded, and what each serves then), the
    collector's polls (recorded with the policy announced and what the test set)."""

    def __init__(
        self,
        run: RLRun,
        http: httpx.AsyncClient,
        c: Any,
        serving: dict[str, str],
        policy: list[str | None],
    ) -> None:
        self.run, self.urls, self.http, self.c = run, run.urls, http, c
        self.serving, self.policy = serving, policy

    async def call(self, server: str, method: str, path: str, body: Any = None) -> Call:
        t0 = time.monotonic()
        r = await self.http.request(method, self.urls[server] + path, json=body)
        try:
            answer = r.json()
        except ValueError:
            answer = r.text
        c = Call(server, method, path.split("?")[0], r.status_code, answer, t0, time.monotonic())
        self.run.calls.append(c)
        if r.status_code == 200 and c.path == "/update_weight_version":
            self.serving[server] = body["new_version"]
        elif r.status_code == 200 and c.path == "/finish_weight_update":
            self.serving[server] = body["weight_version"]
        return c

    async def snapshot(self, phase: str) -> None:
        http, urls, run = self.http, self.urls, self.run
        run.bodies[phase] = {n: (await http.get(u + "/metrics")).text for n, u in urls.items()}
        run.weight_info[phase] = {
            n: (await http.get(u + "/weight_info")).json()["weight_version"]
            for n, u in urls.items()
        }
        run.served_at[phase] = dict(self.serving)

    def record(self, phase: str, view: Any) -> None:
        self.run.views.append((phase, view))
        self.run.truth.append((self.policy[0], dict(self.serving)))

    async def poll(self, phase: str) -> Any:
        view = await self.c.poll()
        self.record(phase, view)
        return view

    async def poll_known(self, phase: str, seconds: float = 120.0) -> Any:
        """A poll that knows every endpoint's served version (the others: ``settle``)."""
        deadline = time.monotonic() + seconds
        while True:
            view = await self.c.poll()
            if all(f"inference/{n}/weight_version_index" in view.keys for n in self.urls):
                self.record(phase, view)
                return view
            self.record("settle", view)
            if time.monotonic() > deadline:
                raise AssertionError(f"the collector never saw every version ({phase})")
            await asyncio.sleep(1.0)

    async def generated(self, server: str) -> float:
        text = (await self.http.get(self.urls[server] + "/metrics")).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:generation_tokens_total{")
        )

    async def poll_until(self, ready: Any, what: str, seconds: float = 120.0) -> None:
        """Poll ("settle") until the collector has seen what the test just did: a probe that
        missed its deadline on a loaded machine backs off 30 s, and its answer is unknown
        (counted nowhere) meanwhile."""
        deadline = time.monotonic() + seconds
        while not ready(await self.poll("settle")):
            if time.monotonic() > deadline:
                raise AssertionError(f"the collector never saw {what}")
            await asyncio.sleep(1.0)


async def rl_scenario(urls: dict[str, str], prom: Any, out_dir: Path) -> RLRun:
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import Endpoint

    run = RLRun(urls)
    serving = dict.fromkeys(urls, VERSIONS[0])  # what each server serves, by the test's calls
    policy: list[str | None] = [None]  # the collector's policy version
    async with httpx.AsyncClient(timeout=60) as http:
        eps = [Endpoint(u, n, role=ROLES[n]) for n, u in urls.items()]
        c = Collector(eps, interval=3600, timeout=10, rl_probes=True)
        d = _Driver(run, http, c, serving, policy)
        call, snapshot, record, poll = d.call, d.snapshot, d.record, d.poll
        poll_known, generated, poll_until = d.poll_known, d.generated, d.poll_until

        proc = proc2 = None
        try:
            await poll("baseline")
            c.set_policy_version(VERSIONS[0])
            policy[0] = VERSIONS[0]
            load_json = out_dir / "rl_load.json"
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(LOADGEN),
                *[a for u in urls.values() for a in ("--url", u)],
                "--requests", "24", "--concurrency", "3", "--seed", "7",
                "--out", str(load_json),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            # wait until server0 is busy (the load reached it)
            for _ in range(240):
                text = (await http.get(urls["server0"] + "/metrics")).text
                running = [
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("vllm:num_requests_running{")
                ]
                if sum(running) > 0:
                    break
                await asyncio.sleep(0.25)
            await poll("before_pause")
            await call("server0", "POST", "/pause?mode=keep")
            await poll_until(lambda v: v.result.endpoint_info["server0"].paused, "the pause")
            for _ in range(PAUSE_POLLS):
                await asyncio.sleep(1.0)
                await poll("paused")
            await snapshot("paused")
            await call("server0", "GET", "/is_paused")
            await call("server0", "POST", "/resume")
            await poll("resumed")
            await call("server1", "POST", "/sleep?level=1&mode=keep")
            await poll_until(
                lambda v: (
                    v.keys.get("inference/server1/engines_asleep") == 2
                    and "inference/server1/engines_paused" in v.keys
                ),
                "the sleep (gauges and /is_paused)",
            )
            for _ in range(PAUSE_POLLS):
                await asyncio.sleep(1.0)
                await poll("asleep")
            await snapshot("asleep")
            await call("server1", "POST", "/wake_up")
            await poll("awake")
            await snapshot("window_start")  # just before the window starts
            window = c.window(WINDOW)
            await window.astart()
            record("window_start", c.last)
            t_enter = time.monotonic()
            async with c.weight_sync("step-1") as s1:
                record("sync1_enter", c.last)
                await call("server0", "POST", "/update_weight_version", {"new_version": "step-1"})
            run.sync_walls["step-1"] = (t_enter, time.monotonic())
            policy[0] = "step-1"  # announced at the exit, before the exit poll
            run.syncs["step-1"] = s1.keys
            record("sync1_exit", c.last)
            await asyncio.sleep(1.0)
            await poll_until(
                lambda v: all(f"inference/{n}/weight_version_lag" in v.keys for n in urls),
                "both servers' weight versions",
            )
            # server1 (stale) generates: a second small load, on server1 only
            tokens = await generated("server1")
            proc2 = await asyncio.create_subprocess_exec(
                sys.executable, str(LOADGEN), "--url", urls["server1"],
                "--requests", "12", "--concurrency", "3", "--seed", "8",
                "--out", str(out_dir / "rl_load2.json"),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            for _ in range(240):
                if await generated("server1") > tokens:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)
            await poll_known("skew")
            await snapshot("skew")
            t_enter = time.monotonic()
            async with c.weight_sync("step-2") as s2:
                record("sync2_enter", c.last)
                await call("server0", "POST", "/pause?mode=keep")
                await call("server0", "POST", "/init_weight_transfer_engine", {"init_info": {}})
                await call("server0", "POST", "/start_weight_update")
                await call("server0", "POST", "/update_weights", EMPTY_CHUNK)
                await call("server0", "POST", "/finish_weight_update", {"weight_version": "step-2"})
                await call("server0", "POST", "/resume")
            run.sync_walls["step-2"] = (t_enter, time.monotonic())
            policy[0] = "step-2"
            run.syncs["step-2"] = s2.keys
            record("sync2_exit", c.last)
            await call("server1", "POST", "/update_weight_version", {"new_version": "step-2"})
            await poll_known("fresh")
            run.window = dict(await window.astop())
            record("window_stop", c.last)
            await snapshot("final")  # just after the window stopped
            for gen in (proc, proc2):
                _, err = await gen.communicate()
                if gen.returncode != 0:
                    raise RuntimeError(f"load generator failed: {err.decode()[-2000:]}")
            run.load = json.loads(load_json.read_text())
            run.load2 = json.loads((out_dir / "rl_load2.json").read_text())
            await poll("after_load")
            run.t_promql = await asyncio.to_thread(prom.wait_for_scrape_after, time.time(), 60.0)
            run.summary = c.summary()
        finally:
            for child in (proc, proc2):
                if child is not None and child.returncode is None:
                    child.kill()
            await c.stop()
    (out_dir / "rl_calls.json").write_text(
        json.dumps([c.__dict__ for c in run.calls], indent=1, default=str) + "\n"
    )
    return run
