"""What the simulated RL routes share: the parsed request, vLLM's error bodies, and the timed
call a handler hands back (see :mod:`fleetscope_sim.rl`).

Error bodies are vLLM 0.32's (``tests/data/real-vllm-rl/``): a FastAPI validation failure is a
400 ``{"error": {"message": "1 validation error:\\n  {...}", "type": "Bad Request", "param":
"query.level", "code": 400}}`` (the ``{...}`` is pydantic's error as a Python ``repr``); an
engine failure a 500 ``{"error": {"message": "Call to collective_rpc method failed: Worker failed
with error '...', please check the stack trace above for the root cause", "type":
"InternalServerError", "param": null, "code": 500}}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

Answer = tuple[int, dict[str, Any]]

_MISSING = object()
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


@dataclass
class Request:
    """One call of an RL route: method, path, query parameters and JSON body."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    raw_body: bytes = b""

    @classmethod
    def parse(cls, method: str, path: str, body: bytes = b"", query: str = "") -> Request:
        return cls(method, path, parse_qs(query, keep_blank_values=True), body)

    def body(self) -> Any:
        """The JSON body (``None`` when empty); raises ``ValueError`` when not JSON."""
        return json.loads(self.raw_body) if self.raw_body.strip() else None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


@dataclass
class Timed:
    """A validated call of a timed handler: ``run`` does the engine call (under the endpoint's
    lock) and returns the answer; its ``operation`` is observed around it. ``begin``, if any,
    is what the call changes as soon as it is in flight (a ``/sleep`` pauses the scheduler at
    once, as ``mode=wait`` shows)."""

    operation: str
    run: Callable[[], Answer]
    begin: Callable[[], None] | None = None


def validation_error(loc: str, kind: str, msg: str, value: Any, ctx: Any = None) -> Answer:
    """FastAPI's 400 for one invalid field (``loc`` like ``query.level``, ``body.init_info``)."""
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": str(value)}
    if ctx is not None:
        err["ctx"] = ctx
    message = f"1 validation error:\n  {err!r}"
    return 400, {"error": {"message": message, "type": "Bad Request", "param": loc, "code": 400}}


def missing(loc: str) -> Answer:
    return validation_error(loc, "missing", "Field required", None)


def engine_error(message: str, method: str = "collective_rpc", worker: bool = True) -> Answer:
    """vLLM's 500 for an engine call that raised (``worker``: raised in the model's worker)."""
    if worker:
        message = (
            f"Worker failed with error '{message}', please check the stack trace above for the"
            " root cause"
        )
    text = f"Call to {method} method failed: {message}"
    return 500, {
        "error": {"message": text, "type": "InternalServerError", "param": None, "code": 500}
    }


def embedded(req: Request, name: str, required: bool) -> tuple[Answer | None, Any]:
    """``Body(embed=True)`` field ``name``: (a 400, None) or (None, its value or ``None``)."""
    try:
        data = req.body()
    except ValueError:
        return validation_error("body", "json_invalid", "JSON decode error", req.raw_body), None
    value = data.get(name, _MISSING) if isinstance(data, dict) else _MISSING
    if value is _MISSING:
        return (missing(f"body.{name}") if required else None), None
    return None, value


def pause_mode(req: Request) -> Answer | None:
    """The ``mode`` query parameter of ``/pause`` and ``/sleep`` (``abort``, ``wait``, ``keep``)."""
    mode = req.param("mode")
    if mode is None or mode in ("abort", "wait", "keep"):
        return None
    expected = "'abort', 'wait' or 'keep'"
    ctx = {"expected": expected}
    return validation_error("query.mode", "literal_error", f"Input should be {expected}", mode, ctx)


def bool_param(req: Request, name: str) -> Answer | None:
    """A boolean query parameter (pydantic's spellings)."""
    value = req.param(name)
    if value is None or value.lower() in _TRUE | _FALSE:
        return None
    msg = "Input should be a valid boolean, unable to interpret input"
    return validation_error(f"query.{name}", "bool_parsing", msg, value)


def int_param(req: Request, name: str, default: int, lo: int, hi: int) -> tuple[Answer | None, int]:
    """An integer query parameter within ``[lo, hi]``: (a 400 or None, its value)."""
    text = req.param(name)
    if text is None:
        return None, default
    loc = f"query.{name}"
    try:
        value = int(text.strip())
    except ValueError:
        msg = "Input should be a valid integer, unable to parse string as an integer"
        return validation_error(loc, "int_parsing", msg, text), default
    if value > hi:
        msg = f"Input should be less than or equal to {hi}"
        return validation_error(loc, "less_than_equal", msg, text, {"le": hi}), default
    if value < lo:
        msg = f"Input should be greater than or equal to {lo}"
        return validation_error(loc, "greater_than_equal", msg, text, {"ge": lo}), default
    return None, value
