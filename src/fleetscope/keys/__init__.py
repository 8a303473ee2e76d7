"""Key schemas: reduced statistics -> flat ``{key: value}`` for trackers, with a key budget.

* ``prime-rl`` (default, a drop-in for prime-rl users): per engine
  ``inference/{engine_id}/{metric}``, per scope ``inference/{scope}/{metric}/{stat}``, the
  per-engine keys bounded by a key budget (:mod:`fleetscope.keys.prime_rl`).
* ``skyrl``: SkyRL's names, ``vllm/[{window}/][{role}/]{name}`` (:mod:`fleetscope.keys.skyrl`).

Two key sets (:mod:`fleetscope.keys.sets`): the *full* set is the complete pass-through
(prime-rl's exact key set; JSONL, TensorBoard, ``WandbSink(keys="full")``); the *compact* set
(W&B's default) leaves out what means nothing or repeats another key. Every mapping returned is
a :class:`KeyDict`: the full set plus the names the compact set leaves out (``full_only``).

This module holds :class:`KeyOptions` and :func:`poll_keys`, and re-exports the names of the
modules above: import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleetscope.keys.prime_rl import (
    CORE_SCOPES,
    DEFAULT_KEY_BUDGET,
    GROUP_HEADLINES,
    HEADLINE_METRICS,
    engine_keys,
    interval_keys,
    prime_rl_keys,
    scope_keys,
    tail_engines,
)
from fleetscope.keys.sets import (
    COUNTED_HISTOGRAMS,
    KEY_SETS,
    KeyDict,
    KeySet,
    compact_engine_column,
    compact_stats,
    key_set_of,
)
from fleetscope.keys.skyrl import (
    SKYRL_STEP_KEYS,
    SKYRL_SUMMARY_TOTALS,
    skyrl_interval_keys,
    skyrl_keys,
)
from fleetscope.stats.reduce import PollStats

__all__ = [
    "CORE_SCOPES",
    "COUNTED_HISTOGRAMS",
    "DEFAULT_KEY_BUDGET",
    "GROUP_HEADLINES",
    "HEADLINE_METRICS",
    "KEY_SETS",
    "SKYRL_STEP_KEYS",
    "SKYRL_SUMMARY_TOTALS",
    "KeyDict",
    "KeyOptions",
    "KeySet",
    "Schema",
    "compact_engine_column",
    "compact_stats",
    "engine_keys",
    "interval_keys",
    "key_prefix",
    "key_set_of",
    "poll_keys",
    "prime_rl_keys",
    "scope_keys",
    "skyrl_interval_keys",
    "skyrl_keys",
    "summary_prefix",
    "tail_engines",
]

Schema = Literal["prime-rl", "skyrl"]


@dataclass(frozen=True, slots=True)
class KeyOptions:
    schema: Schema = "prime-rl"
    prefix: str | None = None  # default: "inference" (prime-rl) / "vllm" (skyrl)
    key_budget: int = DEFAULT_KEY_BUDGET
    window: str | None = None  # skyrl: "train" / "eval" inserted after the prefix


def key_prefix(options: KeyOptions) -> str:
    """The first key segment: the user's prefix, else ``inference`` (prime-rl) / ``vllm``."""
    return options.prefix or ("vllm" if options.schema == "skyrl" else "inference")


def summary_prefix(options: KeyOptions) -> str:
    """The first segment of run-summary keys."""
    if options.schema == "skyrl":
        return "vllm_correct_aggregate"
    return key_prefix(options) + "_summary"


def poll_keys(stats: PollStats, options: KeyOptions = KeyOptions()) -> KeyDict:
    """All keys of one poll under the chosen schema (the full set, compact subset marked)."""
    if options.schema == "skyrl":
        return skyrl_keys(stats, key_prefix(options), options.window)
    return prime_rl_keys(stats, key_prefix(options), options.key_budget)
