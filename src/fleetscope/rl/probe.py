"""A small JSON side request asked of every endpoint each poll (vLLM's ``/is_paused``,
``/is_sleeping``): the latest answer per endpoint, with the rules of the ``/weight_info``
probe (docs/rl-lifecycle.md §3): concurrent with the scrape, a deadline and a 64 KiB cap; an
endpoint that answered 404/405 and never answered before is never asked again; a failure of an
endpoint that answered before is retried at the next poll (one missed deadline on a loaded
machine should not blank its state for 30 s); further failures in a row back off 30 s, doubling
to 15 min. The answer is unknown from the first failure until the next answer. Thread-safe."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from fleetscope.util.backoff import Backoff

T = TypeVar("T")

WEIGHT_INFO_BYTES = 64 * 1024  # the cap of every probe answer (they are a few bytes)


@dataclass
class ProbeState:
    """What one endpoint's answers told us, and when to ask again."""

    answered: bool = False
    never: bool = False  # a definite "no such route"
    backoff: Backoff = field(default_factory=Backoff)
    failures: int = 0  # in a row
    task: asyncio.Task[None] | None = None


class RouteProbe(Generic[T]):
    """``GET route`` on every endpoint; ``parse`` turns the JSON answer into a value (raise
    for an answer that does not say)."""

    def __init__(self, route: str, parse: Callable[[Any], T]):
        self.route = route
        self.parse = parse
        self.answers: dict[str, T] = {}  # endpoint -> its latest answer
        self._probes: dict[str, ProbeState] = {}
        self._lock = threading.RLock()

    def get(self, endpoint: str) -> T | None:
        with self._lock:
            return self.answers.get(endpoint)

    def forget(self, endpoint: str) -> None:
        with self._lock:
            self.answers.pop(endpoint, None)
            p = self._probes.pop(endpoint, None)
        if p is not None and p.task is not None:
            p.task.cancel()

    def cancel(self) -> None:
        with self._lock:
            tasks = [p.task for p in self._probes.values() if p.task is not None]
        for t in tasks:
            t.cancel()

    def probe(
        self, client: httpx.AsyncClient, endpoints: Sequence[Any], *, deadline: float
    ) -> list[asyncio.Task[None]]:
        """Start (or return the running) requests of this poll."""
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        tasks = []
        for ep in endpoints:
            if not getattr(ep, "base_url", None):
                continue
            with self._lock:
                p = self._probes.setdefault(ep.name, ProbeState())
            if p.never or not p.backoff.due(now):
                continue
            if p.task is None or p.task.done():
                p.task = loop.create_task(self._ask(client, ep, p, deadline))
            tasks.append(p.task)
        return tasks

    async def _ask(
        self, client: httpx.AsyncClient, ep: Any, p: ProbeState, deadline: float
    ) -> None:
        from fleetscope.sources.http.client import ScrapeError, get_json

        try:
            info = await get_json(
                client,
                ep.base_url + self.route,
                headers=getattr(ep, "headers", None) or {},
                deadline=deadline,
                cap=WEIGHT_INFO_BYTES,
            )
            value = self.parse(info)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            with self._lock:
                self.answers.pop(ep.name, None)
                if isinstance(e, ScrapeError) and str(e) in ("HTTP 404", "HTTP 405"):
                    p.never = not p.answered
                p.failures += 1
                if not p.never and not (p.answered and p.failures == 1):
                    p.backoff.failed(time.monotonic())
            return
        with self._lock:
            self.answers[ep.name] = value
            p.answered = True
            p.failures = 0
            p.backoff.succeeded()


def bool_field(name: str) -> Callable[[Any], bool]:
    """A parser for ``{name: bool}`` answers."""

    def parse(info: Any) -> bool:
        v = info.get(name) if isinstance(info, dict) else None
        if not isinstance(v, bool):
            raise ValueError(f"no boolean {name} in the answer")
        return v

    return parse
