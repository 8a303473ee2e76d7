"""The server's version, read once per endpoint, and a check of the catalog against its body.

vLLM answers ``GET /version`` with ``{"version": "0.32.0"}``. SGLang 0.5.x has no ``/version``
route (404): its version is the ``version`` field of ``GET /server_info`` (0.5.23; the deprecated
alias ``/get_server_info`` is the route of 0.5.2). So the probe asks ``/version``, and on a
definite "no such route" ``/server_info`` then ``/get_server_info``; only the ``version`` field
is read (``/server_info`` lists server arguments: nothing of it is logged or kept).

Like the HTTP source's other side requests (docs/sources.md): each request has its own short
deadline and the side-body cap, the probe runs beside the poll and is waited for only until the
poll's deadline, a failure is retried with backoff (30 s doubling to 15 min), and a definite
answer (a version, or every route missing) is never asked again.

Once the version is settled, the names the catalog maps or queries for the endpoint's engine
kind at that version (:func:`expected_families`) are looked for in its bodies; a headline
metric none of whose names appears, once the server has shown traffic, is warned about once,
naming the endpoint and the names.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from fleetscope.catalog import (
    FAMILIES,
    GENERATION_TOKENS,
    KV_USAGE,
    PROMPT_TOKENS,
    RUNNING,
    TTFT,
    WAITING,
    Family,
    engine_kind,
)
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.sources.base import ScrapeResult
from fleetscope.sources.http.client import ScrapeError, describe, get_json
from fleetscope.util.backoff import Backoff

if TYPE_CHECKING:
    import httpx

    from fleetscope.exposition import Exposition
    from fleetscope.sources.base import Endpoint

#: routes asked in order; the next one only after a definite "no such route"
VERSION_ROUTES: tuple[str, ...] = ("/version", "/server_info", "/get_server_info")
#: bodies (with traffic) whose family names are pooled before absent names are judged
JUDGE_BODIES = 3

# headline metrics (canonical vLLM names) every engine kind must expose once it served
# requests: what the view, the health checks and the headline keys read
_TIME_TO_FIRST_TOKEN = "vllm:" + TTFT
HEADLINE_FAMILIES: tuple[str, ...] = (
    "vllm:" + RUNNING,
    "vllm:" + WAITING,
    "vllm:" + KV_USAGE,
    "vllm:" + GENERATION_TOKENS.removesuffix("_total"),
    "vllm:" + PROMPT_TOKENS.removesuffix("_total"),
    _TIME_TO_FIRST_TOKEN,
)

_VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+\-_]{0,63}")


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)``; suffixes (``rc1``, ``.post1``, ``+cu121``) ignored."""
    out = []
    for part in version.split("+", 1)[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(out)


def _in_range(f: Family, version: str | None) -> bool:
    if version is None:
        return True
    v = version_tuple(version)
    if not v:
        return True
    if f.first is not None and v < version_tuple(f.first):
        return False
    return not (f.last is not None and v > version_tuple(f.last))


def expected_families(kind: str, version: str | None) -> dict[str, tuple[str, ...]]:
    """Headline metric -> the ``kind`` family names (catalog base names, any one suffices)
    that the catalog maps or queries for it at ``version`` (None: every version)."""
    return dict(_expected_families(kind, version))


@functools.lru_cache(maxsize=64)
def _expected_families(kind: str, version: str | None) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for canonical in HEADLINE_FAMILIES:
        names = tuple(
            f.name
            for f in FAMILIES
            if f.engine == kind
            and (f.parsed_name == canonical or f.name == canonical)
            and _in_range(f, version)
        )
        if kind == "vllm" and canonical not in names:
            names = (canonical, *names)  # vLLM's own current name needs no table row
        if names:
            out[canonical] = names
    return out


_GENERATED = "vllm:" + GENERATION_TOKENS.removesuffix("_total")  # SGLang's is parsed so too
_HEADLINES = frozenset(HEADLINE_FAMILIES)


@dataclass(frozen=True, slots=True)
class _LayoutFacts:
    """What the check reads of one layout: the generation counter's slots, and the slots of
    each headline family it has (a histogram by its ``_count``)."""

    generated: np.ndarray
    headlines: tuple[tuple[str, np.ndarray], ...]


_FACTS: weakref.WeakKeyDictionary[EngineLayout, _LayoutFacts] = weakref.WeakKeyDictionary()


def _facts(layout: EngineLayout) -> _LayoutFacts:
    found = _FACTS.get(layout)
    if found is None:
        slots: dict[str, list[int]] = {}
        for c in layout.counters:
            slots.setdefault(c.name, []).append(c.slot)
        for g in layout.gauges:
            slots.setdefault(g.name, []).append(g.slot)
        for h in layout.histograms:
            if h.count >= 0:
                slots.setdefault(h.name, []).append(h.count)
        found = _LayoutFacts(
            np.array(slots.get(_GENERATED, []), dtype=np.intp),
            tuple((n, np.array(v, dtype=np.intp)) for n, v in slots.items() if n in _HEADLINES),
        )
        _FACTS[layout] = found
    return found


def _snapshots(expo: Exposition) -> list[EngineSnapshot]:
    return [s for s in (*expo.values(), expo.endpoint) if s is not None]


def sampled_families(expo: Exposition) -> set[str]:
    """The headline families (parsed, canonical names) with at least one sample in the body
    (a gauge missing from this scrape is NaN)."""
    out = set()
    for snap in _snapshots(expo):
        for name, slots in _facts(snap.layout).headlines:
            if name not in out and not np.isnan(snap.data[slots]).all():
                out.add(name)
    return out


def served(expo: Exposition) -> bool:
    """Whether the body shows generated tokens (a server that has served requests)."""
    for snap in _snapshots(expo):
        slots = _facts(snap.layout).generated
        if slots.size and bool((snap.data[slots] > 0).any()):
            return True
    return False


def _definite(e: BaseException) -> bool:
    return isinstance(e, ScrapeError) and str(e) in ("HTTP 404", "HTTP 405", "HTTP 501")


@dataclass
class _Probe:
    version: str | None = None
    settled: bool = False  # a version, or every route definitely missing
    kind: str | None = None
    backoff: Backoff = field(default_factory=Backoff)
    task: asyncio.Task[None] | None = None
    seen: set[str] = field(default_factory=set)
    bodies: int = 0
    judged: bool = False


class ServerVersions:
    """Per endpoint: its engine kind (from the body), its version (``GET /version`` ...), and
    the once-only check of the catalog's names against its bodies."""

    def __init__(self, warn: Callable[[str, str, str], None], *, deadline: float) -> None:
        self._warn = warn  # (endpoint, kind, message): rate limited, redacted
        self.deadline = deadline
        self._probes: dict[str, _Probe] = {}

    # ------------------------------------------------------------------ results

    def version(self, name: str) -> str | None:
        p = self._probes.get(name)
        return None if p is None else p.version

    def annotate(self, r: ScrapeResult) -> ScrapeResult:
        """``r`` with the endpoint's engine kind and version (when known)."""
        p = self._probes.get(r.endpoint)
        if p is None or (p.kind == r.engine_kind and p.version == r.server_version):
            return r
        return replace(r, engine_kind=p.kind, server_version=p.version)

    def forget(self, name: str) -> None:
        p = self._probes.pop(name, None)
        if p is not None and p.task is not None:
            p.task.cancel()

    def cancel(self) -> None:
        for p in self._probes.values():
            if p.task is not None:
                p.task.cancel()

    # ------------------------------------------------------------------ polling

    def start(
        self,
        client: Callable[[], Awaitable[httpx.AsyncClient]],
        endpoints: Sequence[Endpoint],
        results: Sequence[ScrapeResult],
    ) -> list[asyncio.Task[None]]:
        """Note this poll's bodies; start (or return running) probes of endpoints that answered
        and whose version is not settled. The caller waits for them only until its deadline."""
        tasks = []
        now = time.monotonic()
        for ep, r in zip(endpoints, results, strict=True):
            if r.exposition is None:
                continue
            p = self._probes.setdefault(ep.name, _Probe())
            self._observe(ep.name, p, r.exposition)
            if p.settled:
                continue
            if p.task is not None and not p.task.done():
                tasks.append(p.task)
            elif p.backoff.due(now):
                p.task = asyncio.get_running_loop().create_task(self._probe(client, ep, p))
                tasks.append(p.task)
        return tasks

    async def _probe(
        self, client: Callable[[], Awaitable[httpx.AsyncClient]], ep: Endpoint, p: _Probe
    ) -> None:
        c = await client()
        for route in VERSION_ROUTES:
            try:
                data = await get_json(
                    c, ep.base_url + route, headers=ep.headers, deadline=self.deadline
                )
            except Exception as e:
                if _definite(e):
                    continue  # no such route: ask the next one
                waited = p.backoff.failed(time.monotonic())
                self._warn(
                    ep.name,
                    "version",
                    f"{route} of {ep.name} unavailable: {describe(e, self.deadline)}; "
                    f"asking again in {waited:g} s",
                )
                return
            v = data.get("version") if isinstance(data, dict) else None
            if isinstance(v, str) and _VERSION_RE.fullmatch(v):
                p.version = v
                break
            # an answer without a usable version: the next route may have one
        p.settled = True

    # ------------------------------------------------------------------ the catalog check

    def _observe(self, name: str, p: _Probe, expo: Exposition) -> None:
        if p.judged:
            return
        if p.kind is None:  # a body's engine kind does not change: read it once
            p.kind = engine_kind(expo.types)
        # the counters exist at 0 before the first request, while a multiprocess server's
        # per-step gauges (and SGLang's tokenizer families) appear only once it served: only
        # bodies that show generated tokens are judged, on the families that have samples
        if not p.settled or not served(expo):
            return
        p.seen |= sampled_families(expo)
        p.bodies += 1
        expected = expected_families(p.kind, p.version) if p.kind else {}
        roles = set(expo.engine_roles.values())
        if roles == {"prefill"}:  # SGLang's prefill server records no first token
            expected.pop(_TIME_TO_FIRST_TOKEN, None)
        if not expected or p.bodies < JUDGE_BODIES:
            return
        p.judged = True
        # a headline metric is served when any of its names (parsed as it) has samples
        missing = [" / ".join(alts) for c, alts in expected.items() if c not in p.seen]
        p.seen = set()
        if missing:
            self._missing(name, p, missing)

    def _missing(self, name: str, p: _Probe, missing: list[str]) -> None:
        version = p.version or "unknown version"
        self._warn(
            name,
            "catalog",
            f"{name} ({p.kind} {version}) serves none of {', '.join(missing)}: the catalog "
            f"maps or queries these names for {p.kind} {version}; the metrics they feed are "
            "missing for this endpoint (docs/sglang.md)",
        )
