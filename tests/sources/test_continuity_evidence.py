"""The HTTP source's evidence about a server process between two scrapes
(``sources/http/continuity.py``): pure bookkeeping, checked rule by rule."""

from __future__ import annotations

from fleetscope.sources.http.continuity import DROP_MARGIN, ContinuityEvidence, early


def test_a_failure_since_the_last_success_is_a_doubt_once() -> None:
    ev = ContinuityEvidence()
    assert ev.succeeded("a") == ""
    ev.failed("a", "connection refused")
    ev.failed("a", "HTTP 503")  # the first failure names the gap
    assert ev.succeeded("a") == (
        "was not there to answer a scrape since its last success (connection refused)"
    )
    assert ev.succeeded("a") == ""  # settled by that success
    ev.failed("b", "connection refused")
    assert ev.succeeded("a") == ""  # per endpoint


def test_an_early_close_is_a_doubt_a_close_at_the_idle_timeout_is_not() -> None:
    ev = ContinuityEvidence()
    assert ev.succeeded("a", dropped_idle=0.01) == ""  # nothing learnt yet: no evidence
    assert ev.succeeded("a", kept_idle=2.0) == ""  # it answered on a connection idle 2 s
    assert ev.succeeded("a", kept_idle=1.0) == ""  # the longest is kept
    assert ev.succeeded("a", dropped_idle=2.5) == ""  # an idle timeout (> 2 s) could explain
    assert ev.succeeded("a", dropped_idle=1.45) == ""  # within the margin: jitter, a late read
    doubt = ev.succeeded("a", dropped_idle=0.3)
    assert doubt.startswith("closed our connection after 0.3 s idle")
    assert "idle for 2 s" in doubt


def test_a_server_that_never_keeps_a_connection_never_gives_evidence() -> None:
    """uvicorn closes idle connections after 5 s; polled every 10 s, every scrape finds the
    kept connection closed, and that says nothing."""
    ev = ContinuityEvidence()
    for _ in range(5):
        assert ev.succeeded("a", dropped_idle=5.0) == ""


def test_forget_drops_what_was_learnt() -> None:
    ev = ContinuityEvidence()
    ev.succeeded("a", kept_idle=3.0)
    ev.failed("a", "HTTP 500")
    ev.forget("a")
    assert ev.succeeded("a", dropped_idle=0.1) == ""


def test_the_margin() -> None:
    """0.1 s plus a quarter of the longest idle: at polls about as far apart as vLLM's 5 s
    keep-alive (kept ~4.9 s, closed at ~5 s), a loop that read a response 1 s late is no
    evidence."""
    assert early(0.0, DROP_MARGIN * 2)
    assert not early(0.0, DROP_MARGIN)
    assert early(7.0, 10.0) and not early(7.45, 10.0)
    assert not early(5.0 - 1.0, 4.9)
