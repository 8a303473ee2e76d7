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
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetscope._warn import RateLimitedWarner
from fleetscope.catalog import RAY_PREFIXES
from fleetscope.exposition import Exposition
from fleetscope.identity import EngineId, Role
from fleetscope.snapshot import (
    CounterSeries,
    EngineLayout,
    EngineSnapshot,
    GaugeSeries,
    HistogramSeries,
)
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.sources.http import Endpoint, HttpSource

log = logging.getLogger("fleetscope")

IDENTITY_LOOKUP_TIMEOUT = 10.0
# model_name is part of the key so a run-unique model name can identify engines when the
# OpenCensus backend drops WorkerId. The parser joins the non-empty values with "/".
RAY_AGENT_IDENTITY = ("ReplicaId", "WorkerId", "model_name", "engine")
# consecutive polls with no vLLM sample at all before that is warned about (engines starting)
NO_VLLM_WARN_AFTER = 3

_WORKER_ID = re.compile(r"[0-9a-f]{56}")  # Ray's WorkerID: 28 bytes, hex
_ENGINE_PREFIXES = tuple(RAY_PREFIXES.values())  # "vllm:", "sglang:" (names after mapping)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # engine ids are `{endpoint}.{label}`; keys use "/"


def discover_agents(nodes: Iterable[Mapping] | None = None) -> list[Endpoint]:
    """One endpoint per alive node's metrics agent (``ray.nodes()`` unless ``nodes`` given).

    Names are ``node-{NodeID[:8]}``, so a node keeps its name while alive.
    """
    if nodes is None:
        nodes = _ray_nodes()
    alive = [
        n
        for n in nodes
        if (n.get("Alive") or n.get("alive")) and n.get("MetricsExportPort") and n.get("NodeID")
    ]
    alive.sort(key=lambda n: n["NodeID"])
    out = []
    for n in alive:
        host = str(n["NodeManagerAddress"])
        if ":" in host and not host.startswith("["):  # IPv6
            host = f"[{host}]"
        out.append(
            Endpoint(url=f"http://{host}:{n['MetricsExportPort']}", name=f"node-{n['NodeID'][:8]}")
        )
    return out


def worker_ids_of_actors(actors: Sequence, timeout: float = IDENTITY_LOOKUP_TIMEOUT) -> list[str]:
    """Worker ids of actors (handles or actor id hex strings), in the order given.

    Reads Ray's actor table from the GCS (works without the dashboard); waits for actors still
    being created. Falls back to the state API (needs the dashboard) where the GCS table is not
    reachable. Bounded by ``timeout``; raises ``TimeoutError`` or ``LookupError``.
    """
    deadline = time.monotonic() + timeout
    ids = [a if isinstance(a, str) else a._actor_id.hex() for a in actors]
    try:
        from ray._private.state import state as gcs_state
        from ray.core.generated import gcs_pb2
    except ImportError:  # a Ray without these private modules
        return _worker_ids_from_state_api(ids, deadline)
    return [_worker_id_from_gcs(a, deadline, gcs_state, gcs_pb2) for a in ids]


def _worker_id_from_gcs(actor_id: str, deadline: float, gcs_state: Any, gcs_pb2: Any) -> str:
    import ray

    states = gcs_pb2.ActorTableData.ActorState
    while True:
        info = gcs_state.get_actor_info(ray.ActorID(bytes.fromhex(actor_id)))
        if info is None:
            raise LookupError(f"actor {actor_id} is unknown to Ray")
        data = gcs_pb2.ActorTableData.FromString(info)
        state = states.Name(data.state)
        if state == "ALIVE" and data.address.worker_id:
            return data.address.worker_id.hex()
        if state == "DEAD":
            raise LookupError(f"actor {actor_id} is dead")
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker id lookup timed out: actor {actor_id} is {state}")
        time.sleep(0.1)


def _worker_ids_from_state_api(actor_ids: Sequence[str], deadline: float) -> list[str]:
    from ray.util.state import get_actor, list_workers

    out = []
    for actor_id in actor_ids:
        if time.monotonic() > deadline:
            raise TimeoutError("worker id lookup timed out")
        left = max(1, int(deadline - time.monotonic()))
        st = get_actor(actor_id, timeout=left)
        if st is None or st.pid is None:
            raise LookupError(f"actor {actor_id} not found or not alive")
        filters: list[Any] = [("pid", "=", int(st.pid)), ("node_id", "=", st.node_id)]
        workers = list_workers(
            filters=filters,
            timeout=left,
        )
        if not workers:
            raise LookupError(f"no worker for actor {actor_id} (pid {st.pid})")
        out.append(workers[0].worker_id)
    return out


@dataclass
class RayIdentity:
    """Which samples are the run's own: by worker id, replica id or model name.

    ``roles`` maps an identity value (worker id, replica id, model name) to its role.
    A worker id decides wherever the sample has one; ``model_names`` is the fallback for samples
    without ``WorkerId`` (OpenCensus backend) and cannot tell two engines with the same tags
    apart.
    """

    worker_ids: set[str] = field(default_factory=set)
    replica_ids: set[str] = field(default_factory=set)
    model_names: set[str] = field(default_factory=set)
    roles: dict[str, Role] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.worker_ids or self.replica_ids or self.model_names)

    @classmethod
    def of_actors(
        cls,
        actors: Sequence,
        roles: Sequence[Role | None] | None = None,
        *,
        timeout: float = IDENTITY_LOOKUP_TIMEOUT,
    ) -> RayIdentity:
        """The identity of actor handles (``roles``, if given, aligned with ``actors``)."""
        wids = worker_ids_of_actors(actors, timeout)
        return cls(
            worker_ids=set(wids),
            roles={w: r for w, r in zip(wids, roles or (), strict=False) if r},
        )


@dataclass(frozen=True, slots=True)
class AgentEngine:
    """The identity tags of one engine label in an agent body."""

    replica_id: str
    worker_id: str
    model_name: str
    engine: str


def decode_label(label: str, identity: RayIdentity | None = None) -> AgentEngine:
    """Split a parser engine label (``RAY_AGENT_IDENTITY`` values joined by "/", empty ones
    left out) back into its tags. Worker ids are recognised by shape (56 hex digits); neither
    they nor replica ids contain "/", model names may. Without a worker id, a leading segment
    is a replica id when ``identity`` knows it as one, or when the rest is a known model name.
    """
    head, sep, engine = label.rpartition("/")
    if not sep:
        return AgentEngine("", "", "", engine)
    segs = head.split("/")
    rid = wid = ""
    if _WORKER_ID.fullmatch(segs[0]):
        wid, rest = segs[0], segs[1:]
    elif len(segs) > 1 and _WORKER_ID.fullmatch(segs[1]):
        rid, wid, rest = segs[0], segs[1], segs[2:]
    else:
        ident = identity or RayIdentity()
        tail = "/".join(segs[1:])
        if segs[0] in ident.replica_ids or (
            len(segs) > 1 and head not in ident.model_names and tail in ident.model_names
        ):
            rid, rest = segs[0], segs[1:]
        else:
            rest = segs
    return AgentEngine(rid, wid, "/".join(rest), engine)


def owner_of(e: AgentEngine, identity: RayIdentity) -> str | None:
    """The identity value that makes ``e`` the run's own, or None (foreign).

    The strongest id both sides have decides: worker id, then replica id, then model name.
    """
    if e.worker_id and identity.worker_ids:
        if e.worker_id in identity.worker_ids:
            return e.worker_id
        return e.replica_id if e.replica_id and e.replica_id in identity.replica_ids else None
    if e.replica_id and identity.replica_ids:
        return e.replica_id if e.replica_id in identity.replica_ids else None
    if e.model_name and e.model_name in identity.model_names:
        return e.model_name
    return None


@dataclass(slots=True)
class _Merged:
    sources: tuple[EngineLayout, ...]  # kept alive so their ids stay theirs
    layout: EngineLayout
    target: np.ndarray  # merged slot of every slot of the concatenated sources
    n: int


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
        nodes: Callable[[], Iterable[Mapping]] | None = None,
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
        self._merged: dict[tuple[int, ...], _Merged] = {}
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
        log.warning("fleetscope: Ray metrics disabled (%s); training continues", why)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def discover(self) -> list[Endpoint]:
        try:
            nodes = await asyncio.to_thread(self._nodes or _ray_nodes)  # a GCS call
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
        Key = tuple[str, str, str]
        groups: dict[Key, list[tuple[AgentEngine, EngineSnapshot]]] = {}
        by_tags: dict[tuple[str, str, str], set[Key]] = {}  # (replica, model, engine)
        by_engine: dict[tuple[str, str], set[Key]] = {}  # (replica, engine)
        loose: list[tuple[AgentEngine, EngineSnapshot]] = []
        for label, snap in expo.items():
            if not _is_engine(snap.layout):
                continue
            e = decode_label(label, ident)
            if not e.worker_id:
                loose.append((e, snap))
                continue
            key = ("w", e.worker_id, e.engine)
            groups.setdefault(key, []).append((e, snap))
            by_engine.setdefault((e.replica_id, e.engine), set()).add(key)
            if e.model_name:
                by_tags.setdefault((e.replica_id, e.model_name, e.engine), set()).add(key)
        own = {k for k, pieces in groups.items() if any(owner_of(e, ident) for e, _ in pieces)}
        # pieces without WorkerId (OpenCensus backend, default cardinality): joined to the one
        # engine with the same tags; Ray sums same-tag series of several workers, so with two
        # or more such engines the piece stands alone (own only by replica id or model name)
        ambiguous = unmatched = 0
        shadows: set[Key] = set()  # pieces summed over engines counted already (not engines)
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
            elif _has_series(snap.layout):
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

        # a piece that several WorkerId engines explain is their sum, not one more engine
        foreign = sum(
            1
            for k, ps in groups.items()
            if k not in own and k not in shadows and any(_has_series(s.layout) for _, s in ps)
        )
        mine = {k: groups[k] for k in groups if k in own}
        labels = _labels(mine)
        kept: dict[str, EngineSnapshot] = {}
        roles: dict[str, Role] = {}
        for key, pieces in mine.items():
            label = labels[key]
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
            kept[label] = snap
            values = [v for e, _ in pieces for v in (e.worker_id, e.replica_id, e.model_name) if v]
            seen.update(v for e, _ in pieces for v in (e.worker_id, e.replica_id) if v)
            role = next((ident.roles[v] for v in values if v in ident.roles), None)
            if role:
                roles[label] = role
        return Exposition(kept, None, expo.types), roles, foreign

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
            m = _merge_layouts(tuple(p.layout for p in pieces))
            if len(self._merged) > 256:
                self._merged.clear()
            self._merged[key] = m
        data = np.concatenate([p.data for p in pieces])
        merged = np.bincount(m.target, weights=data, minlength=m.n)
        invalid = frozenset().union(*(p.invalid for p in pieces))
        return EngineSnapshot(label, m.layout, merged, first.time, first.wall_time, None, invalid)


def _has_series(layout: EngineLayout) -> bool:
    """Whether a piece carries engine metrics beyond info gauges."""
    series: list[CounterSeries | GaugeSeries | HistogramSeries] = [
        *layout.counters,
        *layout.gauges,
        *layout.histograms,
    ]
    return any(s.name.startswith(_ENGINE_PREFIXES) for s in series)


def _is_engine(layout: EngineLayout) -> bool:
    """Whether a piece is (part of) an engine. A body without any `engine` tag comes out of
    the parser as one engine "0" made of Ray's own system metrics: not an engine."""
    return _has_series(layout) or any(f.startswith(_ENGINE_PREFIXES) for f in layout.info)


def _safe(v: str) -> str:
    s = _UNSAFE.sub("_", v)
    return s if s == v else f"{s}-{hashlib.sha1(v.encode()).hexdigest()[:6]}"


def _labels(groups: Mapping[tuple[str, str, str], object]) -> dict[tuple[str, str, str], str]:
    """Stable labels, whatever the order of the body: a worker id's first 8 digits (all of
    them if two engines would share the label), else the replica id or model name."""
    out: dict[tuple[str, str, str], str] = {}
    for kind, value, engine in groups:
        out[(kind, value, engine)] = (
            f"{value[:8]}-{_safe(engine)}" if kind == "w" else f"{_safe(value)}-{_safe(engine)}"
        )
    counts: dict[str, int] = {}
    for label in out.values():
        counts[label] = counts.get(label, 0) + 1
    for (kind, value, engine), label in out.items():
        if counts[label] > 1:
            out[(kind, value, engine)] = f"{_safe(value)}-{_safe(engine)}-{kind}"
    return out


def _merge_layouts(layouts: tuple[EngineLayout, ...]) -> _Merged:
    """The layout of several pieces of one engine; a series in two pieces is summed."""
    index: dict[str, int] = {}
    target: list[int] = []
    maps = []
    for lay in layouts:
        slot_map = [index.setdefault(sid, len(index)) for sid in lay.slot_ids]
        maps.append(slot_map)
        target.extend(slot_map)
    counters: dict[str, CounterSeries] = {}
    gauges: dict[str, GaugeSeries] = {}
    hists: dict[str, HistogramSeries] = {}
    info: dict[str, Mapping[str, str]] = {}
    model_name = None
    for lay, mp in zip(layouts, maps, strict=True):

        def at(slot: int, mp: list[int] = mp) -> int:
            return mp[slot] if slot >= 0 else -1

        for c in lay.counters:
            counters.setdefault(
                lay.slot_ids[c.slot], CounterSeries(c.name, c.labels, at(c.slot), at(c.created))
            )
        for g in lay.gauges:
            gauges.setdefault(lay.slot_ids[g.slot], GaugeSeries(g.name, g.labels, at(g.slot)))
        for h in lay.histograms:
            hists.setdefault(
                repr((h.name, h.labels)),
                HistogramSeries(
                    h.name,
                    h.labels,
                    h.bounds,
                    tuple(at(s) for s in h.buckets),
                    at(h.sum),
                    at(h.count),
                    at(h.created),
                ),
            )
        for fam, lab in lay.info.items():
            info.setdefault(fam, lab)
        model_name = model_name or lay.model_name
    layout = EngineLayout(
        slot_ids=tuple(index),
        counters=tuple(counters.values()),
        gauges=tuple(gauges.values()),
        histograms=tuple(hists.values()),
        info=info,
        model_name=model_name,
    )
    return _Merged(layouts, layout, np.array(target, dtype=np.intp), len(index))


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    return ray.nodes()
