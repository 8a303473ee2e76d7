"""User-defined scopes: per endpoint groups and one scope per served model."""

from __future__ import annotations

from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState
from fleetscope.sources.base import ScrapeResult
from support.paths import FIXTURES

SINGLE = FIXTURES / "vllm-0.32.0-cpu"


def _scrape(
    name: str, parser: Parser, body: str, t: float, groups: tuple[str, ...] = ()
) -> ScrapeResult:
    return ScrapeResult(name, parser.parse(body, time=t, wall_time=t), t, t, groups=groups)


def test_group_by_model_and_endpoint_groups_are_scopes() -> None:
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


def test_many_user_scopes_stay_within_the_key_budget() -> None:
    """Hundreds of user scopes (one per model) do not blow the key budget: agg stays
    complete, the model scopes keep their headline metrics."""
    from fleetscope.keys import DEFAULT_KEY_BUDGET, KeyOptions

    body0 = (SINGLE / "dp2_idle.prom").read_text()
    body1 = (SINGLE / "dp2_load.prom").read_text()
    small = FleetState(key_options=KeyOptions(), group_by_model=True)
    state = FleetState(key_options=KeyOptions(), group_by_model=True)
    parsers = [Parser() for _ in range(200)]
    for st, n in ((small, 1), (state, 200)):
        for body, t in ((body0, 0.0), (body1, 10.0)):
            polls = [
                _scrape(f"server{i}", parsers[i], body.replace("tinymodel", f"m{i}"), t)
                for i in range(n)
            ]
            poll = st.observe(polls)
        if n == 1:
            agg_keys = {k for k in poll.keys if k.startswith("inference/agg/")}
    keys = poll.keys
    assert len(poll.stats.scopes) == 201  # agg + 200 model scopes
    assert len(keys) <= DEFAULT_KEY_BUDGET + 100  # + the collector's own health keys
    assert agg_keys <= set(keys)  # agg is complete
    assert "inference/model:m7/generation_tokens_total:rate/sum" in keys
    assert "inference/model:m7/time_to_first_token_seconds/p90" in keys
    assert "inference/model:m7/num_requests_running/max" not in keys  # headline stats only
    assert "inference/model:m7/request_params_n_sum/sum" not in keys
