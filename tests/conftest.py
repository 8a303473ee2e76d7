"""Fixtures and hooks shared by every test folder. Helpers live in :mod:`support`
(``tests/support``: paths, body editing, the PromQL reference, loopback servers, ...)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.paths import FIXTURES, ROOT


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    assert FIXTURES.is_dir(), f"fixtures not found at {FIXTURES}"
    return FIXTURES


# ``isolation``: run a test module in both collector modes, in-process and with the work in a
# child process (``pytestmark = pytest.mark.usefixtures("isolation")``). In ``process`` mode
# every ``Collector(...)`` the test builds without an explicit isolation runs in a child.
@pytest.fixture(params=["inline", "process"])
def isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "process":
        import fleetscope.collector.process as iso

        def every_collector(endpoints: Sequence[object], options: Mapping[str, Any]) -> bool:
            cfg = options.get("config")
            explicit = options.get("isolation") or (cfg.isolation if cfg is not None else None)
            return explicit in (None, "process", "auto")

        monkeypatch.setattr(iso, "wants_process", every_collector)
    return str(request.param)


# --------------------------------------------------------------------------- the fast tier

# `make test-fast` runs `pytest -m "not slow"`; `make test` runs everything. Slow are: modules
# and tests marked in their file (`pytestmark = pytest.mark.slow`), every `[process]` variant of
# the `isolation` fixture (a child process per collector), and the tests below ("file" or
# "file::test", every parameter of it): each takes about 1.5 s or more on a 2-core machine (real
# Prometheus, Ray, W&B, tmux or CLI processes, long scenarios), or shares a module fixture that
# does. An entry that matches nothing in a collected file fails the collection.
SLOW_TESTS = (
    "tests/cli/test_cli_watch.py::test_stop_on_signals_asyncio_mode_stops_a_real_collector",
    "tests/cli/test_cli_watch.py::test_watch_stops_cleanly_on_signal",
    "tests/cli/test_demo_wandb.py",
    "tests/cli/test_endpoints_file.py::test_a_file_replaced_by_a_rename_is_applied_at_the_next_read",
    "tests/cli/test_endpoints_file.py::"
    "test_a_server_that_leaves_the_file_and_returns_keeps_its_name",
    "tests/cli/test_endpoints_file.py::test_watch_empties_its_fleet_only_once_the_file_stays_empty",
    "tests/cli/test_endpoints_file.py::"
    "test_watch_keeps_its_fleet_while_the_file_is_empty_for_a_moment",
    "tests/cli/test_endpoints_file.py::test_watch_never_applies_a_line_cut_mid_port",
    "tests/cli/test_policy_version_file.py",
    "tests/cli/test_readme_commands.py",
    "tests/collector/test_architecture.py::test_sharded_shards_receive_every_option",
    "tests/collector/test_engine_time.py",
    "tests/collector/test_fleet_changes.py::test_watch_follows_an_endpoints_file",
    "tests/collector/test_health.py::test_condition_names_the_sick_engine_and_only_it",
    "tests/collector/test_health.py::test_healthy_fleet_reports_nothing",
    "tests/collector/test_health.py::test_stall_needs_stall_seconds_of_real_time",
    "tests/collector/test_isolation.py",
    "tests/collector/test_rl_lifecycle.py::test_a_slow_weight_info_never_lengthens_the_poll",
    "tests/collector/test_rl_lifecycle.py::test_an_engine_that_misses_a_version_is_stale",
    "tests/collector/test_rl_lifecycle.py::"
    "test_endpoints_without_weight_info_are_unknown_and_not_asked_again",
    "tests/collector/test_rl_lifecycle.py::test_weight_sync_during_an_open_window_is_exact",
    "tests/collector/test_rl_states.py::"
    "test_paused_and_sleeping_seconds_per_endpoint_role_fleet_window_and_run",
    "tests/collector/test_soak.py",
    "tests/collector/test_trainer_safety.py::test_a_blocked_sink_never_stops_polling_nor_a_window",
    "tests/collector/test_trainer_safety.py::test_churning_engine_labels_stay_bounded",
    "tests/collector/test_trainer_safety.py::test_overload_is_counted_and_warned",
    "tests/collector/test_trainer_safety.py::test_trickling_side_requests_never_slow_a_poll",
    "tests/dashboards/test_grafana.py::test_every_default_expression_runs_and_returns_data",
    "tests/dashboards/test_grafana.py::test_exact_prefix_dashboards",
    "tests/dashboards/test_grafana.py::test_names_as_stored",
    "tests/dashboards/test_grafana.py::test_role_awareness",
    "tests/dashboards/test_grafana.py::test_variable_queries_list_jobs_and_roles",
    "tests/dashboards/test_grafana_rl.py",
    "tests/dashboards/test_wandb_workspace.py::test_every_panel_key_is_emitted",
    "tests/dashboards/test_wandb_workspace.py::test_scenarios_emit_what_the_check_needs",
    "tests/simulate/test_prom_support.py",
    "tests/simulate/test_simulate.py::test_http_scrapes_consistent_while_stepping",
    "tests/simulate/test_simulate.py::test_server_with_256_endpoints_and_auto_stepping",
    "tests/sinks/test_sinks_jsonl_wandb.py::test_wandb_alerts_for_health_events",
    "tests/sinks/test_sinks_jsonl_wandb.py::"
    "test_wandb_offline_run_reads_back_equal_to_input_and_jsonl",
    "tests/sinks/test_sinks_jsonl_wandb.py::test_wandb_trainer_owned_run",
    "tests/sinks/test_sinks_tb_mlflow.py::test_mlflow_batches",
    "tests/sinks/test_sinks_tb_mlflow.py::test_mlflow_histories",
    "tests/sinks/test_sinks_tb_mlflow.py::test_mlflow_latest_values_and_summary",
    "tests/sinks/test_sinks_tb_mlflow.py::test_scenario_is_big_enough",
    "tests/sinks/test_sinks_tb_mlflow.py::test_tensorboard_reads_back_every_poll",
    "tests/sinks/test_sinks_tb_mlflow.py::test_tensorboard_summary",
    "tests/sinks/test_terminal_tmux.py",
    "tests/sinks/test_wandb_key_sets.py",
    "tests/sinks/test_wandb_trainer_run.py",
    "tests/sources/test_prometheus_source.py::"
    "test_openmetrics_underscore_names_map_back_and_new_families_are_typed",
    "tests/sources/test_prometheus_source.py::test_prometheus_source_matches_direct_scraping",
    "tests/sources/test_ray.py",
    "tests/sources/test_sharded.py::test_sharded_collector_follows_fleet_changes",
    "tests/sources/test_sharded.py::test_sharded_collector_matches_one_collector",
    "tests/sources/test_sharded.py::test_sharded_collector_reports_the_same_rl_figures",
    "tests/stats/test_groups.py::test_many_user_scopes_stay_within_the_key_budget",
    "tests/stats/test_keys_budget_and_sets.py::"
    "test_over_the_budget_every_engines_headlines_then_tails",
)


def _slow_entry(item: pytest.Item) -> tuple[str, str]:
    path = item.path.relative_to(ROOT).as_posix()
    return path, f"{path}::{item.nodeid.partition('::')[2].split('[')[0]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``inline_only`` tests read in-process internals: no ``[process]`` variant of them.
    Slow tests get the ``slow`` marker (above)."""
    keep = []
    used: set[str] = set()
    files: set[str] = set()
    slow = set(SLOW_TESTS)
    for item in items:
        params = getattr(item, "callspec", None)
        mode = params.params.get("isolation") if params is not None else None
        if mode == "process" and item.get_closest_marker("inline_only") is not None:
            continue
        path, test = _slow_entry(item)
        files.add(path)
        hits = {path, test} & slow
        used |= hits
        if hits or mode == "process":
            item.add_marker(pytest.mark.slow)
        keep.append(item)
    items[:] = keep
    stale = [e for e in SLOW_TESTS if e.split("::")[0] in files and e not in used]
    if stale:
        raise pytest.UsageError(f"SLOW_TESTS entries that match no test: {stale}")
