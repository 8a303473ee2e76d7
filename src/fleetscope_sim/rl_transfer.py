"""vLLM 0.32's weight-transfer routes on a simulated API server (timed:
``vllm:rl_weight_update_operation_duration_seconds{operation}``).

``POST /init_weight_transfer_engine {"init_info": {...}}`` (``init``),
``/start_weight_update`` (``start``), ``/start_draft_weight_update`` (``start_draft``),
``/update_weights {"update_info": {...} | [{...}, ...]}`` (``update``, one chunk),
``/finish_weight_update {"weight_version": str?}`` (``finish``; sets the version on success),
``/shutdown_weight_transfer_engine`` (``shutdown``). The rules are the worker's
(``v1/worker/gpu_worker.py``), the answers the recorded ones (``tests/data/real-vllm-rl/``):

* without ``--weight-transfer-config`` (``WeightTransfer.backend = None``) every call but
  ``shutdown`` is a 500 ``Weight transfer not configured. ...``;
* ``start`` while an update is active, ``update`` or ``finish`` without one: 500; a chunk that
  fails ends the session (``finish`` then fails too and sets no version);
* the ``ipc`` backend (the default here) checks ``init_info`` / ``update_info`` fields as its
  dataclasses do (unknown or missing keys, mismatched lengths: 500). As on a GPU, a
  well-formed chunk is accepted (``SimRL.cpu``: only an empty one, as recorded on CPU, where
  the failed chunk also killed the engine: not simulated);
* ``start_draft`` needs a draft model (``WeightTransfer.draft_model``).

Ground truth: ``WeightTransfer.completed`` (every finished update: its version and chunks), the
histogram's truth (``endpoint.truth``) and the call ledger (``SimRL.calls``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .hosts import RLHost
from .rl_http import Answer, Request, Timed, embedded, engine_error, validation_error

NOT_CONFIGURED = (
    "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
)


@dataclass
class IPCWeightTransferInitInfo:
    """The ipc backend's init info (its constructor's errors are vLLM's messages)."""

    packed: bool = False


@dataclass
class IPCWeightTransferUpdateInfo:
    """The ipc backend's per-chunk update info."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    ipc_handles: Any = None
    ipc_handles_pickled: str | None = None
    tensor_sizes: list[int] | None = None

    def __post_init__(self) -> None:
        if self.ipc_handles_pickled is not None:
            if self.ipc_handles is not None:
                raise ValueError("Cannot specify both `ipc_handles` and `ipc_handles_pickled`")
            raise ValueError(
                "Refusing to deserialize `ipc_handles_pickled` without "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1"
            )
        if self.ipc_handles is None:
            raise ValueError("Either `ipc_handles` or `ipc_handles_pickled` must be provided")
        n = len(self.names)
        for name in ("dtype_names", "shapes"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"`{name}` should be of the same size as `names`: "
                    f"got {len(getattr(self, name))} and {n}"
                )
        if isinstance(self.ipc_handles, list) and len(self.ipc_handles) != n:
            raise ValueError(
                f"`ipc_handles` should be of the same size as `names`: "
                f"got {len(self.ipc_handles)} and {n}"
            )


@dataclass
class WeightTransfer:
    """The weight-transfer state of one server's workers (DP: every engine's alike)."""

    #: ``--weight-transfer-config`` backend (``None``: not configured)
    backend: str | None = "ipc"
    #: whether a speculative draft model is served (``/start_draft_weight_update`` needs one)
    draft_model: bool = False
    initialized: bool = False
    active: bool = False
    draft: bool = False
    #: chunks received by the active update
    chunks: int = 0
    #: every finished update: (``weight_version`` or None, chunks received)
    completed: list[tuple[str | None, int]] = field(default_factory=list)

    def restart(self) -> None:
        """A new server process: nothing initialised, no update active."""
        self.initialized = self.active = self.draft = False
        self.chunks = 0


class TransferRL(Protocol):
    """What the weight-transfer routes read of ``SimRL``."""

    endpoint: RLHost
    cpu: bool
    transfer: WeightTransfer

    def set_version(self, version: str) -> None: ...


def _check_configured(t: WeightTransfer) -> Answer | None:
    return engine_error(NOT_CONFIGURED) if t.backend is None else None


def route_init(rl: TransferRL, req: Request) -> Answer | Timed:
    error, info = embedded(req, "init_info", required=True)
    if error is not None:
        return error
    if not isinstance(info, dict):
        msg = "Input should be a valid dictionary"
        return validation_error("body.init_info", "dict_type", msg, info)
    t = rl.transfer

    def run() -> Answer:
        if t.backend is None:
            return engine_error(NOT_CONFIGURED)
        if t.backend == "ipc":
            try:
                IPCWeightTransferInitInfo(**info)
            except TypeError as e:
                return engine_error(f"Invalid init_info for IPCWeightTransferEngine: {e}")
        t.initialized = True
        return 200, {"message": "Weight transfer initialized"}

    return Timed("init", run)


def route_shutdown(rl: TransferRL, req: Request) -> Answer | Timed:
    t = rl.transfer

    def run() -> Answer:
        if t.active:
            return engine_error("Cannot release a trainer connection during a weight update")
        t.initialized = False
        return 200, {"message": "Weight transfer shut down"}

    return Timed("shutdown", run)


def _start(rl: TransferRL, draft: bool) -> Timed:
    t = rl.transfer

    def run() -> Answer:
        if t.backend is None:
            return engine_error(NOT_CONFIGURED)
        if t.active:
            return engine_error(
                "start_weight_update called while a weight update is already active. "
                "Call finish_weight_update first."
            )
        if draft and not t.draft_model:
            return engine_error(
                "Draft model weight update requested, but no draft model is configured."
            )
        t.active, t.draft, t.chunks = True, draft, 0
        return 200, {"message": "Draft weight update started" if draft else "Weight update started"}

    return Timed("start_draft" if draft else "start", run)


def route_start(rl: TransferRL, req: Request) -> Timed:
    return _start(rl, draft=False)


def route_start_draft(rl: TransferRL, req: Request) -> Timed:
    return _start(rl, draft=True)


def _chunk_error(t: WeightTransfer, info: Any, rank: int, cpu: bool) -> str | None:
    """Why one engine's worker refuses the chunk (None: it loads it)."""
    if isinstance(info, list):
        if rank >= len(info):
            return "list index out of range"
        info = info[rank]
    if t.backend != "ipc":
        return None
    if not isinstance(info, dict):
        return "Invalid update_info for IPCWeightTransferEngine: argument must be a mapping"
    try:
        IPCWeightTransferUpdateInfo(**info)
    except TypeError as e:
        return f"Invalid update_info for IPCWeightTransferEngine: {e}"
    except ValueError as e:
        return str(e)
    if cpu and info.get("names"):  # CUDA IPC handles
        return "Torch not compiled with CUDA enabled"
    return None


def route_update(rl: TransferRL, req: Request) -> Answer | Timed:
    error, info = embedded(req, "update_info", required=True)
    if error is not None:
        return error
    if not isinstance(info, dict | list):
        msg = "Input should be a valid dictionary"
        return validation_error("body.update_info", "dict_type", msg, info)
    t = rl.transfer

    def run() -> Answer:
        if t.backend is None:
            return engine_error(NOT_CONFIGURED)
        if not t.active:
            return engine_error("start_weight_update must be called before update_weights.")
        for rank in range(len(rl.endpoint.engines)):  # TP=1: global rank = DP index
            problem = _chunk_error(t, info, rank, rl.cpu)
            if problem is not None:
                t.active = t.draft = False  # a failed chunk ends the session
                return engine_error(problem)
        t.chunks += 1
        return 200, {"message": "Weights updated"}

    return Timed("update", run)


def route_finish(rl: TransferRL, req: Request) -> Answer | Timed:
    error, version = embedded(req, "weight_version", required=False)
    if error is not None:
        return error
    if version is not None and not isinstance(version, str):
        msg = "Input should be a valid string"
        return validation_error("body.weight_version", "string_type", msg, version)
    t = rl.transfer

    def run() -> Answer:
        if t.backend is None:
            return engine_error(NOT_CONFIGURED)
        if not t.active:
            return engine_error(
                "finish_weight_update called without a matching start_weight_update."
            )
        t.completed.append((version, t.chunks))
        t.active = t.draft = False
        if version is not None:
            rl.set_version(version)
        return 200, {"message": "Weight update finished"}

    return Timed("finish", run)
