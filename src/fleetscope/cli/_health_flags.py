"""The health thresholds' flags (``fleetscope.health.HealthThresholds``), declared once for
``watch`` (which judges them every poll) and ``alerts`` (which writes them into rules): the
same names, defaults, checks and help in both. ``--stale-seconds`` is ``watch``'s alone: the
rules have no stale-version alert, and a flag that changed nothing would mislead."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fleetscope.cli._common import fraction, positive_float
from fleetscope.health import HealthThresholds

# (flag, HealthThresholds field, argparse type, help)
_FLAGS: tuple[tuple[str, str, Callable[[str], float], str], ...] = (
    ("--stall-seconds", "stall_seconds", positive_float,
     "requests running and no token for this long is a stall"),
    ("--outlier-seconds", "outlier_seconds", positive_float,
     "this long far below its role's median token rate is an outlier"),
    ("--outlier-fraction", "outlier_fraction", fraction,
     "share of its role's median token rate below which an engine is an outlier"),
    ("--stale-seconds", "stale_seconds", positive_float,
     "a server still on an older policy version this long after the trainer announced a "
     "newer one is stale_version"),
    ("--paused-seconds", "paused_seconds", positive_float,
     "an engine paused or asleep this long while no weight sync is open is engine_paused"),
    ("--kv-full", "kv_full", fraction, "KV cache usage share that is near full"),
    ("--kv-seconds", "kv_seconds", positive_float, "KV cache at or above --kv-full this long"),
    ("--queue-seconds", "queue_seconds", positive_float, "waiting queue growing this long"),
    ("--preemption-burst", "preemption_burst", positive_float,
     "preemptions between two scrapes that are a burst"),
)  # fmt: skip
WATCH_ONLY = frozenset({"stale_seconds"})


def add_health_flags(parser: argparse.ArgumentParser, *, stale: bool) -> None:
    """Every threshold flag (``--stale-seconds`` only when ``stale``), defaults from
    ``HealthThresholds()``."""
    defaults = HealthThresholds()
    for flag, name, kind, what in _FLAGS:
        if name in WATCH_ONLY and not stale:
            continue
        parser.add_argument(
            flag, type=kind, default=getattr(defaults, name), help=f"health: {what} (%(default)s)"
        )


def health_thresholds(args: argparse.Namespace) -> HealthThresholds:
    """The thresholds the flags set; any the command has no flag for keep their defaults."""
    given = {name: getattr(args, name) for _f, name, _k, _w in _FLAGS if hasattr(args, name)}
    return HealthThresholds(**given)
