"""Dashboards built from the catalog: Grafana (grafana-foundation-sdk) and W&B workspaces."""
