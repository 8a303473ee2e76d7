"""prometheus_client metric families -> the parser's input, line for line as ``generate_latest``
writes them (text format 0.0.4), so that an in-process registry or a multiprocess directory
gives the very :class:`~fleetscope.exposition.Exposition` a scrape of the same state over HTTP
gives.

What ``generate_latest`` does and this does too: counters are typed under their ``_total`` name,
``info`` families become ``..._info`` gauges, ``stateset`` gauges, ``gaugehistogram``
histograms, ``unknown`` untyped; ``_created`` (and ``_gsum`` / ``_gcount``) samples follow their
family as their own ``gauge`` families; labels are sorted; names outside the legacy character
set have the other characters replaced by ``_`` (its default escaping); a sample timestamp is
written in milliseconds. What it does not: ``# HELP`` lines (the parser skips comments), and
values are written with ``repr`` rather than ``floatToGoString`` (the same float either way).

``keep``: family-name prefixes to keep (an exact name works too); the others are not written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetscope.catalog import PROCESS_START, SGLANG_PREFIX
from fleetscope.exposition.textformat import escape_label_value, format_value

__all__ = ["DEFAULT_KEEP", "LineWriter", "MetricFamily", "family_lines"]

#: what a colocated engine's source reads by default: every vLLM and SGLang family, and the
#: process start time (restarts; an engine whose process started after a window opened)
DEFAULT_KEEP: tuple[str, ...] = ("vllm:", SGLANG_PREFIX, PROCESS_START)

_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_:]")
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "histogram": "histogram",
    "summary": "summary",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


class _Sample(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def timestamp(self) -> object: ...


class MetricFamily(Protocol):
    """What is read of a ``prometheus_client.metrics_core.Metric``."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def samples(self) -> Sequence[_Sample]: ...


def _escape_name(name: str) -> str:
    """``generate_latest``'s default (underscores) escaping of a metric name."""
    if not name or _LEGACY_NAME.fullmatch(name):
        return name
    out = _NOT_NAME_CHAR.sub("_", name)
    return "_" + out[1:] if out[0].isdigit() else out


@dataclass(slots=True)
class _Shape:
    """One family as last written: its samples' (name, labels), and per sample its head
    (``name{labels}``) and the block it goes in (0: the family; 1..: the ``_created``-like
    families after it)."""

    type: str
    samples: list[tuple[str, dict[str, str]]]
    heads: list[str]
    blocks: list[list[int]]  # per block, its samples' indexes
    type_lines: list[str]  # per block


def _value(v: float) -> str:
    """A sample value as the parser reads it (``repr``; ``NaN``/``+Inf``/``-Inf`` spelt out;
    an int or bool a custom collector gives, as a float)."""
    if type(v) is float and v - v == 0:  # a finite float (NaN and infinities give NaN)
        return repr(v)
    return format_value(v)


class LineWriter:
    """Writes families' lines; keeps each family's sample heads between polls (one per
    source): a family whose series are those of the last poll costs one comparison and one
    ``repr`` per sample."""

    def __init__(self) -> None:
        self._shapes: dict[str, _Shape] = {}
        self._label_names: dict[str, str] = {}

    def _label_name(self, k: str) -> str:
        out = self._label_names.get(k)
        if out is None:
            out = k if _LEGACY_LABEL.fullmatch(k) else _NOT_LABEL_CHAR.sub("_", k)
            if out[:1].isdigit():
                out = "_" + out[1:]
            self._label_names[k] = out
        return out

    def _head(self, name: str, labels: dict[str, str]) -> str:
        if not labels:
            return name
        inner = ",".join(
            f'{self._label_name(k)}="{escape_label_value(v)}"' for k, v in sorted(labels.items())
        )
        return name + "{" + inner + "}"

    def _shape(self, m: MetricFamily, samples: list[tuple[str, dict[str, str]]]) -> _Shape:
        base = _escape_name(m.name)
        typ = m.type
        typed = base + "_total" if typ == "counter" else base + "_info" if typ == "info" else base
        heads: list[str] = []
        main: list[int] = []
        extra: dict[str, list[int]] = {}
        for i, (sname, labels) in enumerate(samples):
            suffix = sname[len(m.name) :] if sname.startswith(m.name) else None
            heads.append(
                self._head(base + suffix if suffix is not None else _escape_name(sname), labels)
            )
            if suffix in _OPENMETRICS_ONLY:
                extra.setdefault(suffix, []).append(i)
            else:
                main.append(i)
        blocks = [main] + [extra[k] for k in sorted(extra)]
        type_lines = [f"# TYPE {typed} {_TYPES.get(typ, typ)}"]
        type_lines += [f"# TYPE {base}{k} gauge" for k in sorted(extra)]
        return _Shape(typ, samples, heads, blocks, type_lines)

    def family(self, m: MetricFamily, out: list[str]) -> None:
        raw = m.samples
        samples = [(s.name, s.labels) for s in raw]
        shape = self._shapes.get(m.name)
        if shape is None or shape.type != m.type or shape.samples != samples:
            shape = self._shapes[m.name] = self._shape(m, samples)
            if len(self._shapes) > 1 << 14:  # families that churn: start afresh
                self._shapes = {m.name: shape}
        heads = shape.heads
        stamped = any(s.timestamp is not None for s in raw)
        for type_line, block in zip(shape.type_lines, shape.blocks, strict=True):
            out.append(type_line)
            if stamped:
                out.extend(_stamped(heads[i], raw[i]) for i in block)
            else:
                out.extend(f"{heads[i]} {_value(raw[i].value)}" for i in block)


def _stamped(head: str, s: _Sample) -> str:
    line = f"{head} {_value(s.value)}"
    if s.timestamp is None:
        return line
    return f"{line} {int(float(s.timestamp) * 1000):d}"  # type: ignore[arg-type]


def family_lines(
    metrics: Iterable[MetricFamily],
    keep: Sequence[str] | None = DEFAULT_KEEP,
    writer: LineWriter | None = None,
) -> list[str]:
    """The lines (no line feeds) ``generate_latest`` would write for ``metrics``, less HELP."""
    w = writer or LineWriter()
    prefixes = tuple(keep) if keep is not None else None
    out: list[str] = []
    for m in metrics:
        if prefixes is None or m.name.startswith(prefixes):
            w.family(m, out)
    return out
