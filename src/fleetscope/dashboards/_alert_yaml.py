"""A small YAML writer for the rule files: block mappings and sequences of plain data, strings
double-quoted (JSON's escapes are YAML's), PromQL expressions as literal blocks (no escaping, as
written). Enough for Prometheus rule files and the PrometheusRule resource; no dependency."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: keys whose (string) values are written as literal blocks
LITERAL_KEYS = frozenset({"expr"})


def dump(value: Mapping[str, Any]) -> str:
    """``value`` (a mapping of mappings, lists, strings, numbers, booleans) as a YAML document."""
    return "\n".join(_mapping(value, 0)) + "\n"


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _mapping(value: Mapping[str, Any], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, item in value.items():
        if not key or not all(c.isalnum() or c in "_-./" for c in key):
            raise ValueError(f"not a plain YAML key: {key!r}")
        if key in LITERAL_KEYS and isinstance(item, str):
            if item[:1].isspace() or not item.strip():  # a literal block's indent comes first
                raise ValueError(f"{key}: cannot start with a blank: {item[:40]!r}")
            lines.append(f"{pad}{key}: |-")
            lines += [f"{pad}  {line}" if line else "" for line in item.split("\n")]
        elif isinstance(item, Mapping):
            lines += (
                [f"{pad}{key}:", *_mapping(item, indent + 2)] if item else [f"{pad}{key}: {{}}"]
            )
        elif isinstance(item, Sequence) and not isinstance(item, str):
            lines += [f"{pad}{key}:", *_sequence(item, indent)] if item else [f"{pad}{key}: []"]
        else:
            lines.append(f"{pad}{key}: {_scalar(item)}")
    return lines


def _sequence(items: Sequence[Any], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in items:
        if isinstance(item, Mapping) and item:
            inner = _mapping(item, indent + 2)
            lines.append(f"{pad}- {inner[0][indent + 2 :]}")
            lines += inner[1:]
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines
