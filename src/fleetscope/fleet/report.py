"""Window and run-summary keys: an accumulator's reduced sums under the chosen key schema.

Both return a :class:`fleetscope.keys.KeyDict`: the full key set, with the names the compact
set (W&B's default) leaves out marked ``full_only``."""

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
from fleetscope.stats.windows import COMBINED, Accumulator


def accumulator_keys(
    acc: Accumulator, label: str, options: KeyOptions, *, summary: bool
) -> KeyDict:
    """A window's keys (``summary=False``) or a run label's summary keys."""
    stats = acc.stats()
    if stats is None:
        return KeyDict()
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


def summary_keys(run: Mapping[str, Accumulator], options: KeyOptions, status: str) -> KeyDict:
    """The run summary: every run label with polls (and ``combined``), and ``run_status``."""
    out = KeyDict()
    for label, acc in run.items():
        if label == COMBINED or acc.polls:
            out.update(accumulator_keys(acc, label, options, summary=True))
    out["run_status"] = status
    return out
