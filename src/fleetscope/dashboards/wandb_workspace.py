"""A W&B workspace for fleetscope runs, generated from code with ``wandb-workspaces``.

Three sections: ``RL loop`` (:mod:`fleetscope.dashboards._rl_panels`: weight updates, pauses,
versions, syncs), ``Inference`` (:mod:`fleetscope.dashboards._wandb_panels`: each panel pairs
the fleet aggregate with the cross-engine tail that flags one sick engine, role-aware in
disaggregated runs) and, given the runs' window labels, ``Engine time`` (a panel per window:
where the engines' time went, docs/rules.md §3.13).

* :func:`inference_panels` is the pure panel spec (titles and key names; tested against the
  keys the collector really emits).
* :func:`publish_workspace` saves it as a W&B saved view, reusing a view of the same name;
  :func:`detect_disaggregated` tells from a project's recent runs whether they log role scopes
  (both in :mod:`fleetscope.dashboards._wandb_publish`).

Every name is re-exported here: import them (and look them up, e.g. to patch) from this module.
"""

from __future__ import annotations

from fleetscope.dashboards._wandb_panels import (
    BREAKDOWN_SECTION_NAME,
    DEFAULT_NAME,
    DEFAULT_NAME_DISAGGREGATED,
    ENGINE_KINDS,
    SECTION_NAME,
    Panel,
    Role,
    breakdown_panels,
    default_view_name,
    inference_panels,
    panel_keys,
)
from fleetscope.dashboards._wandb_publish import (
    DEFAULT_X_AXIS,
    PublishResult,
    build_section,
    detect_disaggregated,
    find_views,
    publish_workspace,
    section_fingerprint,
)

__all__ = [
    "BREAKDOWN_SECTION_NAME",
    "DEFAULT_NAME",
    "DEFAULT_NAME_DISAGGREGATED",
    "DEFAULT_X_AXIS",
    "ENGINE_KINDS",
    "SECTION_NAME",
    "Panel",
    "PublishResult",
    "Role",
    "breakdown_panels",
    "build_section",
    "default_view_name",
    "detect_disaggregated",
    "find_views",
    "inference_panels",
    "panel_keys",
    "publish_workspace",
    "section_fingerprint",
]
