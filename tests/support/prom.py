"""Run a real Prometheus server as a test oracle.

Tests freeze the state of some ``/metrics`` endpoints, wait until Prometheus has
scraped that frozen state, and then ask Prometheus itself (counter deltas with
PromQL ``@`` modifiers, ``histogram_quantile``, ...) for the reference answer.

Typical use::

    with PrometheusServer(["127.0.0.1:8001", "127.0.0.1:8002"], scrape_interval=0.5) as prom:
        ...  # drive the engines into state A, then stop touching them
        t1 = prom.wait_for_scrape_after(time.time())
        ...  # drive them into state B, then stop touching them
        t2 = prom.wait_for_scrape_after(time.time())
        delta = prom.query_value(f"sum(vllm:request_success_total @ {t2}) "
                                 f"- sum(vllm:request_success_total @ {t1})")

Metric names with ``:`` (vLLM's ``vllm:...``): Prometheus 2.42 (Debian 12) asks targets for
OpenMetrics, and prometheus_client (0.26 at least; client_python issue #1177) then writes
sample names with ``:`` replaced by ``_`` (``vllm_num_requests_running``) while the
``# TYPE`` line keeps ``vllm:``. Prometheus stores the underscored name, so a PromQL query
for ``vllm:...`` comes back empty. :class:`MetricsServer` (``serve_registry``) serves a
registry in the classic text format whatever the ``Accept`` header says, so Prometheus
stores the same names fleetscope parses.

The ``prometheus`` binary must be installed (Debian: ``apt-get install -y
prometheus``; ``.ci/run`` does this).  If it is missing, :class:`PrometheusNotFound`
is raised: tests that need the oracle fail loudly, they are never skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
from prometheus_client import CollectorRegistry, make_wsgi_app

__all__ = [
    "MetricsServer",
    "PrometheusError",
    "PrometheusNotFound",
    "PrometheusServer",
    "find_prometheus_binary",
    "find_promtool_binary",
    "serve_registry",
]

#: Environment variable that may point at a specific ``prometheus`` binary.
BINARY_ENV = "FLEETSCOPE_PROMETHEUS_BIN"
#: ... and at a specific ``promtool`` (Debian's prometheus package ships it beside prometheus).
PROMTOOL_ENV = "FLEETSCOPE_PROMTOOL_BIN"

_INSTALL_HINT = (
    "Install it with `apt-get install -y prometheus` (Debian/Ubuntu; .ci/run does this) "
    f"or point ${BINARY_ENV} at a prometheus binary."
)


class PrometheusError(RuntimeError):
    """Prometheus failed to start, answered with an error, or never scraped in time."""


class PrometheusNotFound(PrometheusError):
    """The ``prometheus`` binary is not installed."""


def find_prometheus_binary() -> str:
    """Return the path of the ``prometheus`` binary, or raise :class:`PrometheusNotFound`."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise PrometheusNotFound(f"${BINARY_ENV}={explicit!r} is not an executable file.")
    found = shutil.which("prometheus")
    if found:
        return found
    raise PrometheusNotFound(f"The `prometheus` binary was not found on PATH. {_INSTALL_HINT}")


def find_promtool_binary() -> str:
    """Return the path of ``promtool`` (rule checks and rule unit tests), or raise
    :class:`PrometheusNotFound`: next to ``$FLEETSCOPE_PROMETHEUS_BIN`` if that is set, else
    on PATH."""
    explicit = os.environ.get(PROMTOOL_ENV)
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise PrometheusNotFound(f"${PROMTOOL_ENV}={explicit!r} is not an executable file.")
    beside = os.environ.get(BINARY_ENV)
    if beside:
        candidate = os.path.join(os.path.dirname(beside), "promtool")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("promtool")
    if found:
        return found
    raise PrometheusNotFound(f"The `promtool` binary was not found on PATH. {_INSTALL_HINT}")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _duration(seconds: float) -> str:
    """Format seconds as a Prometheus duration (millisecond resolution)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be positive, got {seconds!r}")
    return f"{ms}ms"


def _fmt_time(t: float) -> str:
    return f"{t:.3f}"


class PrometheusServer:
    """A throwaway Prometheus server scraping ``targets``, for use as a context manager.

    * listens on a free port on 127.0.0.1 only (never on 9090 or any other fixed port);
    * keeps its config, TSDB and log in a private temporary directory, removed on exit;
    * scrapes every target in one job (``job`` label, default ``"fleet"``); each target's
      ``instance`` label is the ``host:port`` string given here;
    * ``target_labels`` (optional) adds labels to some targets' series, as a
      ``static_configs`` entry with ``labels`` does: ``{"127.0.0.1:8001": {"role": "decode"}}``;
    * ``rule_files`` (optional) are copied into its directory and evaluated every
      ``evaluation_interval`` seconds (a group's own ``interval`` wins); :meth:`alerts` lists
      the alerts they raise.

    Parameters beyond the first three are keyword-only tuning knobs.
    """

    def __init__(
        self,
        targets: Sequence[str],
        scrape_interval: float = 1.0,
        metrics_path: str = "/metrics",
        *,
        job: str = "fleet",
        binary: str | None = None,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
        target_labels: Mapping[str, Mapping[str, str]] | None = None,
        rule_files: Sequence[Path] = (),
        evaluation_interval: float = 60.0,
    ) -> None:
        if isinstance(targets, str):
            raise TypeError("targets must be a list of 'host:port' strings, not a single string")
        self.targets: list[str] = list(targets)
        for target in self.targets:
            if "://" in target or "/" in target or ":" not in target:
                raise ValueError(f"target must look like 'host:port', got {target!r}")
        self.scrape_interval = float(scrape_interval)
        # Prometheus rejects scrape_timeout > scrape_interval, and its default timeout is 10s.
        self.scrape_timeout = min(self.scrape_interval, 10.0)
        _duration(self.scrape_interval)  # validate early
        self.metrics_path = metrics_path
        self.job = job
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args)
        self.target_labels: dict[str, dict[str, str]] = {
            t: dict(labels) for t, labels in (target_labels or {}).items()
        }
        unknown = set(self.target_labels) - set(self.targets)
        if unknown:
            raise ValueError(f"target_labels for unknown targets: {sorted(unknown)}")
        self.rule_files = [Path(f) for f in rule_files]
        self.evaluation_interval = float(evaluation_interval)
        _duration(self.evaluation_interval)  # validate early

        self.port: int | None = None
        self.url: str = ""
        self.started_at: float | None = None
        self._tmpdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._client: httpx.Client | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def tmpdir(self) -> Path:
        if self._tmpdir is None:
            raise PrometheusError("PrometheusServer is not running")
        return self._tmpdir

    @property
    def log_path(self) -> Path:
        return self.tmpdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        """The Prometheus configuration this server runs with (JSON is valid YAML)."""
        return {
            "global": {
                "scrape_interval": _duration(self.scrape_interval),
                "scrape_timeout": _duration(self.scrape_timeout),
                "evaluation_interval": _duration(self.evaluation_interval),
            },
            "rule_files": [f"rules-{i}.yml" for i in range(len(self.rule_files))],
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": self.metrics_path,
                    "scheme": "http",
                    "honor_labels": False,
                    "static_configs": self._static_configs(),
                }
            ],
        }

    def _static_configs(self) -> list[dict[str, Any]]:
        plain = [t for t in self.targets if not self.target_labels.get(t)]
        configs: list[dict[str, Any]] = [{"targets": plain}] if plain else []
        for target in self.targets:
            labels = self.target_labels.get(target)
            if labels:
                configs.append({"targets": [target], "labels": labels})
        return configs or [{"targets": []}]

    def start(self) -> None:
        if self._proc is not None:
            raise PrometheusError("PrometheusServer already started")
        binary = self.binary or find_prometheus_binary()
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise PrometheusNotFound(f"{binary!r} is not an executable file. {_INSTALL_HINT}")
        self._tmpdir = Path(tempfile.mkdtemp(prefix="fleetscope-prom-"))
        try:
            config_path = self._tmpdir / "prometheus.yml"
            for i, rule_file in enumerate(self.rule_files):
                shutil.copyfile(rule_file, self._tmpdir / f"rules-{i}.yml")
            config_path.write_text(json.dumps(self.config(), indent=2) + "\n")
            self._client = httpx.Client(timeout=10.0, trust_env=False)
            last_error: PrometheusError | None = None
            # The free port is picked before Prometheus binds it, so another process may
            # grab it in between: retry with a fresh port when that happens.
            for _attempt in range(3):
                try:
                    self._launch(binary, config_path)
                    return
                except _PortTaken as e:
                    last_error = e
            assert last_error is not None
            raise last_error
        except BaseException:
            self.stop()
            raise

    def _launch(self, binary: str, config_path: Path) -> None:
        tmp = self.tmpdir
        self.port = _free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            binary,
            f"--config.file={config_path}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.path={tmp / 'data'}",
            "--storage.tsdb.retention.time=1d",
            # Debian defaults these to /etc/prometheus/...; point them at our private dir.
            f"--web.console.templates={tmp / 'consoles'}",
            f"--web.console.libraries={tmp / 'console_libraries'}",
            "--web.max-connections=64",
            "--query.max-concurrency=4",
            "--log.level=warn",
            *self.extra_args,
        ]
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"\n=== {' '.join(args)}\n".encode())
        self._log.flush()
        env = {k: v for k, v in os.environ.items() if k != "GOMAXPROCS"}
        env["GOMAXPROCS"] = "2"
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tmp,
            env=env,
            start_new_session=True,  # a Ctrl-C in the test run must not race our shutdown
        )
        self._wait_ready()
        self.started_at = time.time()

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._client is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                self._proc = None
                log = self.log_tail()
                if "address already in use" in log:
                    raise _PortTaken(f"port {self.port} was taken:\n{log}")
                raise PrometheusError(f"prometheus exited with status {rc} during startup:\n{log}")
            try:
                r = self._client.get(f"{self.url}/-/ready", timeout=1.0)
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"prometheus not ready on {self.url} after {self.startup_timeout}s:\n"
                    + self.log_tail()
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL) and remove its temporary directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=10)
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of Prometheus's own log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, PrometheusError):
            return "<no prometheus log>"
        return text[-max_chars:]

    # ------------------------------------------------------------------ HTTP API

    def _api(self, path: str, data: dict[str, str] | None = None) -> Any:
        if self._client is None or self._proc is None:
            raise PrometheusError("PrometheusServer is not running")
        url = f"{self.url}{path}"
        try:
            if data is None:
                r = self._client.get(url)
            else:
                r = self._client.post(url, data=data)
        except httpx.TransportError as e:
            raise PrometheusError(f"{url}: {e!r}\n{self.log_tail()}") from e
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, dict) else r.text[:2000]
            query = f" for {data.get('query')!r}" if data else ""
            raise PrometheusError(f"{path}{query} failed (HTTP {r.status_code}): {detail}")
        return body["data"]

    def label_values(self, label: str, match: str) -> list[str]:
        """``/api/v1/label/{label}/values?match[]=...``: what Grafana's ``label_values`` runs."""
        from urllib.parse import quote

        values: list[str] = self._api(f"/api/v1/label/{label}/values?match[]={quote(match)}")
        return values

    def _query_raw(self, expr: str, time: float | None) -> dict[str, Any]:
        data = {"query": expr}
        if time is not None:
            data["time"] = _fmt_time(time)
        result: dict[str, Any] = self._api("/api/v1/query", data)
        return result

    def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        """Instant query. Returns ``[{"metric": {label: value}, "timestamp": t, "value": v}]``.

        ``value`` and ``timestamp`` are floats (``NaN`` / ``±Inf`` included). A scalar
        result comes back as a one-element list with empty ``metric``. Use
        :meth:`query_matrix` for range-vector expressions such as ``x[1m]``.
        """
        data = self._query_raw(expr, time)
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [
                {
                    "metric": s["metric"],
                    "timestamp": float(s["value"][0]),
                    "value": float(s["value"][1]),
                }
                for s in result
            ]
        if kind == "scalar":
            return [{"metric": {}, "timestamp": float(result[0]), "value": float(result[1])}]
        raise PrometheusError(f"{expr!r} returned a {kind}, not a vector; use query_matrix")

    def query_value(self, expr: str, time: float | None = None) -> float:
        """Instant query that must return exactly one sample; returns its value."""
        result = self.query(expr, time)
        if len(result) != 1:
            hint = ""
            if not result and ":" in expr:
                hint = (
                    " (metric names with ':' are stored as '_' when the target is served "
                    "with prometheus_client's OpenMetrics output; serve it with "
                    "serve_registry() to keep ':')"
                )
            raise PrometheusError(
                f"{expr!r} returned {len(result)} samples, expected 1: {result}{hint}"
            )
        value: float = result[0]["value"]
        return value

    def query_matrix(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        """Instant query of a range-vector expression (e.g. ``x[30s]``): the raw samples.

        Returns ``[{"metric": {...}, "values": [(timestamp, value), ...]}]``.
        """
        data = self._query_raw(expr, time)
        if data["resultType"] != "matrix":
            raise PrometheusError(f"{expr!r} returned a {data['resultType']}, not a matrix")
        return [
            {"metric": s["metric"], "values": [(float(t), float(v)) for t, v in s["values"]]}
            for s in data["result"]
        ]

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v1/alerts``: every pending and firing alert (``labels``, ``state``,
        ``activeAt``, ``value``...)."""
        data = self._api("/api/v1/alerts")
        alerts: list[dict[str, Any]] = data["alerts"]
        return alerts

    def targets_status(self) -> list[dict[str, Any]]:
        """The active targets as reported by ``/api/v1/targets`` (health, lastScrape, ...)."""
        data = self._api("/api/v1/targets?state=active")
        active: list[dict[str, Any]] = data["activeTargets"]
        return active

    # ------------------------------------------------------------------ scrape timing

    def _up_samples(self, window: float | None = None) -> dict[str, list[tuple[float, float]]]:
        if window is None:
            since = self.started_at or time.time()
            window = time.time() - since + 2 * self.scrape_interval + 1.0
        selector = f'up{{job="{self.job}"}}[{_duration(max(window, 0.001))}]'
        out: dict[str, list[tuple[float, float]]] = {t: [] for t in self.targets}
        for series in self.query_matrix(selector):
            instance = series["metric"].get("instance", "")
            out.setdefault(instance, []).extend(series["values"])
        for values in out.values():
            values.sort()
        return out

    def scrape_times(self, window: float | None = None) -> dict[str, list[float]]:
        """Timestamps (unix seconds, ms resolution) of the scrapes Prometheus stored, per target.

        Keyed by ``instance`` (the ``host:port`` given to the constructor), oldest first,
        over the last ``window`` seconds (default: since the server started). These are
        the exact timestamps of the stored samples, so ``x @ t`` with such a ``t`` reads
        exactly that scrape. Only successful scrapes (``up == 1``) are included.
        """
        return {
            instance: [t for t, v in samples if v == 1.0]
            for instance, samples in self._up_samples(window).items()
        }

    def wait_for_scrape_after(self, t: float, timeout: float = 30.0) -> float:
        """Block until every target has been scraped successfully at a time after ``t``.

        Returns an evaluation time ``T`` (unix seconds) for PromQL's ``@`` modifier such
        that, for every target, the latest sample at or before ``T`` comes from a scrape
        that *started* after ``t`` and had *completed* before this method returned. So:
        stop changing the metrics, take ``t = time.time()``, call this, and ``x @ T``
        is the frozen state of every target — even if you change the metrics right
        after this returns, and even with several targets scraped at different offsets.
        """
        if not self.targets:
            raise PrometheusError("no targets to wait for")
        deadline = time.monotonic() + timeout
        while True:
            window = time.time() - t + 2 * self.scrape_interval + 1.0
            samples = self._up_samples(window)
            ready = self._eval_time_after(samples, t)
            if ready is not None:
                return ready
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"not every target was scraped successfully after t={_fmt_time(t)} within "
                    f"{timeout}s.\nTargets: {self._targets_summary()}\n"
                    f"Samples of up: {samples}\nPrometheus log:\n{self.log_tail()}"
                )
            time.sleep(min(0.1, self.scrape_interval / 4))

    def _eval_time_after(
        self, samples: dict[str, list[tuple[float, float]]], t: float
    ) -> float | None:
        # T = the earliest "latest sample" among targets. Per target, scrapes are
        # sequential, so every sample with timestamp <= its latest visible one has been
        # committed; hence nothing can still land at or before T. We then need every
        # target's last sample at or before T to be a successful scrape after t.
        latest: list[float] = []
        for target in self.targets:
            values = samples.get(target) or []
            if not values:
                return None
            latest.append(values[-1][0])
        eval_time = min(latest)
        for target in self.targets:
            before = [(ts, v) for ts, v in samples[target] if ts <= eval_time]
            if not before:
                return None
            ts, up = before[-1]
            if ts <= t or up != 1.0:
                return None
        return eval_time

    def _targets_summary(self) -> str:
        try:
            return json.dumps(
                [
                    {k: target.get(k) for k in ("scrapeUrl", "health", "lastScrape", "lastError")}
                    for target in self.targets_status()
                ]
            )
        except PrometheusError as e:
            return f"<unavailable: {e}>"

    # ------------------------------------------------------------------ PromQL helpers

    @staticmethod
    def at(t: float) -> str:
        """Format ``t`` for PromQL's ``@``: ``f"x {prom.at(t)}"`` gives ``x @ 1700000000.123``."""
        if not math.isfinite(t):
            raise ValueError(f"not a finite time: {t!r}")
        return f"@ {_fmt_time(t)}"


class _PortTaken(PrometheusError):
    pass


# ---------------------------------------------------------------------- targets


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class MetricsServer:
    """Serve a ``prometheus_client`` registry on 127.0.0.1 (free port) from a thread.

    Like ``prometheus_client.start_http_server``, but by default always answers in the
    classic text format (0.0.4), ignoring ``Accept``: this keeps ``:`` in metric names
    when Prometheus scrapes it (see the module docstring). ``target`` is the
    ``host:port`` to give :class:`PrometheusServer`.
    """

    def __init__(self, registry: CollectorRegistry, *, force_text_format: bool = True) -> None:
        app: _WSGIApp = make_wsgi_app(registry)
        if force_text_format:
            inner = app

            def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
                environ.pop("HTTP_ACCEPT", None)
                return inner(environ, start_response)

        self._server = make_server(
            "127.0.0.1", 0, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self.port: int = int(self._server.server_port)
        self.target = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.target}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_registry(registry: CollectorRegistry, *, force_text_format: bool = True) -> MetricsServer:
    """Start serving ``registry`` on a free loopback port; use as a context manager."""
    return MetricsServer(registry, force_text_format=force_text_format)
