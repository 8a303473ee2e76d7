"""Cyclomatic complexity (ruff's C901, pyproject.toml ``[tool.ruff.lint.mccabe]``): no function
over 15 anywhere, except the exposition tokenizer.

``parse_sample`` (src/fleetscope/exposition/_syntax.py) reads a sample line character by
character in one loop, the parser's hottest code: splitting it would cost a call per token.
Its file is exempt from C901 in the lint config; this test holds it to 30.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "src" / "fleetscope" / "exposition" / "_syntax.py"
TOKENIZER_MAX = 30

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff is not installed"
)


def _c901(path: Path, max_complexity: int) -> subprocess.CompletedProcess[str]:
    """ruff's C901 alone on ``path``, ignoring the project's config (and its exemption)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--select",
            "C901",
            "--config",
            f"lint.mccabe.max-complexity={max_complexity}",
            "--output-format",
            "concise",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_the_tokenizer_stays_within_its_allowance() -> None:
    out = _c901(TOKENIZER, TOKENIZER_MAX)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_sees_the_tokenizer() -> None:
    # the check above is live: at a lower bound ruff reports the tokenizer
    out = _c901(TOKENIZER, 1)
    assert out.returncode == 1 and "`parse_sample` is too complex" in out.stdout, out.stdout


def test_the_exemption_is_the_tokenizer_only() -> None:
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"]
    assert lint["mccabe"]["max-complexity"] == 15
    exempt = {f: rules for f, rules in lint["per-file-ignores"].items() if "C901" in rules}
    assert exempt == {"src/fleetscope/exposition/_syntax.py": ["C901"]}
