"""``watch --endpoints-file``: a file caught mid-rewrite (empty for a moment, a line cut
mid-port) is not applied; a file applied is one that parses and reads the same twice
``ENDPOINTS_FILE_SETTLE_S`` apart; an empty file that stays empty is applied (no servers).

The follower runs with a ``pause`` hook in place of its sleeps, so each test decides exactly
what the file holds at each read: no clock in the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fleetscope import cli

if TYPE_CHECKING:
    from fleetscope.sources.http.source import Endpoint

#: one pause of the follower: its kind and what the test does then (None: nothing)
Step = tuple[str, Callable[[], object] | None]


class FakeCollector:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> tuple[list[Endpoint], list[str]]:
        self.calls.append([e.url for e in endpoints])
        return [], []


def run_follower(
    path: Path, script: Sequence[Step], *, applied: str | None = None
) -> FakeCollector:
    """Run the follower; ``script`` is a list of ``(kind, action)`` hooks consumed one per
    pause: kind "settle" (between the two reads) or "interval" (between rounds). Stops when
    the script is used up."""
    collector = FakeCollector()
    steps = list(script)

    async def pause(seconds: float) -> None:
        kind = "settle" if seconds == cli.ENDPOINTS_FILE_SETTLE_S else "interval"
        if not steps:
            raise asyncio.CancelledError
        want, action = steps.pop(0)
        assert want == kind, (want, kind, seconds)
        if action is not None:
            action()

    async def main() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await cli.follow_endpoints_file(
                collector,  # type: ignore[arg-type]  # a fake: only set_endpoints is called
                str(path),
                [],
                1.0,
                pause=pause,
                applied=applied,
            )

    asyncio.run(main())
    return collector


A = "http://127.0.0.1:18000"
B = "http://127.0.0.1:18001"


def test_a_file_empty_for_a_moment_is_not_applied(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n{B}\n")
    c = run_follower(
        f,
        [
            ("settle", lambda: f.write_text(f"{A}\n{B}\n")),  # the rewrite is done: same text
            ("interval", lambda: f.write_text("")),  # truncated (open "w") ...
            ("settle", lambda: f.write_text(f"{A}\n{B}\n")),  # ... and written again
            ("settle", None),  # read again: stable now, the same as applied
            ("interval", None),
        ],
        applied=f"{A}\n{B}\n",
    )
    assert c.calls == []  # never dropped the fleet


def test_a_line_cut_mid_port_is_not_applied(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    c = run_follower(
        f,
        [
            ("settle", None),
            ("interval", lambda: f.write_text(f"{A}\n{B[:-2]}")),  # cut: ":180" is a valid port
            ("settle", lambda: f.write_text(f"{A}\n{B}\n")),
            ("settle", None),
            ("interval", None),
        ],
        applied=f"{A}\n",
    )
    assert c.calls == [[A, B]]  # only the finished file, never 127.0.0.1:180


def test_an_empty_file_that_stays_empty_is_applied(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    c = run_follower(
        f,
        [
            ("settle", None),
            ("interval", lambda: f.write_text("")),
            ("settle", None),  # still empty at the second read
            ("interval", None),
        ],
        applied=f"{A}\n",
    )
    assert c.calls == [[]]


def test_a_file_that_keeps_changing_is_not_applied_and_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    n = iter(range(100))
    c = run_follower(
        f,
        [("settle", lambda: f.write_text(f"{A}\n# {next(n)}\n"))] * 5 + [("interval", None)],
        applied=f"{A}\n",
    )
    assert c.calls == []
    assert "still being written" in caplog.text
