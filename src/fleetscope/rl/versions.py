"""Policy versions, version skew and weight syncs (docs/rl-lifecycle.md).

The trainer announces policy versions (``Collector.set_policy_version``, or the exit of a
``Collector.weight_sync``); versions are opaque strings ordered by the order of their first
announcement. Each endpoint's served version is read from vLLM's ``GET /weight_info``
(``{"weight_version": ...}``), asked every poll while a policy version is set, concurrently
with the scrape and within ``min(timeout, 2 s)`` and 64 KiB. An endpoint that answered 404 (no
such route: ``VLLM_SERVER_DEV_MODE`` off) is never asked again; other failures back off (30 s,
doubling to 15 min) and the endpoint's version is then unknown.

Per poll an engine is *stale* when its endpoint's latest answer names an announced version
older than the trainer's current one, judged at the poll (the answer of this poll if it came
in time, else the latest earlier one); its generated tokens of that poll's interval are stale
tokens. A version that was never announced (vLLM's initial ``"default"``), or no answer, is
*unknown*. The stale share is over the tokens whose status is known (stale, current or ahead of
the trainer): the tokens of unknown status (before the first announcement too) are reported
beside it (``unknown_version_generation_tokens`` / ``_share``), never mixed into it. An engine
ahead of the trainer (after a rollback) has a negative endpoint lag but is not stale: it counts
0 in ``max_version_lag``. All token counts are exact sums of per-engine deltas of
``vllm:generation_tokens``. Weight syncs are in :mod:`fleetscope.rl.weight_sync`.

Pure bookkeeping plus the probe's I/O; every method is thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetscope.health import HealthEvent
from fleetscope.rl.engine_deltas import generation_delta
from fleetscope.rl.probe import WEIGHT_INFO_BYTES, ProbeState, RouteProbe
from fleetscope.rl.spans import RL, LabelSpan, PollVersions
from fleetscope.rl.spans import TokenSums as _Sums
from fleetscope.rl.spans import share_keys as _share_keys
from fleetscope.rl.spans import token_keys as _token_keys
from fleetscope.stats.reduce import EngineInput

__all__ = [
    "WEIGHT_INFO_BYTES",
    "WEIGHT_INFO_DEADLINE",
    "WEIGHT_INFO_ROUTE",
    "PolicyVersions",
]

WEIGHT_INFO_ROUTE = "/weight_info"
WEIGHT_INFO_DEADLINE = 2.0


def _weight_version(info: Any) -> str:
    version = info.get("weight_version") if isinstance(info, dict) else None
    if not isinstance(version, str):
        raise ValueError("no weight_version in the answer")
    return version


def _endpoint_of(engine_id: str) -> str:
    return str(getattr(engine_id, "endpoint", engine_id))


# ----------------------------------------------------------------------------- probes


@dataclass
class PolicyVersions:
    """The trainer's announced versions and what each endpoint serves."""

    stale_seconds: float = 60.0
    announced: list[str] = field(default_factory=list)
    announced_at: list[float] = field(default_factory=list)  # monotonic, first announcement
    current: int | None = None
    _weights: RouteProbe[str] = field(
        default_factory=lambda: RouteProbe(WEIGHT_INFO_ROUTE, _weight_version)
    )
    _open: dict[str, _Sums] = field(default_factory=dict)  # open windows
    run: dict[str, _Sums] = field(default_factory=dict)  # run labels
    _last_stopped: dict[str, _Sums] = field(default_factory=dict)  # until its keys are read
    _held: _Sums = field(default_factory=_Sums)  # boundary polls' tokens, for the next row
    _held_roles: dict[str, _Sums] = field(default_factory=dict)
    # versions served, lags and per-role tokens per open window / run label (version_spans)
    _open_spans: dict[str, LabelSpan] = field(default_factory=dict)
    run_spans: dict[str, LabelSpan] = field(default_factory=dict)
    _stopped_spans: dict[str, LabelSpan] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # ------------------------------------------------------------------ announcements

    def announce(self, version: str, now: float | None = None) -> int:
        """The trainer's policy is now ``version`` (a new one is ordered after every earlier
        one; announcing an earlier one again makes it current). Returns its index."""
        if not isinstance(version, str):
            raise TypeError(f"a policy version is a string, not {type(version).__name__}")
        with self._lock:
            if version not in self.announced:
                self.announced.append(version)
                self.announced_at.append(time.monotonic() if now is None else now)
            self.current = self.announced.index(version)
            return self.current

    @property
    def active(self) -> bool:
        return self.current is not None

    @property
    def policy_version(self) -> str | None:
        with self._lock:
            return None if self.current is None else self.announced[self.current]

    @property
    def served(self) -> dict[str, str]:
        """Endpoint -> the version its latest ``/weight_info`` answer named."""
        return self._weights.answers

    @property
    def _probes(self) -> dict[str, ProbeState]:
        return self._weights._probes

    def served_index(self, endpoint: str) -> int | None:
        """The index of the endpoint's served version, None when unknown or never announced."""
        with self._lock:
            v = self.served.get(endpoint)
            return self.announced.index(v) if v in self.announced else None

    def forget_endpoint(self, endpoint: str) -> None:
        self._weights.forget(endpoint)

    # ------------------------------------------------------------------ /weight_info

    def cancel_probes(self) -> None:
        """Stop the requests still running (the collector stops)."""
        self._weights.cancel()

    def probe(
        self,
        client: httpx.AsyncClient,
        endpoints: Sequence[Any],
        *,
        deadline: float,
    ) -> list[asyncio.Task[None]]:
        """Start (or return the running) ``/weight_info`` requests of this poll: only while a
        policy version is set, for endpoints that answered it before or were not asked yet."""
        if not self.active:
            return []
        return self._weights.probe(client, endpoints, deadline=deadline)

    # ------------------------------------------------------------------ per poll

    def poll(
        self,
        inputs: Iterable[EngineInput],
        now: float,
        prefix: str,
        active_windows: Iterable[str],
        *,
        boundary: bool = False,
    ) -> tuple[dict[str, float], list[HealthEvent]]:
        """One poll's version keys and ``stale_version`` events; the stale and total tokens of
        its interval go to every open window and run label (``idle`` when none is open).

        ``boundary``: an extra poll at a window or sync boundary. Its row shows the instant
        keys (counts of engines, lags) but not the token share: that interval is held and
        shown by the next regular poll, over the whole interval since the previous one (as
        :meth:`fleetscope.fleet.state.FleetState.observe` does for rates)."""
        with self._lock:
            pv = PollVersions()
            sums = _Sums()
            counts: dict[str, list[int]] = {}  # role -> [stale engines, unknown engines]
            events: list[HealthEvent] = []
            n_stale, n_unknown = self._tally(inputs, now, pv, sums, counts, events)
            self._attribute(sums, pv, active_windows, boundary)
            if self.current is None:
                return {}, []
            return self._poll_keys(prefix, sums, pv, counts, n_stale, n_unknown, boundary), events

    def _tally(
        self,
        inputs: Iterable[EngineInput],
        now: float,
        pv: PollVersions,
        sums: _Sums,
        counts: dict[str, list[int]],
        events: list[HealthEvent],
    ) -> tuple[int, int]:
        """Every engine's generated tokens into ``sums`` (and its role's), its served version
        and lag into ``pv``, its ``stale_version`` event; returns how many engines are stale
        and how many of unknown version."""
        n_stale = n_unknown = 0
        for inp in [i for i in inputs if i.is_engine]:
            tokens = generation_delta(inp.delta)
            sums.total += tokens
            ep = _endpoint_of(inp.engine_id)
            role = inp.role
            rs = None
            if role is not None:
                pv.roles[ep] = role
                rs = pv.role_sums.setdefault(role, _Sums())
                rs.total += tokens
                counts.setdefault(role, [0, 0])
            if self.current is None:
                continue
            idx = self.served_index(ep)
            if idx is None:
                n_unknown += 1
                if role is not None:
                    counts[role][1] += 1
                continue
            pv.served[ep] = idx
            sums.known += tokens
            lag = self.current - idx
            pv.lags[ep] = lag
            if rs is not None:
                rs.known += tokens
            if lag > 0:
                n_stale += 1
                sums.stale += tokens
                if rs is not None and role is not None:
                    rs.stale += tokens
                    counts[role][0] += 1
                event = self._stale_version(str(inp.engine_id), idx, lag, now)
                if event is not None:
                    events.append(event)
        return n_stale, n_unknown

    def _stale_version(self, engine: str, idx: int, lag: int, now: float) -> HealthEvent | None:
        """``stale_version``: the engine serves an older version ``stale_seconds`` after the
        trainer announced the first newer one."""
        assert self.current is not None
        since = now - self.announced_at[idx + 1]  # the first newer version
        if since >= self.stale_seconds:
            return HealthEvent(
                "stale_version",
                engine,
                float(lag),
                f"{engine}: serves {self.announced[idx]!r}, "
                f"{lag} version(s) behind the trainer's "
                f"{self.announced[self.current]!r} for {since:.0f} s",
            )
        return None

    def _attribute(
        self, sums: _Sums, pv: PollVersions, active_windows: Iterable[str], boundary: bool
    ) -> None:
        """A poll's tokens and versions to the run, every open window (``idle`` when none is
        open); a boundary poll's tokens are held for the next regular row, which takes them
        into ``sums`` (and its roles')."""
        from fleetscope.stats.windows import COMBINED, IDLE

        self.run.setdefault(COMBINED, _Sums()).merge(sums)
        self.run_spans.setdefault(COMBINED, LabelSpan()).observe(pv)
        labels = list(active_windows)
        for label in labels:
            self._open.setdefault(label, _Sums()).merge(sums)
            self._open_spans.setdefault(label, LabelSpan()).observe(pv)
        if not labels:
            self.run.setdefault(IDLE, _Sums()).merge(sums)
            self.run_spans.setdefault(IDLE, LabelSpan()).observe(pv)
        role_sums = pv.role_sums
        if boundary:
            self._held.merge(sums)
            for name, rsum in role_sums.items():
                self._held_roles.setdefault(name, _Sums()).merge(rsum)
        else:
            sums.merge(self._held)
            self._held = _Sums()
            for name, rsum in self._held_roles.items():
                role_sums.setdefault(name, _Sums()).merge(rsum)
            self._held_roles = {}

    def _poll_keys(
        self,
        prefix: str,
        sums: _Sums,
        pv: PollVersions,
        counts: dict[str, list[int]],
        n_stale: int,
        n_unknown: int,
        boundary: bool,
    ) -> dict[str, float]:
        """A poll's version keys: the fleet's, each role's, each endpoint's (token shares only
        on a regular row)."""
        assert self.current is not None
        lags = pv.lags
        p = f"{prefix}/{RL}/"
        keys = {
            p + "policy_version_index": float(self.current),
            p + "engines_stale": float(n_stale),
            p + "engines_unknown_version": float(n_unknown),
            # an engine ahead of the trainer (after a rollback) is not stale: lag 0 here
            p + "max_version_lag": float(max((max(0, g) for g in lags.values()), default=0)),
        }
        if not boundary:
            keys.update(_token_keys(p, sums))
        role_lags = pv.scope_lags()
        for name, (n_role_stale, n_role_unknown) in counts.items():
            rp = f"{p}{name}/"
            keys[rp + "engines_stale"] = float(n_role_stale)
            keys[rp + "engines_unknown_version"] = float(n_role_unknown)
            keys[rp + "max_version_lag"] = float(role_lags.get(name, 0))
            if not boundary and name in pv.role_sums:
                keys.update(_token_keys(rp, pv.role_sums[name]))
        for ep, lag in lags.items():
            keys[f"{prefix}/{ep}/weight_version_lag"] = float(lag)
            keys[f"{prefix}/{ep}/weight_version_index"] = float(pv.served[ep])
        return keys

    # ------------------------------------------------------------------ windows

    def window_action(self, action: str, label: str) -> None:
        """Follow a window's boundary (after its poll was attributed)."""
        with self._lock:
            if action == "start":
                self._open[label] = _Sums()
                self._open_spans[label] = LabelSpan()
            elif action == "stop":
                sums = self._open.pop(label, None)
                if sums is not None:
                    self.run.setdefault(label, _Sums()).merge(sums)
                    self._last_stopped[label] = sums
                span = self._open_spans.pop(label, None)
                if span is not None:
                    self.run_spans.setdefault(label, LabelSpan()).merge(span)
                    self._stopped_spans[label] = span

    def window_keys(self, label: str, prefix: str) -> dict[str, float]:
        """The stale token share of a window that just stopped (when versions were in use)."""
        with self._lock:
            sums = self._last_stopped.pop(label, None)
            span = self._stopped_spans.pop(label, None)
            if sums is None or not self.announced:
                return {}
            out = _share_keys(f"{prefix}/{label}/{RL}/", sums)
            if span is not None:
                out.update(span.keys(f"{prefix}/{label}"))
            return out

    def summary_keys(self, prefix: str) -> dict[str, float]:
        with self._lock:
            if not self.announced:
                return {}
            out: dict[str, float] = {}
            for label, sums in self.run.items():
                out.update(_share_keys(f"{prefix}/{label}/{RL}/", sums))
            for label, span in self.run_spans.items():
                out.update(span.keys(f"{prefix}/{label}"))
            out[f"{prefix}/{RL}/policy_versions"] = float(len(self.announced))
            return out

    def served_versions(self) -> dict[str, str]:
        """Endpoint -> the announced version it served last in the run (the run summary's
        ``endpoints/{name}/weight_version``)."""
        from fleetscope.stats.windows import COMBINED

        with self._lock:
            span = self.run_spans.get(COMBINED)
            if span is None:
                return {}
            return {ep: self.announced[v[2]] for ep, v in span.versions.items()}

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the announced versions and the stale token sums (open windows' too)."""
        with self._lock:
            return {
                "announced": list(self.announced),
                "current": self.current,
                "run": {k: v.to_list() for k, v in self.run.items()},
                "open": {k: v.to_list() for k, v in self._open.items()},
                "run_spans": {k: v.to_data() for k, v in self.run_spans.items()},
                "open_spans": {k: v.to_data() for k, v in self._open_spans.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any], now: float | None = None) -> None:
        """Continue saved versions: their ``stale_seconds`` clocks restart ``now``; served
        versions are asked afresh."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.announced = [str(v) for v in state.get("announced", [])]
            self.announced_at = [now] * len(self.announced)
            cur = state.get("current")
            self.current = None if cur is None else int(cur)
            self.run = {k: _Sums.from_list(v) for k, v in state["run"].items()}
            self._open = {k: _Sums.from_list(v) for k, v in state["open"].items()}
            spans = state.get("run_spans", {})
            self.run_spans = {k: LabelSpan.from_data(v) for k, v in spans.items()}
            spans = state.get("open_spans", {})
            self._open_spans = {k: LabelSpan.from_data(v) for k, v in spans.items()}
