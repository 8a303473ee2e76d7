"""Window and run-summary keys: an accumulator's reduced sums under the chosen key schema;
warnings about statistics at the limits of float64.

Both return a :class:`fleetscope.keys.KeyDict`: the full key set, with the names the compact
set (W&B's default) leaves out marked ``full_only``. :class:`LimitWarnings` says which
statistics a poll, a window or a run label left out (not finite) or rounded (past 2**53)."""

from __future__ import annotations

from collections.abc import Mapping

from fleetscope.keys import (
    KeyDict,
    KeyOptions,
    interval_keys,
    key_prefix,
    skyrl_interval_keys,
    summary_prefix,
)
from fleetscope.keys.breakdown import breakdown_keys
from fleetscope.rl.operations import accumulator_rows, operation_keys
from fleetscope.stats.reduce import PollStats
from fleetscope.stats.windows import COMBINED, Accumulator
from fleetscope.util.warn import RateLimitedWarner

_SHOWN = 6  # metrics named per warning


def _named(names: list[str]) -> str:
    """``agg/x/sum``, ``agg/x/delta``, ``agg/x:rate/max`` -> ``agg/x (sum, delta), agg/x:rate
    (max)``: every metric, with its stats, up to :data:`_SHOWN` metrics."""
    by_metric: dict[str, list[str]] = {}
    for n in names:
        metric, _, stat = n.rpartition("/")
        by_metric.setdefault(metric, []).append(stat)
    shown = [f"{m} ({', '.join(st)})" for m, st in list(by_metric.items())[:_SHOWN]]
    more = len(by_metric) - _SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


class LimitWarnings:
    """Warnings about statistics at the limits of float64 (docs/bad-data.md §13): the ones left
    out because they are not finite (rate-limited, per place: a poll, a window, a run label),
    and counter sums past 2**53 (once per name: they stay past it)."""

    def __init__(self, warner: RateLimitedWarner) -> None:
        self._warner = warner
        self._inexact_seen: set[str] = set()

    def __call__(self, stats: PollStats, where: str) -> None:
        lost = stats.limits.not_finite
        if lost:
            self._warner.warn(
                f"not_finite:{where}",
                f"{where}: left out, not finite (a float64 sum past ~1.8e308, or an infinite "
                f"value): {_named(lost)}",
            )
        new = [n for n in stats.limits.inexact if f"{where}|{n}" not in self._inexact_seen]
        if new and len(self._inexact_seen) < 100_000:
            said = self._warner.warn(
                f"inexact:{where}",
                f"{where}: past 2**53, where float64 sums are no longer exact integers "
                f"(rounded): {_named(new)}",
            )
            if said:  # held back by the rate limit: said at a later call
                self._inexact_seen.update(f"{where}|{n}" for n in new)


def accumulator_keys(
    acc: Accumulator,
    label: str,
    options: KeyOptions,
    *,
    summary: bool,
    limits: LimitWarnings | None = None,
) -> KeyDict:
    """A window's keys (``summary=False``) or a run label's summary keys; ``limits`` warns
    about the statistics they leave out (not finite) or round (past 2**53)."""
    stats = acc.stats()
    if stats is None:
        return KeyDict()
    if limits is not None:
        limits(stats, f"{'run summary' if summary else 'window'} {label}")
    meta = {
        "active_seconds": acc.active_seconds,
        "coverage": acc.coverage(),
        "polls": float(acc.polls),
        "failed_scrapes": float(acc.failed_scrapes),
        "engine_restarts": float(acc.engine_restarts),
        "restarts_unseen_tail": float(acc.restarts_unseen_tail),
    }
    base = (summary_prefix(options) if summary else key_prefix(options)) + "/" + label
    if options.schema == "skyrl":
        out = skyrl_interval_keys(stats, base, meta, summary=summary)
        out.update(breakdown_keys(acc.engines, stats, base, summary=summary, per_engine_keys=False))
        return out
    out = interval_keys(stats, base, meta)
    out.update(operation_keys(accumulator_rows(acc.engines), base))
    # where the engines' time went, who holds the latency tail (docs/rules.md §3.13)
    out.update(breakdown_keys(acc.engines, stats, base, summary=summary))
    return out


def summary_keys(
    run: Mapping[str, Accumulator],
    options: KeyOptions,
    status: str,
    limits: LimitWarnings | None = None,
) -> KeyDict:
    """The run summary: every run label with polls (and ``combined``), and ``run_status``."""
    out = KeyDict()
    for label, acc in run.items():
        if label == COMBINED or acc.polls:
            out.update(accumulator_keys(acc, label, options, summary=True, limits=limits))
    out["run_status"] = status
    return out
