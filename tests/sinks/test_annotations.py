"""GrafanaAnnotator against a local HTTP server that records every request.

The server plays Grafana's annotation API (POST /api/annotations -> {"id": n}, PUT/PATCH
/api/annotations/{id}) or misbehaves on demand: HTTP 500, a body that is not JSON, or no answer
at all. Whatever it does, no annotator call may raise, and every call must be bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetscope.cli import main as cli_main
from fleetscope.sinks.base import Sink
from fleetscope.sinks.grafana import GrafanaAnnotator, validate_grafana_url

TOKEN = "glsa_test-token-0123456789"


class FakeGrafana:
    """A threaded HTTP server on 127.0.0.1 recording requests; ``mode`` sets its behaviour:
    ``ok``, ``500``, ``garbage`` (200, not JSON), ``no-id`` (200, JSON without id), ``hang``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        self.release = threading.Event()
        self._next_id = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with fake._lock:
                    fake.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": json.loads(raw) if raw else None,
                        }
                    )
                    mode = fake.mode
                    if mode == "ok" and self.command == "POST":
                        fake._next_id += 1
                        answer: Any = {"id": fake._next_id, "message": "Annotation added"}
                    else:
                        answer = {"message": "Annotation updated"}
                if mode == "hang":
                    fake.release.wait(30)
                    return
                if mode == "500":
                    self._send(500, b'{"message":"internal error"}')
                elif mode == "garbage":
                    self._send(200, b"<html>proxy login</html>")
                elif mode == "no-id":
                    self._send(200, b'{"message":"Annotation added"}')
                else:
                    self._send(200, json.dumps(answer).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    server = FakeGrafana()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fleetscope.sinks.grafana" and r.levelno == logging.WARNING
    ]


# --------------------------------------------------------------------------------- happy path


def test_run_region_post_then_put_with_time_end(grafana: FakeGrafana) -> None:
    ann = GrafanaAnnotator(grafana.url + "/", org_id=3, tags=["fleetscope", "team-a"])
    before = int(time.time() * 1000)
    assert ann.start_run("run-42", "GRPO run 42") == 1
    after = int(time.time() * 1000)
    assert ann.run_annotation_id == 1

    (post,) = grafana.requests
    assert post["method"] == "POST" and post["path"] == "/api/annotations"
    assert post["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert post["headers"]["x-grafana-org-id"] == "3"
    assert post["headers"]["content-type"] == "application/json"
    body = post["body"]
    assert isinstance(body["time"], int) and before <= body["time"] <= after  # milliseconds
    assert body["text"] == "GRPO run 42"
    assert body["tags"] == ["fleetscope", "team-a", "run-id:run-42"]
    assert "timeEnd" not in body

    time.sleep(0.01)
    assert ann.finish_run("success") is True
    put = grafana.requests[1]
    assert put["method"] == "PUT" and put["path"] == "/api/annotations/1"
    assert put["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert put["body"]["time"] == body["time"]  # PUT replaces: the start is sent again
    assert put["body"]["timeEnd"] > body["time"]
    assert put["body"]["timeEnd"] <= int(time.time() * 1000)
    assert put["body"]["text"] == "GRPO run 42"
    assert put["body"]["tags"] == ["fleetscope", "team-a", "run-id:run-42", "status:success"]

    assert ann.finish_run("failed") is False  # once only
    ann.close()
    ann.close()
    assert len(grafana.requests) == 2
    assert ann.failures == {}


def test_one_region_per_window(grafana: FakeGrafana) -> None:
    ann = GrafanaAnnotator(grafana.url, dashboard_uid="fleetscope-vllm-fleet", panel_id=2)
    ann.start_run("r1")
    assert ann.window_start("train") == 2
    assert ann.window_end("train") is True
    with ann.window("eval", text="eval @ step 100"):
        pass
    ann.window_start("train")  # left open: finish_run closes it first
    assert ann.finish_run("failed") is True
    assert ann.window_end("nope") is False  # not open: a warning, no request

    calls = [(r["method"], r["path"]) for r in grafana.requests]
    assert calls == [
        ("POST", "/api/annotations"),  # run, id 1
        ("POST", "/api/annotations"),  # train, id 2
        ("PUT", "/api/annotations/2"),
        ("POST", "/api/annotations"),  # eval, id 3
        ("PUT", "/api/annotations/3"),
        ("POST", "/api/annotations"),  # train again, id 4
        ("PUT", "/api/annotations/4"),  # closed by finish_run ...
        ("PUT", "/api/annotations/1"),  # ... before the run
    ]
    bodies = [r["body"] for r in grafana.requests]
    assert bodies[1]["tags"] == ["fleetscope", "run-id:r1", "window:train"]
    assert bodies[1]["text"] == "train window"
    assert bodies[3]["text"] == "eval @ step 100"
    assert bodies[4]["tags"] == ["fleetscope", "run-id:r1", "window:eval"]
    assert bodies[4]["timeEnd"] >= bodies[3]["time"] == bodies[4]["time"]
    assert "status:failed" in bodies[7]["tags"]
    for body in bodies:
        assert body["dashboardUID"] == "fleetscope-vllm-fleet" and body["panelId"] == 2
    ann.close()


def test_as_a_collector_sink(grafana: FakeGrafana) -> None:
    """Wired as a Collector sink: the first poll opens the run, stop(status=) closes it."""
    from fleetscope.collector.core import Collector
    from fleetscope_sim import FleetServer, SimFleet

    ann = GrafanaAnnotator(grafana.url, run_id="sink-run")
    assert isinstance(ann, Sink)
    fleet = SimFleet.build(2, dp=1, seed=5)

    async def run(urls: list[str]) -> None:
        collector = Collector(urls, interval=0.2, sinks=[ann], timeout=2.0)
        await collector.start()
        await asyncio.sleep(0.5)
        await collector.stop(status="failed")

    with FleetServer(fleet, step_interval=0.1) as server:
        asyncio.run(run(server.urls))
    calls = [(r["method"], r["path"]) for r in grafana.requests]
    assert calls == [("POST", "/api/annotations"), ("PUT", "/api/annotations/1")]
    assert "run-id:sink-run" in grafana.requests[0]["body"]["tags"]
    assert "status:failed" in grafana.requests[1]["body"]["tags"]


def test_collector_windows_become_regions(grafana: FakeGrafana) -> None:
    """The collector announces its windows to the annotator: one region per window."""
    from fleetscope.collector.core import Collector
    from fleetscope_sim import FleetServer, SimFleet

    ann = GrafanaAnnotator(grafana.url, run_id="windows-run")
    fleet = SimFleet.build(1, dp=1, seed=6)

    async def run(urls: list[str]) -> None:
        collector = Collector(urls, interval=3600, sinks=[ann], timeout=2.0)
        async with collector.window("train"):
            fleet.step(1.0)
        await collector.stop()

    with FleetServer(fleet) as server:
        asyncio.run(run(server.urls))
    calls = [(r["method"], r["path"]) for r in grafana.requests]
    assert calls == [
        ("POST", "/api/annotations"),  # the run, at the first poll
        ("POST", "/api/annotations"),  # the train window
        ("PUT", "/api/annotations/2"),  # the window ends
        ("PUT", "/api/annotations/1"),  # the run ends, status:success
    ]
    assert "window:train" in grafana.requests[1]["body"]["tags"]
    assert "timeEnd" in grafana.requests[2]["body"]
    assert "status:success" in grafana.requests[3]["body"]["tags"]


def test_sink_hooks_and_close(grafana: FakeGrafana) -> None:
    ann = GrafanaAnnotator(grafana.url, run_id="hooks")
    ann.log({"x": 1.0}, step=0, wall_time=time.time())
    ann.log({"x": 2.0}, step=1, wall_time=time.time())  # the run is opened once
    ann.on_window_start("train")
    ann.on_window_stop("train")
    ann.log_summary({"run_status": "running"})  # a mid-run summary closes nothing
    assert len(grafana.requests) == 3
    ann.on_window_start("eval")
    ann.close()  # ends the open window and the run ("ended")
    calls = [(r["method"], r["path"]) for r in grafana.requests]
    assert calls[3:] == [
        ("POST", "/api/annotations"),
        ("PUT", "/api/annotations/3"),
        ("PUT", "/api/annotations/1"),
    ]
    assert "status:ended" in grafana.requests[-1]["body"]["tags"]
    ann.start_run("after-close")  # closed: a warning, no request, no exception
    assert len(grafana.requests) == 6


def test_on_run_end_and_context_manager(grafana: FakeGrafana) -> None:
    with GrafanaAnnotator(grafana.url) as ann:
        ann.start_run("cm")
        ann.on_run_end("success")
    assert "status:success" in grafana.requests[-1]["body"]["tags"]
    with pytest.raises(RuntimeError), GrafanaAnnotator(grafana.url) as ann:
        ann.start_run("boom")
        raise RuntimeError("trainer crashed")
    assert "status:failed" in grafana.requests[-1]["body"]["tags"]


def test_without_token(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN")
    ann = GrafanaAnnotator(grafana.url)
    assert ann.start_run("anon") == 1
    assert "authorization" not in grafana.requests[0]["headers"]
    assert any("GRAFANA_TOKEN is not set" in m for m in _warnings(caplog))
    monkeypatch.setenv("MY_TOKEN", "other")
    ann2 = GrafanaAnnotator(grafana.url, token_env="MY_TOKEN")
    ann2.start_run("other")
    assert grafana.requests[1]["headers"]["authorization"] == "Bearer other"
    ann3 = GrafanaAnnotator(grafana.url, token_env=None)
    ann3.start_run("none")
    assert "authorization" not in grafana.requests[2]["headers"]


# --------------------------------------------------------------------------------- failures


def test_server_error_never_raises_and_warns_once(
    grafana: FakeGrafana, caplog: pytest.LogCaptureFixture
) -> None:
    grafana.mode = "500"
    ann = GrafanaAnnotator(grafana.url)
    with caplog.at_level(logging.WARNING, logger="fleetscope.sinks.grafana"):
        assert ann.start_run("r500") is None
        for _ in range(5):
            assert ann.window_start("train") is None
            assert ann.window_end("train") is False
    warnings = _warnings(caplog)
    assert any("start_run failed (HTTP 500" in m for m in warnings)
    assert sum("window_start(train) failed" in m for m in warnings) == 1  # rate-limited
    assert ann.failures["http"] == 11
    assert all(TOKEN not in m for m in warnings)

    # Grafana recovers before the end: the run is created whole, start and end in one POST
    grafana.mode = "ok"
    n = len(grafana.requests)
    assert ann.finish_run("success") is True
    (last,) = grafana.requests[n:]
    assert last["method"] == "POST" and last["path"] == "/api/annotations"
    assert last["body"]["time"] <= last["body"]["timeEnd"]
    assert "status:success" in last["body"]["tags"] and "run-id:r500" in last["body"]["tags"]


@pytest.mark.parametrize("mode", ["garbage", "no-id"])
def test_unusable_answer(grafana: FakeGrafana, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    grafana.mode = mode
    ann = GrafanaAnnotator(grafana.url)
    assert ann.start_run("r") is None
    assert ann.failures == {"response": 1}
    assert _warnings(caplog)


def test_server_that_never_answers_is_bounded(
    grafana: FakeGrafana, caplog: pytest.LogCaptureFixture
) -> None:
    grafana.mode = "hang"
    ann = GrafanaAnnotator(grafana.url, timeout=0.3)
    t0 = time.monotonic()
    assert ann.start_run("slow") is None
    assert ann.window_start("train") is None
    assert ann.finish_run("failed") is False  # ends train (POST) then the run (POST): 2 calls
    ann.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 4 * 0.3 + 2.0, elapsed  # 4 requests, each bounded by the timeout
    assert ann.failures["transport"] == 4
    assert any("ReadTimeout after 0.3 s" in m for m in _warnings(caplog))


def test_nothing_listening(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ann = GrafanaAnnotator(f"http://127.0.0.1:{port}", timeout=1.0)
    assert ann.start_run("x") is None
    assert ann.finish_run() is False
    assert ann.failures["transport"] == 2
    assert any("ConnectError" in m for m in _warnings(caplog))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://grafana.example.com", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("grafana.example.com:3000", "http:// or https://"),
        ("http://user:pass@grafana.example.com", "credentials"),
        ("https://admin@grafana.example.com", "credentials"),
        ("http://:secret@grafana.example.com", "credentials"),
        ("http://", "no host"),
        ("http://grafana.example.com?orgId=1", "query string"),
        ("http://grafana.example.com/#frag", "fragment"),
        ("http://grafana.example.com:99999", "not a valid URL"),
        ("", "non-empty"),
    ],
)
def test_invalid_urls_rejected_at_construction(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GrafanaAnnotator(url)


def test_valid_urls_normalized() -> None:
    assert validate_grafana_url("HTTPS://g.example.com:3000/grafana/") == (
        "https://g.example.com:3000/grafana"
    )
    assert validate_grafana_url("http://[::1]:3000") == "http://[::1]:3000"
    with pytest.raises(ValueError):
        GrafanaAnnotator("http://g", timeout=0)
    with pytest.raises(ValueError):
        GrafanaAnnotator("http://g", org_id="1")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- CLI


def test_cli_start_and_finish(grafana: FakeGrafana) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli_main(["annotate", "start", grafana.url, "--run-id", "cli-1", "--text", "hi"])
    assert rc == 0 and out.getvalue().strip() == "1"
    assert len(grafana.requests) == 1  # the region stays open: no PUT at exit
    assert grafana.requests[0]["body"]["tags"] == ["fleetscope", "run-id:cli-1"]

    rc = cli_main(
        ["annotate", "finish", grafana.url, "--id", "1", "--run-id", "cli-1", "--status", "failed"]
    )
    assert rc == 0
    patch = grafana.requests[1]
    assert patch["method"] == "PATCH" and patch["path"] == "/api/annotations/1"
    assert patch["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert set(patch["body"]) == {"timeEnd", "tags"}
    assert patch["body"]["tags"] == ["fleetscope", "run-id:cli-1", "status:failed"]

    grafana.mode = "500"
    assert cli_main(["annotate", "start", grafana.url, "--timeout", "1"]) == 0
    assert cli_main(["annotate", "start", grafana.url, "--strict"]) == 1
    assert cli_main(["annotate", "finish", grafana.url]) == 2  # --id missing
    assert cli_main(["annotate", "start", "ftp://x"]) == 2
