"""Statistics as pure functions over engine snapshots: deltas (Prometheus reset rules),
per-engine plans, cross-engine reductions, quantiles (PromQL rules), exact window sums."""
