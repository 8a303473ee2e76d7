"""The fleet's statistical state between polls, with no I/O: scrapes in, statistics and keys out.

A source (HTTP, Ray, files) produces one :class:`ScrapeResult` per endpoint per poll; the
:class:`FleetState` turns them into per-engine deltas (docs/rules.md §3), reduces them per
scope, and renders keys. The collector and ``fleetscope inspect`` share it, so the CLI shows
exactly what the collector logs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetscope.fleet.report import LimitWarnings
from fleetscope.identity import EngineId, Role
from fleetscope.keys import KeyOptions, key_prefix, poll_keys
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.baselines import Advance, Baselines, share_restarts
from fleetscope.stats.deltas import EngineDelta
from fleetscope.util.redact import redact
from fleetscope.util.warn import RateLimitedWarner

if TYPE_CHECKING:
    from fleetscope.exposition import Exposition
    from fleetscope.exposition.snapshot import EngineSnapshot
    from fleetscope.health import HealthEvent
    from fleetscope.rl.view import EndpointInfo
from fleetscope.fleet.held import instant_view, joined
from fleetscope.stats.reduce import (
    EngineInput,
    Partial,
    PollStats,
    finish_reduce,
    merge_partials,
    partial_reduce,
)

log = logging.getLogger("fleetscope")

# how far an engine's clock may be ahead of ours when we judge that it started after a poll
DEFAULT_CLOCK_SKEW = 1.0


@dataclass
class PollResult:
    """What one poll produced."""

    step: int
    stats: PollStats
    keys: dict[str, float]
    deltas: dict[EngineId, EngineDelta]
    scrapes: list[ScrapeResult]
    restarts: list[EngineId] = field(default_factory=list)
    wall_time: float = 0.0
    time: float = 0.0  # monotonic time of the latest response in this poll
    inputs: list[EngineInput] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)
    # per endpoint: engine kind, served weight version, paused / asleep (fleetscope.rl.view)
    endpoint_info: dict[str, EndpointInfo] = field(default_factory=dict)
    # a row over a sliver of an interval (a boundary, a poll soon after the previous row):
    # instant values only; its increases are shown by the next row (docs/rules.md §3.9)
    held: bool = False


class FleetState:
    """Baselines, restart counts and poll bookkeeping for one fleet."""

    def __init__(
        self,
        *,
        key_options: KeyOptions | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        prefixes: Sequence[str] | None = None,
        group_by_model: bool = False,
        max_engines_per_endpoint: int = 512,
        evict_after: float = 600.0,
    ):
        self.baselines = Baselines()
        # one extra scope per served model (``model:{name}``), for fleets serving several
        self.group_by_model = group_by_model
        self.key_options = key_options or KeyOptions()
        self.clock_skew = clock_skew
        self.prefixes = tuple(prefixes) if prefixes else None
        self.step = 0
        self.restarts: dict[EngineId, int] = {}
        self.scrape_failures_total: dict[str, int] = {}
        self._prev_poll: tuple[float, float] | None = None  # (monotonic, wall) of last poll
        self._first_attempt: dict[str, float] = {}  # endpoint -> wall time of its first scrape
        self.invalid_series_total = 0
        self._invalid_seen: set[tuple[str, str, str]] = set()  # warned once each
        self._invalid_this_poll: dict[str, int] = {}
        # cardinality: engines per endpoint are bounded, silent ones evicted (sums kept)
        self.max_engines_per_endpoint = max(1, max_engines_per_endpoint)
        self.evict_after = evict_after
        self._last_seen: dict[EngineId, float] = {}
        self._ever: dict[str, int] = {}  # endpoint -> distinct engine ids seen
        self._evicted: list[EngineId] = []
        self._held: dict[str, EngineInput] = {}  # boundary deltas the next regular poll shows
        self.roles: dict[str, Role | None] = {}  # endpoint -> role
        self.engine_role: dict[EngineId, Role | None] = {}
        # a crash-looping engine is counted every time, but warned about once per interval
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        # statistics left out (not finite) or rounded (past 2**53): docs/bad-data.md §13
        self.limits = LimitWarnings(self._warner)

    def observe(self, scrapes: Sequence[ScrapeResult], *, boundary: bool = False) -> PollResult:
        """Fold one poll's scrapes into the state and reduce them.

        ``boundary``: an extra scrape taken at a window boundary, often a fraction of an
        interval after the regular poll. Its deltas are exact for the windows
        (``result.inputs``), but a rate over a sliver is not a fleet state: the boundary row
        shows no rates, ratios, quantiles or increases, and the next regular poll shows them
        over the whole interval since the previous regular poll (no dip, no spike).
        """
        inputs, deltas, restarts = self.fold(scrapes)
        kwargs = {"prefixes": self.prefixes} if self.prefixes else {}
        shown = inputs
        if boundary:
            for inp in inputs:
                self._held[inp.engine_id] = joined(self._held.get(inp.engine_id), inp)
        elif self._held:
            shown = [joined(self._held.get(inp.engine_id), inp) for inp in inputs]
            self._held = {}
        result = self.finish(
            [partial_reduce(shown, **kwargs)],
            scrapes,
            inputs=inputs,
            deltas=deltas,
            restarts=restarts,
            instant_only=boundary,
        )
        result.held = boundary
        return result

    def forget_engine(self, engine_id: EngineId) -> None:
        """An engine is gone for good (its worker will never report again)."""
        self.baselines.forget(engine_id)
        self.engine_role.pop(engine_id, None)
        self._last_seen.pop(engine_id, None)

    def forget_endpoint(self, endpoint: str) -> None:
        """An endpoint left the fleet: drop its baselines and roles (run totals stay). If it
        comes back it is a new endpoint: its first scrape is a baseline again."""
        for eid in self.baselines.engines():
            if isinstance(eid, EngineId) and eid.endpoint == endpoint:
                self.forget_engine(eid)
        self.roles.pop(endpoint, None)
        self._first_attempt.pop(endpoint, None)

    def fold(
        self, scrapes: Sequence[ScrapeResult]
    ) -> tuple[list[EngineInput], dict[EngineId, EngineDelta], list[EngineId]]:
        """Per-engine deltas of one poll (the baselines advance); nothing is reduced yet."""
        inputs: list[EngineInput] = []
        deltas: dict[EngineId, EngineDelta] = {}
        restarts: list[EngineId] = []
        pending: list[Advance] = []
        meta: list[tuple[EngineId, ScrapeResult, bool, Role | None]] = []
        for sc in scrapes:
            first_attempt = self._first_attempt.setdefault(sc.endpoint, sc.wall_time)
            if sc.exposition is None:
                continue
            self._note_invalid(sc)
            for eid, snap, is_engine, role in self._engine_rows(sc, sc.exposition):
                known = eid in self.baselines
                start = snap.start_time
                interval = None if known else self._new_engine_interval(snap, first_attempt)
                # the source doubts the process lived on, and no start time says: a restart
                # could hide in the interval
                unknown = known and bool(sc.continuity_doubt) and start is None
                pending.append(Advance(eid, snap, interval, unknown))
                meta.append((eid, sc, is_engine, role))
        # every engine's delta at once (one matrix per layout), then the bookkeeping
        rows = [(m[0], adv.snapshot) for m, adv in zip(meta, pending, strict=True)]
        computed = share_restarts(rows, self.baselines.advance_many(pending))
        for adv, d, (eid, sc, is_engine, role) in zip(pending, computed, meta, strict=True):
            snap, interval = adv.snapshot, adv.new_engine_interval
            unknown = d.continuity_unknown
            if d.type_changed:
                self._warner.warn(
                    f"type:{eid}",
                    f"{eid}: the type of {', '.join(d.type_changed[:3])} changed; its "
                    "baseline was dropped (no delta this poll)",
                )
            if unknown:
                why = sc.continuity_doubt or "showed a restart on another of its rows"
                self._warner.warn(
                    f"continuity:{eid}",
                    f"{eid} shows no start time and {sc.endpoint} {why}: a restart cannot be "
                    "ruled out, coverage lowered",
                )
            # the endpoint's engine-less row restarts with its engines: count engines only
            if d.restarted and not d.baseline_only and interval is None and is_engine:
                restarts.append(eid)
                self.restarts[eid] = self.restarts.get(eid, 0) + 1
                self._warner.warn(f"restart:{eid}", f"{eid} restarted; counting its series from 0")
            deltas[eid] = d
            self.engine_role[eid] = role
            if eid not in self._last_seen and is_engine:
                self._ever[sc.endpoint] = self._ever.get(sc.endpoint, 0) + 1
            self._last_seen[eid] = sc.time
            groups = sc.groups
            if self.group_by_model and snap.layout.model_name:
                groups = (*groups, f"model:{snap.layout.model_name}")
            inputs.append(EngineInput(eid, d, role, groups, is_engine))
        ok = [sc for sc in scrapes if sc.ok]
        if ok:
            self._prev_poll = (max(sc.time for sc in ok), max(sc.wall_time for sc in ok))
            self._bound_engines(max(sc.time for sc in ok))
        return inputs, deltas, restarts

    def _engine_rows(
        self, sc: ScrapeResult, expo: Exposition
    ) -> list[tuple[EngineId, EngineSnapshot, bool, Role | None]]:
        """The scrape's engines (at most ``max_engines_per_endpoint``: the rest are ignored,
        with a warning) and its endpoint's engine-less row: (id, snapshot, is engine, role)."""
        labels = list(expo)
        if len(labels) > self.max_engines_per_endpoint:
            self._warner.warn(
                f"too-many-engines:{sc.endpoint}",
                f"{sc.endpoint} exposes {len(labels)} engines, more than the "
                f"{self.max_engines_per_endpoint} allowed per endpoint: the rest are ignored",
            )
            labels = sorted(labels)[: self.max_engines_per_endpoint]
        rows = [
            (
                EngineId(sc.endpoint, label),
                expo[label],
                True,
                sc.engine_roles.get(label, sc.role),
            )
            for label in labels
        ]
        if expo.endpoint is not None:
            rows.append((EngineId(sc.endpoint), expo.endpoint, False, sc.role))
        return rows

    def _new_engine_interval(self, snap: EngineSnapshot, first_attempt: float) -> float | None:
        """For an engine never seen before: the seconds it counted in, when its start time
        proves it started during them (everything it counted is new); None: a baseline."""
        start = snap.start_time
        if start is None:
            return None
        if self._prev_poll is not None and start > self._prev_poll[1] + self.clock_skew:
            # started after the previous poll: everything it counted is new
            return max(snap.time - self._prev_poll[0], 0.0)
        if first_attempt + self.clock_skew < start <= snap.wall_time + self.clock_skew:
            # started after its endpoint joined (refused until then, as every
            # vLLM is for its first 30-50 s): counted from 0, over its own life
            return max(snap.wall_time - start, 0.0)
        return None

    def _bound_engines(self, now: float) -> None:
        """Evict engines silent for ``evict_after`` seconds, and the least recently seen ones
        of an endpoint past its bound (labels that churn every scrape); warn about churn."""
        live: dict[str, list[EngineId]] = {}
        for eid, seen in list(self._last_seen.items()):
            if not eid.is_engine:
                continue
            if now - seen > self.evict_after:
                self._evict(eid)
            else:
                live.setdefault(eid.endpoint, []).append(eid)
        for endpoint, engines in live.items():
            extra = len(engines) - self.max_engines_per_endpoint
            if extra > 0:
                for eid in sorted(engines, key=self._last_seen.__getitem__)[:extra]:
                    self._evict(eid)
            ever = self._ever.get(endpoint, 0)
            if ever > 2 * self.max_engines_per_endpoint or ever > 4 * len(engines) + 16:
                self._warner.warn(
                    f"churn:{endpoint}",
                    f"{endpoint}: its engine labels churn ({ever} distinct engines seen, "
                    f"{len(engines)} now): silent ones are evicted, their sums kept under "
                    f"{endpoint}.evicted",
                )

    def _evict(self, eid: EngineId) -> None:
        self.forget_engine(eid)
        self._evicted.append(eid)

    def take_evicted(self) -> list[EngineId]:
        """Engines evicted since the last call (windows fold their sums, once each)."""
        out, self._evicted = self._evicted, []
        return out

    def _note_invalid(self, sc: ScrapeResult) -> None:
        """Series left out of this scrape for bad values: warned once per endpoint and series,
        counted in a key."""
        assert sc.exposition is not None
        invalid = sc.exposition.invalid
        if not invalid:
            return
        self._invalid_this_poll[sc.endpoint] = len(invalid)
        self.invalid_series_total += len(invalid)
        for inv in invalid:
            key = (sc.endpoint, inv.engine, inv.series)
            if key in self._invalid_seen or len(self._invalid_seen) > 100_000:
                continue
            self._invalid_seen.add(key)
            where = f"{sc.endpoint}.{inv.engine}" if inv.engine else sc.endpoint
            log.warning(
                "fleetscope: %s",
                redact(
                    f"{where}: series {inv.series} left out ({inv.reason}): its baseline is "
                    "kept, it counts again from its next valid value"
                ),
            )

    def finish(
        self,
        partials: Sequence[Partial],
        scrapes: Sequence[ScrapeResult],
        *,
        inputs: list[EngineInput] | None = None,
        deltas: dict[EngineId, EngineDelta] | None = None,
        restarts: Sequence[EngineId] = (),
        instant_only: bool = False,
    ) -> PollResult:
        """Merge reduced parts (one, or one per shard) into this poll's statistics and keys
        (``instant_only``: only values of this instant, no interval statistics)."""
        for sc in scrapes:
            self.roles[sc.endpoint] = sc.role
            if not sc.ok:
                self.scrape_failures_total[sc.endpoint] = (
                    self.scrape_failures_total.get(sc.endpoint, 0) + 1
                )
        stats = finish_reduce(merge_partials(partials))
        self.limits(stats, "poll")
        keys = poll_keys(instant_view(stats) if instant_only else stats, self.key_options)
        keys.update(self._health_keys(scrapes, stats))
        result = PollResult(
            step=self.step,
            stats=stats,
            keys=keys,
            deltas=deltas or {},
            scrapes=list(scrapes),
            restarts=list(restarts),
            wall_time=max((sc.wall_time for sc in scrapes), default=0.0),
            time=max((sc.time for sc in scrapes), default=0.0),
            inputs=inputs or [],
        )
        self.step += 1
        return result

    def _scope_base(self, scope: str) -> str:
        base = key_prefix(self.key_options)
        if self.key_options.schema == "skyrl" and scope == "agg":
            return f"{base}/"
        return f"{base}/{scope}/"

    def _health_keys(self, scrapes: Sequence[ScrapeResult], stats: PollStats) -> dict[str, float]:
        """engines_reporting, scrape failures and latency: the loss is visible every poll."""
        out: dict[str, float] = {}
        scopes: dict[str, list[ScrapeResult]] = {"agg": list(scrapes)}
        for sc in scrapes:
            # an endpoint's role, or its engines' roles (a Ray agent serves several roles)
            for role in dict.fromkeys((sc.role, *sc.engine_roles.values())):
                if role:
                    scopes.setdefault(role, []).append(sc)
        for scope, scs in scopes.items():
            base = self._scope_base(scope)
            reduced = stats.scopes.get(scope)
            out[base + "engines_reporting"] = float(reduced.engines if reduced else 0)
            out[base + "endpoints_reporting"] = float(sum(1 for s in scs if s.ok))
            out[base + "endpoints_expected"] = float(len(scs))
            out[base + "scrape_failures"] = float(sum(1 for s in scs if not s.ok))
            lat = [s.latency for s in scs if s.ok]
            if lat:
                out[base + "scrape_latency_seconds/max"] = max(lat)
                out[base + "scrape_latency_seconds/mean"] = sum(lat) / len(lat)
        base = self._scope_base("agg")
        out[base + "invalid_series"] = float(sum(self._invalid_this_poll.values()))
        out[base + "invalid_series_total"] = float(self.invalid_series_total)
        self._invalid_this_poll = {}
        out[base + "scrape_failures_total"] = float(sum(self.scrape_failures_total.values()))
        out[base + "engine_restarts_total"] = float(sum(self.restarts.values()))
        return out
