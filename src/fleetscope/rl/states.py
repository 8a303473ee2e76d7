"""Time paused and asleep, per endpoint, per role and for the fleet (docs/rl-lifecycle.md §5).

Two states per engine, judged at every poll:

* **paused**: its endpoint's latest ``GET /is_paused`` answer (vLLM answers ``true`` from the
  ``/pause`` call on, during a ``/sleep`` too: a sleep pauses the scheduler). A pause is per
  endpoint (DP broadcasts it), so every engine of the endpoint takes the answer.
* **asleep**: the engine's own ``vllm:engine_sleep_state{sleep_state="awake"}`` gauge is 0
  (level 0, 1 or 2). An engine without that gauge takes its endpoint's ``GET /is_sleeping``
  answer instead (vLLM's is ``true`` during a plain ``/pause`` too: without the gauge, a pause
  also counts as asleep).

**Time-weighting** is the rule of gauges in windows (docs/rules.md §3.8): the state observed
at a poll covers the engine's whole interval since its previous successful scrape (its own
``seconds``), so ``paused_engine_seconds`` is the sum over engines of the interval seconds
ending in a paused observation. Sums are engine-seconds: an endpoint with two engines paused
for 10 s adds 20. An engine whose state is unknown (no answer, no gauge) adds to neither the
state nor the known seconds the shares divide by. A baseline (first scrape) covers no time.
Boundary rows show the instant counts and hold their seconds for the next regular row; windows
and the run summary get every interval exactly once.

The ``engine_paused`` health condition counts, per engine, the paused-or-asleep seconds in a
row of intervals with no weight sync open: an interval that ends at a poll while a sync is open
(the sync's exit poll included) restarts the count from 0: the seconds of a sync never add to
it, and a pause that outlasts a sync is counted from the sync's exit poll on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from fleetscope import catalog
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.health import HealthEvent
from fleetscope.identity import endpoint_of
from fleetscope.rl.probe import RouteProbe, bool_field
from fleetscope.stats.reduce import EngineInput

__all__ = ["SLEEP_STATE_FAMILY", "EngineStates", "asleep_from_gauge"]

SLEEP_STATE_FAMILY = catalog.SLEEP_STATE_FAMILY
IS_PAUSED_ROUTE = "/is_paused"
IS_SLEEPING_ROUTE = "/is_sleeping"
# per scope: paused s, asleep s, engine-seconds with a known paused state, with a known sleep state
_FIELDS = 4

_awake_slot: dict[int, tuple[EngineLayout, int]] = {}


def asleep_from_gauge(snap: EngineSnapshot) -> bool | None:
    """Whether ``engine_sleep_state{sleep_state="awake"}`` says asleep (None: no such gauge)."""
    layout = snap.layout
    hit = _awake_slot.get(id(layout))
    if hit is None or hit[0] is not layout:
        slot = -1
        for g in layout.gauges:
            if g.name == SLEEP_STATE_FAMILY and dict(g.labels).get("sleep_state") == "awake":
                slot = g.slot
                break
        if len(_awake_slot) > 4096:
            _awake_slot.clear()
        _awake_slot[id(layout)] = hit = (layout, slot)
    slot = hit[1]
    if slot < 0:
        return None
    v = float(snap.data[slot])
    return None if v != v else v == 0.0


def _add(into: dict[str, list[float]], other: Mapping[str, Sequence[float]]) -> None:
    for scope, vals in other.items():
        acc = into.setdefault(scope, [0.0] * _FIELDS)
        for i in range(_FIELDS):
            acc[i] += vals[i]


class EngineStates:
    """Paused and asleep engines: probes, per-poll keys, sums per window and run label."""

    def __init__(self, probe: bool | None = None) -> None:
        self.probe_mode = probe  # None: once RL is in use; True: always; False: never
        self.paused = RouteProbe(IS_PAUSED_ROUTE, bool_field("is_paused"))
        self.sleeping = RouteProbe(IS_SLEEPING_ROUTE, bool_field("is_sleeping"))
        self.in_use = False  # a policy version was set or a weight sync entered
        self.run: dict[str, dict[str, list[float]]] = {}
        self._open: dict[str, dict[str, list[float]]] = {}
        self._last_stopped: dict[str, dict[str, list[float]]] = {}
        self._held: dict[str, list[float]] = {}
        #: endpoint -> {"paused": bool | None, "engines_asleep": int, "engines": int} (last poll)
        self.last: dict[str, dict[str, Any]] = {}
        self._streak: dict[str, float] = {}  # engine -> seconds paused or asleep in a row
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ probes

    @property
    def probing(self) -> bool:
        return self.probe_mode is True or (self.probe_mode is None and self.in_use)

    def probe(
        self, client: httpx.AsyncClient, endpoints: Sequence[Any], *, deadline: float
    ) -> list[asyncio.Task[None]]:
        if not self.probing:
            return []
        return [
            *self.paused.probe(client, endpoints, deadline=deadline),
            *self.sleeping.probe(client, endpoints, deadline=deadline),
        ]

    def cancel_probes(self) -> None:
        self.paused.cancel()
        self.sleeping.cancel()

    def forget_endpoint(self, endpoint: str) -> None:
        self.paused.forget(endpoint)
        self.sleeping.forget(endpoint)
        self.forget_engine_streaks(endpoint)
        with self._lock:
            self.last.pop(endpoint, None)

    # ------------------------------------------------------------------ per poll

    def poll(
        self,
        inputs: Iterable[EngineInput],
        prefix: str,
        active_windows: Iterable[str],
        *,
        boundary: bool = False,
        syncing: bool = False,
    ) -> dict[str, float]:
        """One poll's keys; its engine-seconds go to every open window and run label.

        ``syncing``: a weight sync was open over this poll's interval (the trainer paused the
        engines on purpose): the ``engine_paused`` streaks restart from 0 instead of growing,
        so they count only pauses with no sync open."""
        with self._lock:
            if syncing:
                self._streak.clear()
            sums, counts, self.last = self._observe(inputs, syncing)
            self._attribute(sums, active_windows, boundary)
            return _poll_keys(prefix, counts, sums, boundary)

    def held(self, inputs: Sequence[EngineInput]) -> list[bool]:
        """Per input: its engine was paused or asleep at this scrape, by the rule of
        :meth:`poll` (False for an endpoint's own row, or when neither is known): what the
        engine-time breakdown calls ``paused`` (docs/rules.md §3.13)."""
        answers: dict[str, tuple[bool | None, bool | None]] = {}
        out: list[bool] = []
        for inp in inputs:
            if not inp.is_engine:
                out.append(False)
                continue
            ep = endpoint_of(inp.engine_id)
            known = answers.get(ep)
            if known is None:
                known = answers[ep] = (self.paused.get(ep), self.sleeping.get(ep))
            asleep = asleep_from_gauge(inp.delta.current)
            out.append(bool(known[0]) or bool(known[1] if asleep is None else asleep))
        return out

    def _observe(
        self, inputs: Iterable[EngineInput], syncing: bool
    ) -> tuple[dict[str, list[float]], dict[str, list[int]], dict[str, dict[str, Any]]]:
        """Every engine's state this poll: per scope, its engine-seconds (see ``_FIELDS``) and
        counts [paused, asleep, paused known, asleep known]; per endpoint, the last answers.
        The ``engine_paused`` streaks grow (or end) on the way."""
        sums: dict[str, list[float]] = {}
        counts: dict[str, list[int]] = {}  # scope -> [paused, asleep, paused known, asleep known]
        last: dict[str, dict[str, Any]] = {}
        for inp in inputs:
            if not inp.is_engine:
                continue
            ep = endpoint_of(inp.engine_id)
            paused = self.paused.get(ep)
            asleep = asleep_from_gauge(inp.delta.current)
            if asleep is None:
                asleep = self.sleeping.get(ep)
            info = last.setdefault(ep, {"paused": paused, "engines_asleep": 0, "engines": 0})
            info["engines"] += 1
            info["engines_asleep"] += int(bool(asleep))
            if paused is None and asleep is None:
                continue
            secs = 0.0 if inp.delta.baseline_only else max(0.0, float(inp.delta.seconds))
            if syncing:
                pass  # a sync breaks the row: nothing accrues while one is open
            elif paused or asleep:
                self._streak[inp.engine_id] = self._streak.get(inp.engine_id, 0.0) + secs
            else:
                self._streak.pop(inp.engine_id, None)
            row = [
                secs if paused else 0.0,
                secs if asleep else 0.0,
                secs if paused is not None else 0.0,
                secs if asleep is not None else 0.0,
            ]
            for scope in dict.fromkeys(("agg", inp.role or "agg", ep)):
                _add(sums, {scope: row})
                cnt = counts.setdefault(scope, [0, 0, 0, 0])
                cnt[0] += int(bool(paused))
                cnt[1] += int(bool(asleep))
                cnt[2] += int(paused is not None)
                cnt[3] += int(asleep is not None)
        return sums, counts, last

    def _attribute(
        self, sums: dict[str, list[float]], active_windows: Iterable[str], boundary: bool
    ) -> None:
        """A poll's engine-seconds to the run, every open window (``idle`` when none is open);
        a boundary poll's are held for the next regular row, which takes them into ``sums``."""
        from fleetscope.stats.windows import COMBINED, IDLE

        _add(self.run.setdefault(COMBINED, {}), sums)
        labels = list(active_windows)
        for label in labels:
            _add(self._open.setdefault(label, {}), sums)
        if not labels:
            _add(self.run.setdefault(IDLE, {}), sums)
        if boundary:
            _add(self._held, sums)
        else:
            _add(sums, self._held)
            self._held = {}

    def events(self, threshold: float) -> list[HealthEvent]:
        """``engine_paused``: an engine paused or asleep ``threshold`` seconds in a row while no
        weight sync is open, i.e. while the trainer thinks it is generating (the streaks of
        :meth:`poll` hold only such seconds: a sync restarts them)."""
        with self._lock:
            long = sorted((e, s) for e, s in self._streak.items() if s >= threshold)
        return [
            HealthEvent(
                "engine_paused",
                eid,
                secs,
                f"{eid}: paused or asleep for {secs:.0f} s while no weight sync is open",
            )
            for eid, secs in long
        ]

    def forget_engine_streaks(self, endpoint: str) -> None:
        with self._lock:
            for e in [e for e in self._streak if endpoint_of(e) == endpoint]:
                del self._streak[e]

    # ------------------------------------------------------------------ windows and summary

    def window_action(self, action: str, label: str) -> None:
        with self._lock:
            if action == "start":
                self._open[label] = {}
            elif action == "stop":
                sums = self._open.pop(label, None)
                if sums is not None:
                    _add(self.run.setdefault(label, {}), sums)
                    self._last_stopped[label] = sums

    def window_keys(self, label: str, prefix: str) -> dict[str, float]:
        with self._lock:
            sums = self._last_stopped.pop(label, None)
            return _sum_keys(f"{prefix}/{label}/", sums or {})

    def summary_keys(self, prefix: str) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = {}
            for label, sums in self.run.items():
                out.update(_sum_keys(f"{prefix}/{label}/", sums))
            return out

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "in_use": self.in_use,
                "run": {k: {s: list(v) for s, v in d.items()} for k, d in self.run.items()},
                "open": {k: {s: list(v) for s, v in d.items()} for k, d in self._open.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def load(d: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
            return {k: {s: [float(x) for x in v] for s, v in m.items()} for k, m in d.items()}

        with self._lock:
            self.in_use = self.in_use or bool(state.get("in_use", False))
            self.run = load(state.get("run", {}))
            self._open = load(state.get("open", {}))


def _poll_keys(
    prefix: str,
    counts: Mapping[str, Sequence[int]],
    sums: Mapping[str, Sequence[float]],
    boundary: bool,
) -> dict[str, float]:
    """A poll's keys per scope: engines paused and asleep (when known), and their
    engine-seconds (not on a boundary row: those are held for the next regular one)."""
    keys: dict[str, float] = {}
    for scope, (n_paused, n_asleep, k_paused, k_asleep) in counts.items():
        base = f"{prefix}/{scope}/"
        if k_paused:
            keys[base + "engines_paused"] = float(n_paused)
        if k_asleep:
            keys[base + "engines_asleep"] = float(n_asleep)
        if not boundary:
            s = sums[scope]
            if k_paused:
                keys[base + "paused_engine_seconds"] = s[0]
            if k_asleep:
                keys[base + "sleeping_engine_seconds"] = s[1]
    return keys


def _sum_keys(base: str, sums: Mapping[str, Sequence[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for scope, (paused, asleep, k_paused, k_asleep) in sums.items():
        b = f"{base}{scope}/"
        if k_paused > 0:
            out[b + "paused_engine_seconds"] = paused
            out[b + "paused_share"] = paused / k_paused
        if k_asleep > 0:
            out[b + "sleeping_engine_seconds"] = asleep
            out[b + "sleeping_share"] = asleep / k_asleep
    return out
