"""A W&B workspace for fleetscope runs, generated from code with ``wandb-workspaces``.

Two sections: ``RL loop`` (:mod:`fleetscope.dashboards._rl_panels`: weight updates, pauses,
versions, syncs) and ``Inference``, whose panels each pair the fleet aggregate with the cross-engine
tail that flags one sick engine (prime-rl's seven panels, plus latency, truncation and the
collector's own health):

=============================  ==============================  ==================================
panel                          colocated fleet (``agg``)       disaggregated (role-aware)
=============================  ==============================  ==================================
KV cache usage                 mean + min/max                  agg mean; decode min/max; prefill max
Preemptions /s                 sum + max                       agg sum; decode max; prefill max
Running requests               mean + min/max                  agg mean; decode min/max; prefill max
Waiting requests               mean + min/max                  agg mean; decode min/max; prefill max
Prefix cache hit rate          pooled + min                    agg pooled; prefill min; decode min
Generation tokens /s           sum + min                       agg sum; decode min
Prompt tokens /s               sum + max                       agg sum; prefill max
TTFT                           p50/p90/p99 + slowest mean      decode p50/p90/p99; slowest mean
                                                               per role
TPOT (per request), ITL        p50/p90/p99 + slowest mean      decode p50/p90/p99 + slowest mean
SGLang ITL (its own keys)      p50/p90/p99 + slowest mean      decode p50/p90/p99 + slowest mean
Truncation share (``length``)  pooled + max                    decode pooled + max (vLLM only)
Engines reporting / failures   agg                             agg + engines per role
Health conditions              ``health/*``                    ``health/*``
=============================  ==============================  ==================================

Role-aware: in disaggregated runs every tail comes from its role's scope, never from ``agg``
(``inference/decode/generation_tokens_total:rate/min``: prefill engines would pin ``agg``'s
minimum near 0 and hide a stalled decode engine), and the decode-only quantities (TPOT, ITL,
truncation: prefill requests all end with ``finished_reason=length``) use the decode scope
for the aggregate as well.

Both engine kinds: SGLang's families share vLLM's keys where the catalog maps them (one panel
for both); SGLang's inter-token latency has its own keys (``sglang_inter_token_latency_seconds``:
its count means something else) and panel; SGLang has no finish reason, so truncation is a vLLM
panel. ``inference_panels(..., engines=("vllm",))`` leaves out the other kind's panels.

* :func:`inference_panels` is the pure panel spec (titles and key names; tested against the
  keys the collector really emits).
* :func:`publish_workspace` saves it as a W&B saved view (needs the W&B cloud and an API key):
  it looks up the project's views with the same name, skips if one already holds the same
  panels, updates an existing one in place if they differ (keeping its other sections), and
  creates a view only when none exists.
* :func:`detect_disaggregated` tells from a project's recent runs whether they log role scopes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleetscope import catalog
from fleetscope.health import CONDITIONS

SECTION_NAME = "Inference"
DEFAULT_NAME = "fleetscope: inference"
DEFAULT_NAME_DISAGGREGATED = "fleetscope: inference (prefill/decode)"
DEFAULT_X_AXIS = "WallTime"  # W&B's _timestamp: polls and trainer steps on one time axis

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class Panel:
    """One line chart: its title and the metric keys it plots (in legend order)."""

    title: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Spec:
    title: str
    fleet: tuple[str, ...]  # "metric/stat" of the fleet aggregate
    tail: tuple[str, ...]  # the cross-engine tail, colocated fleets (from agg)
    role_tails: tuple[tuple[Role, tuple[str, ...]], ...]  # disaggregated: (role, tail) pairs
    fleet_role: Role | None = None  # disaggregated: aggregate from this role instead of agg
    engine: str | None = None  # an engine kind's own keys only (None: every kind's)


def _q(metric: str) -> tuple[str, ...]:
    return tuple(f"{metric}/{q}" for q in ("p50", "p90", "p99"))


# the metric names come from the catalog (an SGLang engine's are parsed under the same names)
_KV = catalog.KV_USAGE
_PRE = catalog.PREEMPTION_RATE
_RUN = catalog.RUNNING
_WAIT = catalog.WAITING
_HIT = catalog.PREFIX_HIT_RATE
_GEN = catalog.GENERATION_RATE
_PROMPT = catalog.PROMPT_RATE
_TTFT = catalog.TTFT
_TPOT = catalog.TPOT
_ITL = catalog.ITL
_SGLANG_ITL = "sglang_" + catalog.ITL  # SGLang's own ITL (docs/sglang.md: not vLLM's)
_TRUNC = catalog.LENGTH_SHARE

_SPECS: tuple[_Spec, ...] = (
    _Spec(
        "KV cache usage (mean; min/max engine)",
        (f"{_KV}/mean",),
        (f"{_KV}/min", f"{_KV}/max"),
        (("decode", (f"{_KV}/min", f"{_KV}/max")), ("prefill", (f"{_KV}/max",))),
    ),
    _Spec(
        "Preemptions /s (fleet sum; max engine)",
        (f"{_PRE}/sum",),
        (f"{_PRE}/max",),
        (("decode", (f"{_PRE}/max",)), ("prefill", (f"{_PRE}/max",))),
    ),
    _Spec(
        "Running requests (mean; min/max engine)",
        (f"{_RUN}/mean",),
        (f"{_RUN}/min", f"{_RUN}/max"),
        (("decode", (f"{_RUN}/min", f"{_RUN}/max")), ("prefill", (f"{_RUN}/max",))),
    ),
    _Spec(
        "Waiting requests (mean; min/max engine)",
        (f"{_WAIT}/mean",),
        (f"{_WAIT}/min", f"{_WAIT}/max"),
        (("decode", (f"{_WAIT}/min", f"{_WAIT}/max")), ("prefill", (f"{_WAIT}/max",))),
    ),
    _Spec(
        "Prefix cache hit rate (pooled; min engine)",
        (f"{_HIT}/pooled",),
        (f"{_HIT}/min",),
        (("prefill", (f"{_HIT}/min",)), ("decode", (f"{_HIT}/min",))),
    ),
    _Spec(
        "Generation tokens /s (fleet sum; min engine)",
        (f"{_GEN}/sum",),
        (f"{_GEN}/min",),
        (("decode", (f"{_GEN}/min",)),),
    ),
    _Spec(
        "Prompt tokens /s (fleet sum; max engine)",
        (f"{_PROMPT}/sum",),
        (f"{_PROMPT}/max",),
        (("prefill", (f"{_PROMPT}/max",)),),
    ),
    _Spec(
        "TTFT seconds (p50/p90/p99; slowest engine mean)",
        _q(_TTFT),
        (f"{_TTFT}:mean/max",),
        (("decode", (f"{_TTFT}:mean/max",)), ("prefill", (f"{_TTFT}:mean/max",))),
        fleet_role="decode",
    ),
    _Spec(
        "TPOT seconds, per request (p50/p90/p99; slowest engine mean)",
        _q(_TPOT),
        (f"{_TPOT}:mean/max",),
        (("decode", (f"{_TPOT}:mean/max",)),),
        fleet_role="decode",
    ),
    _Spec(
        "ITL seconds (p50/p90/p99; slowest engine mean)",
        _q(_ITL),
        (f"{_ITL}:mean/max",),
        (("decode", (f"{_ITL}:mean/max",)),),
        fleet_role="decode",
        engine="vllm",
    ),
    _Spec(
        "SGLang ITL seconds (p50/p90/p99; slowest engine mean)",
        _q(_SGLANG_ITL),
        (f"{_SGLANG_ITL}:mean/max",),
        (("decode", (f"{_SGLANG_ITL}:mean/max",)),),
        fleet_role="decode",
        engine="sglang",
    ),
    _Spec(  # SGLang exposes no finish reason
        "Truncation share, finished_reason=length (pooled; max engine)",
        (f"{_TRUNC}/pooled",),
        (f"{_TRUNC}/max",),
        (("decode", (f"{_TRUNC}/max",)),),
        fleet_role="decode",
        engine="vllm",
    ),
    _Spec(
        "Collector: engines reporting, scrape failures",
        ("engines_reporting", "scrape_failures"),
        (),
        (("prefill", ("engines_reporting",)), ("decode", ("engines_reporting",))),
    ),
)


ENGINE_KINDS: tuple[str, ...] = ("vllm", "sglang")


def inference_panels(
    disaggregated: bool, prefix: str = "inference", engines: Iterable[str] = ENGINE_KINDS
) -> list[Panel]:
    """The inference section's panels. ``disaggregated``: take tails from role scopes;
    ``engines``: the engine kinds of the fleet (a kind's own panels only for those)."""
    panels: list[Panel] = []
    kinds = set(engines)
    for s in _SPECS:
        if s.engine is not None and s.engine not in kinds:
            continue
        if disaggregated:
            scope = s.fleet_role or "agg"
            keys = [f"{prefix}/{scope}/{k}" for k in s.fleet]
            for role, tail in s.role_tails:
                keys += [f"{prefix}/{role}/{k}" for k in tail]
        else:
            keys = [f"{prefix}/agg/{k}" for k in (*s.fleet, *s.tail)]
        panels.append(Panel(s.title, tuple(dict.fromkeys(keys))))
    panels.append(
        Panel(
            "Health: engines in each condition",
            tuple(f"{prefix}/health/{c}" for c in CONDITIONS),
        )
    )
    return panels


def panel_keys(panels: Iterable[Panel]) -> set[str]:
    """Every metric key the panels reference."""
    return {k for p in panels for k in p.keys}


def default_view_name(disaggregated: bool) -> str:
    return DEFAULT_NAME_DISAGGREGATED if disaggregated else DEFAULT_NAME


# --------------------------------------------------------------------------- W&B


@dataclass
class PublishResult:
    action: Literal["created", "updated", "unchanged"]
    workspace: Any  # the wandb_workspaces.workspaces.Workspace saved (or found)
    disaggregated: bool

    @property
    def url(self) -> str | None:
        try:
            return self.workspace.url
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


def section_fingerprint(section: Any) -> tuple | None:
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
) -> PublishResult:
    """Save the inference section as the W&B view ``name`` of ``entity/project``, reusing.

    An existing view of that name that already holds identical panels is left alone
    (``unchanged``); one whose ``Inference`` section differs (or lacks it) gets the section
    replaced in place, its other sections kept (``updated``); otherwise a view is created
    (``created``). ``wandb_workspaces`` (the module) and ``api`` (a ``wandb.Api``) can be
    passed in, e.g. fakes for tests.
    """
    from fleetscope.dashboards._rl_panels import RL_SECTION_NAME, rl_panels

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
