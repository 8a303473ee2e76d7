"""What the views (terminal, dashboards) show per endpoint about the RL loop: the engine kind
(vLLM or SGLang: the source's ``ScrapeResult.engine_kind``, else the families the body
declares, ``vllm:`` / ``sglang:`` and Ray's ``ray_vllm_`` / ``ray_sglang_``; docs/sglang.md),
the weight version it serves (its latest ``/weight_info`` answer), its lag behind the trainer,
and whether it is paused or asleep."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetscope.catalog import engine_kind

if TYPE_CHECKING:
    from fleetscope.rl.states import EngineStates
    from fleetscope.rl.versions import PolicyVersions
    from fleetscope.sources.base import ScrapeResult

__all__ = ["KIND_NAMES", "EndpointInfo", "endpoint_info", "engine_kind"]

KIND_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    kind: str | None = None  # "vllm" | "sglang" | None (not known yet)
    version: str | None = None  # served weight version (None: not asked or no answer)
    lag: int | None = None  # versions behind the trainer (None: unknown)
    paused: bool | None = None
    engines_asleep: int = 0
    engines: int = 0


_kinds: dict[int, tuple[Mapping[str, str], str | None]] = {}


def _kind_of(types: Mapping[str, str]) -> str | None:
    hit = _kinds.get(id(types))
    if hit is None or hit[0] is not types:
        if len(_kinds) > 4096:
            _kinds.clear()
        _kinds[id(types)] = hit = (types, engine_kind(types))
    return hit[1]


def endpoint_info(
    scrapes: Iterable[ScrapeResult],
    versions: PolicyVersions,
    states: EngineStates,
    previous: Mapping[str, EndpointInfo] | None = None,
) -> dict[str, EndpointInfo]:
    """Per endpoint of this poll (a failed scrape keeps the kind it had)."""
    out: dict[str, EndpointInfo] = {}
    current = versions.current
    for sc in scrapes:
        ep = sc.endpoint
        kind = sc.engine_kind
        if kind is None and sc.exposition is not None:
            kind = _kind_of(sc.exposition.types)
        if kind is None and previous and ep in previous:
            kind = previous[ep].kind
        idx = versions.served_index(ep)
        st = states.last.get(ep, {})
        out[ep] = EndpointInfo(
            kind=kind,
            version=versions.served.get(ep) if versions.active else None,
            lag=None if current is None or idx is None else current - idx,
            paused=st.get("paused"),
            engines_asleep=int(st.get("engines_asleep", 0)),
            engines=int(st.get("engines", 0)),
        )
    return out
