"""``watch --endpoints-file`` (docs/bad-data.md §12): a file caught mid-rewrite (empty for a
moment, a line cut mid-port) is not applied; a file that stays empty is, after enough evidence;
a renamed file is applied at the next read; a server that comes back gets its old name.

The first tests run the follower with a ``pause`` hook in place of its sleeps and a clock that
advances one read period per read, over the real endpoint set: each test decides exactly what
the file holds at each read, no clock in the outcome. The last ones run ``fleetscope watch``
itself against a simulated fleet over HTTP, waiting on what it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetscope import cli
from fleetscope.sinks.jsonl import read_jsonl
from fleetscope.sources.base import Endpoint
from fleetscope.sources.http.membership import EndpointSet
from fleetscope_sim import FleetServer, SimFleet
from support.paths import ROOT

READ_S = cli.ENDPOINTS_FILE_READ_S
EVIDENCE_S = cli.ENDPOINTS_FILE_EVIDENCE_S


class Fleet:
    """A collector's membership without its polls: the real endpoint set, changed at once.
    ``calls``: (read number, URLs) of each change the follower made."""

    def __init__(self, text: str) -> None:
        self.members = EndpointSet(cli.parse_endpoints_text(text))
        self.calls: list[tuple[int, list[str]]] = []
        self.read = 0

    @property
    def endpoints(self) -> list[Endpoint]:
        return self.members.endpoints

    def set_endpoints(self, endpoints: list[Endpoint]) -> tuple[list[Endpoint], list[str]]:
        self.calls.append((self.read, [e.url for e in endpoints]))
        out = self.members.assign(endpoints)
        self.members.apply()
        return out

    @property
    def names(self) -> dict[str, str]:
        return {e.url: e.name for e in self.endpoints}


def follow(
    path: Path,
    script: Iterable[Callable[[], object] | None],
    *,
    applied: str,
    interval: float = 0.5,
) -> Fleet:
    """Run the follower, the fleet built from ``applied``; ``script``: one action per read,
    done after it (``None``: nothing), the clock one read period further. Stops when used
    up; read ``n`` is at ``n * READ_S``."""
    fleet = Fleet(applied)
    steps = list(script)

    async def pause(seconds: float) -> None:
        assert seconds == READ_S
        if not steps:
            raise asyncio.CancelledError
        action = steps.pop(0)
        fleet.read += 1
        if action is not None:
            action()

    async def main() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await cli.follow_endpoints_file(
                fleet,  # type: ignore[arg-type]
                str(path),
                [],
                interval,
                pause=pause,
                clock=lambda: fleet.read * READ_S,
                applied=applied,
            )

    asyncio.run(main())
    return fleet


A = "http://127.0.0.1:18000"
B = "http://127.0.0.1:18001"
C = "http://127.0.0.1:18002"


def writer(f: Path, text: str) -> Callable[[], object]:
    return lambda: f.write_text(text)


def appender(f: Path, text: str) -> Callable[[], None]:
    def append() -> None:
        with open(f, "a") as out:
            out.write(text)

    return append


def test_an_in_place_rewrite_is_applied_when_two_reads_agree(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    fleet = follow(f, [writer(f, f"{A}\n{B}\n"), None, None], applied=f"{A}\n")
    assert fleet.calls == [(2, [A, B])]  # read at 1, the same at 2


def test_a_renamed_file_is_applied_at_the_first_read(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")

    def replace() -> None:
        tmp = tmp_path / "fleet.txt.tmp"
        tmp.write_text(f"{A}\n{B}\n")
        os.replace(tmp, f)

    fleet = follow(f, [replace, None], applied=f"{A}\n")
    assert fleet.calls == [(1, [A, B])]


def test_a_file_empty_for_a_moment_is_not_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n{B}\n")
    script = [writer(f, ""), None, writer(f, f"{A}\n{B}\n"), *[None] * 8]
    fleet = follow(f, script, applied=f"{A}\n{B}\n")
    assert fleet.calls == []  # empty at reads 1 and 2: never dropped
    assert caplog.text.count(f"endpoints file {f}: lists no server") == 1, caplog.text


@pytest.mark.parametrize(("interval", "at"), [(0.5, 6), (4.0, 9)])
def test_a_file_that_stays_empty_is_applied_after_the_evidence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, interval: float, at: int
) -> None:
    """Empty since read 1: applied once read ``max(5 s, 2 intervals)`` later (and 3 reads)."""
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n{B}\n")
    fleet = follow(
        f, [writer(f, "# none\n"), *[None] * 12], applied=f"{A}\n{B}\n", interval=interval
    )
    assert fleet.calls == [(at, [])]
    assert (at - 1) * READ_S >= max(EVIDENCE_S, 2 * interval)
    assert caplog.text.count("lists no server") == 1, caplog.text


def test_an_empty_file_with_no_server_watched_from_it_is_not_suspect(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text("# soon\n")
    fleet = follow(f, [writer(f, ""), None, None], applied="# soon\n")
    assert fleet.calls == [(2, [])]  # nothing to remove: an ordinary change


def test_a_line_cut_mid_port_is_not_applied(tmp_path: Path) -> None:
    """A writer stalls mid-line for three reads (``:180`` is a valid port)."""
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    script = [appender(f, B[:-2]), None, None, appender(f, B[-2:] + "\n"), None, None]
    fleet = follow(f, script, applied=f"{A}\n")
    assert fleet.calls == [(5, [A, B])]  # only the finished file, never 127.0.0.1:180


def test_a_last_line_without_newline_is_applied_once_it_stays(tmp_path: Path) -> None:
    """An editor that writes no final newline: applied, after the evidence."""
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    fleet = follow(f, [writer(f, f"{A}\n{B}"), *[None] * 8], applied=f"{A}\n")
    assert fleet.calls == [(6, [A, B])]


def test_a_file_that_keeps_changing_is_not_applied_and_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    script = [writer(f, f"{A}\n# {i}\n") for i in range(10)]
    fleet = follow(f, script, applied=f"{A}\n")
    assert fleet.calls == []
    assert caplog.text.count("keeps changing") == 1, caplog.text


def test_a_broken_file_keeps_the_fleet_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n")
    fleet = follow(f, [writer(f, f"{A}\nbogus=line\n"), *[None] * 5], applied=f"{A}\n")
    assert fleet.calls == []
    assert caplog.text.count("fleet unchanged") == 1, caplog.text
    assert f"endpoints file {f}: line 2:" in caplog.text


def test_a_url_that_returns_gets_its_name_back(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text(f"{A}\n{B}\n")
    script = [
        writer(f, f"{A}\n"),
        None,
        writer(f, f"{A}\n{B}\n"),
        None,
        writer(f, f"{A}\ndecode={B}\n{C}\n"),  # its role given: still its name
        None,
        None,
    ]
    fleet = follow(f, script, applied=f"{A}\n{B}\n")
    assert [urls for _, urls in fleet.calls] == [[A], [A, B], [A, B, C]]
    assert fleet.names == {A: "server0", B: "server1", C: "server2"}
    assert next(e for e in fleet.endpoints if e.url == B).role == "decode"


def test_a_name_never_belongs_to_two_urls() -> None:
    """The endpoint set: a name may be given again to its own URL only; unnamed endpoints
    still get names never used (the library's ``add_endpoints``)."""
    members = EndpointSet([A, B])
    assert members.remove(B) == ["server1"]
    members.apply()
    with pytest.raises(ValueError, match="already in use"):
        members.add(Endpoint(C, name="server1"))
    [back] = members.add(Endpoint(B, name="server1"))
    [new] = members.add(C)
    members.apply()
    assert (back.name, new.name) == ("server1", "server2")
    assert members.remove(C) == ["server2"]
    members.apply()
    [again] = members.add(C)
    assert again.name == "server3"


# --------------------------------------------------------------------------- a server back


def test_a_server_back_under_its_name_starts_its_health_streaks_over() -> None:
    """Its name returns, its old streaks do not: a stall before it left does not count."""
    import numpy as np

    from fleetscope import catalog
    from fleetscope.health import HealthMonitor, HealthThresholds

    class Stalled:  # the parts of a poll's readings HealthMonitor reads
        def __init__(self) -> None:
            self.scrapes: list[object] = []
            self.stats = self
            self.engine_ids = ["server1.0"]
            self.is_engine = [True]
            self.seconds = np.full(1, 5.0)

        def engine_values(self, columns: object) -> dict[str, dict[str, float]]:
            return {"server1.0": {catalog.RUNNING: 8.0, catalog.DECODE_RATES[0]: 0.0}}

    def stalls(mon: HealthMonitor) -> int:
        events = mon.evaluate(Stalled(), {"server1.0": "decode"})  # type: ignore[arg-type]
        return sum(1 for e in events if e.condition == "generation_stalled")

    mon = HealthMonitor(HealthThresholds(stall_seconds=10.0))
    assert stalls(mon) == 0  # 5 s without a token
    mon.forget_endpoint("server0")  # another endpoint: nothing of server1's goes
    mon.forget_endpoint("server1")  # it left
    assert stalls(mon) == 0  # back: 5 s, not 10
    assert stalls(mon) == 1


def test_a_server_back_under_its_name_is_expected_again_by_the_run() -> None:
    """The run's coverage stops expecting a server that left; one that comes back under the same
    name is expected again (its silence after that counts as missing)."""
    from fleetscope.identity import EngineId
    from fleetscope.stats.windows import WindowSet

    windows = WindowSet()
    [run] = windows.run.values()
    run.engines[EngineId("server1", "0")] = None  # type: ignore[assignment]
    windows.endpoint_leaves("server1", 10.0)
    assert run.departed == {"server1.0"}
    windows.endpoint_joins("server1", 20.0)
    assert run.departed == set()


# --------------------------------------------------------------------------- the command


DEADLINE_S = 180  # a bound on waiting for a loaded 2-core machine, not an expected time
ENTRY_POINT = Path(sys.executable).with_name("fleetscope")
HOLD_S = 1.5  # how long the tests leave a file half-written (an editor, a slow writer)


def cli_env() -> dict[str, str]:
    """This checkout's src first, as an absolute path, whatever the working folder."""
    env = dict(os.environ)
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *extra])
    return env


def endpoints_in(poll: dict[str, Any]) -> set[str]:
    """The endpoints with per-engine keys in one JSONL poll (``server0`` of ``server0.0``)."""
    return {k.split("/")[1].split(".")[0] for k in poll["metrics"] if "." in k.split("/")[1]}


class Watch:
    """``fleetscope watch --endpoints-file FILE`` as a user runs it (the installed entry
    point): its JSONL polls and its stderr, read as they come."""

    def __init__(self, tmp_path: Path, listing: Path, interval: float = 0.3) -> None:
        assert ENTRY_POINT.exists(), f"no installed entry point at {ENTRY_POINT}"
        self.out = tmp_path / "polls.jsonl"
        argv = [str(ENTRY_POINT), "watch", "--endpoints-file", str(listing), "--no-tui"]
        argv += ["--jsonl", str(self.out), "--interval", str(interval)]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=cli_env())
        self._err: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    @property
    def err(self) -> str:
        return "".join(self._err)

    def polls(self) -> list[set[str]]:
        return [endpoints_in(p) for p in read_jsonl(self.out)[0]] if self.out.exists() else []

    def wait(self, predicate: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                self._reader.join(DEADLINE_S)
                raise AssertionError(
                    f"exited {self.proc.returncode} waiting for {what}: {self.err}"
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.polls()[-5:]} {self.err}")

    def wait_polls(self, endpoints: set[str], after: int, n: int = 2) -> int:
        """Until ``n`` polls after the first ``after`` show exactly ``endpoints``; returns the
        poll count then."""
        self.wait(
            lambda: sum(1 for s in self.polls()[after:] if s == endpoints) >= n,
            f"{n} polls of {sorted(endpoints)}",
        )
        return len(self.polls())

    def stop(self) -> None:
        """SIGINT: the last poll, the run summary, exit 0."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(DEADLINE_S)
        self._reader.join(DEADLINE_S)
        assert self.proc.returncode == 0, self.err
        assert read_jsonl(self.out)[1]["run_status"] == "success"

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(DEADLINE_S)
        self._reader.join(DEADLINE_S)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def sim_urls() -> Iterator[list[str]]:
    fleet = SimFleet(seed=11)
    for _ in range(3):
        fleet.add_endpoint(dp=1)
    fleet.step(3.0)
    with FleetServer(fleet, step_interval=0.25) as server:
        yield list(server.urls)


def test_watch_keeps_its_fleet_while_the_file_is_empty_for_a_moment(
    tmp_path: Path, sim_urls: list[str]
) -> None:
    """An editor truncates the file, then writes it again ~1.5 s later: the fleet stays, with
    one warning naming the file (it used to drop every server after two empty reads)."""
    a, b, _ = sim_urls
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"{a}\n{b}\n")
    with Watch(tmp_path, listing) as w:
        n = w.wait_polls({"server0", "server1"}, 0)
        t0 = time.monotonic()
        listing.write_text("")
        # the follower has read it empty: it warns (or, as it used to, drops the fleet)
        w.wait(lambda: "lists no server" in w.err or "fleet changed" in w.err, "a reaction")
        time.sleep(max(0.0, t0 + HOLD_S - time.monotonic()))
        listing.write_text(f"{a}\n{b}\n")
        held = time.monotonic() - t0
        w.wait(lambda: len(w.polls()) >= n + 3, "three more polls")
        w.stop()
    if held >= EVIDENCE_S - 1.0:
        pytest.skip(f"the machine took {held:.1f} s to rewrite the file: nothing to judge")
    assert all(s == {"server0", "server1"} for s in w.polls()), w.polls()
    assert "fleet changed" not in w.err, w.err
    assert w.err.count(f"endpoints file {listing}: lists no server") == 1, w.err


def test_watch_empties_its_fleet_only_once_the_file_stays_empty(
    tmp_path: Path, sim_urls: list[str]
) -> None:
    """A file that stays empty is "no servers", applied once it has stayed empty for
    ``ENDPOINTS_FILE_EVIDENCE_S`` (at least)."""
    a, b, _ = sim_urls
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"{a}\n{b}\n")
    with Watch(tmp_path, listing) as w:
        n = w.wait_polls({"server0", "server1"}, 0)
        t0 = time.monotonic()
        listing.write_text("# nobody for now\n")
        w.wait(lambda: "fleet changed" in w.err, "the fleet emptied")
        emptied = time.monotonic() - t0
        w.wait_polls(set(), n)
        w.stop()
    assert emptied >= EVIDENCE_S, emptied
    assert "fleet changed: -server0, -server1" in w.err, w.err


def test_watch_never_applies_a_line_cut_mid_port(tmp_path: Path, sim_urls: list[str]) -> None:
    """A writer stalls ~1.5 s in the middle of a line (``http://127.0.0.1:80`` of ``...:8001``):
    that line is never watched; the finished file is."""
    a, b, _ = sim_urls
    cut = b[:-2]  # a valid URL: a shorter port
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"{a}\n")
    with Watch(tmp_path, listing) as w:
        n = w.wait_polls({"server0"}, 0)
        t0 = time.monotonic()
        with open(listing, "a") as f:  # appending, flushed mid-line
            f.write(cut)
        w.wait(lambda: "no newline" in w.err or "fleet changed" in w.err, "a reaction")
        time.sleep(max(0.0, t0 + HOLD_S - time.monotonic()))
        with open(listing, "a") as f:
            f.write(b[-2:] + "\n")
        held = time.monotonic() - t0
        w.wait_polls({"server0", "server1"}, n)
        w.stop()
    if held >= EVIDENCE_S - 1.0:
        pytest.skip(f"the machine took {held:.1f} s to finish the line: nothing to judge")
    changes = [line for line in w.err.splitlines() if "fleet changed" in line]
    assert changes == [f"WARNING fleetscope: {listing}: fleet changed: +server1={b}"], w.err


def test_a_file_replaced_by_a_rename_is_applied_at_the_next_read(
    tmp_path: Path, sim_urls: list[str]
) -> None:
    """An atomic writer (a temporary file, then rename) is taken at its word, even with no
    newline at the end: no second read to wait for."""
    a, b, _ = sim_urls
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"{a}\n")
    with Watch(tmp_path, listing) as w:
        n = w.wait_polls({"server0"}, 0)
        tmp = tmp_path / "fleet.txt.tmp"
        tmp.write_text(f"{a}\n{b}\n")
        os.replace(tmp, listing)
        w.wait_polls({"server0", "server1"}, n)
        w.stop()
    assert f"+server1={b}" in w.err


def test_a_server_that_leaves_the_file_and_returns_keeps_its_name(
    tmp_path: Path, sim_urls: list[str]
) -> None:
    """A URL that comes back gets its old name (its series continue in every sink); a new URL
    gets the next name never used; no name ever belongs to two URLs."""
    a, b, c = sim_urls
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"{a}\n{b}\n")
    with Watch(tmp_path, listing) as w:
        n = w.wait_polls({"server0", "server1"}, 0)
        listing.write_text(f"{a}\n")  # server1 leaves
        n = w.wait_polls({"server0"}, n)
        listing.write_text(f"{a}\n{b}\n")  # and comes back
        w.wait(lambda: len(w.polls()[-1]) == 2, "two servers again")
        listing.write_text(f"{a}\n{b}\n{c}\n")  # a new one
        w.wait(lambda: len(w.polls()[-1]) == 3, "three servers")
        w.stop()
    phases = [s for i, s in enumerate(w.polls()) if i == 0 or s != w.polls()[i - 1]]
    assert phases == [
        {"server0", "server1"},
        {"server0"},
        {"server0", "server1"},
        {"server0", "server1", "server2"},
    ], phases
    assert w.err.count(f"+server1={b}") == 1 and f"+server2={c}" in w.err, w.err
