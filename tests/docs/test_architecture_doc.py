"""docs/architecture.md names every module of both packages, and every module it names exists;
the layout it describes holds (at most 12 modules directly in ``src/fleetscope/``, the simulator
outside it, no tracked file over 1 MB outside ``tests/data/``)."""

from __future__ import annotations

import re
import subprocess

from support.paths import ROOT

SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"


def modules() -> set[str]:
    return {
        p.relative_to(SRC).as_posix()
        for pkg in ("fleetscope", "fleetscope_sim")
        for p in (SRC / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }


def named() -> set[str]:
    return set(re.findall(r"^\| `([\w/]+\.py)` \|", DOC.read_text(encoding="utf-8"), flags=re.M))


def test_every_module_is_named_and_every_named_module_exists() -> None:
    have, doc = modules(), named()
    assert len(have) > 100
    assert sorted(have - doc) == [], "modules docs/architecture.md does not name"
    assert sorted(doc - have) == [], "modules docs/architecture.md names that do not exist"


def test_every_module_says_what_it_holds() -> None:
    rows = re.findall(r"^\| `([\w/]+\.py)` \| \d+ \| (.*) \|$", DOC.read_text(), flags=re.M)
    assert {m for m, _ in rows} == named()
    assert [m for m, what in rows if len(what.strip()) < 10] == []


def test_the_package_root_stays_small_and_the_simulator_outside() -> None:
    top = sorted(p.name for p in (SRC / "fleetscope").glob("*.py"))
    assert len(top) <= 12, top
    assert not (SRC / "fleetscope" / "simulate").exists()
    assert (SRC / "fleetscope_sim" / "__init__.py").exists()


def test_no_tracked_file_over_1_mb_outside_the_test_data() -> None:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    big = [
        f
        for f in out.split("\0")
        if f
        and not f.startswith("tests/data/")
        and (ROOT / f).is_file()
        and (ROOT / f).stat().st_size > 1 << 20
    ]
    assert big == []
