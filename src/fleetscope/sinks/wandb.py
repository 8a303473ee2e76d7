"""Weights & Biases sink: fleet keys on their own step axis, in the trainer's run or a new one.

``wandb`` is imported only when a :class:`WandbSink` is built, so fleetscope works without it.

Step axes. The sink declares ``run.define_metric(step_metric)`` and
``run.define_metric(key_prefix_glob, step_metric=step_metric)`` and logs every poll as
``{**numeric_metrics, step_metric: step, wall_time_key: wall_time}`` without ever passing
``step=`` to ``run.log``: charts of fleet keys use ``step_metric`` as x axis, and W&B's own
``_step`` belongs to whoever owns the run.

Rows. ``run.log`` without ``step=`` commits a new history row and advances ``_step``; with
``step=N`` below the current ``_step`` W&B drops the row ("Tried to log to step N that is less
than the current step M"); ``commit=False`` merges into the pending row, where a later value of
the same key overwrites an earlier one (checked on wandb 0.31). So no way of writing polls
into rows of a run the trainer owns keeps every poll for every trainer: a row per poll moves
``_step`` past a trainer that passes ``step=``, and merging keeps one poll per trainer row.

In a run the sink creates (no ``run=``): one row per poll (``commit=True``), every poll kept.

With ``run=trainer_run`` (``history="companion"``, the default): fleetscope writes NO history
row of its own into the trainer's run. Every poll goes to its own row of a companion run the
sink creates: same project and entity, ``group`` = the trainer's group (or, if it has none, the
trainer's run id), ``job_type="fleetscope"``, name ``<trainer name>-fleetscope``, same mode
(online / offline) and directory, ``config["fleetscope/trainer_run_id"]`` = the trainer's id.
The trainer's run gets, in its summary only (``run.summary``, which never touches history):
the run summary and ``fleetscope/history_run_id`` (and ``fleetscope/history_run_path`` online).
Window keys (``inference/<label>/...``, default schema) of a window that just stopped are also
merged into the trainer's pending row with ``commit=False`` (never ``step=``, never a commit),
so they land in a trainer row, never a row of their own: a trainer that passes ``step=`` gets
them in the row of the step during which the window stopped (it is still pending); one that
does not (its ``run.log`` commits at once) gets them in its next row. If one label's
window stops twice between two trainer log calls, that row keeps the later one (the companion
run has both). ``close()`` finishes the companion run and leaves the trainer's alone.

Key sets. ``keys="compact"`` (the default) logs the compact key set, a few hundred keys per
scope and ~60 per engine, which keeps every prime-rl overview-panel key, every SkyRL key and
every per-engine headline and leaves out what means nothing or repeats another key (table in
docs/sinks.md); ``keys="full"`` logs prime-rl's complete pass-through, as JSONL and
TensorBoard do. The run summary follows the same choice.

``history="trainer"`` keeps the old single-run behaviour: polls go into the trainer's run with
``commit`` (default False: merged into the trainer's row, one poll per trainer row kept;
``commit=True`` one row per poll, lossless only if the trainer never passes ``step=``).
"""

from __future__ import annotations

import logging
import netrc
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from fleetscope.keys import KEY_SETS, KeySet
from fleetscope.sinks.base import SinkBase, Value
from fleetscope.util.warn import RateLimitedWarner

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.wandb.ai"


def api_key_configured() -> bool:
    """True if W&B can find an API key: ``WANDB_API_KEY``, or a netrc entry for the W&B host.

    The host is that of ``WANDB_BASE_URL`` (default api.wandb.ai); the netrc file is ``$NETRC``
    or ``~/.netrc``, as wandb itself looks them up.
    """
    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not host or not os.path.isfile(path):
        return False
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def resolve_mode(mode: str | None) -> str:
    """The mode for a run the sink creates.

    ``mode`` if given; else ``WANDB_MODE`` if set (``WANDB_DISABLED=true`` means "disabled");
    else "online" when an API key is configured; else "offline" (no key: keep the run on disk,
    ``wandb sync`` it later).
    """
    if mode:
        return mode
    env_mode = os.environ.get("WANDB_MODE", "").strip()
    if env_mode:
        return env_mode
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "disabled"
    return "online" if api_key_configured() else "offline"


class WandbSink(SinkBase):
    """Logs fleet keys to a W&B run: ``run`` if given (e.g. the trainer's), else a new one.

    Construction errors (wandb missing, ``wandb.init`` failing) raise. After that, tracker
    trouble never does: a failing wandb call is logged as a warning, at most once a minute per
    kind of call, with a count of the ones held back, and its data is dropped.

    ``project``, ``entity``, ``mode``, ``dir``, ``name`` and ``config`` are for the run the sink
    creates (see :func:`resolve_mode` for ``mode``) and are ignored when ``run`` is given.
    String values are skipped by :meth:`log` (W&B charts need numbers) and kept by
    :meth:`log_summary`. Non-finite floats are passed on; W&B stores them as NaN/±Infinity.
    ``keys``: ``"compact"`` (default) or ``"full"`` (module docs); the collector hands the sink
    that set (its ``key_set`` attribute).
    """

    extra = "wandb"

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        run: Run | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        step_metric: str = "inference/step",
        key_prefix_glob: str = "inference/*",
        *,
        wall_time_key: str = "inference/wall_time",
        commit: bool | None = None,
        history: str = "companion",
        alerts: bool = False,
        alert_interval: float = 600.0,
        keys: KeySet = "compact",
    ) -> None:
        if keys not in KEY_SETS:
            raise ValueError(f"keys must be one of {KEY_SETS}, not {keys!r}")
        #: which key set the collector hands this sink: "compact" or "full"
        self.key_set: KeySet = keys
        (wandb,) = self._import_extra("wandb")
        self.step_metric = step_metric
        self.key_prefix_glob = key_prefix_glob
        self.wall_time_key = wall_time_key
        self._closed = False
        self._warner = RateLimitedWarner(logger, prefix="WandbSink: ")
        # health events as W&B alerts (email / Slack per the user's W&B settings), at most one
        # per condition and engine every ``alert_interval`` seconds
        self.alerts = alerts
        self.alert_interval = alert_interval
        self._alerted: dict[tuple[str, str], float] = {}
        if run is None:
            self.mode: str | None = resolve_mode(mode)
            # reinit="create_new": never return or finish a run the process already has open
            # (wandb's default in scripts would hand back the trainer's run, which close()
            # would then finish).
            run = wandb.init(
                project=project,
                entity=entity,
                mode=self.mode,
                dir=os.fspath(dir) if dir is not None else None,
                name=name,
                config=dict(config) if config is not None else None,
                reinit="create_new",
            )
            self.owns_run = True
        else:
            ignored = {
                k: v
                for k, v in dict(
                    project=project, entity=entity, mode=mode, dir=dir, name=name, config=config
                ).items()
                if v is not None
            }
            if ignored:
                logger.warning("WandbSink: run= given, ignoring %s", sorted(ignored))
            self.mode = None
            self.owns_run = False
        if history not in ("companion", "trainer"):
            raise ValueError(f"history must be 'companion' or 'trainer', not {history!r}")
        self.run = run
        #: where poll rows go: ``run`` itself, or the companion run (see the module docs)
        self.history_run = run
        self.history = "own" if self.owns_run else history
        self._window_labels: set[str] = set()
        self._window_prefix = key_prefix_glob.rstrip("*").rstrip("/")
        if self.history == "companion":
            self.history_run = self._companion(wandb, run, config)
            self.commit = True
        else:
            self.commit = self.owns_run if commit is None else bool(commit)
        try:
            self.history_run.define_metric(step_metric)
            self.history_run.define_metric(key_prefix_glob, step_metric=step_metric)
        except Exception as e:
            self._warner.warn("define_metric", f"define_metric failed: {type(e).__name__}: {e}")

    def _companion(self, wandb: Any, trainer: Any, config: Mapping[str, Any] | None) -> Any:
        """The run that holds fleetscope's rows next to a trainer's run (module docs)."""
        settings = getattr(trainer, "settings", None)
        trainer_id = getattr(trainer, "id", None)
        mode = "online"
        if getattr(trainer, "disabled", False):
            mode = "disabled"
        elif getattr(trainer, "offline", False):
            mode = "offline"
        root = getattr(settings, "root_dir", None)
        base = getattr(trainer, "name", None) or trainer_id or "run"
        companion = wandb.init(
            project=getattr(trainer, "project", None) or None,
            entity=getattr(trainer, "entity", None) or None,
            group=getattr(trainer, "group", None) or trainer_id,
            job_type="fleetscope",
            name=f"{base}-fleetscope",
            mode=mode,
            dir=os.fspath(root) if root else None,
            config={"fleetscope/trainer_run_id": trainer_id, **dict(config or {})},
            reinit="create_new",
        )
        pointer: dict[str, Any] = {"fleetscope/history_run_id": getattr(companion, "id", None)}
        path = getattr(companion, "path", None) if mode == "online" else None
        if path:
            pointer["fleetscope/history_run_path"] = (
                "/".join(path) if not isinstance(path, str) else path
            )
        try:
            trainer.summary.update(pointer)
        except Exception as e:
            self._warner.warn("summary", f"summary update failed: {type(e).__name__}: {e}")
        return companion

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        payload: dict[str, Any] = {k: v for k, v in metrics.items() if not isinstance(v, str)}
        payload[self.step_metric] = int(step)
        payload[self.wall_time_key] = float(wall_time)
        if self._closed:
            self._warner.warn("closed", f"log after close(), dropped poll {step}")
            return
        try:
            self.history_run.log(payload, commit=self.commit)
        except Exception as e:
            self._warner.warn(
                "log", f"run.log failed, dropped poll {step}: {type(e).__name__}: {e}"
            )
        if self.history == "companion" and self._window_labels:
            prefixes = tuple(f"{self._window_prefix}/{label}/" for label in self._window_labels)
            windows = {k: v for k, v in payload.items() if k.startswith(prefixes)}
            if windows:
                try:  # the trainer's pending row, at the trainer's step: no commit, no step=
                    self.run.log(windows, commit=False)
                except Exception as e:
                    self._warner.warn(
                        "log-windows", f"window keys to the trainer's run failed: {e!r}"
                    )

    def on_window_start(self, label: str) -> None:
        """A window opened: its keys, when it stops, also go to the trainer's run."""
        self._window_labels.add(str(label))

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        if self._closed:
            self._warner.warn("closed", "log_summary after close(), dropped")
            return
        runs = [self.run] if self.history_run is self.run else [self.run, self.history_run]
        for run in runs:
            try:
                run.summary.update(dict(summary))
            except Exception as e:
                self._warner.warn(
                    "summary", f"summary update failed, dropped: {type(e).__name__}: {e}"
                )

    def log_events(self, events: Sequence[Any]) -> None:
        """Send health events (``fleetscope.health.HealthEvent``) as W&B alerts, if enabled."""
        if not self.alerts or self._closed:
            return
        import wandb

        now = time.monotonic()
        for ev in events:
            key = (ev.condition, ev.subject)
            last = self._alerted.get(key)
            if last is not None and now - last < self.alert_interval:
                continue
            self._alerted[key] = now
            try:
                self.history_run.alert(
                    title=f"fleetscope: {ev.condition} on {ev.subject}",
                    text=ev.message,
                    level=wandb.AlertLevel.WARN,  # type: ignore[attr-defined]
                    wait_duration=self.alert_interval,
                )
            except Exception as e:
                self._warner.warn("alert", f"run.alert failed: {type(e).__name__}: {e}")

    def close(self) -> None:
        """Finish the run(s) this sink created (its own, or the companion); leave a passed-in run
        alone. Idempotent."""
        if self._closed:
            return
        self._closed = True
        run = (
            self.run if self.owns_run else self.history_run if self.history == "companion" else None
        )
        if run is None:
            return
        try:
            run.finish()
        except Exception as e:
            self._warner.warn("finish", f"run.finish failed: {type(e).__name__}: {e}")
