"""Line syntax of Prometheus text 0.0.4 / OpenMetrics, and the result types of a parse."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.identity import Role

# docs/rules.md §2: a 50 MB body is bad input. Real bodies are ~50-70 kB (vLLM) to ~0.5 MB (a Ray
# node agent); 16 MiB leaves room for large fleets behind one endpoint.
MAX_BODY_BYTES = 16 * 1024 * 1024


class ExpositionError(ValueError):
    """A body that is not a valid exposition. The scrape that produced it counts as failed."""

    def __init__(self, message: str, line: int | None = None, text: str | None = None):
        self.line = line
        self.text = text
        where = f"line {line}: " if line is not None else ""
        shown = f" ({text[:120]!r})" if text else ""
        super().__init__(f"{where}{message}{shown}")


@dataclass(frozen=True, slots=True)
class InvalidSeries:
    """A series left out of one scrape (docs/rules.md §3.9, docs/bad-data.md).

    ``engine``: the engine label ("" = the endpoint's engine-less samples); ``series``: a counter
    child's id (``vllm:x_total{...}``) or a histogram child's (``vllm:ttft_seconds{...}``);
    ``reason``: ``NaN``, ``+Inf``, ``-Inf``, ``negative``, ``no +Inf bucket``, ``no _count``,
    ``bad le`` (a bucket bound that is not a number), ``buckets decrease`` (a cumulative bucket
    count below a lower bucket's, beyond float noise) or ``sum overflows`` (samples summed
    into one series, each finite, whose sum is not).
    """

    engine: str
    series: str
    reason: str


class Exposition(Mapping[str, EngineSnapshot]):
    """One scraped body: engine label -> :class:`EngineSnapshot` (``len()`` = engines).

    Samples without an engine identity (API-server counters, ``process_*``, ``http_*``) are in
    :attr:`endpoint`; ``process_start_time_seconds`` is also copied to every engine snapshot.
    :attr:`invalid`: the series left out of this scrape because their values were bad.
    :attr:`engine_roles`: roles the body itself reports per engine label (SGLang's
    ``engine_type="prefill"|"decode"``); empty when it reports none (vLLM, unified servers).
    """

    __slots__ = ("_engines", "endpoint", "engine_roles", "invalid", "types")

    def __init__(
        self,
        engines: dict[str, EngineSnapshot],
        endpoint: EngineSnapshot | None,
        types: Mapping[str, str],
        invalid: tuple[InvalidSeries, ...] = (),
        engine_roles: Mapping[str, Role] | None = None,
    ):
        self._engines = engines
        self.endpoint = endpoint
        self.types = types
        self.invalid = invalid
        self.engine_roles: Mapping[str, Role] = engine_roles if engine_roles is not None else {}

    def __getitem__(self, engine: str) -> EngineSnapshot:
        return self._engines[engine]

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    def __repr__(self) -> str:
        return f"Exposition(engines={list(self._engines)})"


_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_QUOTED = r'"((?:[^"\\\n]|\\.)*)"'
# one label (or a quoted metric name) and the separator after it
_LABEL_RE = re.compile(
    r"[ \t]*(?:([a-zA-Z_][a-zA-Z0-9_.]*)|"
    + _QUOTED
    + r")[ \t]*(?:=[ \t]*"
    + _QUOTED
    + r")?[ \t]*([,}])"
)
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), v)


def parse_float(token: str) -> float:
    if "_" in token:  # Python accepts 1_000; Prometheus does not
        raise ValueError(token)
    return float(token)


def format_bound(b: float) -> str:
    return "+Inf" if b == math.inf else repr(b)


@dataclass(slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    # the text before the value when the line is `head value` or `head value timestamp`
    # (single spaces, no exemplar): the fast path can read it
    head: str | None
    line: int


def parse_sample(line: str, lineno: int) -> Sample:
    m = _NAME_RE.match(line)
    labels: dict[str, str] = {}
    name = m.group(0) if m else ""
    pos = m.end() if m else 0
    if pos < len(line) and line[pos] == "{":
        pos += 1
        if line[pos : pos + 1] == "}":
            pos += 1
        else:
            while True:
                lm = _LABEL_RE.match(line, pos)
                if lm is None:
                    raise ExpositionError("malformed labels", lineno, line)
                key, quoted, val, sep = lm.groups()
                pos = lm.end()
                if val is None:  # a quoted UTF-8 metric name inside the braces
                    if quoted is None or name:
                        raise ExpositionError("label without value", lineno, line)
                    name = unescape(quoted)
                else:
                    if key is None:
                        key = unescape(quoted or "")
                    if key in labels:
                        raise ExpositionError(f"duplicate label {key!r}", lineno, line)
                    labels[key] = unescape(val)
                if sep == "}":
                    break
                if line[pos : pos + 1] == "}":  # trailing comma
                    pos += 1
                    break
    if not name:
        raise ExpositionError("no metric name", lineno, line)
    rest = line[pos:]
    if not rest or rest[0] not in " \t":
        raise ExpositionError("expected a space before the value", lineno, line)
    exemplar = rest.find(" # ")
    body = rest[:exemplar] if exemplar >= 0 else rest
    tokens = body.split()
    if not 1 <= len(tokens) <= 2:
        raise ExpositionError("expected a value and at most a timestamp", lineno, line)
    try:
        value = parse_float(tokens[0])
        if len(tokens) == 2:
            parse_float(tokens[1])
    except ValueError:
        raise ExpositionError("value is not a number", lineno, line) from None
    # the fast path splits at the last space (twice for a timestamp): only lines shaped
    # `head value` or `head value timestamp` can use it. Interned: endpoints serving the same
    # shape share these strings in their templates.
    head = sys.intern(line[:pos]) if rest == " " + " ".join(tokens) else None
    return Sample(name, labels, value, head, lineno)
