"""The pieces of Ray engines in one agent body: grouped by the engine they belong to (by
WorkerId), and indexed by the tags that let a piece without a WorkerId find its engine."""

from __future__ import annotations

from fleetscope.exposition import Exposition
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.sources.ray.identity import AgentEngine, RayIdentity, decode_label
from fleetscope.sources.ray.merge import is_engine

PieceKey = tuple[str, str, str]  # ("w", worker id, engine) | ("r", replica id, engine) | ("m", ...)
Piece = tuple[AgentEngine, EngineSnapshot]


def grouped(
    expo: Exposition, ident: RayIdentity
) -> tuple[
    dict[PieceKey, list[Piece]],
    dict[tuple[str, str, str], set[PieceKey]],
    dict[tuple[str, str], set[PieceKey]],
    list[Piece],
]:
    """The agent's engine pieces by WorkerId engine, that engine's keys by (replica, model,
    engine) and by (replica, engine), and the pieces without a WorkerId."""
    groups: dict[PieceKey, list[Piece]] = {}
    by_tags: dict[tuple[str, str, str], set[PieceKey]] = {}  # (replica, model, engine)
    by_engine: dict[tuple[str, str], set[PieceKey]] = {}  # (replica, engine)
    loose: list[Piece] = []
    for label, snap in expo.items():
        if not is_engine(snap.layout):
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
    return groups, by_tags, by_engine, loose
