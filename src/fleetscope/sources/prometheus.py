"""A Prometheus (or compatible: Thanos, Mimir, VictoriaMetrics) HTTP API as a source.

For fleets that are already scraped: each poll asks the server, with instant queries, for the
latest value of every vLLM series and for each target's last scrape time, rebuilds one
exposition per target (``instance``) with the types from ``/api/v1/metadata``, and hands it to
the same pipeline as direct scraping — so the keys are the same. A target whose last scrape
failed (``up == 0``) or that has no sample is a failed scrape for that poll. Prometheus also
knows the scrapes in between: a target down at any of them since the last poll
(``min_over_time(up[...])`` < 1), or down at an earlier poll, is a doubt on its next success
(``ScrapeResult.continuity_doubt``): its rows without a start time count that interval as not
observed, as with direct scraping (docs/bad-data.md, "Continuity without a start time").

Snapshot times are the targets' own scrape timestamps, so rates are exact per target. Names
Prometheus stored as ``vllm_...`` (prometheus_client rewrites ``:`` to ``_`` when a server
negotiates OpenMetrics) are mapped back to ``vllm:``.

Faults (docs/bad-data.md §12): ``timeout`` bounds a whole poll (every query of it together), not
one read, so a server that trickles its answers costs one ``timeout``; an answer larger than
``max_body_bytes`` is refused as it streams in; malformed entries (no ``value``, a value that is
not a number) are left out with a warning; a target that is up with no matching series is a
failed scrape with a warning. Every warning names the source's URL (secrets redacted).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from fleetscope.exposition import ExpositionError, Parser
from fleetscope.exposition.textformat import escape_label_value, format_value, labels_text
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.util.warn import RateLimitedWarner

log = logging.getLogger("fleetscope")

DEFAULT_MATCH = '{__name__=~"vllm[:_].+"}'
# a bound on one answer of the HTTP API (a fleet's metadata is a few hundred kB)
DEFAULT_MAX_ANSWER_BYTES = 64 << 20
_DROP_LABELS = frozenset({"__name__", "job", "instance"})


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
        max_body_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ):
        self.url = url.rstrip("/")
        self.match = match
        self.role_label = role_label
        self.extra = extra_selector
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
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
        self._last_at: float | None = None  # the previous poll's evaluation time
        self._down: dict[str, str] = {}  # instance -> why, since its last success

    async def aclose(self) -> None:
        await self._client.aclose()
        self._pool.shutdown(wait=False)

    async def _get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """One answer of the HTTP API, read up to ``max_body_bytes`` (refused past it)."""
        url = f"{self.url}{path}"
        async with self._client.stream("GET", url, params=params) as r:
            r.raise_for_status()
            chunks: list[bytes] = []
            size = 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise AnswerError(
                        f"{path} answered more than {self.max_body_bytes} bytes: refused"
                    )
                chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except ValueError as e:
            raise AnswerError(f"{path} answered something that is not JSON ({e})") from None

    async def _query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        body = await self._get_json("/api/v1/query", params)
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise AnswerError(f"query {expr!r} failed: {error!r:.200}")
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise AnswerError(f"query {expr!r}: the answer has no result list")
        return result

    async def _metadata(self) -> None:
        body = await self._get_json("/api/v1/metadata")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise AnswerError("/api/v1/metadata: the answer has no data object")
        types: dict[str, str] = {}
        for name, entries in data.items():
            if isinstance(entries, list) and entries and isinstance(entries[0], dict):
                types[_vllm_name(str(name))] = str(entries[0].get("type", "unknown"))
        self._types = types

    def _vector(self, expr: str, entries: list[dict[str, Any]]) -> dict[str, float]:
        """``{instance: value}`` of an instant vector; malformed entries are left out, with
        one warning per query."""
        out: dict[str, float] = {}
        bad = 0
        for e in entries:
            point = _point(e)
            if point is None:
                bad += 1
            else:
                out[point[0].get("instance", "")] = point[1]
        if bad:
            self._warner.warn(
                f"malformed:{expr}",
                f"Prometheus source {self.url}: {bad} malformed entries in the answer to "
                f"{expr!r} (no metric or no numeric value): left out",
            )
        return out

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
        """One poll: the latest scrape of every target. Never raises; ``timeout`` bounds the
        whole poll's queries together."""
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self._read()
        except Exception as e:
            why = "timed out" if isinstance(e, TimeoutError) else f"failed: {e!r}"
            self._warner.warn("query", f"Prometheus source {self.url} {why}")
            return []
        samples, up, scraped_at, up_roles, min_up = answer
        for inst, low in min_up.items():
            if low < 1.0:
                self._down.setdefault(inst, "was down at a Prometheus scrape since the last poll")
        latency = time.monotonic() - t0
        by_instance: dict[str, list[dict[str, Any]]] = {}
        roles: dict[str, Role | None] = dict(up_roles)
        for s in samples:
            m = s["metric"]
            inst = m.get("instance", "")
            by_instance.setdefault(inst, []).append(s)
            role = m.get(self.role_label)
            if role in ("prefill", "decode"):
                roles[inst] = role
        return await self._results(by_instance, up, scraped_at, roles, latency)

    async def _read(
        self,
    ) -> tuple[
        list[dict[str, Any]], dict[str, float], dict[str, float], dict[str, Role], dict[str, float]
    ]:
        """The queries of one poll: samples, ``up`` and scrape times per instance, roles, and
        the lowest ``up`` of each target since the previous poll."""
        if self._polls % self._metadata_every == 0 or not self._types:
            await self._metadata()
        self._polls += 1
        up_sel = f"{{{self.extra}}}" if self.extra else ""
        up_expr, stamp_expr = f"up{up_sel}", f"timestamp(up{up_sel})"
        # Every query is evaluated at one time, and the scrape times are read before and
        # after the samples: a target scraped while we read (its samples and `up` are
        # committed together) is read again, so values and times come from one scrape.
        at = time.time()
        since = self._last_at
        min_expr = ""
        if since is not None and at > since:  # the scrapes after the previous poll's time
            min_expr = f"min_over_time(up{up_sel}[{max(1, int((at - since) * 1000))}ms])"
        ups, stamps, lows = await asyncio.gather(
            self._query(up_expr, at),
            self._query(stamp_expr, at),
            self._query(min_expr, at) if min_expr else _nothing(),
        )
        samples = self._valid_samples(await self._query(self._selector(), at))
        after = self._vector(stamp_expr, await self._query(stamp_expr, at))
        if self._unknown_families(samples):
            await self._metadata()  # a family that appeared since the last metadata
        scraped_at = self._vector(stamp_expr, stamps)
        moved = {inst for inst, t in after.items() if scraped_at.get(inst) != t}
        if moved:
            again = self._valid_samples(await self._query(self._selector(sorted(moved)), at))
            samples = [s for s in samples if s["metric"].get("instance", "") not in moved]
            samples += again
            scraped_at = after
        roles: dict[str, Role] = {}
        for u in ups:
            m = u.get("metric") if isinstance(u, dict) else None
            r = m.get(self.role_label) if isinstance(m, dict) else None
            if r in ("prefill", "decode"):
                roles[str(m.get("instance", ""))] = r  # type: ignore[union-attr]
        min_up = self._vector(min_expr, lows) if min_expr else {}
        self._last_at = at  # only once the poll's answers are in: a failed poll checks nothing
        return samples, self._vector(up_expr, ups), scraped_at, roles, min_up

    def _valid_samples(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The samples with a name and a numeric value; others are left out with a warning."""
        good = [
            e
            for e in entries
            if (p := _point(e)) is not None and isinstance(p[0].get("__name__"), str)
        ]
        if len(good) < len(entries):
            self._warner.warn(
                "malformed:samples",
                f"Prometheus source {self.url}: {len(entries) - len(good)} malformed samples "
                "(no name or no numeric value): left out",
            )
        return good

    async def _results(
        self,
        by_instance: dict[str, list[dict[str, Any]]],
        up: dict[str, float],
        scraped_at: dict[str, float],
        roles: dict[str, Role | None],
        latency: float,
    ) -> list[ScrapeResult]:
        offset = self._clock_offset
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
                why = "target down" if up.get(inst, 1.0) != 1.0 else "no matching series"
                if why == "target down":
                    self._down.setdefault(inst, "was down at an earlier poll (Prometheus' up)")
                if why != "target down":
                    self._warner.warn(
                        f"{inst}:empty",
                        f"Prometheus source {self.url}: target {inst} ({name}) is up but has "
                        f"no series matching {self._selector()}: a failed scrape",
                    )
                results.append(ScrapeResult(name, None, mono, wall, latency, why, role))
                continue
            text = self._render(by_instance[inst])
            parser = self._parsers.setdefault(inst, Parser())
            try:
                expo = await asyncio.get_running_loop().run_in_executor(
                    self._pool, functools.partial(parser.parse, text, time=mono, wall_time=wall)
                )
            except ExpositionError as e:
                self._warner.warn(
                    f"{inst}:parse", f"Prometheus source {self.url}: {name} ({inst}): {e}"
                )
                results.append(ScrapeResult(name, None, mono, wall, latency, str(e), role))
                continue
            doubt = self._down.pop(inst, "")
            results.append(
                ScrapeResult(name, expo, mono, wall, latency, None, role, continuity_doubt=doubt)
            )
        return results

    def _render(self, samples: list[dict[str, Any]]) -> str:
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

    def _unknown_families(self, samples: list[dict[str, Any]]) -> bool:
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


class AnswerError(RuntimeError):
    """An answer of the HTTP API that fleetscope cannot use (too large, not JSON, malformed)."""


async def _nothing() -> list[dict[str, Any]]:
    return []


def _point(entry: object) -> tuple[dict[str, str], float] | None:
    """An instant-vector entry's labels and value, or None when it is malformed."""
    if not isinstance(entry, dict):
        return None
    metric, value = entry.get("metric"), entry.get("value")
    if not isinstance(metric, dict) or not isinstance(value, list | tuple) or len(value) != 2:
        return None
    try:
        return metric, float(value[1])
    except (TypeError, ValueError):
        return None
