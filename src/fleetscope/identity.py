"""Who a row of statistics belongs to: an engine of an endpoint, or the endpoint itself.

An :class:`EngineId` is a value made of its parts, the endpoint's name and the engine's label
there (``None`` for the endpoint's own engine-less row: API-server counters, ``process_*``).
It is also the string keys show (``server0.1``, or ``server0`` for an endpoint's row), so it
can be used wherever an engine id string is expected, but its parts are never recovered by
splitting that string: ``EngineId("rack1", "a.b").endpoint == "rack1"``.

Endpoint names are validated: they appear in keys as one path segment, so they cannot contain
the key separator ``/`` or the engine separator ``.``.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeGuard

#: an endpoint's (or engine's) role in a disaggregated fleet
Role = Literal["prefill", "decode"]


def is_role(text: str | None) -> TypeGuard[Role]:
    """Whether ``text`` (a label value, an argument) names a role."""
    return text in ("prefill", "decode")


_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")


def validate_endpoint_name(name: str) -> str:
    """``name`` if it can name an endpoint (letters, digits, ``_``, ``-``), else ValueError."""
    if not isinstance(name, str) or not _ENDPOINT_NAME.fullmatch(name):
        raise ValueError(
            f"endpoint name {name!r} is not valid: use letters, digits, '_' and '-' "
            "(it is one segment of every key; '.' separates the engine label, '/' the key path)"
        )
    return name


def endpoint_of(engine: str) -> str:
    """The endpoint of an engine id (a plain string id is taken as a whole endpoint)."""
    return engine.endpoint if isinstance(engine, EngineId) else engine


class EngineId(str):
    """An engine (``label`` set) or an endpoint's own row (``label`` None), as a value.

    Equal to, and hashed like, its rendering (``server0.1``), so mappings keyed by engine id
    accept the rendered string too.
    """

    __slots__ = ("endpoint", "label")
    endpoint: str
    label: str | None

    def __new__(cls, endpoint: str, label: str | None = None) -> EngineId:
        text = endpoint if label is None else f"{endpoint}.{label}"
        self = super().__new__(cls, text)
        self.endpoint = endpoint
        self.label = label
        return self

    @property
    def is_engine(self) -> bool:
        """False for an endpoint's own engine-less row."""
        return self.label is not None

    def __reduce__(self) -> tuple[Any, ...]:
        return (EngineId, (self.endpoint, self.label))

    def __repr__(self) -> str:
        return f"EngineId({self.endpoint!r}, {self.label!r})"

    def to_json(self) -> list[str | None]:
        return [self.endpoint, self.label]

    @classmethod
    def from_json(cls, value: Any) -> EngineId:
        """From :meth:`to_json` (a plain string is read as an endpoint's own row)."""
        if isinstance(value, list | tuple):
            return cls(str(value[0]), None if value[1] is None else str(value[1]))
        return cls(str(value))
