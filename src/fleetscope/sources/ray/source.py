"""vLLM metrics read through Ray's per-node metrics agents, filtered to the run's own engines.

Facts this relies on (Ray 2.60, see ``docs/ray-metrics-facts.md``): every alive node's agent
serves ``http://{NodeManagerAddress}:{MetricsExportPort}/metrics``; vLLM names come as
``ray_vllm_*`` (mapped back to ``vllm:`` by the parser); every sample carries ``WorkerId`` (the
recording actor's worker, 56 hex digits) and ``ReplicaId`` (Ray Serve's replica, "" outside
Serve); counters never incremented are absent; gauges expire ~2 report intervals after their
last update (missing, never 0); histogram ``_sum`` is rebuilt from bucket midpoints, so means are
estimates and token totals come from the counters. The OpenCensus backend exports counters twice
(counted once) and, in its default cardinality mode, drops ``WorkerId`` from counters and gauges
(histograms keep it): those samples are identified by ``ReplicaId`` or a run-unique
``model_name`` and joined to the engine whose histograms carry the same tags.

An engine's samples can come in several pieces (``cache_config_info`` has no ``model_name``;
the OpenCensus split above): :meth:`RaySource.filter` joins the pieces of one engine into one
snapshot, labelled ``{worker id[:8]}-{engine}``. The agent's own ``process_start_time_seconds``
is not the engine's and is not used as restart evidence.

Identity filtering keeps only the run's own engines; what it drops is counted and, when it drops
everything, warned about (never silent). A failed identity lookup disables only this source.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import numpy as np

from fleetscope.exposition import Exposition
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.identity import EngineId, Role
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.ray.identity import (
    IDENTITY_LOOKUP_TIMEOUT,
    RAY_AGENT_IDENTITY,
    AgentEngine,
    RayIdentity,
    RayNode,
    decode_label,
    discover_agents,
    owner_of,
    ray_nodes,
    worker_ids_of_actors,
)
from fleetscope.sources.ray.merge import (
    MergedLayout,
    has_series,
    merge_layouts,
    stable_labels,
)
from fleetscope.sources.ray.pieces import Piece, PieceKey, grouped
from fleetscope.util.redact import redact
from fleetscope.util.warn import RateLimitedWarner

__all__ = [
    "IDENTITY_LOOKUP_TIMEOUT",
    "NO_VLLM_WARN_AFTER",
    "RAY_AGENT_IDENTITY",
    "AgentEngine",
    "RayIdentity",
    "RaySource",
    "decode_label",
    "discover_agents",
    "owner_of",
    "worker_ids_of_actors",
]

log = logging.getLogger("fleetscope")

# consecutive polls with no vLLM sample at all before that is warned about (engines starting)
NO_VLLM_WARN_AFTER = 3


class RaySource:
    """Scrapes every node's metrics agent and keeps only the run's own engines.

    Engine labels are ``{worker id[:8]}-{engine}`` (the replica id or model name where that
    is the identity), so engine ids read ``node-5f904afd.ea26d7d6-0``.

    Args:
        identity: the run's own engines; or ``identity_lookup``, a callable returning one,
            run with a time bound in a thread (a failure disables this source, logged once).
        nodes: a callable returning ``ray.nodes()``-like dicts (default ``ray.nodes``),
            re-read every ``rediscover_every`` polls so nodes that come and go are followed.

    After every poll: ``foreign_engines`` (engines filtered out), ``missing`` (own worker or
    replica ids with no sample: not started, idle with expired gauges, or restarted under a
    new worker id) and ``disabled`` (why this source gave up, or None).

    A restarted actor runs in a new worker under a new worker id. With ``identity_lookup``,
    the lookup is run again once own ids have been missing for ``relookup_after`` polls in a
    row (then after twice as many, up to ``relookup_max`` polls, while nothing changes); a
    worker id found that way is a new process, so its engines count from 0 at first sight
    and nothing it did before is lost. A failed re-lookup keeps the identity it had.
    """

    def __init__(
        self,
        identity: RayIdentity | None = None,
        *,
        identity_lookup: Callable[[], RayIdentity] | None = None,
        nodes: Callable[[], Iterable[RayNode]] | None = None,
        rediscover_every: int = 12,
        http: HttpSource | None = None,
        lookup_timeout: float = IDENTITY_LOOKUP_TIMEOUT,
        relookup_after: int = 3,
        relookup_max: int = 96,
    ):
        self.identity = identity
        self.relookup_after = max(1, relookup_after)
        self.relookup_max = max(self.relookup_after, relookup_max)
        self._relookup_wait = self.relookup_after
        self._missing_polls = 0
        # foreign engines when the identity was last looked up (None: not scraped yet)
        self._foreign_known: int | None = None
        # worker ids a re-lookup found (new processes) -> wall time of their first sample
        self._fresh: dict[str, float | None] = {}
        self._label_wid: dict[str, str] = {}  # engine label -> its worker id
        self._engines_of_wid: dict[str, set[EngineId]] = {}  # worker id -> engine ids seen
        self._retired: set[EngineId] = set()  # engine ids of workers no longer the run's
        self._departures: list[Departure] = []
        self._lookup = identity_lookup
        self._nodes = nodes
        self.rediscover_every = max(1, rediscover_every)
        self.http = http or HttpSource(identity_labels=RAY_AGENT_IDENTITY)
        self.lookup_timeout = lookup_timeout
        self.endpoints: list[Endpoint] = []
        self.disabled: str | None = None
        self.foreign_engines = 0
        self.missing: set[str] = set()
        self._polls = 0
        self._no_vllm_polls = 0
        self._counts: tuple[int, int] | None = None  # (kept, foreign) last logged
        self._merged: dict[tuple[int, ...], MergedLayout] = {}
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")

    async def _ensure_identity(self) -> bool:
        if self.identity is None and self._lookup is None:
            self._disable("no identity given: refusing to count every actor's samples")
            return False
        if self.identity is None:
            try:
                self.identity = await self._call_lookup()
            except TimeoutError:
                self._disable(f"identity lookup timed out after {self.lookup_timeout:g} s")
                return False
            except Exception as e:
                self._disable(f"identity lookup failed: {type(e).__name__}: {e}")
                return False
        if not isinstance(self.identity, RayIdentity) or self.identity.empty:
            self._disable(
                f"identity has no worker ids, replica ids or model names: {self.identity}"
            )
            return False
        return True

    async def _call_lookup(self) -> RayIdentity:
        """The identity lookup in a thread, bounded by ``lookup_timeout``."""
        assert self._lookup is not None
        return await asyncio.wait_for(asyncio.to_thread(self._lookup), timeout=self.lookup_timeout)

    async def _relookup(self) -> None:
        """Own ids went missing: ask the lookup again (actors restart under new workers)."""
        old = self.identity or RayIdentity()
        try:
            new = await self._call_lookup()
        except Exception as e:  # keep what we had: the old ids may come back
            self._warner.warn("relookup", f"Ray identity re-lookup failed: {type(e).__name__}: {e}")
            return
        if not isinstance(new, RayIdentity) or new.empty:
            self._warner.warn("relookup", f"Ray identity re-lookup gave nothing usable: {new}")
            return
        added = new.worker_ids - old.worker_ids
        dropped = (old.worker_ids | old.replica_ids) - (new.worker_ids | new.replica_ids)
        for wid in added:
            self._fresh[wid] = None
        for wid in old.worker_ids - new.worker_ids:
            self._fresh.pop(wid, None)
            self._retired.update(self._engines_of_wid.pop(wid, ()))
        self.identity = new
        if added or dropped or new.roles != old.roles:
            self._relookup_wait = self.relookup_after
            log.warning(
                "fleetscope: Ray identity re-resolved: %d new worker id(s) %s, %d gone %s",
                len(added),
                sorted(w[:8] for w in added),
                len(dropped),
                sorted(w[:8] for w in dropped),
            )
        else:  # nothing changed: missing for another reason (idle gauges); ask less often
            self._relookup_wait = min(self._relookup_wait * 2, self.relookup_max)

    def take_departures(self) -> list[Departure]:
        """Engines of workers that stopped being the run's (a restarted actor's old worker),
        each reported once, at the poll after the one that found it out (that poll still
        folded their last samples)."""
        out, self._departures = self._departures, []
        return out

    def _disable(self, why: str) -> None:
        self.disabled = why
        log.warning("fleetscope: Ray metrics disabled (%s); training continues", redact(why))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def discover(self) -> list[Endpoint]:
        try:
            nodes = await asyncio.to_thread(self._nodes or ray_nodes)  # a GCS call
            self.endpoints = discover_agents(nodes)
        except Exception as e:
            self._warner.warn("discover", f"Ray node discovery failed: {e!r}")
        return self.endpoints

    async def scrape(self) -> list[ScrapeResult]:
        """One poll: every agent, filtered to the run's own engines. Never raises."""
        self._departures += [Departure(engine=e) for e in sorted(self._retired)]
        self._retired = set()
        if self.disabled or not await self._ensure_identity():
            return []
        if not self.endpoints or self._polls % self.rediscover_every == 0:
            await self.discover()
        self._polls += 1
        results = await self.http.scrape_all(self.endpoints)
        out = []
        kept_total = 0
        foreign = 0
        seen: set[str] = set()
        for r in results:
            if r.exposition is None:
                out.append(r)
                continue
            try:
                expo, roles, dropped = self._filter(r.exposition, seen)
            except Exception as e:  # never into the caller's loop: a failed scrape instead
                self._warner.warn("filter", f"Ray identity filter failed on {r.endpoint}: {e!r}")
                out.append(ScrapeResult(r.endpoint, None, r.time, r.wall_time, r.latency, repr(e)))
                continue
            kept_total += len(expo)
            foreign += dropped
            for label in expo:
                wid = self._label_wid.get(label)
                if wid:
                    self._engines_of_wid.setdefault(wid, set()).add(EngineId(r.endpoint, label))
            # no continuity doubt from the agent's connection: a restarted actor has a new
            # WorkerId, so it is a new engine row, never a hidden restart of an old one
            out.append(
                ScrapeResult(
                    r.endpoint, expo, r.time, r.wall_time, r.latency, None, None, r.groups, roles
                )
            )
        if any(r.ok for r in results) and (kept_total, foreign) != self._counts:
            self._counts = (kept_total, foreign)
            log.info(
                "fleetscope: Ray agents: %d own vLLM engine(s) kept, %d foreign filtered out",
                kept_total,
                foreign,
            )
        self.foreign_engines = foreign
        ident = self.identity or RayIdentity()
        self.missing = (ident.worker_ids | ident.replica_ids) - seen
        answered = any(r.ok for r in results)
        # own ids without samples, or new foreign engines (a restarted actor's new worker,
        # while the agent still exports the dead one's last values): maybe a restart
        suspect = False
        if answered:  # a poll nobody answered tells nothing, not "0 foreign engines"
            known = foreign if self._foreign_known is None else self._foreign_known
            suspect = bool(self.missing) or foreign > known
            self._foreign_known = min(known, foreign)
        self._missing_polls = self._missing_polls + 1 if suspect else 0
        if self._lookup is not None and self._missing_polls >= self._relookup_wait:
            self._missing_polls = 0
            self._foreign_known = foreign
            await self._relookup()
        if answered and kept_total == 0 and foreign:
            self._warner.warn(
                "filtered-all",
                f"Ray agents answered but none of their {foreign} vLLM engines is this run's "
                "own (the identity filter removed everything); check the worker/replica ids",
            )
        self._no_vllm_polls = self._no_vllm_polls + 1 if answered and not kept_total else 0
        if answered and not foreign and self._no_vllm_polls >= NO_VLLM_WARN_AFTER:
            self._warner.warn(
                "no-vllm",
                f"Ray agents answered {self._no_vllm_polls} polls in a row without any vLLM "
                "metric (engines not started, or not logging through RayPrometheusStatLogger?)",
            )
        return out

    def filter(self, expo: Exposition) -> tuple[Exposition, dict[str, Role], int]:
        """Keep the run's own engines, one snapshot each, labelled ``{id[:8]}-{engine}``.

        Returns the kept engines, their roles, and how many foreign engines were dropped.
        """
        return self._filter(expo, set())

    def _filter(self, expo: Exposition, seen: set[str]) -> tuple[Exposition, dict[str, Role], int]:
        ident = self.identity or RayIdentity()
        groups, by_tags, by_engine, loose = grouped(expo, ident)
        own = {k for k, pieces in groups.items() if any(owner_of(e, ident) for e, _ in pieces)}
        shadows = self._join_loose(loose, groups, by_tags, by_engine, own, ident)
        # a piece that several WorkerId engines explain is their sum, not one more engine
        foreign = sum(
            1
            for k, ps in groups.items()
            if k not in own and k not in shadows and any(has_series(s.layout) for _, s in ps)
        )
        mine = {k: groups[k] for k in groups if k in own}
        labels = stable_labels(mine)
        body_roles = expo.engine_roles  # SGLang's `engine_type`; the identity's roles win
        kept: dict[str, EngineSnapshot] = {}
        roles: dict[str, Role] = {}
        for key, pieces in mine.items():
            label = labels[key]
            kept[label] = self._engine_snapshot(key, pieces, label)
            values = [v for e, _ in pieces for v in (e.worker_id, e.replica_id, e.model_name) if v]
            seen.update(v for e, _ in pieces for v in (e.worker_id, e.replica_id) if v)
            role = next((ident.roles[v] for v in values if v in ident.roles), None)
            role = role or next((r for _, s in pieces if (r := body_roles.get(s.engine))), None)
            if role:
                roles[label] = role
        return Exposition(kept, None, expo.types), roles, foreign

    def _join_loose(
        self,
        loose: list[Piece],
        groups: dict[PieceKey, list[Piece]],
        by_tags: dict[tuple[str, str, str], set[PieceKey]],
        by_engine: dict[tuple[str, str], set[PieceKey]],
        own: set[PieceKey],
        ident: RayIdentity,
    ) -> set[PieceKey]:
        """Pieces without WorkerId (OpenCensus backend, default cardinality): joined to the one
        engine with the same tags; Ray sums same-tag series of several workers, so with two or
        more such engines the piece stands alone (own only by replica id or model name).
        Updates ``groups`` and ``own``; returns the pieces summed over engines counted already
        (not engines). Warns about pieces it cannot attribute."""
        ambiguous = unmatched = 0
        shadows: set[PieceKey] = set()
        for e, snap in loose:
            cands = by_tags.get((e.replica_id, e.model_name, e.engine), set())
            if not cands and not e.model_name:  # cache_config_info carries no model_name
                cands = by_engine.get((e.replica_id, e.engine), set())
            if len(cands) == 1:
                groups[next(iter(cands))].append((e, snap))
                continue
            ambiguous += bool(cands & own)
            key = ("r", e.replica_id, e.engine) if e.replica_id else ("m", e.model_name, e.engine)
            if cands:
                shadows.add(key)
            groups.setdefault(key, []).append((e, snap))
            if owner_of(e, ident):
                own.add(key)
            elif has_series(snap.layout):
                unmatched += 1
        if ambiguous:
            self._warner.warn(
                "no-worker-id-ambiguous",
                "Ray exports vLLM counters/gauges without WorkerId (OpenCensus backend, default "
                "cardinality) and several engines share their tags: Ray summed them, so per-"
                "engine statistics are wrong; set RAY_metric_cardinality_level=legacy",
            )
        if unmatched and ident.worker_ids and not (ident.model_names or ident.replica_ids):
            self._warner.warn(
                "no-worker-id",
                f"{unmatched} vLLM engine piece(s) in Ray's metrics carry no WorkerId "
                "(OpenCensus backend, default cardinality) and match no engine by tags: give "
                "RayIdentity.model_names too, or set RAY_metric_cardinality_level=legacy",
            )
        return shadows

    def _engine_snapshot(self, key: PieceKey, pieces: list[Piece], label: str) -> EngineSnapshot:
        """One kept engine's snapshot from its pieces; a process that started after the
        previous poll takes its first sighting as its start time."""
        snap = self._merge([s for _, s in pieces], label)
        wid = key[1] if key[0] == "w" else None
        if wid:
            self._label_wid[label] = wid
        if wid in self._fresh:  # a new process: it started after the previous poll
            if self._fresh[wid] is None:
                self._fresh[wid] = snap.wall_time
            snap = EngineSnapshot(
                label,
                snap.layout,
                snap.data,
                snap.time,
                snap.wall_time,
                self._fresh[wid],
                snap.invalid,
            )
        return snap

    def _merge(self, pieces: list[EngineSnapshot], label: str) -> EngineSnapshot:
        """One snapshot from an engine's pieces; the agent's process start is dropped."""
        first = pieces[0]
        if len(pieces) == 1:
            return EngineSnapshot(
                label, first.layout, first.data, first.time, first.wall_time, None, first.invalid
            )
        key = tuple(id(p.layout) for p in pieces)
        m = self._merged.get(key)
        if m is None or any(a is not p.layout for a, p in zip(m.sources, pieces, strict=True)):
            m = merge_layouts(tuple(p.layout for p in pieces))
            if len(self._merged) > 256:
                self._merged.clear()
            self._merged[key] = m
        data = np.concatenate([p.data for p in pieces])
        merged = np.bincount(m.target, weights=data, minlength=m.n)
        invalid = frozenset().union(*(p.invalid for p in pieces))
        return EngineSnapshot(label, m.layout, merged, first.time, first.wall_time, None, invalid)
