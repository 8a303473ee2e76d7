"""The "RL loop" section of the W&B workspace (docs/rl-lifecycle.md): weight-update time per
operation, operations in flight, paused / asleep engines and engine-seconds, version skew and
lag, weight-sync wall time next to the engines' own update time, tokens during syncs.

Every key is one the collector emits (tested against a collector's real keys). The Grafana
dashboard's RL row is in :mod:`fleetscope.dashboards._grafana_panels`: Prometheus has only
vLLM's own series, which say nothing of pauses, versions or the trainer's syncs.
"""

from __future__ import annotations

from fleetscope.dashboards._wandb_panels import Panel

RL_SECTION_NAME = "RL loop"
#: the operations plotted (vLLM's weight-transfer handlers; ``init`` / ``shutdown`` are rare)
OPERATIONS = ("start", "update", "finish")
_HIST = "rl_weight_update_operation_duration_seconds"
_FLIGHT = "rl_weight_update_operations_in_flight"


def rl_panels(disaggregated: bool, prefix: str = "inference") -> list[Panel]:
    """The RL loop section's panels (role scopes too when ``disaggregated``)."""
    scopes = ("agg", "prefill", "decode") if disaggregated else ("agg",)
    a, rl, sync = f"{prefix}/agg", f"{prefix}/rl", f"{prefix}/rl/sync"
    ops = [f"{{operation={op}}}" for op in OPERATIONS]
    return [
        Panel(
            "Weight-update seconds per operation (p90; pooled mean)",
            tuple(k for o in ops for k in (f"{a}/{_HIST}{o}/p90", f"{a}/{_HIST}{o}:mean/pooled")),
        ),
        Panel(
            "Weight-update operations (calls per poll; in flight)",
            tuple(k for o in ops for k in (f"{a}/{_HIST}{o}/delta", f"{a}/{_FLIGHT}{o}/sum")),
        ),
        Panel(
            "Engines paused / asleep",
            tuple(f"{prefix}/{s}/engines_{x}" for s in scopes for x in ("paused", "asleep")),
        ),
        Panel(
            "Paused / asleep engine-seconds per poll",
            tuple(
                f"{prefix}/{s}/{x}_engine_seconds" for s in scopes for x in ("paused", "sleeping")
            ),
        ),
        Panel(
            "Version skew: stale and unknown engines, largest lag",
            (f"{rl}/engines_stale", f"{rl}/engines_unknown_version", f"{rl}/max_version_lag"),
        ),
        Panel(
            "Stale share (of known-version tokens), unknown-version share; policy version index",
            (
                f"{rl}/stale_generation_share",
                f"{rl}/unknown_version_generation_share",
                f"{rl}/policy_version_index",
            ),
        ),
        Panel(
            "Weight sync wall time vs the engines' update seconds",
            (f"{sync}/seconds", *(f"{sync}/engine_update_seconds{o}" for o in ops)),
        ),
        Panel(
            "Weight syncs: tokens generated during them, counts",
            (f"{sync}/generation_tokens", f"{sync}/count", f"{sync}/failed_total"),
        ),
    ]
