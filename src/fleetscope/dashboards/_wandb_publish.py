"""Publishing the workspace to W&B and reading back what a project logs.

* :func:`publish_workspace` saves the ``Inference`` and ``RL loop`` sections (and ``Engine
  time``, a panel per window, when given the runs' window labels) as a W&B saved
  view (needs the W&B cloud and an API key): it looks up the project's views with the same
  name, skips if one already holds the same panels, updates an existing one in place if they
  differ (keeping its other sections), and creates a view only when none exists.
* :func:`detect_disaggregated` tells from a project's recent runs whether they log role scopes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleetscope.dashboards._rl_panels import RL_SECTION_NAME, rl_panels
from fleetscope.dashboards._wandb_panels import (
    BREAKDOWN_SECTION_NAME,
    SECTION_NAME,
    Panel,
    breakdown_panels,
    default_view_name,
    inference_panels,
)

DEFAULT_X_AXIS = "WallTime"  # W&B's _timestamp: polls and trainer steps on one time axis


@dataclass
class PublishResult:
    action: Literal["created", "updated", "unchanged"]
    workspace: Any  # the wandb_workspaces.workspaces.Workspace saved (or found)
    disaggregated: bool

    @property
    def url(self) -> str | None:
        try:
            url: str | None = self.workspace.url
            return url
        except Exception:  # no internal name (never saved), or no W&B API at hand
            return None


def _import_workspaces() -> Any:
    try:
        import wandb_workspaces
        import wandb_workspaces._graphql
        import wandb_workspaces.reports.v2
        import wandb_workspaces.workspaces
    except ImportError as e:
        raise ImportError(
            "publishing a W&B workspace needs 'wandb-workspaces': "
            "pip install 'fleetscope[dashboards]'"
        ) from e
    return wandb_workspaces


def _wandb_api() -> Any:
    import wandb

    return wandb.Api()


def build_section(
    panels: Sequence[Panel],
    *,
    x_axis: str = DEFAULT_X_AXIS,
    wandb_workspaces: Any = None,
    name: str = SECTION_NAME,
) -> Any:
    """A section (``wandb_workspaces.workspaces.Section``, ``Inference`` by default)."""
    mods = wandb_workspaces or _import_workspaces()
    ws, wr = mods.workspaces, mods.reports.v2
    return ws.Section(
        name=name,
        panels=[wr.LinePlot(title=p.title, x=x_axis, y=list(p.keys)) for p in panels],
        is_open=True,
        layout_settings=ws.SectionLayoutSettings(columns=3, rows=math.ceil(len(panels) / 3)),
    )


def _name(metric: Any) -> str:
    """A panel axis as a string: ``wr.Metric("x")`` (loaded views) and ``"x"`` alike."""
    return str(getattr(metric, "name", metric))


#: a section's panels as (title, x axis, y keys) each
SectionFingerprint = tuple[tuple[str | None, str, tuple[str, ...]], ...]


def section_fingerprint(section: Any) -> SectionFingerprint | None:
    """What makes two inference sections the same: each panel's title, x axis and y keys."""
    if section is None:
        return None
    return tuple(
        (
            getattr(p, "title", None),
            _name(getattr(p, "x", None)),
            tuple(_name(y) for y in (getattr(p, "y", None) or ())),
        )
        for p in section.panels
    )


def _find_section(workspace: Any, name: str = SECTION_NAME) -> Any:
    for s in getattr(workspace, "sections", None) or ():
        if s.name == name:
            return s
    return None


_LIST_VIEWS = """
query FleetscopeViews($entity: String!, $project: String!, $cursor: String) {
  project(name: $project, entityName: $entity) {
    allViews(viewType: "project-view", first: 100, after: $cursor) {
      edges { node { id name displayName } cursor }
      pageInfo { endCursor hasNextPage }
    }
  }
}
"""


def find_views(
    entity: str, project: str, name: str, *, wandb_workspaces: Any = None, api: Any = None
) -> list[Any]:
    """The project's saved views whose display name is ``name``, loaded as Workspaces."""
    mods = wandb_workspaces or _import_workspaces()
    api = api if api is not None else _wandb_api()
    found: list[Any] = []
    cursor = None
    for _ in range(50):  # at most 5,000 views
        resp = mods._graphql.execute_graphql(
            api, _LIST_VIEWS, {"entity": entity, "project": project, "cursor": cursor}
        )
        views = ((resp or {}).get("project") or {}).get("allViews") or {}
        for edge in views.get("edges") or ():
            node = edge.get("node") or {}
            internal = str(node.get("name") or "")
            if node.get("displayName") != name or not internal or internal.startswith("nwuser"):
                continue  # other views, and personal workspaces (not loadable as saved views)
            nw = internal.removeprefix("nw-").removesuffix("-v")
            # from_url reads only the path and the nw= parameter, so the host does not matter
            found.append(
                mods.workspaces.Workspace.from_url(f"https://wandb.ai/{entity}/{project}?nw={nw}")
            )
        page = views.get("pageInfo") or {}
        cursor = page.get("endCursor")
        if not page.get("hasNextPage") or not cursor:
            break
    return found


def publish_workspace(
    entity: str,
    project: str,
    *,
    disaggregated: bool,
    name: str | None = None,
    prefix: str = "inference",
    x_axis: str = DEFAULT_X_AXIS,
    wandb_workspaces: Any = None,
    api: Any = None,
    windows: Sequence[str] = (),
) -> PublishResult:
    """Save the inference section as the W&B view ``name`` of ``entity/project``, reusing;
    ``windows``: the window labels the runs use, one engine-time panel each (an ``Engine
    time`` section, docs/rules.md §3.13).

    An existing view of that name that already holds identical panels is left alone
    (``unchanged``); one whose ``Inference`` section differs (or lacks it) gets the section
    replaced in place, its other sections kept (``updated``); otherwise a view is created
    (``created``). ``wandb_workspaces`` (the module) and ``api`` (a ``wandb.Api``) can be
    passed in, e.g. fakes for tests.
    """
    mods = wandb_workspaces or _import_workspaces()
    name = name or default_view_name(disaggregated)
    ours = [
        build_section(
            inference_panels(disaggregated, prefix), x_axis=x_axis, wandb_workspaces=mods
        ),
        build_section(
            rl_panels(disaggregated, prefix),
            x_axis=x_axis,
            wandb_workspaces=mods,
            name=RL_SECTION_NAME,
        ),
    ]
    if windows:
        ours.append(
            build_section(
                breakdown_panels(windows, disaggregated, prefix),
                x_axis=x_axis,
                wandb_workspaces=mods,
                name=BREAKDOWN_SECTION_NAME,
            )
        )
    want = [section_fingerprint(s) for s in ours]
    existing = find_views(entity, project, name, wandb_workspaces=mods, api=api)
    for view in existing:
        if [section_fingerprint(_find_section(view, s.name)) for s in ours] == want:
            return PublishResult("unchanged", view, disaggregated)
    if existing:
        view = existing[0]
        sections = list(view.sections)
        for pos, section in enumerate(ours):
            for i, s in enumerate(sections):
                if s.name == section.name:
                    sections[i] = section
                    break
            else:
                sections.insert(pos, section)
        view.sections = sections
        view.save()
        return PublishResult("updated", view, disaggregated)
    view = mods.workspaces.Workspace(entity=entity, project=project, name=name, sections=ours)
    view.save()
    return PublishResult("created", view, disaggregated)


def detect_disaggregated(
    entity: str, project: str, *, prefix: str = "inference", max_runs: int = 20, api: Any = None
) -> bool:
    """True if any of the project's ``max_runs`` latest runs logged a prefill/decode scope."""
    api = api if api is not None else _wandb_api()
    scopes = (f"{prefix}/prefill/", f"{prefix}/decode/")
    runs = api.runs(f"{entity}/{project}", order="-created_at", per_page=max_runs)
    for i, run in enumerate(runs):
        if i >= max_runs:
            break
        keys = run.summary.keys()  # a wandb summary object, not a dict
        if any(str(k).startswith(scopes) for k in keys):
            return True
    return False
