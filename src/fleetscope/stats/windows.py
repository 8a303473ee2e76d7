"""Windows and the run summary (docs/rules.md §3.8): exact sums of per-engine deltas over named
intervals.

Every poll's per-engine deltas are *attributed*: to each active window, and to the run label
of each active window; deltas that arrive while no window is active go to the ``idle`` label,
so nothing is lost (tokens produced between two windows show up under ``idle``). The run's
``combined`` label receives every delta once: it is the exact total of the whole run.

A window's totals are exact for every engine and series it covers (see
:mod:`fleetscope.stats.accumulate`); pure bookkeeping: the collector supplies clock readings
and polls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetscope.identity import EngineId, endpoint_of
from fleetscope.stats.accumulate import Accumulator
from fleetscope.stats.reduce import EngineInput

__all__ = ["COMBINED", "IDLE", "Accumulator", "Window", "WindowError", "WindowSet"]

IDLE = "idle"
COMBINED = "combined"
#: names under ``inference/`` that other keys use: a window so named would mix its keys with
#: theirs (``inference/rl/...`` are the RL keys of every poll)
KEY_SCOPES = frozenset({"agg", "prefill", "decode", "rl", "health", "collector", "endpoints"})


class WindowError(RuntimeError):
    """A window used out of order (pause before start, stop twice, ...)."""


def check_action(action: str, label: str, active: Collection[str], paused: Collection[str]) -> None:
    """Raise :class:`WindowError` if ``action`` is not valid for ``label`` given the windows
    ``active`` and ``paused`` now."""
    open_ = label in active or label in paused
    if action == "start":
        if label in (IDLE, COMBINED):
            raise WindowError(f"{label!r} is reserved for the run summary")
        if label in KEY_SCOPES:
            raise WindowError(f"{label!r} names other keys (inference/{label}/...): not a window")
        if open_:
            raise WindowError(f"window {label!r} is already open; stop it first")
    elif action == "pause" and label not in active:
        state = "paused" if label in paused else "not started"
        raise WindowError(f"cannot pause window {label!r}: it is {state}")
    elif action == "resume" and label not in paused:
        state = "active" if label in active else "not started"
        raise WindowError(f"cannot resume window {label!r}: it is {state}")
    elif action == "stop" and not open_:
        raise WindowError(f"cannot stop window {label!r}: it is not open")
    elif action not in ("start", "pause", "resume", "stop"):
        raise WindowError(f"unknown window action {action!r}")


@dataclass
class Window:
    """One named measurement interval. Created by :class:`WindowSet`; see its methods."""

    label: str
    acc: Accumulator
    state: str = "created"  # created | active | paused | stopped
    started_at: float | None = None
    resumed_at: float | None = None
    result: dict[str, float] = field(default_factory=dict)


class WindowSet:
    """All windows of one collector, the run summary per label, and attribution of deltas."""

    def __init__(self) -> None:
        self.active: dict[str, Window] = {}
        self.paused: dict[str, Window] = {}
        self.run: dict[str, Accumulator] = {COMBINED: Accumulator(COMBINED)}
        self.last_attributed_time: float | None = None
        self._resume_at_next_poll: set[str] = set()
        self._resume_from: float | None = None

    # ------------------------------------------------------------------ state changes

    def check(self, action: str, label: str) -> None:
        """Raise :class:`WindowError` if ``action`` is not valid for ``label`` now."""
        check_action(action, label, self.active.keys(), self.paused.keys())

    def start(self, label: str, now: float, times: Mapping[str, float] | None = None) -> Window:
        """Open a window; ``times``: each engine's scrape time in the boundary poll."""
        self.check("start", label)
        w = Window(label, Accumulator(label), "active", now, now)
        w.acc.open_span(now, times or {})
        self.active[label] = w
        return w

    def pause(self, label: str, now: float, times: Mapping[str, float] | None = None) -> Window:
        self.check("pause", label)
        w = self.active.pop(label)
        w.acc.add_seconds(now - (now if w.resumed_at is None else w.resumed_at))
        w.acc.close_span(now, times or {})
        w.state = "paused"
        self.paused[label] = w
        return w

    def resume(self, label: str, now: float, times: Mapping[str, float] | None = None) -> Window:
        self.check("resume", label)
        w = self.paused.pop(label)
        w.state = "active"
        w.resumed_at = now
        w.acc.open_span(now, times or {})
        self.active[label] = w
        return w

    def stop(self, label: str, now: float, times: Mapping[str, float] | None = None) -> Window:
        self.check("stop", label)
        w = self.active.pop(label, None)
        if w is not None:
            w.acc.add_seconds(now - (now if w.resumed_at is None else w.resumed_at))
            w.acc.close_span(now, times or {})
        else:
            w = self.paused.pop(label)
        w.state = "stopped"
        self.run.setdefault(label, Accumulator(label)).merge(w.acc)
        return w

    def stop_all(self, now: float, times: Mapping[str, float] | None = None) -> list[Window]:
        """The end of the run: stop every window still open or paused."""
        return [self.stop(label, now, times) for label in [*self.active, *self.paused]]

    def endpoint_joins(self, endpoint: str, time: float) -> None:
        """An endpoint joined the fleet (first scraped at ``time``): open windows expect its
        engines from then on, and run labels again if it is one that left and came back."""
        for w in self.active.values():
            w.acc.endpoint_joins(endpoint, time)
        for acc in self.run.values():
            acc.departed -= {e for e in acc.departed if endpoint_of(e) == endpoint}

    def endpoint_leaves(self, endpoint: str, time: float) -> None:
        """An endpoint left the fleet (last scraped at ``time``): open windows stop expecting
        its engines there, run labels stop expecting them at all."""
        for w in self.active.values():
            w.acc.endpoint_leaves(endpoint, time)
        for acc in self.run.values():
            acc.departed.update(e for e in acc.engines if endpoint_of(e) == endpoint)

    def engine_leaves(self, engine: EngineId, time: float) -> None:
        """An engine is gone for good (last scraped at ``time``)."""
        for w in self.active.values():
            w.acc.engine_leaves(engine, time)
        for acc in self.run.values():
            acc.departed.add(engine)

    def evict(self, engine: str, into: str) -> None:
        """An engine evicted for silence or churn: its sums fold into ``into`` everywhere."""
        for w in [*self.active.values(), *self.paused.values()]:
            w.acc.evict(engine, into)
        for acc in self.run.values():
            acc.evict(engine, into)

    def endpoint_answers(self, endpoint: str, *, lost: bool) -> None:
        """An endpoint that never answered has answered (first scraped now): the time it was
        silent is lost, or not (``lost=False``: its engines started after its first try)."""
        windows = [*self.active.values(), *self.paused.values()]
        for acc in [*self.run.values(), *(w.acc for w in windows)]:
            acc.endpoint_answers(endpoint, lost=lost)

    # ------------------------------------------------------------------ attribution

    def attribute(
        self,
        inputs: list[EngineInput],
        *,
        now: float,
        failed_scrapes: int = 0,
        unseen: Mapping[str, float] | None = None,
        phases: Sequence[tuple[int, float, float] | None] | None = None,
    ) -> None:
        """Give one poll's deltas to every active window (or to ``idle``) and to the run;
        ``unseen``: endpoints tried this poll that never answered, with the seconds since
        their previous attempt (docs/bad-data.md §7);
        ``phases``: each input's class (:mod:`fleetscope.stats.breakdown`)."""
        prev = self.last_attributed_time
        self.last_attributed_time = now
        resume = now if self._resume_from is None else self._resume_from
        for label in self._resume_at_next_poll:  # restored from a checkpoint, open again
            w = self.active[label]
            w.resumed_at = resume
            w.acc.open_span(resume, {})
        self._resume_at_next_poll = set()
        self._resume_from = None
        elapsed = 0.0 if prev is None else max(0.0, now - prev)

        def add(acc: Accumulator) -> None:
            acc.add(inputs, failed_scrapes=failed_scrapes, unseen=unseen, phases=phases)

        add(self.run[COMBINED])
        self.run[COMBINED].add_seconds(elapsed)
        if self.active:
            for w in self.active.values():
                add(w.acc)
        else:
            idle = self.run.setdefault(IDLE, Accumulator(IDLE))
            add(idle)
            idle.add_seconds(elapsed)

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """Plain data: every run label, and the windows still open or paused (an open
        window is saved as if paused at the last poll, and resumes at the first poll after
        :meth:`load_state_dict`: its pre-checkpoint part is kept)."""
        now = self.last_attributed_time
        open_windows = []
        for label, w in [*self.active.items(), *self.paused.items()]:
            acc = Accumulator.from_state_dict(w.acc.state_dict())
            acc.expected = dict(w.acc.expected)
            if label in self.active and now is not None:
                acc.add_seconds(now - (now if w.resumed_at is None else w.resumed_at))
                acc._open, acc._open_default = dict(w.acc._open or {}), w.acc._open_default
                acc._joined, acc._left = dict(w.acc._joined), set(w.acc._left)
                acc.close_span(now, {})
            open_windows.append(
                {"label": label, "active": label in self.active, "acc": acc.state_dict()}
            )
        return {
            "run": {k: v.state_dict() for k, v in self.run.items()},
            "open": open_windows,
            "version": 1,
            "saved_at": now,  # this machine's monotonic clock (for a continuous reload)
        }

    def load_state_dict(self, state: Mapping[str, Any], *, continuous: bool = False) -> None:
        """``continuous``: the same run goes on without a pause (the isolation child restarted on
        this machine): open windows resume at the saved poll, not the next one, so the time in
        between is expected of every engine and, unseen, shows as missing coverage."""
        if state.get("version") != 1:
            raise ValueError("unknown fleetscope window state version")
        self.run = {k: Accumulator.from_state_dict(v) for k, v in state["run"].items()}
        self.run.setdefault(COMBINED, Accumulator(COMBINED))
        self.active, self.paused = {}, {}
        for o in state.get("open", []):
            acc = Accumulator.from_state_dict(o["acc"])
            w = Window(o["label"], acc, "paused")
            if o["active"]:
                w.state = "active"
                self._resume_at_next_poll.add(o["label"])
                self.active[o["label"]] = w
            else:
                self.paused[o["label"]] = w
        saved_at = state.get("saved_at")
        self._resume_from = saved_at if continuous and saved_at is not None else None
        if self._resume_from is not None:
            self.last_attributed_time = self._resume_from
            # the run labels the next poll goes to (combined; idle unless a window is open:
            # a gap inside a window is not idle's) did not see the gap either
            labels = [COMBINED] if self.active else [COMBINED, IDLE]
            for label in labels:
                if label in self.run:  # a label with no sums yet knows no engine to expect
                    self.run[label].continue_after(self._resume_from)
