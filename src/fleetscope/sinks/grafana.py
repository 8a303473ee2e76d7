"""Grafana annotations for runs and windows: a region per run and per window, never an error.

A run becomes one Grafana *region* annotation: ``start_run`` POSTs ``/api/annotations`` (time in
ms, tags ``fleetscope``, ``run-id:{id}``), ``finish_run(status)`` PUTs ``/api/annotations/{id}``
with ``timeEnd`` and a ``status:{status}`` tag. Each window (``train``, ``eval``...) becomes
its own region (``window_start(label)`` / ``window_end(label)``, tags ``window:{label}``).
fleetscope's Grafana dashboard (:mod:`fleetscope.dashboards.grafana`) shows every annotation
tagged ``fleetscope``.

Never breaks training: every HTTP call has a bounded timeout (``timeout`` seconds for each of
connect / write / read / pool), nothing is retried in a loop, and every failure (refused
connection, timeout, HTTP error, bad JSON) is logged as a rate-limited warning and swallowed:
no method raises. Only the constructor raises ``ValueError`` for an unusable URL (not
http/https, credentials embedded in it, query or fragment). If the start of a region could not
be created, its end creates the whole region in one POST (``time`` and ``timeEnd``).

Authentication: ``Authorization: Bearer $GRAFANA_TOKEN`` (a service account token; the
variable name is ``token_env``), read from the environment at each request and never logged;
``org_id`` adds ``X-Grafana-Org-Id``.

Wiring it to a :class:`~fleetscope.collector.core.Collector`: pass it as a sink. Its ``log()``
opens the run region at the first poll (with ``run_id`` given here), and ``log_summary()``,
which the collector calls from ``stop(status=...)``, closes it with the summary's
``run_status`` (``success`` / ``failed``); ``close()`` closes whatever is still open. The
collector announces its windows to sinks that have ``on_window_start`` / ``on_window_stop``,
so each window becomes a region by itself::

    from fleetscope.sinks.grafana import GrafanaAnnotator
    from fleetscope.collector.core import Collector

    grafana = GrafanaAnnotator("https://grafana.example.com", run_id="run-42")
    collector = Collector(urls, sinks=[wandb_sink, grafana])
    async with collector:
        async with collector.window("train"):      # -> a "window:train" region
            ...
    # collector.stop() -> log_summary({"run_status": ...}) -> PUT timeEnd + status:success

Or drive it directly: ``start_run("run-42")`` ... ``finish_run("failed")``. The hook names
``on_window_start(label)`` / ``on_window_stop(label)`` / ``on_run_end(status)`` are aliases.

Calls block the calling thread for at most a few ``timeout``; the collector runs sinks in its
own sink thread, never on the trainer's event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from fleetscope.sinks._grafana_api import Region, now_ms, validate_grafana_url
from fleetscope.sinks.base import SinkBase
from fleetscope.util.redact import redact
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["DEFAULT_TAGS", "GrafanaAnnotator", "validate_grafana_url"]

log = logging.getLogger(__name__)

DEFAULT_TAGS: tuple[str, ...] = ("fleetscope",)


class GrafanaAnnotator(SinkBase):
    """Grafana annotations for one run and its windows (see the module docs).

    Args:
        url: Grafana base URL, ``http(s)://host[:port][/subpath]`` (no credentials).
        token_env: environment variable with the bearer token (``None``: no Authorization).
        org_id: Grafana organization id (``X-Grafana-Org-Id``), optional.
        timeout: seconds, for each phase of every request (connect / write / read / pool).
        tags: tags on every annotation (run and windows), default ``("fleetscope",)``.
        run_id: run id used when the run region is opened by ``log()`` (default: a random id).
        dashboard_uid, panel_id: attach the annotations to one dashboard (and panel) instead
            of the whole organization.
        verify: TLS verification (``False`` or a CA bundle path), as httpx takes it.
        warn_interval: minimum seconds between two warnings of the same kind.
        transport: an ``httpx.BaseTransport`` (tests).

    Every public method returns normally whatever Grafana does.
    """

    def __init__(
        self,
        url: str,
        *,
        token_env: str | None = "GRAFANA_TOKEN",
        org_id: int | None = None,
        timeout: float = 5.0,
        tags: Sequence[str] = DEFAULT_TAGS,
        run_id: str | None = None,
        dashboard_uid: str | None = None,
        panel_id: int | None = None,
        verify: bool | str = True,
        warn_interval: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = validate_grafana_url(url)
        if isinstance(tags, str):
            raise TypeError("tags must be a sequence of strings, not one string")
        if not (isinstance(timeout, int | float) and 0 < timeout <= 300):
            raise ValueError(f"timeout must be in (0, 300] seconds, got {timeout!r}")
        if org_id is not None and (isinstance(org_id, bool) or not isinstance(org_id, int)):
            raise ValueError(f"org_id must be an integer, got {org_id!r}")
        self.token_env = token_env
        self.org_id = org_id
        self.timeout = float(timeout)
        self.tags = [str(t) for t in tags]
        self.run_id = run_id
        self.dashboard_uid = dashboard_uid
        self.panel_id = panel_id
        self._verify = verify
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.RLock()
        self._warner = RateLimitedWarner(log, interval=warn_interval, prefix="fleetscope grafana: ")
        self._run: Region | None = None
        self._run_attempted = False
        self._run_finished = False
        self._windows: dict[str, Region] = {}
        self._closed = False
        #: counts of requests that failed, by kind (``transport``, ``http``, ``response``)
        self.failures: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"GrafanaAnnotator({self.url!r}, run_id={self.run_id!r})"

    # ---------------------------------------------------------------------------- HTTP

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "fleetscope"}
        if self.token_env:
            token = os.environ.get(self.token_env, "").strip()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            else:
                self._warner.warn(
                    "no-token",
                    f"${self.token_env} is not set: sending annotations without a token",
                )
        if self.org_id is not None:
            headers["X-Grafana-Org-Id"] = str(self.org_id)
        return headers

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                timeout=httpx.Timeout(self.timeout),
                verify=self._verify,
                follow_redirects=False,  # never carry the token to another host
                transport=self._transport,
            )
        return self._client

    def _token(self) -> str | None:
        return os.environ.get(self.token_env, "").strip() or None if self.token_env else None

    def _fail(self, kind: str, what: str, detail: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        # the token itself is masked wherever it appears (a body echoing the request headers),
        # then anything that looks like a secret (fleetscope.util.redact)
        detail = redact(detail, secrets=(self._token(),))
        self._warner.warn(f"{kind}:{what}", f"{what} failed ({detail}); training goes on")

    def _request(self, method: str, path: str, body: Mapping[str, Any], what: str) -> Any:
        """One request; returns the decoded JSON (``{}`` if none) or ``None`` on any failure."""
        if self._closed:
            self._fail("closed", what, "annotator is closed")
            return None
        try:
            r = self._http().request(
                method, f"{self.url}{path}", json=dict(body), headers=self._headers()
            )
        except httpx.TimeoutException as e:
            self._fail("transport", what, f"{type(e).__name__} after {self.timeout:g} s")
            return None
        except Exception as e:  # refused, DNS, TLS, anything: never raised to the trainer
            self._fail("transport", what, f"{type(e).__name__}: {e}")
            return None
        if not 200 <= r.status_code < 300:
            # redacted before it is cut: a cut must not leave half a secret unrecognised
            text = redact(r.text, secrets=(self._token(),)) if r.content else ""
            snippet = text[:200].replace("\n", " ")
            self._fail("http", what, f"HTTP {r.status_code} {snippet}".rstrip())
            return None
        if not r.content:
            return {}
        try:
            return r.json()
        except ValueError:
            self._fail("response", what, "response is not JSON")
            return None

    def _body(self, region: Region, time_end: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"time": region.time_ms, "text": region.text, "tags": region.tags}
        if time_end is not None:
            body["timeEnd"] = time_end
        if self.dashboard_uid:
            body["dashboardUID"] = self.dashboard_uid
        if self.panel_id is not None:
            body["panelId"] = self.panel_id
        return body

    def _create(self, region: Region, what: str, time_end: int | None = None) -> int | None:
        data = self._request("POST", "/api/annotations", self._body(region, time_end), what)
        if data is None:
            return None
        ident = data.get("id") if isinstance(data, Mapping) else None
        if isinstance(ident, bool) or not isinstance(ident, int):
            self._fail("response", what, f"no annotation id in the response: {data!r:.200}")
            return None
        region.id = ident
        return ident

    def _end(self, region: Region, extra_tags: Sequence[str], what: str) -> bool:
        end = max(now_ms(), region.time_ms)
        region.tags = [*region.tags, *(t for t in extra_tags if t not in region.tags)]
        if region.id is None:  # the start never reached Grafana: create the whole region now
            return self._create(region, what, time_end=end) is not None
        body = self._body(region, time_end=end)
        return self._request("PUT", f"/api/annotations/{region.id}", body, what) is not None

    # ---------------------------------------------------------------------------- runs

    def _run_tags(self, run_id: str | None, tags: Sequence[str] = ()) -> list[str]:
        out = [*self.tags, *([f"run-id:{run_id}"] if run_id else []), *tags]
        return list(dict.fromkeys(out))

    def start_run(
        self, run_id: str | None = None, text: str | None = None, *, tags: Sequence[str] = ()
    ) -> int | None:
        """Open the run region now. Returns Grafana's annotation id, or ``None`` on failure."""
        try:
            with self._lock:
                run_id = str(run_id or self.run_id or uuid.uuid4().hex[:12])
                self.run_id = run_id
                self._run_attempted = True
                self._run_finished = False
                self._run = Region(
                    now_ms(), text or f"fleetscope run {run_id}", self._run_tags(run_id, tags)
                )
                return self._create(self._run, "start_run")
        except Exception as e:  # pragma: no cover - defensive: never raise
            self._fail("internal", "start_run", repr(e))
            return None

    def finish_run(self, status: str = "success") -> bool:
        """Close open windows, then the run region (``timeEnd`` now, tag ``status:{status}``).

        Returns True if Grafana accepted it. A second call does nothing (returns False).
        """
        try:
            with self._lock:
                for label in list(self._windows):
                    self.window_end(label)
                if self._run is None or self._run_finished:
                    return False
                self._run_finished = True
                return self._end(self._run, [f"status:{status}"], "finish_run")
        except Exception as e:  # pragma: no cover - defensive
            self._fail("internal", "finish_run", repr(e))
            return False

    @property
    def run_annotation_id(self) -> int | None:
        """Grafana's id of the run region (``None`` before or if its creation failed)."""
        return None if self._run is None else self._run.id

    # ---------------------------------------------------------------------------- windows

    def window_start(self, label: str, text: str | None = None) -> int | None:
        """Open a region for window ``label`` (closing an open one with the same label)."""
        try:
            with self._lock:
                if label in self._windows:
                    self.window_end(label)
                region = Region(
                    now_ms(),
                    text or f"{label} window",
                    self._run_tags(self.run_id, [f"window:{label}"]),
                )
                self._windows[label] = region
                return self._create(region, f"window_start({label})")
        except Exception as e:  # pragma: no cover - defensive
            self._fail("internal", "window_start", repr(e))
            return None

    def window_end(self, label: str) -> bool:
        """Close the region of window ``label`` (``timeEnd`` now). False if none is open."""
        try:
            with self._lock:
                region = self._windows.pop(label, None)
                if region is None:
                    self._warner.warn(f"no-window:{label}", f"window_end({label!r}): not open")
                    return False
                return self._end(region, [], f"window_end({label})")
        except Exception as e:  # pragma: no cover - defensive
            self._fail("internal", "window_end", repr(e))
            return False

    @contextlib.contextmanager
    def window(self, label: str, text: str | None = None) -> Iterator[None]:
        """``with annotator.window("eval"): ...`` = ``window_start`` ... ``window_end``."""
        self.window_start(label, text)
        try:
            yield
        finally:
            self.window_end(label)

    # ---------------------------------------------------------------------------- sink hooks

    def on_window_start(self, label: str) -> None:
        self.window_start(label)

    def on_window_stop(self, label: str) -> None:
        self.window_end(label)

    def on_run_end(self, status: str = "success") -> None:
        self.finish_run(status)

    def log(self, metrics: Mapping[str, Any], *, step: int, wall_time: float) -> None:
        """Sink interface: the first poll opens the run region (once, even if that fails)."""
        if not self._run_attempted and not self._closed:
            self.start_run()

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Sink interface: a final summary (``run_status`` not ``running``) closes the run."""
        status = summary.get("run_status")
        if isinstance(status, str) and status != "running":
            self.finish_run(status)

    def close(self, *, finish: bool = True) -> None:
        """Close open windows and the run region (status ``ended`` if none was given), then
        release the HTTP client. Idempotent. ``finish=False`` leaves every region open (to be
        ended by another process with :meth:`end_annotation`)."""
        with self._lock:
            if self._closed:
                return
            if finish:
                if self._run is not None and not self._run_finished:
                    self.finish_run("ended")  # also ends the open windows
                for label in list(self._windows):
                    self.window_end(label)
            self._closed = True
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
                self._client = None

    # ---------------------------------------------------------------------------- one-shot

    def end_annotation(
        self, annotation_id: int, *, status: str | None = None, run_id: str | None = None
    ) -> bool:
        """End an annotation created elsewhere (another process, the CLI): PATCH ``timeEnd``
        now and, with ``run_id`` / ``status``, reset its tags to this annotator's tags plus
        ``run-id:`` and ``status:``. Returns True if Grafana accepted it."""
        try:
            body: dict[str, Any] = {"timeEnd": now_ms()}
            if run_id is not None or status is not None:
                tags = [*self.tags]
                if run_id is not None:
                    tags.append(f"run-id:{run_id}")
                if status is not None:
                    tags.append(f"status:{status}")
                body["tags"] = list(dict.fromkeys(tags))
            with self._lock:
                done = self._request(
                    "PATCH", f"/api/annotations/{int(annotation_id)}", body, "end_annotation"
                )
            return done is not None
        except Exception as e:  # pragma: no cover - defensive
            self._fail("internal", "end_annotation", repr(e))
            return False

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and self._run is not None and not self._run_finished:
            self.finish_run("failed")
        self.close()
