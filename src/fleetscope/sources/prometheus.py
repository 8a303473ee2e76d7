"""A Prometheus (or compatible: Thanos, Mimir, VictoriaMetrics) HTTP API as a source.

For fleets that are already scraped: each poll asks the server, with instant queries, for the
latest value of every vLLM series and for each target's last scrape time, rebuilds one
exposition per target (``instance``) with the types from ``/api/v1/metadata``, and hands it to
the same pipeline as direct scraping — so the keys are the same. A target whose last scrape
failed (``up == 0``) or that has no sample is a failed scrape for that poll.

Snapshot times are the targets' own scrape timestamps, so rates are exact per target. Names
Prometheus stored as ``vllm_...`` (prometheus_client rewrites ``:`` to ``_`` when a server
negotiates OpenMetrics) are mapped back to ``vllm:``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypedDict

import httpx

from fleetscope.exposition import ExpositionError, Parser
from fleetscope.exposition.textformat import escape_label_value, format_value, labels_text
from fleetscope.identity import Role, is_role
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.util.warn import RateLimitedWarner

log = logging.getLogger("fleetscope")

DEFAULT_MATCH = '{__name__=~"vllm[:_].+"}'
_DROP_LABELS = frozenset({"__name__", "job", "instance"})


class InstantSample(TypedDict):
    """One series of an instant query's ``data.result`` (a vector)."""

    metric: dict[str, str]  # its labels, ``__name__`` included
    value: list[float | str]  # [unix time, "value as text"]


def _vllm_name(name: str) -> str:
    return "vllm:" + name[5:] if name.startswith("vllm_") else name


class PrometheusSource:
    """Reads a fleet from a Prometheus-compatible HTTP API.

    Args:
        url: the server's base URL (``http://prometheus:9090``).
        match: the series selector (default: every ``vllm:``/``vllm_`` series).
        names: optional ``{instance: endpoint name}``; others are named ``server0``...
            (``prefill0``/``decode0`` when the target has a role label), in order of appearance.
        roles: optional ``{instance: "prefill" | "decode"}``.
        role_label: a target label holding ``prefill`` / ``decode`` (used when ``roles`` is
            silent about a target).
        extra_selector: label matchers added to every query (``job="vllm"``).
    """

    def __init__(
        self,
        url: str,
        *,
        match: str = DEFAULT_MATCH,
        names: Mapping[str, str] | None = None,
        roles: Mapping[str, Role] | None = None,
        role_label: str = "role",
        extra_selector: str = "",
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        metadata_every: int = 60,
    ):
        self.url = url.rstrip("/")
        self.match = match
        self.role_label = role_label
        self.extra = extra_selector
        self.timeout = timeout
        self._client = httpx.AsyncClient(timeout=timeout, headers=dict(headers or {}))
        self._names: dict[str, str] = dict(names or {})
        self._roles: dict[str, Role] = dict(roles or {})
        self._counters: dict[str, int] = {}
        self._types: dict[str, str] = {}
        self._metadata_every = max(1, metadata_every)
        self._polls = 0
        self._parsers: dict[str, Parser] = {}
        self._untyped: set[str] = set()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetscope-prom")
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        # the targets' scrape times are wall clock; ScrapeResult.time is this process'
        # monotonic clock: translated with one offset, read once and rounded to 2^-10 s so
        # that adding it to a wall timestamp is exact (intervals stay exact to the bit)
        self._clock_offset = round((time.monotonic() - time.time()) * 1024) / 1024

    async def aclose(self) -> None:
        await self._client.aclose()
        self._pool.shutdown(wait=False)

    async def _query(self, expr: str, at: float | None = None) -> list[InstantSample]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        r = await self._client.get(f"{self.url}/api/v1/query", params=params)
        r.raise_for_status()
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body.get('error')}")
        result: list[InstantSample] = body["data"]["result"]
        return result

    async def _metadata(self) -> None:
        r = await self._client.get(f"{self.url}/api/v1/metadata")
        r.raise_for_status()
        types: dict[str, str] = {}
        for name, entries in r.json().get("data", {}).items():
            if entries:
                types[_vllm_name(name)] = entries[0].get("type", "unknown")
        self._types = types

    def _name_for(self, instance: str, role: Role | None) -> str:
        name = self._names.get(instance)
        if name is None:
            prefix = role or "server"
            i = self._counters.get(prefix, 0)
            taken = set(self._names.values())
            while f"{prefix}{i}" in taken:
                i += 1
            self._counters[prefix] = i + 1
            name = self._names[instance] = f"{prefix}{i}"
        return name

    def _selector(self, instances: Sequence[str] = ()) -> str:
        matchers = [self.extra] if self.extra else []
        if instances:
            alts = "|".join(re.escape(i) for i in sorted(instances))
            matchers.append(f'instance=~"{escape_label_value(alts)}"')
        if not matchers:
            return self.match
        return self.match[:-1] + "," + ",".join(matchers) + "}"

    def take_departures(self) -> list[Departure]:
        return []  # targets come and go with Prometheus' own service discovery

    async def scrape(self) -> list[ScrapeResult]:
        """One poll: the latest scrape of every target. Never raises."""
        t0 = time.monotonic()
        try:
            if self._polls % self._metadata_every == 0 or not self._types:
                await self._metadata()
            self._polls += 1
            up_sel = f"{{{self.extra}}}" if self.extra else ""
            # Every query is evaluated at one time, and the scrape times are read before and
            # after the samples: a target scraped while we read (its samples and `up` are
            # committed together) is read again, so values and times come from one scrape.
            at = time.time()
            ups, stamps = await asyncio.gather(
                self._query(f"up{up_sel}", at), self._query(f"timestamp(up{up_sel})", at)
            )
            samples = await self._query(self._selector(), at)
            after = await self._query(f"timestamp(up{up_sel})", at)
            if self._unknown_families(samples):
                await self._metadata()  # a family that appeared since the last metadata
        except Exception as e:
            self._warner.warn("query", f"Prometheus source {self.url} failed: {e!r}")
            return []
        scraped_at = {u["metric"].get("instance", ""): float(u["value"][1]) for u in stamps}
        moved = {
            inst
            for u in after
            if scraped_at.get(inst := u["metric"].get("instance", "")) != float(u["value"][1])
        }
        if moved:
            try:
                again = await self._query(self._selector(sorted(moved)), at)
            except Exception as e:
                self._warner.warn("query", f"Prometheus source {self.url} failed: {e!r}")
                return []
            samples = [s for s in samples if s["metric"].get("instance", "") not in moved]
            samples += again
            scraped_at = {u["metric"].get("instance", ""): float(u["value"][1]) for u in after}
        latency = time.monotonic() - t0
        offset = self._clock_offset
        by_instance: dict[str, list[InstantSample]] = {}
        roles: dict[str, Role | None] = {}
        for s in samples:
            m = s["metric"]
            inst = m.get("instance", "")
            by_instance.setdefault(inst, []).append(s)
            role = m.get(self.role_label)
            if is_role(role):
                roles[inst] = role
        up = {u["metric"].get("instance", ""): float(u["value"][1]) for u in ups}
        for u in ups:
            r = u["metric"].get(self.role_label)
            if is_role(r):
                roles.setdefault(u["metric"].get("instance", ""), r)
        results = []
        # targets in the order of `names` (then of discovery): rows, and so every float sum
        # over them, come in the same order as a direct collector given the same endpoints
        order = {inst: i for i, inst in enumerate(self._names)}
        instances = sorted(set(up) | set(by_instance), key=lambda i: (order.get(i, len(order)), i))
        for inst in instances:
            role = self._roles.get(inst) or roles.get(inst)
            name = self._name_for(inst, role)
            wall = scraped_at.get(inst, time.time())
            mono = wall + offset
            if up.get(inst, 1.0) != 1.0 or inst not in by_instance:
                results.append(ScrapeResult(name, None, mono, wall, latency, "target down", role))
                continue
            text = self._render(by_instance[inst])
            parser = self._parsers.setdefault(inst, Parser())
            try:
                expo = await asyncio.get_running_loop().run_in_executor(
                    self._pool, functools.partial(parser.parse, text, time=mono, wall_time=wall)
                )
            except ExpositionError as e:
                self._warner.warn(f"{inst}:parse", f"{name} ({inst}) from Prometheus: {e}")
                results.append(ScrapeResult(name, None, mono, wall, latency, str(e), role))
                continue
            results.append(ScrapeResult(name, expo, mono, wall, latency, None, role))
        return results

    def _render(self, samples: list[InstantSample]) -> str:
        """One target's samples as text 0.0.4, sorted so the parser's fast path applies."""
        rows = []
        families: dict[str, str] = {}
        for s in samples:
            m = s["metric"]
            name = _vllm_name(m["__name__"])
            labels = sorted((k, v) for k, v in m.items() if k not in _DROP_LABELS)
            lab = labels_text(tuple((k, v) for k, v in labels if k != self.role_label))[1:-1]
            rows.append((name, lab, format_value(float(s["value"][1]))))
            fam = self._family_of(name)
            if fam is not None:
                families[fam[0]] = fam[1]
        rows.sort()
        out = [f"# TYPE {f} {t}" for f, t in sorted(families.items())]
        out += [f"{n}{{{lab}}} {v}" if lab else f"{n} {v}" for n, lab, v in rows]
        return "\n".join(out) + "\n"

    def _unknown_families(self, samples: list[InstantSample]) -> bool:
        """Whether a sample's family has no type yet (metadata not fetched since it appeared):
        untyped, a counter would be read as a gauge until the next metadata refresh."""
        names = {s["metric"].get("__name__", "") for s in samples}
        unknown = {n for n in names if self._family_of(_vllm_name(n)) is None} - self._untyped
        self._untyped |= unknown  # asked once: some series never get metadata
        return bool(unknown)

    def _family_of(self, name: str) -> tuple[str, str] | None:
        types = self._types
        if name in types:
            return name, types[name]
        for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                if base in types:
                    return base, types[base]
                if base + "_total" in types:
                    return base + "_total", types[base + "_total"]
        return None
