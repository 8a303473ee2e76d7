"""Where the tests' data lives: the repository, ``tests/data`` and the real captures.

The captures in ``tests/data/fixtures`` are never edited; tests that need a different state edit
the text in memory (:mod:`support.bodies`).
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent  # the repository
DATA = TESTS / "data"  # every test's data, versioned with the tests (provenance in READMEs)
# real vLLM 0.32 and Ray 2.60 captures
FIXTURES = DATA / "fixtures"
VLLM_DIR = FIXTURES / "vllm-0.32.0-cpu"
RAY_DIR = FIXTURES / "ray-2.60-vllm-0.32"
ALL_FIXTURES = sorted([*VLLM_DIR.glob("*.prom"), *RAY_DIR.glob("*.prom")])


def fixture_text(name: str) -> str:
    """A capture's body by file name (searched in both fixture folders)."""
    for d in (VLLM_DIR, RAY_DIR):
        p = d / name
        if p.exists():
            return p.read_text(encoding="utf-8")
    raise FileNotFoundError(name)
