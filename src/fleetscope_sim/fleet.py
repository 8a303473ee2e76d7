"""A simulated fleet: endpoints sharing one simulated clock and one lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from .endpoint import Mode, SimClock, SimEndpoint
from .engine import LoadProfile, Role, SimEngine
from .sglang_endpoint import SglangEndpoint

#: ``engine_kind`` of one endpoint, or of a fleet (``mixed``: vLLM and SGLang alternately)
EngineKind = Literal["vllm", "sglang"]
FleetKind = Literal["vllm", "sglang", "mixed"]
ENDPOINT_CLASSES: dict[str, type[SimEndpoint]] = {"vllm": SimEndpoint, "sglang": SglangEndpoint}


def endpoint_kinds(kind: str, endpoints: int) -> list[EngineKind]:
    """Each endpoint's engine kind for a fleet of ``kind`` (``mixed``: vllm, sglang, vllm...)."""
    if kind == "mixed":
        return ["vllm" if i % 2 == 0 else "sglang" for i in range(endpoints)]
    if kind not in ENDPOINT_CLASSES:
        raise ValueError(f"engine kind must be vllm, sglang or mixed, not {kind!r}")
    return [kind] * endpoints  # type: ignore[list-item]


_ROLE_PREFIX = {None: "server", "prefill": "prefill", "decode": "decode"}


class SimFleet:
    """A set of simulated vLLM API servers stepped together.

    State only changes in ``step()`` and in the endpoints' fault methods, each endpoint under
    its own lock (which its renders take too), so a body is always consistent and two scrapes
    between steps see identical bodies.

    Attributes:
        clock: the shared ``SimClock``.
        lock: serializes ``step()``, ``add_endpoint()`` and ``render_all()`` (a whole-fleet
            snapshot at one step).
        endpoints: the ``SimEndpoint`` list, in creation order.
        seed: base seed; each engine draws from its own stream (seed, endpoint name, index).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        wall_start: float | None = None,
        record_observations: bool = True,
    ) -> None:
        self.seed = seed
        self.record_observations = record_observations
        self.clock = SimClock(wall_start)
        self.lock = threading.RLock()
        self.endpoints: list[SimEndpoint] = []
        self._role_counts: dict[Role, int] = {}

    @classmethod
    def build(
        cls,
        endpoints: int = 2,
        *,
        dp: int = 1,
        roles: Sequence[Role] | None = None,
        mode: Mode | None = None,
        model_name: str = "tinymodel",
        max_model_len: int = 512,
        load: LoadProfile | None = None,
        seed: int = 0,
        wall_start: float | None = None,
        record_observations: bool = True,
        engine_kind: FleetKind | str = "vllm",
    ) -> SimFleet:
        """A fleet of ``endpoints`` identical servers with ``dp`` engines each.

        ``roles`` (one per endpoint, ``None``/``"prefill"``/``"decode"``) names them
        ``prefill0``, ``decode0``, ``decode1``... (counted per role); without roles they are
        ``server0``, ``server1``... ``mode`` defaults to multiprocess iff ``dp > 1``.
        ``engine_kind``: ``vllm`` (vLLM 0.32 servers), ``sglang`` (SGLang 0.5.23 servers,
        always multiprocess) or ``mixed`` (even endpoints vLLM, odd ones SGLang).
        """
        if roles is not None and len(roles) != endpoints:
            raise ValueError(f"{len(roles)} roles for {endpoints} endpoints")
        kinds = endpoint_kinds(engine_kind, endpoints)
        fleet = cls(seed=seed, wall_start=wall_start, record_observations=record_observations)
        for i in range(endpoints):
            fleet.add_endpoint(
                role=None if roles is None else roles[i],
                dp=dp,
                mode=mode,
                model_name=model_name,
                max_model_len=max_model_len,
                load=load,
                engine_kind=kinds[i],
            )
        return fleet

    def add_endpoint(
        self,
        *,
        role: Role = None,
        dp: int = 1,
        mode: Mode | None = None,
        model_name: str = "tinymodel",
        max_model_len: int = 512,
        load: LoadProfile | None = None,
        name: str | None = None,
        engine_kind: EngineKind | str = "vllm",
        **kwargs: Any,
    ) -> SimEndpoint:
        """Create an endpoint on the fleet's clock and lock (named per role unless ``name``);
        ``engine_kind`` ``vllm`` or ``sglang`` (:class:`SglangEndpoint`)."""
        cls = ENDPOINT_CLASSES.get(engine_kind)
        if cls is None:
            raise ValueError(f"engine_kind must be vllm or sglang, not {engine_kind!r}")
        with self.lock:
            if name is None:
                n = self._role_counts.get(role, 0)
                self._role_counts[role] = n + 1
                name = f"{_ROLE_PREFIX[role]}{n}"
            if any(ep.name == name for ep in self.endpoints):
                raise ValueError(f"duplicate endpoint name {name!r}")
            kwargs.setdefault("record_observations", self.record_observations)
            endpoint = cls(
                name,
                role=role,
                dp=dp,
                mode=mode,
                model_name=model_name,
                max_model_len=max_model_len,
                load=load,
                seed=self.seed,
                clock=self.clock,
                **kwargs,
            )
            self.endpoints.append(endpoint)
            return endpoint

    def step(self, dt: float) -> None:
        """Advance every endpoint by ``dt`` simulated seconds.

        Steps are serialized by ``self.lock``; each endpoint is stepped under its own lock, so
        a render of one endpoint waits only for that endpoint's step (and always sees it
        either before or after it, never half-way)."""
        with self.lock:
            self.clock.advance(dt)
            t_end = self.clock.sim_time
            for endpoint in self.endpoints:
                with endpoint._lock:
                    endpoint._step_to(t_end)

    def run(self, seconds: float, dt: float = 1.0) -> None:
        """``step(dt)`` until ``seconds`` have passed (the last step may be shorter)."""
        left = seconds
        while left > 1e-12:
            self.step(min(dt, left))
            left -= dt

    def endpoint(self, name: str) -> SimEndpoint:
        """The endpoint called ``name``."""
        for ep in self.endpoints:
            if ep.name == name:
                return ep
        raise KeyError(name)

    def engines(self) -> Iterator[SimEngine]:
        """Every engine of every endpoint (``engine.engine_id`` is ``server0.1``...)."""
        for ep in self.endpoints:
            yield from ep.engines

    def truth_total(self, family: str, *key: str, role: Role | str = "any") -> float:
        """Ground-truth total of a counter over the fleet (or over endpoints of one role)."""
        return sum(
            ep.truth_total(family, *key)
            for ep in self.endpoints
            if role == "any" or ep.role == role
        )

    def render_all(self) -> dict[str, bytes]:
        """``{endpoint name: /metrics body}`` (no faults applied)."""
        with self.lock:
            return {ep.name: ep.render() for ep in self.endpoints}

    def __len__(self) -> int:
        return len(self.endpoints)

    def __repr__(self) -> str:
        return f"SimFleet({len(self.endpoints)} endpoints, t={self.clock.sim_time:.3f}s)"
