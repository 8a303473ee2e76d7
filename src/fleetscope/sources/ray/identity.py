"""Which Ray engines are the run's own: node agents, actors' worker ids, engine labels.

Ray's per-node metrics agents serve every actor's samples; a run keeps its own engines by
worker id, replica id or model name (:class:`RayIdentity`). The parser's engine labels carry
those tags joined by "/" (:data:`RAY_AGENT_IDENTITY`); :func:`decode_label` splits them back and
:func:`owner_of` decides whose an engine is. See :mod:`fleetscope.sources.ray.source`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from fleetscope.identity import Role
from fleetscope.sources.http.source import Endpoint

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = [
    "IDENTITY_LOOKUP_TIMEOUT",
    "RAY_AGENT_IDENTITY",
    "AgentEngine",
    "RayIdentity",
    "decode_label",
    "discover_agents",
    "owner_of",
    "worker_ids_of_actors",
]

IDENTITY_LOOKUP_TIMEOUT = 10.0
# model_name is part of the key so a run-unique model name can identify engines when the
# OpenCensus backend drops WorkerId. The parser joins the non-empty values with "/".
RAY_AGENT_IDENTITY = ("ReplicaId", "WorkerId", "model_name", "engine")

_WORKER_ID = re.compile(r"[0-9a-f]{56}")  # Ray's WorkerID: 28 bytes, hex

#: one entry of ``ray.nodes()`` (``NodeID``, ``Alive``, ``NodeManagerAddress``,
#: ``MetricsExportPort``, ... : values of several types)
RayNode = Mapping[str, Any]
#: an actor as the lookups take it: its handle, or its actor id in hex
Actor: TypeAlias = "ActorHandle[Any] | str"


def discover_agents(nodes: Iterable[RayNode] | None = None) -> list[Endpoint]:
    """One endpoint per alive node's metrics agent (``ray.nodes()`` unless ``nodes`` given).

    Names are ``node-{NodeID[:8]}``, so a node keeps its name while alive.
    """
    if nodes is None:
        nodes = ray_nodes()
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


def worker_ids_of_actors(
    actors: Sequence[Actor], timeout: float = IDENTITY_LOOKUP_TIMEOUT
) -> list[str]:
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
        worker_id: bytes = data.address.worker_id
        if state == "ALIVE" and worker_id:
            return worker_id.hex()
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
        actors: Sequence[Actor],
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


def ray_nodes() -> list[dict[str, Any]]:
    import ray

    nodes: Callable[[], list[dict[str, Any]]] = ray.nodes  # Ray leaves it unannotated
    return nodes()
