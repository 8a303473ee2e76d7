"""The public API is ``fleetscope.__all__``: every name in it resolves, ``dir(fleetscope)`` lists
it, only the names needing an optional extra are imported lazily, and every ``fs.X`` /
``fleetscope.X`` / ``from fleetscope import X`` of README.md's code is in it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import fleetscope
from support.paths import ROOT

EXTRAS = ("wandb", "ray", "mlflow", "tensorboard")


def readme_code() -> str:
    """README.md's fenced blocks and inline code spans."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, flags=re.S | re.M)
    rest = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.S | re.M)
    return "\n".join([*blocks, *re.findall(r"`([^`\n]+)`", rest)])


def readme_names() -> set[str]:
    code = readme_code()
    names = set(re.findall(r"\b(?:fs|fleetscope)\.([A-Za-z_]\w*)", code))
    for group in re.findall(r"^\s*from fleetscope import ([^\n]+)", code, flags=re.M):
        names.update(n.strip() for n in group.strip("()").split(","))
    # submodules (``fleetscope.stats.deltas``) are not API names
    return {n for n in names if importlib.util.find_spec(f"fleetscope.{n}") is None}


def test_every_name_in_all_resolves_and_is_listed() -> None:
    assert len(fleetscope.__all__) == len(set(fleetscope.__all__))
    for name in fleetscope.__all__:
        assert getattr(fleetscope, name) is not None, name
    assert set(fleetscope.__all__) <= set(dir(fleetscope))


def test_only_the_names_needing_an_extra_are_lazy() -> None:
    lazy = set(fleetscope._LAZY)
    assert lazy <= set(fleetscope.__all__)
    script = (
        "import fleetscope, sys\n"
        "print(sorted(n for n in fleetscope.__all__ if n not in vars(fleetscope)))\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {EXTRAS!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == repr(sorted(lazy))  # everything else is imported by `import fleetscope`
    assert out[1] == "[]"  # and no extra is


def test_readme_names_are_public() -> None:
    names = readme_names()
    assert {"Collector", "WandbSink", "EngineId", "Parser", "stop_on_signals"} <= names, names
    assert names <= set(fleetscope.__all__), sorted(names - set(fleetscope.__all__))
