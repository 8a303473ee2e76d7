"""The few pieces of the Prometheus text format that fleetscope writes (series ids, label sets,
sample values), shared by snapshots and the Prometheus source."""

from __future__ import annotations

import math

Labels = tuple[tuple[str, str], ...]


def escape_label_value(v: str) -> str:
    """A label value as the text format writes it (backslash, double quote, line feed)."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels_text(labels: Labels) -> str:
    """``{k="v",...}``, or "" for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"


def format_value(v: float) -> str:
    """A sample value: ``NaN``, ``+Inf``, ``-Inf`` or the shortest float repr."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))
