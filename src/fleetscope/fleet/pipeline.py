"""One poll's statistics, from scrapes to the fleet view: the collector's stateful core.

Departures, deltas, reductions, window attribution, health and the view, for every poll, in
one worker thread under one lock; the run summary and checkpoints read the same state under
the same lock, from any thread. No I/O and no clock of its own: the collector supplies both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.report import summary_keys
from fleetscope.fleet.state import FleetState
from fleetscope.fleet.view import FleetView, build_view
from fleetscope.health import HealthMonitor, health_keys
from fleetscope.identity import EngineId, endpoint_of
from fleetscope.keys import key_prefix, summary_prefix
from fleetscope.rl.operations import operation_keys, poll_rows
from fleetscope.rl.states import EngineStates
from fleetscope.rl.versions import PolicyVersions
from fleetscope.rl.view import EndpointInfo, endpoint_info
from fleetscope.rl.weight_sync import WeightSyncs
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.stats.breakdown import PhaseClassifier
from fleetscope.stats.reduce import EngineInput
from fleetscope.stats.windows import Window, WindowSet
from fleetscope.util.warn import RateLimitedWarner

log = logging.getLogger("fleetscope")


class PollPipeline:
    """The fleet state, the windows and the health monitor of one collector."""

    def __init__(self, config: CollectorConfig):
        self.state = FleetState(
            key_options=config.key_options,
            group_by_model=config.group_by_model,
            max_engines_per_endpoint=config.max_engines_per_endpoint,
            evict_after=config.evict_after,
        )
        self.windows = WindowSet()
        self.health = HealthMonitor(config.health_thresholds)
        self._paused_seconds = config.health_thresholds.paused_seconds
        self.prefix = key_prefix(config.key_options)
        self.lock = threading.RLock()
        # RL: the trainer's policy versions, what endpoints serve, weight syncs
        self.versions = PolicyVersions(stale_seconds=config.health_thresholds.stale_seconds)
        self.syncs = WeightSyncs()
        self.states = EngineStates(config.rl_probes)  # paused / asleep engine-seconds
        # where the engines' time went: idle, busy, saturated, paused, syncing
        self.engine_time = PhaseClassifier(config.health_thresholds.kv_full)
        self._info: dict[str, EndpointInfo] = {}
        self._answered: set[str] = set()  # endpoints that answered at least once
        self._last_attempt: dict[str, float] = {}  # endpoint -> its latest scrape's time
        self._last_shown: float | None = None  # scrape time of the last row that showed rates
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        # endpoint -> (engine kind, server version) as the source reported them (run summary)
        self.servers: dict[str, tuple[str | None, str | None]] = {}

    def process(
        self,
        scrapes: list[ScrapeResult],
        departures: Iterable[Departure],
        *,
        boundary: bool = False,
        row_floor: float = 0.0,
        max_model_len: Mapping[str, int | None] | None = None,
    ) -> FleetView:
        """Everything one poll does to the statistics; returns the fleet view.

        ``row_floor``: a poll less than this many seconds after the previous row that showed
        rates is held like a boundary (instant values only; the next row shows its increases):
        a rate over a sliver is not a fleet state (docs/rules.md §3.9)."""
        with self.lock:
            boundary = self._held(scrapes, boundary, row_floor)
            self._depart(departures)
            latest = max((s.time for s in scrapes if s.ok), default=None)
            for sc in scrapes:
                if sc.joined:
                    self.windows.endpoint_joins(sc.endpoint, _joined_at(sc, latest))
                if sc.engine_kind is not None or sc.server_version is not None:
                    self.servers[sc.endpoint] = (sc.engine_kind, sc.server_version)
            result = self.state.observe(scrapes, boundary=boundary)
            for eid in self.state.take_evicted():
                self.windows.evict(eid, EngineId(eid.endpoint, "evicted"))
            answers = self._first_answers(scrapes, result.inputs)
            self.windows.attribute(
                result.inputs,
                now=result.time,
                failed_scrapes=sum(1 for s in scrapes if not s.ok),
                unseen=self._unseen(scrapes),
                # each engine's interval in one class (docs/rules.md §3.13); a sync open over
                # this interval: the same rule as the paused engine-seconds' below
                phases=self.engine_time.classify(
                    result.inputs,
                    self.states.held(result.inputs),
                    syncing=self.syncs.open_count > 0,
                ),
            )
            for endpoint, lost in answers.items():
                self.windows.endpoint_answers(endpoint, lost=lost)
            roles: dict[str, str | None] = {k: v for k, v in self.state.engine_role.items()}
            result.events = self.health.evaluate(result, roles)
            vkeys, vevents = self.versions.poll(
                result.inputs,
                result.time,
                self.prefix,
                list(self.windows.active),
                boundary=boundary,
            )
            result.keys.update(operation_keys(poll_rows(result.inputs), self.prefix))
            result.keys.update(self.syncs.poll(result.inputs, result.time, self.prefix))
            result.keys.update(vkeys)
            result.keys.update(
                self.states.poll(
                    result.inputs,
                    self.prefix,
                    list(self.windows.active),
                    boundary=boundary,
                    # open over this interval: a sync's entry poll ends the interval before it
                    # (the sync opens after it), its exit poll the last interval inside it
                    syncing=self.syncs.open_count > 0,
                )
            )
            result.events.extend(vevents)
            result.events.extend(self.states.events(self._paused_seconds))
            result.keys.update(health_keys(result.events, self.prefix))
            self._info = endpoint_info(scrapes, self.versions, self.states, self._info)
            result.endpoint_info = self._info
            for ev in result.events:
                if ev.condition != "scrape_failed":  # the source already warned, naming it
                    self._warner.warn(
                        f"health:{ev.condition}:{ev.subject}", f"health: {ev.message}"
                    )
            return build_view(
                result,
                known_engines=[
                    e for e in self.state.baselines.engines() if isinstance(e, EngineId)
                ],
                engine_roles=self.state.engine_role,
                endpoint_roles=self.state.roles,
                max_model_len=max_model_len or {},
            )

    def _unseen(self, scrapes: list[ScrapeResult]) -> dict[str, float]:
        """Endpoints this poll tried that never answered, each with the seconds since its
        previous attempt: an engine's interval is between its own scrapes, and so is this (one
        just added is not counted: the interval before its first try was not its own)."""
        self._answered.update(s.endpoint for s in scrapes if s.ok)
        out: dict[str, float] = {}
        for s in scrapes:
            before = self._last_attempt.get(s.endpoint)
            self._last_attempt[s.endpoint] = s.time
            if not s.ok and not s.joined and s.endpoint not in self._answered:
                out[s.endpoint] = 0.0 if before is None else max(0.0, s.time - before)
        return out

    def _first_answers(
        self, scrapes: list[ScrapeResult], inputs: Iterable[EngineInput]
    ) -> dict[str, bool]:
        """Endpoints answering for the first time, each with whether the time it never
        answered was lost: not if each of its engines proved it started since its first try
        (a late starter, counted from 0: rules §3.3 and §3.10)."""
        first = {s.endpoint for s in scrapes if s.ok and s.endpoint not in self._answered}
        late: dict[str, bool] = {}
        for inp in inputs:
            endpoint = endpoint_of(inp.engine_id)
            if inp.is_engine and endpoint in first:
                late[endpoint] = late.get(endpoint, True) and inp.delta.started
        return {endpoint: not late.get(endpoint, False) for endpoint in first}

    def _held(self, scrapes: list[ScrapeResult], boundary: bool, row_floor: float) -> bool:
        """Whether this poll's row is held; the time of the last row shown otherwise."""
        now = max((s.time for s in scrapes if s.ok), default=None)
        if now is None:
            return boundary
        last = self._last_shown
        if boundary or (last is not None and now - last < row_floor):
            return True
        self._last_shown = now
        return False

    def _depart(self, departures: Iterable[Departure]) -> None:
        """Open windows stop expecting what left; its baselines are dropped (sums stay)."""
        for d in departures:
            if d.endpoint is not None:
                if d.time is not None:
                    self.windows.endpoint_leaves(d.endpoint, d.time)
                self.state.forget_endpoint(d.endpoint)
                self.health.forget_endpoint(d.endpoint)
                self.versions.forget_endpoint(d.endpoint)
                self.states.forget_endpoint(d.endpoint)
                self._last_attempt.pop(d.endpoint, None)
                log.info("fleetscope: %s removed from the fleet", d.endpoint)
            if d.engine is not None:
                last = self.state.baselines.last(d.engine)
                t = d.time if d.time is not None else (last.time if last is not None else None)
                if t is not None:
                    self.windows.engine_leaves(d.engine, t)
                self.state.forget_engine(d.engine)

    def window_action(
        self, action: str, label: str, now: float, times: Mapping[str, float]
    ) -> Window:
        with self.lock:
            w: Window = getattr(self.windows, action)(label, now, times)
            self.versions.window_action(action, label)
            self.states.window_action(action, label)
            return w

    def close_windows(self, now: float) -> None:
        with self.lock:
            self.windows.stop_all(now)

    def summary(self, status: str) -> dict[str, float | str]:
        with self.lock:
            out = summary_keys(self.windows.run, self.state.key_options, status, self.state.limits)
            sp = summary_prefix(self.state.key_options)
            out.update(self.versions.summary_keys(sp))
            out.update(self.syncs.summary_keys(sp))
            out.update(server_keys(self.servers, sp))
            for name, version in sorted(self.versions.served_versions().items()):
                out[f"{sp}/endpoints/{name}/weight_version"] = version
            out.update(self.states.summary_keys(sp))
            return out

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "windows": self.windows.state_dict(),
                "restarts": [[e.to_json(), n] for e, n in self.state.restarts.items()],
                "scrape_failures_total": dict(self.state.scrape_failures_total),
                "step": self.state.step,
                "servers": {name: list(kv) for name, kv in self.servers.items()},
                "rl": {
                    "versions": self.versions.state_dict(),
                    "syncs": self.syncs.state_dict(),
                    "states": self.states.state_dict(),
                },
            }

    def load_state_dict(self, state: Mapping[str, Any], *, continuous: bool = False) -> None:
        with self.lock:
            self.windows.load_state_dict(state["windows"], continuous=continuous)
            restarts = state.get("restarts", [])
            pairs = restarts.items() if isinstance(restarts, Mapping) else restarts
            for e, n in pairs:
                self.state.restarts[EngineId.from_json(e)] = int(n)
            self.state.scrape_failures_total.update(state.get("scrape_failures_total", {}))
            self.state.step = max(self.state.step, int(state.get("step", 0)))
            for name, (kind, version) in state.get("servers", {}).items():
                self.servers.setdefault(name, (kind, version))
            rl = state.get("rl")
            if rl:
                self.versions.load_state_dict(rl["versions"])
                self.syncs.load_state_dict(rl["syncs"])
                self.states.load_state_dict(rl.get("states", {}))


def _joined_at(sc: ScrapeResult, latest: float | None) -> float:
    """When open windows expect a joining endpoint's engines from: its first scrape; a
    refused first try no later than the poll's latest answer, the time a process that starts
    after this poll is counted from (its first interval begins there, rules §3.3): the same
    poll, whatever order its scrapes finished in."""
    if sc.ok or latest is None:
        return sc.time
    return min(sc.time, latest)


def server_keys(
    servers: Mapping[str, tuple[str | None, str | None]], prefix: str
) -> dict[str, float | str]:
    """Run-summary strings per endpoint (every endpoint the run watched, departed ones too):
    ``{prefix}/endpoints/{name}/engine_kind`` and ``.../engine_version``."""
    out: dict[str, float | str] = {}
    for name, (kind, version) in sorted(servers.items()):
        if kind is not None:
            out[f"{prefix}/endpoints/{name}/engine_kind"] = kind
        if version is not None:
            out[f"{prefix}/endpoints/{name}/engine_version"] = version
    return out
