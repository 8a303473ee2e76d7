"""No password, token or API key in what fleetscope logs or raises (fleetscope.util.redact).

Each failure is produced for real (a scrape of a closed loopback port with credentials in the
URL, a Grafana stand-in on loopback that echoes the request headers in a 500 body, bad Grafana
URLs) and every captured log record and exception text is searched for the secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator

import pytest

from fleetscope.util.redact import redact
from fleetscope.util.warn import RateLimitedWarner
from support.loopback import LoopbackServer, Reply, Request

SECRET = "s3cr3tPassw0rd"
TOKEN = "glsa_TopSecretToken_0123456789"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def all_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "text, secret",
    [
        (f"GET http://user:{SECRET}@10.0.0.1:8000/metrics failed", SECRET),
        (f"https://{SECRET}@host/x", SECRET),
        (f"Authorization: Bearer {TOKEN}", TOKEN),
        (f"Authorization: Basic {SECRET}", SECRET),
        (f"{{'authorization': 'Bearer {TOKEN}'}}", TOKEN),
        (f'{{"headers": {{"Authorization": ["Bearer {TOKEN}"]}}}}', TOKEN),
        (f"http://g:3000/api/annotations?api_key={SECRET}&x=1", SECRET),
        (f"?apikey={SECRET}", SECRET),
        (f"?access_token={SECRET}#frag", SECRET),
        (f"password={SECRET}", SECRET),
        (f'{{"password": "{SECRET}", "user": "me"}}', SECRET),
        (f'{{"client_secret":"{SECRET}"}}', SECRET),
        (f"token={SECRET}", SECRET),
        (f"X-Api-Key: {SECRET}", SECRET),
        ("WANDB_API_KEY=" + "0123456789abcdef" * 2 + "01234567", "0123456789abcdef" * 2),
        ("api key " + "ab" * 20, "ab" * 20),
    ],
)
def test_redact_masks(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and "***" in out, out


def test_redact_keeps_ordinary_text() -> None:
    for text in (
        "inference/agg/generation_tokens_total/delta",
        "scrape of server0 (http://127.0.0.1:8000/metrics) failed: ConnectError",
        "server0.1 kv_cache_usage_perc=0.5 tokens=12",
        # metric names in warnings are not secret fields (a warning came out as `*** catalog`)
        "family vllm:time_to_first_token_seconds: not in the catalog",
        "...token_seconds: not in the catalog",
        "time_to_first_token_seconds: 3 buckets missing",
        "vllm:request_prefill_kv_computed_tokens: unknown",
    ):
        assert redact(text) == text


def test_every_warning_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    w = RateLimitedWarner(logging.getLogger("fleetscope.test"), prefix=f"http://u:{SECRET}@h: ")
    with caplog.at_level(logging.WARNING):
        assert w.warn("k", f"Authorization: Bearer {TOKEN}")
    assert SECRET not in all_text(caplog) and TOKEN not in all_text(caplog)


def test_scrape_warning_hides_url_credentials(caplog: pytest.LogCaptureFixture) -> None:
    from fleetscope.collector.core import Collector

    url = f"http://user:{SECRET}@127.0.0.1:{closed_port()}"

    async def run() -> None:
        c = Collector([url], interval=60, timeout=2)
        view = await c.poll()
        assert view.endpoints_reporting == 0
        await c.stop()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(run())
    text = all_text(caplog)
    assert "127.0.0.1" in text  # the scrape failure was warned about ...
    assert SECRET not in text  # ... without the password


def _echo(request: Request) -> Reply:
    """A 500 whose body echoes the request's headers (the bearer token included)."""
    body = json.dumps({"message": "boom", "request_headers": request.headers})
    return Reply(body, status=500, content_type="application/json")


@pytest.fixture
def echo_grafana() -> Iterator[str]:
    with LoopbackServer(default=_echo) as server:
        yield server.url


def test_grafana_error_echoing_headers_hides_the_token(
    echo_grafana: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fleetscope.sinks.grafana import GrafanaAnnotator

    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    with caplog.at_level(logging.WARNING):
        a = GrafanaAnnotator(echo_grafana, warn_interval=0)
        assert a.start_run("r1", "text") is None
        a.window_start("train")
        a.close()
    text = all_text(caplog)
    assert "HTTP 500" in text  # the failure is reported ...
    assert TOKEN not in text and TOKEN[:12] not in text  # ... not the token, not a part of it


@pytest.mark.parametrize(
    "url",
    [
        f"http://grafana:3000?api_key={SECRET}",
        f"http://grafana:3000/?token={SECRET}",
        f"http://grafana:{SECRET}/",  # a bad port
        f"http://admin:{SECRET}@grafana:3000",
        f"http://grafana:3000/#access_token={SECRET}",
    ],
)
def test_bad_grafana_url_error_hides_the_secret(url: str) -> None:
    from fleetscope.sinks.grafana import GrafanaAnnotator

    with pytest.raises(ValueError) as info:
        GrafanaAnnotator(url)
    assert SECRET not in str(info.value), str(info.value)
    assert SECRET not in repr(info.value)


def test_annotate_cli_bad_url_hides_the_secret(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetscope import cli

    rc = cli.main(["annotate", "start", f"http://grafana:3000?api_key={SECRET}"])
    assert rc == 2
    assert SECRET not in capsys.readouterr().err


def test_a_duplicate_endpoint_error_hides_the_password() -> None:
    from fleetscope.sources.http.membership import EndpointSet
    from fleetscope.sources.http.source import Endpoint

    url = f"http://user:{SECRET}@127.0.0.1:9/metrics"
    watched = EndpointSet([Endpoint(url, "a")])
    with pytest.raises(ValueError) as twice:
        watched.assign([Endpoint(url, "a"), Endpoint(url, "b")])
    assert SECRET not in str(twice.value) and "127.0.0.1" in str(twice.value)
    with pytest.raises(ValueError) as again:
        watched.add(Endpoint(url, "b"))
    assert SECRET not in str(again.value) and "already watched" in str(again.value)
