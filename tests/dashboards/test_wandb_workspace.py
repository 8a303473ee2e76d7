"""The W&B inference workspace: every panel points at keys the collector really emits, the
role-aware variant takes its tails from role scopes, and publishing reuses views.

``publish_workspace`` needs the W&B cloud, so it runs here against a fake backend: the real
``wandb_workspaces`` classes (so every argument is checked by the library's own validators and
views make the same ``_to_model``/``_from_model`` round trip as on W&B) with ``save`` and
``from_url`` patched to an in-memory store, and a fake ``execute_graphql`` answering the
view-listing query.
"""

from __future__ import annotations

import asyncio
import io
import json
from contextlib import redirect_stdout
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from fleetscope.cli import main
from fleetscope.collector.core import Collector
from fleetscope.dashboards import wandb_workspace as ww
from fleetscope.health import CONDITIONS
from fleetscope.identity import Role
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet

# wandb-workspaces still uses pydantic v1-style validators
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic V1 style:DeprecationWarning")

# --------------------------------------------------------------------------- emitted keys


async def _emitted(roles: list[Role | None], polls: int = 4, kind: str = "vllm") -> set[str]:
    fleet = SimFleet.build(len(roles), dp=2, roles=roles, seed=11, engine_kind=kind)
    fleet.step(3.0)
    keys: set[str] = set()
    with FleetServer(fleet) as server:
        endpoints = [
            Endpoint(url, role=ep.role)
            for url, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        collector = Collector(endpoints, interval=3600)
        for _ in range(polls):
            view = await collector.poll()
            keys |= set(view.keys)
            fleet.step(2.0)
        await collector.stop()
    return keys


@pytest.fixture(scope="module")
def plain_keys() -> set[str]:
    return asyncio.run(_emitted([None, None]))


@pytest.fixture(scope="module")
def disaggregated_keys() -> set[str]:
    return asyncio.run(_emitted(["prefill", "decode", "decode"]))


def _missing(panels: list[ww.Panel], emitted: set[str]) -> dict[str, list[str]]:
    return {
        p.title: missing for p in panels if (missing := [k for k in p.keys if k not in emitted])
    }


def test_scenarios_emit_what_the_check_needs(
    plain_keys: set[str], disaggregated_keys: set[str]
) -> None:
    """Not vacuous: the sets are real polls, with health keys and (only) the roles expected."""
    for keys in (plain_keys, disaggregated_keys):
        assert len(keys) > 1000
        assert {f"inference/health/{c}" for c in CONDITIONS} <= keys
    assert not any(k.startswith(("inference/decode/", "inference/prefill/")) for k in plain_keys)
    assert "inference/decode/generation_tokens_total:rate/min" in disaggregated_keys


@pytest.mark.parametrize("disaggregated", [False, True])
def test_every_panel_key_is_emitted(
    disaggregated: bool, plain_keys: set[str], disaggregated_keys: set[str]
) -> None:
    panels = ww.inference_panels(disaggregated, engines=("vllm",))
    assert _missing(panels, disaggregated_keys) == {}
    if not disaggregated:  # the colocated view also works on a plain fleet
        assert _missing(panels, plain_keys) == {}


def test_a_panel_pointing_at_nothing_is_caught(plain_keys: set[str]) -> None:
    panels = ww.inference_panels(False, engines=("vllm",))
    bad = [*panels, ww.Panel("typo", ("inference/agg/kv_cache_usage/mean",))]
    assert _missing(bad, plain_keys) == {"typo": ["inference/agg/kv_cache_usage/mean"]}


# prime-rl's seven panels: (metric, aggregate stat, tail stats)
PRIME_RL = [
    ("kv_cache_usage_perc", "mean", {"min", "max"}),
    ("num_preemptions_total:rate", "sum", {"max"}),
    ("num_requests_running", "mean", {"min", "max"}),
    ("num_requests_waiting", "mean", {"min", "max"}),
    ("prefix_cache_hit_rate", "pooled", {"min"}),
    ("generation_tokens_total:rate", "sum", {"min"}),
    ("prompt_tokens_total:rate", "sum", {"max"}),
]


def _split(key: str) -> tuple[str, str, str]:
    """inference/{scope}/{metric}/{stat} -> (scope, metric, stat)."""
    _, scope, rest = key.split("/", 2)
    metric, _, stat = rest.rpartition("/")
    return scope, metric, stat


@pytest.mark.parametrize("disaggregated", [False, True])
def test_prime_rl_panels_pair_aggregate_with_tail(disaggregated: bool) -> None:
    panels = ww.inference_panels(disaggregated)
    assert len(panels) >= 7
    for panel, (metric, agg_stat, tails) in zip(panels, PRIME_RL, strict=False):
        parts = [_split(k) for k in panel.keys]
        assert {m for _, m, _ in parts} == {metric}, panel.title
        assert parts[0] == ("agg", metric, agg_stat), panel.title
        assert {s for _, _, s in parts[1:]} == tails, panel.title
    titles = " ".join(p.title for p in panels)
    for needed in ("TTFT", "TPOT", "ITL", "Truncation", "engines reporting", "Health"):
        assert needed in titles
    every = ww.panel_keys(panels)
    assert {f"inference/health/{c}" for c in CONDITIONS} <= every
    assert "inference/agg/engines_reporting" in every and "inference/agg/scrape_failures" in every
    for m in ("time_to_first_token_seconds", "request_time_per_output_token_seconds"):
        scope = "decode" if disaggregated else "agg"
        assert {f"inference/{scope}/{m}/{q}" for q in ("p50", "p90", "p99")} <= every
    assert any("length_finished_share" in k for k in every)


def test_role_aware_tails_come_from_role_scopes() -> None:
    plain = ww.inference_panels(False)
    role = ww.inference_panels(True)
    assert [p.title for p in plain] == [p.title for p in role]
    for p in role:
        for key in p.keys[1:]:
            scope, _, stat = _split(key)
            if stat in ("min", "max"):
                assert scope in ("prefill", "decode"), key
    every = ww.panel_keys(role)
    assert "inference/decode/generation_tokens_total:rate/min" in every
    assert "inference/agg/generation_tokens_total:rate/min" not in every
    assert "inference/prefill/generation_tokens_total:rate/min" not in every
    assert "inference/decode/length_finished_share/pooled" in every  # prefill ends on length
    assert not any(
        k.startswith(("inference/decode/", "inference/prefill/")) for k in ww.panel_keys(plain)
    )


def test_prefix() -> None:
    keys = ww.panel_keys(ww.inference_panels(True, prefix="rollout"))
    assert all(k.startswith("rollout/") for k in keys)


# --------------------------------------------------------------------------- publishing


class FakeWandb:
    """An in-memory W&B project: saved views as the library's own ``internal.View`` models."""

    def __init__(self, ws: Any, page_size: int = 2) -> None:
        self.ws = ws
        self.views: dict[str, Any] = {}  # internal name -> internal.View
        self.saves: list[str] = []
        self.queries = 0
        self.page_size = page_size
        self.extra_nodes: list[dict[str, str]] = []  # listed views that are not loadable

    def save(self, workspace: Any) -> Any:
        """As ``Workspace.save``: the view's spec goes out as JSON (``upsert_view2``)."""
        model = workspace._to_model()
        if not model.name:
            n = len(self.views) + 1
            model.name, model.id = f"nw-view{n}-v", f"id{n}"
        spec = model.spec.model_dump_json(by_alias=True, exclude_none=True)
        self.views[model.name] = model.model_copy(update={"spec": self._parse(spec)})
        self.saves.append(model.name)
        workspace._internal_name, workspace._internal_id = model.name, model.id
        return workspace

    def _parse(self, spec_json: str) -> Any:
        from wandb_workspaces.workspaces import internal

        return internal.WorkspaceViewspec.model_validate_json(spec_json)

    def load(self, url: str) -> Any:
        """As ``Workspace.from_url``: the view comes back from its JSON spec."""
        parsed = urlparse(url)
        _, entity, project = parsed.path.split("/")
        nw = parse_qs(parsed.query)["nw"][0]
        model = self.views[f"nw-{nw}-v"]
        assert (entity, project) == (model.entity, model.project)
        spec = self._parse(model.spec.model_dump_json(by_alias=True, exclude_none=True))
        return self.ws.Workspace._from_model(model.model_copy(update={"spec": spec}))

    def execute_graphql(self, api: Any, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        assert "allViews" in query and variables["entity"] == "ent"
        self.queries += 1
        nodes = [*self.extra_nodes]
        nodes += [
            {"id": v.id, "name": name, "displayName": v.display_name}
            for name, v in self.views.items()
        ]
        start = int(variables.get("cursor") or 0)
        page = nodes[start : start + self.page_size]
        end = start + len(page)
        return {
            "project": {
                "allViews": {
                    "edges": [{"node": n, "cursor": str(start + i)} for i, n in enumerate(page)],
                    "pageInfo": {"endCursor": str(end), "hasNextPage": end < len(nodes)},
                }
            }
        }


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeWandb, Any]:
    import wandb_workspaces  # noqa: F401  # the test extra installs it: fail loudly
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    backend = FakeWandb(ws)
    monkeypatch.setattr(ws.Workspace, "save", lambda self: backend.save(self))
    monkeypatch.setattr(ws.Workspace, "from_url", classmethod(lambda cls, url: backend.load(url)))
    module = SimpleNamespace(
        workspaces=ws,
        reports=SimpleNamespace(v2=wr),
        _graphql=SimpleNamespace(execute_graphql=backend.execute_graphql),
    )
    return backend, module


def _publish(module: Any, disaggregated: bool, **kw: Any) -> ww.PublishResult:
    return ww.publish_workspace(
        "ent", "proj", disaggregated=disaggregated, wandb_workspaces=module, api=object(), **kw
    )


def _saved_panels(backend: FakeWandb, name: str) -> list[tuple[str, str, list[str]]]:
    view = backend.ws.Workspace._from_model(backend.views[name])
    (section,) = [s for s in view.sections if s.name == ww.SECTION_NAME]
    return [(p.title, p.x.name, [y.name for y in p.y]) for p in section.panels]


def test_publish_creates_the_view(fake: tuple[FakeWandb, Any]) -> None:
    backend, module = fake
    result = _publish(module, False)
    assert result.action == "created" and backend.saves == ["nw-view1-v"]
    model = backend.views["nw-view1-v"]
    assert (model.entity, model.project, model.display_name) == ("ent", "proj", ww.DEFAULT_NAME)
    assert _saved_panels(backend, "nw-view1-v") == [
        (p.title, "WallTime", list(p.keys)) for p in ww.inference_panels(False)
    ]
    section = model.spec.section.panel_bank_config.sections[0]
    assert section.is_open and section.name == "Inference"


def test_publish_reuses_updates_and_keeps_other_sections(fake: tuple[FakeWandb, Any]) -> None:
    backend, module = fake
    assert _publish(module, False, name="fleet").action == "created"
    assert _publish(module, False, name="fleet").action == "unchanged"
    assert backend.saves == ["nw-view1-v"]  # nothing piled up
    # a user adds a section of their own to the saved view
    ws = backend.ws
    view = ws.Workspace._from_model(backend.views["nw-view1-v"])
    view.sections.append(ws.Section(name="My charts", panels=[]))
    backend.save(view)
    # the panel spec changes (here: the role-aware variant under the same name): in place
    result = _publish(module, True, name="fleet")
    assert result.action == "updated"
    assert list(backend.views) == ["nw-view1-v"] and backend.views["nw-view1-v"].id == "id1"
    assert [s.name for s in ws.Workspace._from_model(backend.views["nw-view1-v"]).sections] == [
        "Inference",
        "RL loop",
        "My charts",
    ]
    assert _saved_panels(backend, "nw-view1-v") == [
        (p.title, "WallTime", list(p.keys)) for p in ww.inference_panels(True)
    ]
    assert _publish(module, True, name="fleet").action == "unchanged"


def test_publish_default_names_keep_both_variants(fake: tuple[FakeWandb, Any]) -> None:
    backend, module = fake
    backend.extra_nodes = [
        {"id": "u1", "name": "nwuser-someone", "displayName": ww.DEFAULT_NAME},  # personal
        {"id": "o1", "name": "nw-other-v", "displayName": "someone else's view"},
    ]
    assert _publish(module, False).action == "created"
    assert _publish(module, True).action == "created"
    assert _publish(module, False).action == "unchanged"
    assert _publish(module, True).action == "unchanged"
    names = {v.display_name for v in backend.views.values()}
    assert names == {ww.DEFAULT_NAME, ww.DEFAULT_NAME_DISAGGREGATED}
    assert len(backend.saves) == 2


def test_publish_with_a_duplicate_skips(fake: tuple[FakeWandb, Any]) -> None:
    backend, module = fake
    _publish(module, False)
    backend.views["nw-copy-v"] = backend.views["nw-view1-v"].model_copy(
        update={"name": "nw-copy-v", "id": "copy"}
    )
    saves = list(backend.saves)
    assert _publish(module, False).action == "unchanged"
    assert backend.saves == saves


def test_publish_section_missing_from_existing_view(fake: tuple[FakeWandb, Any]) -> None:
    backend, module = fake
    ws = backend.ws
    backend.save(ws.Workspace(entity="ent", project="proj", name=ww.DEFAULT_NAME, sections=[]))
    assert _publish(module, False).action == "updated"
    assert len(backend.views) == 1
    assert len(_saved_panels(backend, "nw-view1-v")) == len(ww.inference_panels(False))


def test_detect_disaggregated() -> None:
    def api(summaries: list[list[str]]) -> Any:
        runs = [SimpleNamespace(summary={k: 1 for k in keys}) for keys in summaries]
        return SimpleNamespace(runs=lambda path, order, per_page: iter(runs))

    plain = [["inference/agg/x/mean", "loss"], ["inference/server0.0/x"]]
    assert not ww.detect_disaggregated("e", "p", api=api(plain))
    assert ww.detect_disaggregated("e", "p", api=api([*plain, ["inference/decode/x/min"]]))
    assert not ww.detect_disaggregated(
        "e", "p", api=api([*plain, ["inference/decode/x/min"]]), max_runs=2
    )


def test_cli_dry_run_and_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["dashboard", "wandb", "--entity", "e", "--project", "p", "--dry-run",
                     "--role-aware"]) == 0  # fmt: skip
    spec = json.loads(out.getvalue())
    assert spec["disaggregated"] is True
    assert [(p["title"], p["keys"]) for p in spec["panels"]] == [
        (p.title, list(p.keys)) for p in ww.inference_panels(True)
    ]

    calls: list[tuple[str, Any]] = []

    def publish(entity: str, project: str, **kw: Any) -> ww.PublishResult:
        calls.append(("publish", kw))
        ws = SimpleNamespace(name=kw["name"] or ww.default_view_name(kw["disaggregated"]))
        return ww.PublishResult("created", ws, kw["disaggregated"])

    monkeypatch.setattr(ww, "publish_workspace", publish)
    monkeypatch.setattr(ww, "detect_disaggregated", lambda *a, **k: True)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["dashboard", "wandb", "--entity", "e", "--project", "p"]) == 0
    assert calls[-1][1]["disaggregated"] is True  # --auto is the default
    assert out.getvalue().startswith("created: role-aware")
    with redirect_stdout(io.StringIO()):
        main(["dashboard", "wandb", "--entity", "e", "--project", "p", "--plain"])
    assert calls[-1][1]["disaggregated"] is False


# --------------------------------------------------------------------------- the RL loop


async def _rl_emitted(roles: list[Role | None]) -> set[str]:
    """A run with the whole RL loop: versions (one endpoint misses one), a pause, a sleep, a
    weight sync with the engines' own update calls (an operation in flight)."""
    from fleetscope.dashboards._rl_panels import OPERATIONS

    fleet = SimFleet.build(len(roles), dp=2, roles=roles, seed=5)
    fleet.step(3.0)
    keys: set[str] = set()
    with FleetServer(fleet) as server:
        eps = [
            Endpoint(u, role=ep.role) for u, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        c = Collector(eps, interval=3600, rl_probes=True)
        first, last = fleet.endpoints[0], fleet.endpoints[-1]

        async def poll() -> None:
            fleet.step(1.0)
            keys.update((await c.poll()).keys)

        await poll()
        c.set_policy_version("v0")
        first.pause()
        last.sleep(1)
        await poll()
        async with c.weight_sync("v1") as sync:
            fleet.step(1.0)
            first.simulate_weight_update("v1", dict.fromkeys(OPERATIONS, 0.2))
            first.rl.set_in_flight("update", 1)
            await poll()
        keys.update(sync.keys)
        first.resume()
        last.wake_up()
        await poll()
        await poll()
        await c.stop()
    return keys


@pytest.mark.parametrize("roles", [[None, None], ["prefill", "decode", "decode"]])
def test_every_rl_panel_key_is_emitted(roles: list[Role | None]) -> None:
    from fleetscope.dashboards._rl_panels import rl_panels

    emitted = asyncio.run(_rl_emitted(roles))
    panels = rl_panels(disaggregated=roles[0] is not None)
    assert len(panels) == 8
    assert _missing(panels, emitted) == {}


@pytest.mark.parametrize("roles", [[None, None, None], ["prefill", "decode", "decode"]])
def test_panels_of_mixed_and_sglang_fleets_are_emitted(roles: list[Role | None]) -> None:
    """A mixed vLLM + SGLang fleet fills every panel of both kinds. An SGLang-only fleet fills
    every panel but vLLM's own (truncation: SGLang has no finish reason) and preemptions when
    the simulated SGLang servers retracted nothing (a missing series is missing, never 0)."""
    disaggregated = roles[0] is not None
    mixed = asyncio.run(_emitted(roles, kind="mixed"))
    assert _missing(ww.inference_panels(disaggregated), mixed) == {}
    sglang = asyncio.run(_emitted(roles, kind="sglang"))
    assert not [k for k in sglang if "inference/agg/inter_token_latency_seconds/" in k]
    missing = _missing(ww.inference_panels(disaggregated, engines=("sglang",)), sglang)
    retracted = any("num_preemptions_total" in k for k in sglang)
    assert set(missing) <= ({"Preemptions /s (fleet sum; max engine)"} if not retracted else set())
    titles = [p.title for p in ww.inference_panels(disaggregated, engines=("sglang",))]
    assert any(t.startswith("SGLang ITL") for t in titles)
    assert not any(t.startswith("Truncation") for t in titles)


# --------------------------------------------------------------------------- engine time


async def _window_keys(roles: list[Role | None]) -> set[str]:
    """Every key of a run with a ``train`` and an ``eval`` window (simulated time)."""
    from support.simsource import SimSource

    fleet = SimFleet.build(len(roles), dp=2, roles=roles, seed=11)
    fleet.step(3.0)
    c = Collector(source=SimSource(fleet), interval=3600, fetch_model_info=False)
    keys: set[str] = set()
    await c.poll()
    for label in ("train", "eval"):
        w = c.window(label)
        fleet.step(1.0)
        await w.astart()
        for _ in range(3):
            fleet.step(1.0)
            keys |= set((await c.poll()).keys)
        fleet.step(1.0)
        keys |= set(await w.astop())
    await c.stop()
    return keys


@pytest.mark.parametrize("roles", [[None, None], ["prefill", "decode"]])
def test_every_engine_time_panel_key_is_emitted(roles: list[Role | None]) -> None:
    emitted = asyncio.run(_window_keys(roles))
    disaggregated = roles[0] is not None
    panels = ww.breakdown_panels(("train", "eval"), disaggregated)
    assert len(panels) == (6 if disaggregated else 2)  # a panel per window (and role)
    assert _missing(panels, emitted) == {}
    assert all(len(p.keys) == 5 for p in panels)
    assert _missing(ww.breakdown_panels(["rollout"], disaggregated), emitted)  # never stopped


def test_publish_adds_an_engine_time_section_for_the_windows_given(
    fake: tuple[FakeWandb, Any],
) -> None:
    backend, module = fake
    assert _publish(module, False, name="fleet").action == "created"
    assert _publish(module, False, name="fleet", windows=["train"]).action == "updated"
    view = backend.ws.Workspace._from_model(backend.views["nw-view1-v"])
    assert [s.name for s in view.sections] == ["Inference", "RL loop", "Engine time"]
    (section,) = [s for s in view.sections if s.name == ww.BREAKDOWN_SECTION_NAME]
    assert [[y.name for y in p.y] for p in section.panels] == [
        list(p.keys) for p in ww.breakdown_panels(["train"], False)
    ]
    assert _publish(module, False, name="fleet", windows=["train"]).action == "unchanged"


def test_cli_dry_run_shows_a_panel_per_window() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        argv = ["dashboard", "wandb", "--entity", "e", "--project", "p", "--dry-run", "--plain"]
        assert main(argv) == 0
    spec = json.loads(out.getvalue())
    assert spec["breakdown_section"] == "Engine time"
    assert [p["keys"][0] for p in spec["breakdown_panels"]] == [
        "inference/train/agg/engine_time/idle_share",
        "inference/eval/agg/engine_time/idle_share",
    ]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*argv, "--window", "rollout"]) == 0
    titles = [p["title"] for p in json.loads(out.getvalue())["breakdown_panels"]]
    assert len(titles) == 1 and "rollout" in titles[0]
