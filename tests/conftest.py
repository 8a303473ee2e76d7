"""Fixtures and hooks shared by every test folder. Helpers live in :mod:`support`
(``tests/support``: paths, body editing, the PromQL reference, loopback servers, ...)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.paths import FIXTURES


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``inline_only`` tests read in-process internals: no ``[process]`` variant of them."""
    keep = []
    for item in items:
        params = getattr(item, "callspec", None)
        mode = params.params.get("isolation") if params is not None else None
        if mode == "process" and item.get_closest_marker("inline_only") is not None:
            continue
        keep.append(item)
    items[:] = keep
