"""MLflow sink: every poll as batched metrics of one MLflow run, the run summary as metrics + tags.

``mlflow`` is imported only when an :class:`MlflowSink` is built (``pip install
'fleetscope[mlflow]'``). It talks to the tracking server through ``MlflowClient`` only (never
the fluent ``mlflow.start_run`` state), so it neither needs nor disturbs a trainer's active run.

Runs. With ``run_id`` the sink logs into that run (e.g. the trainer's:
``run_id=mlflow.active_run().info.run_id``) and leaves it open on :meth:`close`. Without it,
the sink creates a run named ``run_name`` in ``experiment`` (created if missing) and ends it
on :meth:`close`: ``FAILED`` if the last summary said ``run_status = "failed"``, else
``FINISHED``.

Writes. Each poll (~3,000 keys for a mid-size fleet) goes out as ``MlflowClient.log_batch``
calls of at most 1,000 metrics (MLflow's per-request limit), every metric with the poll's
``step`` and ``timestamp = round(wall_time * 1000)`` ms. Strings are skipped; bools are 0/1.
The summary goes out the same way: numeric values as metrics at the step of the last poll
(their latest value is the summary value, in ``get_run(id).data.metrics``), string values such
as ``run_status`` as run tags (``get_run(id).data.tags``).

Key names. MLflow allows only alphanumerics, ``_``, ``-``, ``.``, space, ``:`` and ``/`` in
metric and tag keys (no ``:`` on Windows servers), at most 250 characters, and a key must stay
the same under ``posixpath.normpath``. :func:`mlflow_key` maps a fleetscope key onto that,
deterministically:

1. Prometheus labels become dotted path parts: ``{`` ``=`` ``,`` become ``.``; ``}`` and
   ``"`` are dropped. ``request_success_total{finished_reason=length}`` becomes
   ``request_success_total.finished_reason.length``, ``x{a="1",b="2"}/sum`` ``x.a.1.b.2/sum``.
2. Any other character outside ``[A-Za-z0-9_\\-. :/]`` becomes ``_``.
3. Path parts are normalised: empty parts (``//``, a leading or trailing ``/``) are dropped,
   a part that is ``.`` or ``..`` becomes ``_`` or ``__``.
4. Keys longer than 250 characters keep their first 241 and end with ``-`` plus the first 8 hex
   digits of the SHA-1 of the original key.

Keys that are already valid (all of fleetscope's unlabelled keys, ``:rate`` and ``:mean``
included) are unchanged. Should two keys of one run map to the same name (``a{x=y}`` and
``a.x.y``), the key seen second gets ``-`` + 8 hex digits of its SHA-1 appended, and a warning.

Stores. Any tracking URI MLflow takes. Locally, prefer ``sqlite:///mlflow.db``: recent MLflow 3
releases (3.17 checked) refuse a ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set,
and the file store's ``get_metric_history`` walks every metric file of the run on each call.
Cost: 3,000 metrics took 2-4 s per poll on a local file or sqlite store, measured on a
2-core machine that was busy with other work: mind it with a short poll interval.

Trouble. Construction errors (mlflow missing, tracking server unreachable) raise. After that
nothing does: a failed write is a rate-limited warning, the rest of that poll is dropped, and
writes pause for ``retry_after`` seconds (polls in that time are dropped and counted), so an
unreachable server (MLflow's HTTP client retries for minutes) does not hold up every poll. The
summary is always attempted.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from fleetscope.keys import KEY_SETS, KeySet
from fleetscope.sinks.base import SinkBase, Value, numeric
from fleetscope.util.warn import RateLimitedWarner

logger = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_TAGS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
MAX_KEY_LENGTH = 250  # MAX_ENTITY_KEY_LENGTH
MAX_TAG_VALUE_LENGTH = 8000  # MAX_TAG_VAL_LENGTH

_LABEL_TRANS = str.maketrans({"{": ".", "=": ".", ",": ".", "}": None, '"': None})
_INVALID = re.compile(r"[^A-Za-z0-9_\-. :/]")


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]


def mlflow_key(key: str) -> str:
    """The MLflow metric/tag name for a fleetscope key (see the module doc for the rule)."""
    out = _INVALID.sub("_", str(key).translate(_LABEL_TRANS))
    parts = []
    for part in out.split("/"):
        if not part:
            continue
        if part in (".", ".."):
            part = "_" * len(part)
        parts.append(part)
    out = "/".join(parts) or "_"
    if len(out) > MAX_KEY_LENGTH:
        out = f"{out[: MAX_KEY_LENGTH - 9]}-{_digest(key)}"
    return out


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MlflowSink(SinkBase):
    """Logs fleet keys to an MLflow run: ``run_id`` if given, else a new run.

    Args:
        tracking_uri: MLflow tracking URI (``http://...``, or a local database:
            ``sqlite:///mlflow.db``); None uses MLflow's default (``MLFLOW_TRACKING_URI``,
            ...). MLflow 3 refuses new runs in a ``file:`` store (``./mlruns``).
        experiment: experiment name for the run the sink creates (created if missing).
        run_id: log into this existing run instead, and leave it open on close.
        run_name: name of the run the sink creates.
        tags: tags for the run the sink creates.
        retry_after: seconds to pause writes after a failed one.
        keys: ``"full"`` (default: the complete pass-through) or ``"compact"`` (the key set
            W&B gets by default; see docs/sinks.md).
    """

    extra = "mlflow"

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "fleetscope",
        run_id: str | None = None,
        run_name: str = "fleetscope",
        *,
        tags: Mapping[str, str] | None = None,
        retry_after: float = 30.0,
        keys: KeySet = "full",
    ) -> None:
        if keys not in KEY_SETS:
            raise ValueError(f"keys must be one of {KEY_SETS}, not {keys!r}")
        self.key_set: KeySet = keys
        MlflowClient, self._Metric, self._RunTag = self._import_extra(
            "mlflow.tracking:MlflowClient", "mlflow.entities:Metric", "mlflow.entities:RunTag"
        )
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.retry_after = float(retry_after)
        self._lock = threading.Lock()
        self._warner = RateLimitedWarner(logger, prefix="MlflowSink: ")
        self._keys: dict[str, str] = {}  # fleetscope key -> MLflow key
        self._owners: dict[str, str] = {}  # MLflow key -> fleetscope key
        self._paused_until = 0.0
        self._dropped = 0
        self._closed = False
        self._status: str | None = None
        self._summary_ts = 0
        self.last_step = 0
        if run_id is not None:
            self.run_id = run_id
            self.owns_run = False
            self.experiment_id = self.client.get_run(run_id).info.experiment_id
        else:
            self.experiment_id = self._experiment_id(experiment)
            run = self.client.create_run(
                self.experiment_id, run_name=run_name, tags=dict(tags or {})
            )
            self.run_id = run.info.run_id
            self.owns_run = True

    def _experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:  # created by someone else meanwhile?
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    # ------------------------------------------------------------------ keys

    def key(self, key: str) -> str:
        """The MLflow name this sink uses for ``key`` (stable for the sink's lifetime)."""
        name = self._keys.get(key)
        if name is not None:
            return name
        name = mlflow_key(key)
        owner = self._owners.get(name)
        if owner is not None and owner != key:
            clash = name
            name = f"{name[: MAX_KEY_LENGTH - 9]}-{_digest(key)}"
            self._warner.warn(
                "key-clash", f"{key!r} and {owner!r} both map to {clash!r}; using {name!r}"
            )
        self._owners.setdefault(name, key)
        self._keys[key] = name
        return name

    # ------------------------------------------------------------------ Sink

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        with self._lock:
            if self._closed:
                self._warner.warn("closed", f"log after close(), dropped poll {step}")
                return
            if time.monotonic() < self._paused_until:
                self._dropped += 1
                return
            try:
                ts = round(float(wall_time) * 1000)
                batch = [
                    self._Metric(self.key(k), f, ts, int(step))
                    for k, v in metrics.items()
                    if (f := numeric(v)) is not None
                ]
            except Exception as e:
                self._warner.warn("encode", f"dropped poll {step}: {type(e).__name__}: {e}")
                return
            if self._send(batch, [], what=f"poll {step}"):
                self.last_step = max(self.last_step, int(step))

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        with self._lock:
            if self._closed:
                self._warner.warn("closed", "log_summary after close(), dropped")
                return
            # strictly later than any earlier summary: MLflow's latest value of a key is the
            # one with the highest (step, timestamp), so a re-published summary wins
            ts = max(round(time.time() * 1000), self._summary_ts + 1)
            self._summary_ts = ts
            metrics, tags = [], []
            try:
                for k, v in summary.items():
                    f = numeric(v)
                    if f is not None:
                        metrics.append(self._Metric(self.key(k), f, ts, self.last_step))
                    elif v is not None:
                        tags.append(self._RunTag(self.key(k), str(v)[:MAX_TAG_VALUE_LENGTH]))
                        if k == "run_status":
                            self._status = str(v)
            except Exception as e:
                self._warner.warn("encode-summary", f"dropped the summary: {e!r}")
                return
            self._paused_until = 0.0  # the summary is worth one more try
            self._send(metrics, tags, what="the summary")

    def _send(self, metrics: list[Any], tags: list[Any], *, what: str) -> bool:
        """Write in batches MLflow accepts; on failure warn, pause, drop the rest."""
        batches: list[tuple[list[Any], list[Any]]] = [
            (m, []) for m in _chunks(metrics, MAX_METRICS_PER_BATCH)
        ]
        batches += [([], t) for t in _chunks(tags, MAX_TAGS_PER_BATCH)]
        for m, t in batches:
            try:
                self.client.log_batch(self.run_id, metrics=m, tags=t)
            except Exception as e:
                self._paused_until = time.monotonic() + self.retry_after
                dropped, self._dropped = self._dropped, 0
                more = f"; {dropped} earlier poll(s) dropped while paused" if dropped else ""
                self._warner.warn(
                    "log_batch",
                    f"log_batch failed, dropped {what} (writes paused {self.retry_after:g} s"
                    f"{more}): {type(e).__name__}: {e}",
                )
                return False
        return True

    def close(self) -> None:
        """End the run if this sink created it (FAILED after a failed run). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.owns_run:
            return
        status = "FAILED" if self._status == "failed" else "FINISHED"
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            self._warner.warn("terminate", f"set_terminated failed: {type(e).__name__}: {e}")
