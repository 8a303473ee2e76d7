"""Prometheus text (0.0.4) and OpenMetrics expositions -> per-engine snapshots. The hot path.

Two paths share one result:

* the **full parser** reads every line (escapes, timestamps, exemplars, TYPE lines), groups
  samples by engine, maps names to current vLLM names, and records a *template* of the body;
* the **fast path** reuses the template while the body keeps its shape (vLLM writes the same
  series in the same order every poll): per line one ``rpartition``, one dict lookup, and the
  value strings are converted in bulk. Any mismatch falls back to the full parser, which is also
  the one that reports errors, with line numbers.
"""

from __future__ import annotations

import math
import re
import sys
import time as _time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleetscope.catalog import (
    BREAKDOWN_LABELS,
    PROCESS_START,
    RAY_IDENTITY_LABELS,
    RAY_PREFIXES,
    VLLM_IDENTITY_LABELS,
    canonical_family,
)
from fleetscope.snapshot import (
    CounterSeries,
    EngineLayout,
    EngineSnapshot,
    GaugeSeries,
    HistogramSeries,
    Labels,
    format_series,
)

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


class Exposition(Mapping[str, EngineSnapshot]):
    """One scraped body: engine label -> :class:`EngineSnapshot` (``len()`` = engines).

    Samples without an engine identity (API-server counters, ``process_*``, ``http_*``) are in
    :attr:`endpoint`; ``process_start_time_seconds`` is also copied to every engine snapshot.
    """

    __slots__ = ("_engines", "endpoint", "types")

    def __init__(
        self,
        engines: dict[str, EngineSnapshot],
        endpoint: EngineSnapshot | None,
        types: Mapping[str, str],
    ):
        self._engines = engines
        self.endpoint = endpoint
        self.types = types

    def __getitem__(self, engine: str) -> EngineSnapshot:
        return self._engines[engine]

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    def __repr__(self) -> str:
        return f"Exposition(engines={list(self._engines)})"


# --------------------------------------------------------------------------- line syntax

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
_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total", "_gcount", "_gsum", "_info")
_CUMULATIVE_KINDS = frozenset({"counter", "bucket", "count", "sum"})


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), v)


def _parse_float(token: str) -> float:
    if "_" in token:  # Python accepts 1_000; Prometheus does not
        raise ValueError(token)
    return float(token)


def _format_bound(b: float) -> str:
    return "+Inf" if b == math.inf else repr(b)


@dataclass(slots=True)
class _Sample:
    name: str
    labels: dict[str, str]
    value: float
    head: str | None  # the text before the value, when the line has no timestamp/exemplar
    line: int


def _parse_sample(line: str, lineno: int) -> _Sample:
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
                    name = _unescape(quoted)
                else:
                    if key is None:
                        key = _unescape(quoted or "")
                    if key in labels:
                        raise ExpositionError(f"duplicate label {key!r}", lineno, line)
                    labels[key] = _unescape(val)
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
        value = _parse_float(tokens[0])
        if len(tokens) == 2:
            _parse_float(tokens[1])
    except ValueError:
        raise ExpositionError("value is not a number", lineno, line) from None
    # the fast path splits at the last space: only lines shaped `head value` can use it
    # interned: endpoints serving the same shape share these strings in their templates
    head = sys.intern(line[:pos]) if rest == " " + tokens[0] else None
    return _Sample(name, labels, value, head, lineno)


# --------------------------------------------------------------------------- templates

_SKIP = -1  # a line that carries nothing we keep (comments, filtered families)
_TYPE_LINE = -2  # a `# TYPE` line; its type must not change under the template
_MISS = -9

# layouts by shape, shared by all parsers (bounded: a shape not in it only loses sharing)
_LAYOUTS: dict[tuple, EngineLayout] = {}
_MAX_LAYOUTS = 1024
# The last template built per (parser settings, line count), offered to parsers that have none
# yet: engines of one fleet mostly serve line-for-line identical bodies, so a fleet's first poll
# costs one full parse per shape, not per endpoint. The fast path checks every line's head, so a
# template that does not fit is simply not used.
_SHARED_TEMPLATES: dict[tuple, _Template] = {}
_MAX_SHARED_TEMPLATES = 256


@dataclass(slots=True)
class _EngineBlock:
    engine: str
    start: int
    stop: int
    layout: EngineLayout


@dataclass(slots=True)
class _Template:
    n_lines: int
    n_skip: int
    ordinal: dict[str, int]
    types_by_head: dict[str, str]
    slot_of_ordinal: np.ndarray
    n_slots: int
    blocks: list[_EngineBlock]
    endpoint: _EngineBlock | None
    process_start_slot: int
    strict_nan: np.ndarray  # ordinals whose NaN fails the scrape
    min_ordinals: np.ndarray  # `_created` ordinals sharing a slot: the slot takes their min
    types: dict[str, str]


@dataclass(slots=True)
class _SeriesDraft:
    kind: str  # counter | created | gauge | info | bucket | sum | count
    family: str
    labels: Labels
    le: float | None
    renamed: bool  # came from an old vLLM name; dropped when the current name is present
    model: str | None = None  # the sample's model_name label (summed away, kept for grouping)


class Parser:
    """A reusable parser for one endpoint. Keeps the template of the last body it parsed.

    ``identity_labels``: labels that tell engines apart, the last being the primary one (a sample
    without it belongs to the endpoint). Ray agent bodies (``ray_vllm_*``) switch to
    ``RAY_IDENTITY_LABELS`` automatically unless identity labels are given.
    ``keep``: family-name prefixes (after renaming) to keep; None keeps every family.
    ``share_templates``: start from a template another parser built for a body of the same
    shape (checked line by line before use), so a new endpoint's first body is a fast parse.
    """

    def __init__(
        self,
        *,
        identity_labels: Sequence[str] | None = None,
        keep: Sequence[str] | None = None,
        max_bytes: int = MAX_BODY_BYTES,
        share_templates: bool = True,
    ):
        self._share = share_templates
        self._identity = tuple(identity_labels) if identity_labels else None
        self._keep = tuple(keep) if keep is not None else None
        self._max_bytes = max_bytes
        self._template: _Template | None = None
        # shared by every parser: endpoints of one fleet serve the same shapes, and one layout
        # per shape keeps plans, alignments and reductions one matrix operation per shape
        self._layouts = _LAYOUTS
        self.fast_hits = 0
        self.full_parses = 0

    def parse(
        self,
        body: str | bytes,
        *,
        time: float | None = None,
        wall_time: float | None = None,
    ) -> Exposition:
        """Parse one body. Raises :class:`ExpositionError` for anything that is not valid."""
        if len(body) > self._max_bytes:
            raise ExpositionError(f"body of {len(body)} bytes exceeds the {self._max_bytes} cap")
        if isinstance(body, bytes | bytearray | memoryview):
            try:
                text = bytes(body).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ExpositionError(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
        else:
            text = body
        now = _time.monotonic() if time is None else time
        wall = _time.time() if wall_time is None else wall_time
        if not text.strip():
            raise ExpositionError("empty body")
        if not text.endswith("\n"):
            raise ExpositionError(
                "truncated body: the last line has no line feed",
                text.count("\n") + 1,
                text[text.rfind("\n") + 1 :],
            )
        lines = text.split("\n")
        lines.pop()  # the empty string after the final line feed
        tpl = self._template
        if tpl is not None:
            result = self._parse_fast(tpl, lines, now, wall)
            if result is not None:
                self.fast_hits += 1
                return result
        shared_key = (self._identity, self._keep, len(lines))
        shared = _SHARED_TEMPLATES.get(shared_key) if self._share else None
        if shared is not None and shared is not tpl:
            result = self._parse_fast(shared, lines, now, wall)
            if result is not None:
                self._template = shared
                self.fast_hits += 1
                return result
        tpl = self._build_template(lines)
        self._template = tpl
        self.full_parses += 1
        if self._share:
            if len(_SHARED_TEMPLATES) >= _MAX_SHARED_TEMPLATES:
                _SHARED_TEMPLATES.pop(next(iter(_SHARED_TEMPLATES)), None)
            _SHARED_TEMPLATES[shared_key] = tpl
        result = self._parse_fast(tpl, lines, now, wall)
        if result is None:  # cannot happen for a template built from these very lines
            raise ExpositionError("internal: template does not match its own body")
        return result

    # ------------------------------------------------------------------ fast path

    def _parse_fast(
        self, tpl: _Template, lines: list[str], now: float, wall: float
    ) -> Exposition | None:
        if len(lines) != tpl.n_lines:
            return None
        get = tpl.ordinal.get
        vals: list[str | None] = [None] * len(tpl.slot_of_ordinal)
        skipped = 0
        for line in lines:
            head, _, v = line.rpartition(" ")
            o = get(head, _MISS)
            if o >= 0:
                vals[o] = v
            elif o == _SKIP or (o == _TYPE_LINE and tpl.types_by_head[head] == v):
                skipped += 1
            else:
                return None
        if skipped != tpl.n_skip:
            return None
        try:
            arr = np.array(vals, dtype=np.float64)
        except (TypeError, ValueError):
            return None  # a missing or malformed value: let the full parser say which line
        if "_" in "".join([v for v in vals if v is not None]):
            return None  # numpy, like Python, reads 1_000; Prometheus does not
        # NaN in a cumulative series fails the scrape (the full parser names the line); a NaN
        # gauge stays NaN through the sum below, which the statistics read as "missing"
        if np.isnan(arr[tpl.strict_nan]).any():
            return None
        # a series line written twice in place of another leaves that other one unfilled
        # (None converts to NaN): a duplicate series, which the full parser reports
        nan_at = np.flatnonzero(np.isnan(arr))
        if len(nan_at) and any(vals[i] is None for i in nan_at.tolist()):
            return None
        slots = np.bincount(tpl.slot_of_ordinal, weights=arr, minlength=tpl.n_slots + 1)
        if len(tpl.min_ordinals):
            targets = tpl.slot_of_ordinal[tpl.min_ordinals]
            slots[targets] = np.inf
            np.minimum.at(slots, targets, arr[tpl.min_ordinals])
        pstart = float(slots[tpl.process_start_slot]) if tpl.process_start_slot >= 0 else None
        engines = {
            b.engine: EngineSnapshot(b.engine, b.layout, slots[b.start : b.stop], now, wall, pstart)
            for b in tpl.blocks
        }
        endpoint = None
        if tpl.endpoint is not None:
            b = tpl.endpoint
            endpoint = EngineSnapshot("", b.layout, slots[b.start : b.stop], now, wall, pstart)
        return Exposition(engines, endpoint, tpl.types)

    # ------------------------------------------------------------------ full parser

    def _build_template(self, lines: list[str]) -> _Template:
        types: dict[str, str] = {}
        types_by_head: dict[str, str] = {}
        for i, line in enumerate(lines, 1):
            if line.startswith("# TYPE ") or line.startswith("#TYPE "):
                parts = line.split()
                if len(parts) != 4 and not (len(parts) == 3 and parts[0] == "#TYPE"):
                    raise ExpositionError("malformed TYPE line", i, line)
                fam, typ = sys.intern(parts[-2]), sys.intern(parts[-1])
                if fam in types and types[fam] != typ:
                    raise ExpositionError(f"conflicting TYPE for {fam}", i, line)
                types[fam] = typ
                head, _, v = line.rpartition(" ")
                types_by_head[sys.intern(head)] = sys.intern(v)
        is_ray = any(name.startswith(p) for name in types for p in RAY_PREFIXES)
        identity = self._identity or (RAY_IDENTITY_LABELS if is_ray else VLLM_IDENTITY_LABELS)
        primary = identity[-1]

        # families of counters, for Ray's OpenCensus "bare DEPRECATED gauge + _total" pairs
        counter_bases = {
            f[:-6] if f.endswith("_total") else f for f, t in types.items() if t == "counter"
        }

        ordinal: dict[str, int] = {}
        n_skip = 0
        samples: list[tuple[int, str, _SeriesDraft, float, int]] = []  # (ord, engine, draft, v, ln)
        seen_series: set[tuple] = set()
        eof_seen = False
        for i, line in enumerate(lines, 1):
            if eof_seen:
                raise ExpositionError("content after # EOF", i, line)
            if not line or line[0] == "#":
                if line.startswith("# EOF") or line == "#EOF":
                    eof_seen = True
                head, _, v = line.rpartition(" ")
                head = sys.intern(head)
                if head in types_by_head and types_by_head[head] == v:
                    ordinal[head] = _TYPE_LINE
                elif head not in ordinal:
                    ordinal[head] = _SKIP
                else:
                    # a comment whose head collides with a sample: cannot use the fast path
                    ordinal[head] = _MISS
                n_skip += 1
                continue
            if not line.strip():
                raise ExpositionError("blank line with whitespace", i, line)
            s = _parse_sample(line, i)
            draft = self._classify(s, types, counter_bases, identity)
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen_series:
                raise ExpositionError("duplicate series", i, line)
            seen_series.add(key)
            if draft is None:
                if s.head is not None:
                    ordinal.setdefault(s.head, _SKIP)
                n_skip += 1
                continue
            engine_key = ""
            if primary in s.labels:
                engine_key = "/".join(s.labels[k] for k in identity if s.labels.get(k))
            o = len(samples)
            if s.head is not None and s.head not in ordinal:
                ordinal[s.head] = o
            else:
                # timestamps, exemplars, odd spacing: this body cannot use the fast path
                ordinal[s.head or f"\x00{o}"] = _MISS
            samples.append((o, engine_key, draft, s.value, i))

        return self._assemble(lines, samples, ordinal, n_skip, types, types_by_head)

    def _classify(
        self,
        s: _Sample,
        types: dict[str, str],
        counter_bases: set[str],
        identity: tuple[str, ...] = (),
    ) -> _SeriesDraft | None:
        name = s.name
        typ = types.get(name)
        family, suffix = name, ""
        if typ is None:
            for suf in _SUFFIXES:
                if name.endswith(suf) and name[: -len(suf)] in types:
                    family, suffix = name[: -len(suf)], suf
                    typ = types[family]
                    break
        if typ is None and name.endswith("_created"):
            base = name[:-8]
            if types.get(base + "_total") == "counter":
                family, suffix, typ = base + "_total", "_created", "counter"
        if typ is None:
            typ = "untyped"
        # `_created` declared as its own gauge family (0.0.4 format from prometheus_client)
        if typ == "gauge" and name.endswith("_created"):
            base = name[:-8]
            for cand in (base, base + "_total"):
                if types.get(cand) in ("counter", "histogram", "summary"):
                    family, suffix, typ = cand, "_created", types[cand]
                    break
        if typ == "gauge" and name in counter_bases and name.startswith("ray_"):
            return None  # Ray OpenCensus exports counters twice; count the `_total` one only
        labels = {k: v for k, v in s.labels.items()}
        le_str = labels.pop("le", None) if typ in ("histogram", "gaugehistogram") else None

        if typ == "counter":
            base = family[:-6] if family.endswith("_total") else family
            kind = "created" if suffix == "_created" or name.endswith("_created") else "counter"
            if kind == "counter" and not name.endswith("_total") and name != base:
                kind = "counter"
        elif typ in ("histogram", "summary"):
            base = family
            if suffix == "_created":
                kind = "created"
            elif suffix == "_bucket" and typ == "histogram":
                kind = "bucket"
            elif suffix == "_sum":
                kind = "sum"
            elif suffix == "_count":
                kind = "count"
            else:
                kind = "gauge"  # summary quantiles
        elif typ == "info" or (typ in ("gauge", "untyped") and name.endswith("_info")):
            base = name if typ != "info" else family
            if not base.endswith("_info"):
                base += "_info"
            kind = "info"
        else:  # gauge, untyped, unknown, stateset, gaugehistogram
            base, kind = name, "gauge"
            if le_str is not None:
                labels["le"] = le_str
                le_str = None

        canon, renamed = canonical_family(base)
        if self._keep is not None and not canon.startswith(self._keep):
            return None
        le = None
        if kind == "bucket":
            if le_str is None:
                raise ExpositionError("histogram bucket without le", s.line, s.name)
            try:
                le = _parse_float(le_str)
            except ValueError:
                raise ExpositionError(f"bad le {le_str!r}", s.line, s.name) from None
        if kind == "info":
            kept: Labels = tuple(sorted((k, v) for k, v in labels.items() if k not in identity))
        else:
            kept = tuple(sorted((k, v) for k, v in labels.items() if k in BREAKDOWN_LABELS))
        return _SeriesDraft(kind, canon, kept, le, renamed, s.labels.get("model_name"))

    def _assemble(
        self,
        lines: list[str],
        samples: list[tuple[int, str, _SeriesDraft, float, int]],
        ordinal: dict[str, int],
        n_skip: int,
        types: dict[str, str],
        types_by_head: dict[str, str],
    ) -> _Template:
        by_engine: dict[str, list[tuple[int, _SeriesDraft, float, int]]] = {}
        current: set[tuple[str, str]] = {
            (e, _series_id(d)) for _, e, d, _, _ in samples if not d.renamed
        }
        for o, eng, draft, v, ln in samples:
            if draft.renamed and (eng, _series_id(draft)) in current:
                continue  # both old and new names exported: count the current one only
            by_engine.setdefault(eng, []).append((o, draft, v, ln))
        if not any(by_engine) and "" in by_engine:
            by_engine = {"0": by_engine.pop("")}  # no identity labels at all: one engine

        slot_of_ordinal = np.full(len(samples), -1, dtype=np.intp)
        strict: list[int] = []
        blocks: list[_EngineBlock] = []
        endpoint_block = None
        process_start_slot = -1
        n = 0
        for eng, rows in by_engine.items():
            layout, slot_map = self._layout(rows)
            for o, draft, v, ln in rows:
                slot = slot_map[id(draft)]
                slot_of_ordinal[o] = n + slot
                if draft.kind in _CUMULATIVE_KINDS or draft.kind == "created":
                    strict.append(o)
                    if math.isnan(v):
                        raise ExpositionError("NaN in a cumulative series", ln, lines[ln - 1])
                    if v < 0 and draft.kind != "sum":
                        raise ExpositionError("negative value in a counter", ln, lines[ln - 1])
                if draft.family == PROCESS_START and draft.kind == "gauge":
                    process_start_slot = n + slot
            block = _EngineBlock(eng, n, n + len(layout.slot_ids), layout)
            n += len(layout.slot_ids)
            if eng == "":
                endpoint_block = block
            else:
                blocks.append(block)
        slot_of_ordinal[slot_of_ordinal < 0] = n  # renamed duplicates land in a spare slot
        # `_created` of children summed into one slot: keep the earliest, so a child created
        # later (a new handler, a new model) does not look like a reset of the others
        created_ords = [o for o, _e, d, _v, _ln in samples if d.kind == "created"]
        targets = slot_of_ordinal[created_ords] if created_ords else np.zeros(0, np.intp)
        uniq, counts = np.unique(targets, return_counts=True)
        shared = set(uniq[counts > 1].tolist())
        min_ords = [o for o in created_ords if int(slot_of_ordinal[o]) in shared]
        return _Template(
            n_lines=len(lines),
            n_skip=n_skip,
            ordinal=ordinal,
            types_by_head=types_by_head,
            slot_of_ordinal=slot_of_ordinal,
            n_slots=n,
            blocks=blocks,
            endpoint=endpoint_block,
            process_start_slot=process_start_slot,
            strict_nan=np.array(strict, dtype=np.intp),
            types=types,
            min_ordinals=np.array(min_ords, dtype=np.intp),
        )

    def _layout(
        self, rows: list[tuple[int, _SeriesDraft, float, int]]
    ) -> tuple[EngineLayout, dict[int, int]]:
        """Build (or reuse) the layout for one engine's samples; map each draft to its slot."""
        ids: dict[str, int] = {}
        slot_map: dict[int, int] = {}
        model_names: list[str] = []
        kinds: list[str] = []
        for _o, d, _v, _ln in rows:
            if d.model is not None and not model_names:
                model_names.append(d.model)
            sid = _series_id(d)
            slot = ids.get(sid)
            if slot is None:
                slot = ids[sid] = len(ids)
                kinds.append(d.kind)
            slot_map[id(d)] = slot
        slot_ids = tuple(ids)
        key = (
            slot_ids,
            tuple(kinds),
            tuple(_info_key(d) for _o, d, _v, _ln in rows if d.kind == "info"),
            model_names[0] if model_names else None,
        )
        cached = self._layouts.get(key)
        if cached is not None:
            return cached, slot_map
        counters: list[CounterSeries] = []
        gauges: list[GaugeSeries] = []
        hist_parts: dict[tuple[str, Labels], dict] = {}
        info: dict[str, dict[str, str]] = {}
        created_of: dict[tuple[str, Labels], int] = {}
        seen: set[str] = set()
        for _o, d, _v, _ln in rows:
            sid = _series_id(d)
            if sid in seen:
                continue
            seen.add(sid)
            slot = ids[sid]
            if d.kind == "counter":
                counters.append(CounterSeries(d.family, d.labels, slot, -1))
            elif d.kind == "created":
                created_of[(d.family, d.labels)] = slot
            elif d.kind == "gauge":
                gauges.append(GaugeSeries(d.family, d.labels, slot))
            elif d.kind == "info":
                labels = dict(d.labels)
                if "model_name" in labels:
                    model_names.append(labels["model_name"])
                info.setdefault(d.family, labels)
            else:
                part = hist_parts.setdefault((d.family, d.labels), {"b": []})
                if d.kind == "bucket":
                    part["b"].append((d.le, slot))
                else:
                    part[d.kind] = slot
        counters = [
            CounterSeries(c.name, c.labels, c.slot, created_of.get((c.name, c.labels), -1))
            for c in counters
        ]
        hists = []
        for (fam, labels), part in hist_parts.items():
            b = sorted(part["b"])
            hists.append(
                HistogramSeries(
                    fam,
                    labels,
                    tuple(x for x, _ in b),
                    tuple(s for _, s in b),
                    part.get("sum", -1),
                    part.get("count", -1),
                    created_of.get((fam, labels), -1),
                )
            )
        layout = EngineLayout(
            slot_ids=slot_ids,
            counters=tuple(counters),
            gauges=tuple(gauges),
            histograms=tuple(hists),
            info=info,
            model_name=model_names[0] if model_names else None,
        )
        if len(self._layouts) >= _MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout, slot_map


def _series_id(d: _SeriesDraft) -> str:
    if d.kind == "counter":
        return format_series(d.family + "_total", d.labels)
    if d.kind == "created":
        return format_series(d.family + "_created", d.labels)
    if d.kind == "bucket":
        assert d.le is not None
        labels = tuple(sorted((*d.labels, ("le", _format_bound(d.le)))))
        return format_series(d.family + "_bucket", labels)
    if d.kind in ("sum", "count"):
        return format_series(f"{d.family}_{d.kind}", d.labels)
    if d.kind == "info":
        return d.family
    return format_series(d.family, d.labels)


def _info_key(d: _SeriesDraft) -> tuple:
    return (d.family, d.labels)


def parse(
    body: str | bytes,
    *,
    identity_labels: Sequence[str] | None = None,
    keep: Sequence[str] | None = None,
    time: float | None = None,
    wall_time: float | None = None,
) -> Exposition:
    """Parse one exposition into ``{engine label: EngineSnapshot}``.

    A one-off convenience; a poller keeps one :class:`Parser` per endpoint so repeated bodies
    take the fast path.
    """
    return Parser(identity_labels=identity_labels, keep=keep).parse(
        body, time=time, wall_time=wall_time
    )
