"""Cumulative metric values of a simulated engine or API server.

A ``Ledger`` holds counters, histograms and summaries keyed by family name (as exposed, e.g.
``vllm:request_success_total``) and by the tuple of the values of the family's breakdown labels
(``("length",)`` for ``finished_reason="length"``, ``()`` for a family without one).

Each simulated engine keeps two ledgers that receive exactly the same increments:

* ``exported``: what ``/metrics`` shows; replaced by an empty one on a restart.
* ``truth``: a ``Truth`` (a ledger that is never reset, plus restart bookkeeping and gauge
  history): the exact totals the engine added over its whole life, for tests to compare a
  collector's numbers against.
"""

from __future__ import annotations

import copy
from bisect import bisect_left

SeriesKey = tuple[str, ...]


class HistogramCounts:
    """Bucket counts, count and sum of one histogram series (non-cumulative buckets).

    ``bucket_counts[i]`` counts observations ``<= bounds[i]`` and ``> bounds[i-1]``; the last
    element counts those above every finite bound (the ``+Inf`` bucket only). If
    ``observations`` is a list, every observation is also kept there as ``(value, times)``.
    """

    __slots__ = ("bounds", "bucket_counts", "count", "observations", "sum")

    def __init__(self, bounds: tuple[float, ...], record_observations: bool = False) -> None:
        self.bounds: tuple[float, ...] = tuple(float(b) for b in bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bucket bounds must be strictly increasing: {bounds!r}")
        self.bucket_counts: list[int] = [0] * (len(self.bounds) + 1)
        self.count: int = 0
        self.sum: float = 0.0
        self.observations: list[tuple[float, int]] | None = [] if record_observations else None

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``times`` observations of ``value`` (Prometheus ``le`` semantics)."""
        self.bucket_counts[bisect_left(self.bounds, value)] += times
        self.count += times
        self.sum += value * times
        if self.observations is not None:
            self.observations.append((value, times))

    def cumulative(self) -> list[int]:
        """Cumulative counts per bound, ``+Inf`` last (what the ``_bucket`` samples show)."""
        out: list[int] = []
        running = 0
        for c in self.bucket_counts:
            running += c
            out.append(running)
        return out

    def cumulative_by_bound(self) -> dict[float, int]:
        """``{le: cumulative count}`` with ``float('inf')`` for ``+Inf``."""
        return dict(zip((*self.bounds, float("inf")), self.cumulative(), strict=True))

    def rebinned(self, bounds: tuple[float, ...]) -> HistogramCounts:
        """The same observations counted in another bucket layout (needs ``observations``)."""
        if self.observations is None:
            if self.count:
                raise ValueError("cannot re-bin a histogram whose observations were not recorded")
            return HistogramCounts(bounds, record_observations=False)
        out = HistogramCounts(bounds, record_observations=True)
        for value, times in self.observations:
            out.observe(value, times)
        return out

    def __repr__(self) -> str:
        return f"HistogramCounts(count={self.count}, sum={self.sum:.6g}, bounds={self.bounds})"


class Ledger:
    """Cumulative counters, histograms and summaries, keyed by family and breakdown values."""

    def __init__(self, record_observations: bool = False) -> None:
        self.record_observations = record_observations
        self.counters: dict[str, dict[SeriesKey, float]] = {}
        self.histograms: dict[str, dict[SeriesKey, HistogramCounts]] = {}
        #: summaries: family -> key -> [count, sum]
        self.summaries: dict[str, dict[SeriesKey, list[float]]] = {}

    # -- writing ---------------------------------------------------------------------------
    def add(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        """Add ``amount`` (>= 0) to counter ``family{key}``."""
        series = self.counters.setdefault(family, {})
        series[key] = series.get(key, 0.0) + amount

    def ensure_counter(self, family: str, key: SeriesKey = ()) -> None:
        """Create counter ``family{key}`` at 0 if it does not exist."""
        self.counters.setdefault(family, {}).setdefault(key, 0.0)

    def ensure_histogram(
        self, family: str, bounds: tuple[float, ...], key: SeriesKey = ()
    ) -> HistogramCounts:
        """Return histogram ``family{key}``, creating it empty with ``bounds`` if needed."""
        series = self.histograms.setdefault(family, {})
        hist = series.get(key)
        if hist is None:
            hist = series[key] = HistogramCounts(bounds, self.record_observations)
        return hist

    def observe(
        self,
        family: str,
        bounds: tuple[float, ...],
        value: float,
        times: int = 1,
        key: SeriesKey = (),
    ) -> None:
        """Observe ``value`` ``times`` times in histogram ``family{key}``."""
        self.ensure_histogram(family, bounds, key).observe(value, times)

    def summary_observe(self, family: str, value: float, key: SeriesKey = ()) -> None:
        """Observe ``value`` in summary ``family{key}`` (count and sum only, like fastapi's)."""
        pair = self.summaries.setdefault(family, {}).setdefault(key, [0.0, 0.0])
        pair[0] += 1
        pair[1] += value

    # -- reading ---------------------------------------------------------------------------
    def counter(self, family: str, *key: str) -> float:
        """Value of counter ``family{key}``; ``family`` summed over all keys if none is given.

        A series that was never created reads as 0 here (this is ground truth, not a scrape).
        """
        series = self.counters.get(family, {})
        if not key:
            return float(sum(series.values()))
        return float(series.get(tuple(key), 0.0))

    def counter_series(self, family: str) -> dict[SeriesKey, float]:
        """All series of counter ``family`` (a copy)."""
        return dict(self.counters.get(family, {}))

    def histogram(self, family: str, *key: str) -> HistogramCounts | None:
        """Histogram ``family{key}`` or ``None`` if nothing created it."""
        return self.histograms.get(family, {}).get(tuple(key))

    def snapshot(self) -> Ledger:
        """A deep copy (take one at a window boundary, subtract with ``delta``)."""
        return copy.deepcopy(self)

    def delta(self, earlier: Ledger) -> dict[str, dict[SeriesKey, float]]:
        """Counter increments since ``earlier`` (a snapshot of this same ledger)."""
        out: dict[str, dict[SeriesKey, float]] = {}
        for family, series in self.counters.items():
            before = earlier.counters.get(family, {})
            out[family] = {k: v - before.get(k, 0.0) for k, v in series.items()}
        return out


#: what a simulated engine's time goes to (the truth of fleetscope's engine-time breakdown)
PHASES: tuple[str, ...] = ("idle", "busy", "saturated", "paused", "syncing")
#: KV usage at or above which an engine step counts as saturated (as fleetscope's default
#: ``HealthThresholds.kv_full``)
SATURATED_KV = 0.95


class PhaseSeconds:
    """Simulated seconds one engine spent in each phase (:data:`PHASES`), never reset.

    Recorded by the load model as it runs (:mod:`~fleetscope_sim.engine_scheduler`): every
    engine step is ``busy``, or ``saturated`` when it preempted, left a request ready to run
    waiting for capacity, or ran with the KV cache at least :data:`SATURATED_KV` full; the time
    with nothing to run is ``idle``; a step while the scheduler is paused or asleep ``paused``.
    ``override`` (set by the endpoint for a step: ``syncing`` while a weight transfer is
    active) takes every second of that step instead."""

    __slots__ = ("override", "seconds")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.override: str | None = None

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self.seconds[self.override or phase] += seconds


class Truth(Ledger):
    """Exact ground truth of one engine (or of one API server's own families).

    It is a ``Ledger`` that is never reset (``counter()``, ``histogram()``...), plus:

    Attributes:
        restarts: number of restarts so far.
        restart_times: simulated time (seconds since the fleet started) of each restart.
        lost_at_restart: the exported counter values just before each restart (the most a
            collector can have seen before the reset, if it scraped right before it).
        gauges: exported gauge values after the latest step: family -> key -> value.
        gauge_history: ``(sim_time, gauges)`` after every step (kept when
            ``record_observations``).
        phases: the engine's seconds per phase (:class:`PhaseSeconds`).
    """

    def __init__(self, record_observations: bool = False) -> None:
        super().__init__(record_observations)
        self.restarts: int = 0
        self.restart_times: list[float] = []
        self.lost_at_restart: list[dict[str, dict[SeriesKey, float]]] = []
        self.gauges: dict[str, dict[SeriesKey, float]] = {}
        self.gauge_history: list[tuple[float, dict[str, dict[SeriesKey, float]]]] = []
        self.phases = PhaseSeconds()
