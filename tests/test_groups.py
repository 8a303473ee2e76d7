"""User-defined scopes: per endpoint groups and one scope per served model."""

from __future__ import annotations

from conftest import FIXTURES
from fleetscope.exposition import Parser
from fleetscope.fleet import FleetState, ScrapeResult

SINGLE = FIXTURES / "vllm-0.32.0-cpu"


def _scrape(name: str, parser: Parser, body: str, t: float, groups=()) -> ScrapeResult:
    return ScrapeResult(name, parser.parse(body, time=t, wall_time=t), t, t, groups=groups)


def test_group_by_model_and_endpoint_groups_are_scopes():
    a0 = (SINGLE / "single_load.prom").read_text()
    a1 = (SINGLE / "single_after.prom").read_text()
    b0 = (SINGLE / "dp2_idle.prom").read_text().replace("tinymodel", "othermodel")
    b1 = (SINGLE / "dp2_load.prom").read_text().replace("tinymodel", "othermodel")
    state = FleetState(group_by_model=True)
    pa, pb = Parser(), Parser()
    state.observe([_scrape("server0", pa, a0, 0.0, ("rack1",)), _scrape("server1", pb, b0, 0.0)])
    poll = state.observe(
        [_scrape("server0", pa, a1, 10.0, ("rack1",)), _scrape("server1", pb, b1, 10.0)]
    )
    scopes = poll.stats.scopes
    assert scopes["model:tinymodel"].engines == 1
    assert scopes["model:othermodel"].engines == 2
    assert scopes["rack1"].engines == 1
    gen = "generation_tokens_total"
    total = scopes["agg"].metrics[gen]["delta"]
    parts = scopes["model:tinymodel"].metrics[gen]["delta"]
    parts += scopes["model:othermodel"].metrics[gen]["delta"]
    assert total == parts  # the model scopes partition the fleet exactly
    assert scopes["rack1"].metrics[gen]["delta"] == scopes["model:tinymodel"].metrics[gen]["delta"]
    assert f"inference/model:othermodel/{gen}/delta" in poll.keys
