"""Templates of a body's shape, built by the full parser (every line checked).

The fast path that reuses a template, and the finish every parse path ends in (a full parse,
a parser's own template, a template shared by another parser), are in ``_fastpath.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fleetscope.catalog import (
    KEEP_OWN_NAME,
    PROCESS_START,
    RAY_IDENTITY_LABELS,
    RAY_PREFIXES,
    SGLANG_IDENTITY_LABELS,
    SGLANG_PREFIX,
)
from fleetscope.exposition._classify import CUMULATIVE_KINDS, SeriesDraft, build_layout, classify
from fleetscope.exposition._classify import series_id as _series_id
from fleetscope.exposition._sglang import RAY_SGLANG, SGLangBody, escaped_names, sglang_pass
from fleetscope.exposition._syntax import (
    ExpositionError,
    Sample,
    parse_sample,
)
from fleetscope.exposition._values import (
    FINITE,
    NONNEG,
    bucket_chain,
    incomplete,
)
from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.exposition.textformat import Labels
from fleetscope.identity import Role

_ENGINE_PREFIXES = tuple(RAY_PREFIXES.values())  # "vllm:", "sglang:" (names after mapping)

SKIP = -1  # a line that carries nothing we keep (comments, filtered families)
TYPE_LINE = -2  # a `# TYPE` line; its type must not change under the template
MISS = -9


@dataclass(slots=True)
class EngineBlock:
    engine: str
    start: int
    stop: int
    layout: EngineLayout
    # groups of the layout invalid in every body of this shape (incomplete histograms)
    incomplete: tuple[tuple[int, str], ...] = ()


@dataclass(slots=True)
class Template:
    n_lines: int
    n_skip: int
    ordinal: dict[str, int]
    types_by_head: dict[str, str]
    slot_of_ordinal: np.ndarray
    n_slots: int
    blocks: list[EngineBlock]
    endpoint: EngineBlock | None
    process_start_slot: int
    check_ords: np.ndarray  # ordinals of cumulative samples: must be finite
    check_lower: np.ndarray  # ... and >= this: 0, or any finite value (`_sum` and `_created`)
    bucket_seq: np.ndarray  # every histogram child's bucket ordinals, by `le` (_values)
    bucket_step: np.ndarray  # ... where the next one must not be lower
    summed_slots: np.ndarray  # cumulative slots summing several samples: must stay finite
    min_ordinals: np.ndarray  # `_created` ordinals sharing a slot: the slot takes their min
    types: dict[str, str]
    any_incomplete: bool
    engine_roles: dict[str, Role]


def _declared_types(lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The body's TYPE lines: family -> type, and the line's head -> type (for the fast path)."""
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
    return types, types_by_head


def _engines_of_body(
    lines: list[str],
    types: dict[str, str],
    identity_labels: tuple[str, ...] | None,
    keep: tuple[str, ...] | None,
    vllm_identity: tuple[str, ...],
    escaped: dict[str, str] | None,
) -> tuple[tuple[str, ...], set[str], SGLangBody | None]:
    """The body's identity labels, its counter families, and its SGLang engines (None: not an
    SGLang body, native or through Ray)."""
    is_ray = any(name.startswith(p) for name in types for p in RAY_PREFIXES)
    # an SGLang server's own body (docs/sglang.md): engines are DP replicas (`dp_rank`)
    is_sglang = (
        not is_ray
        and identity_labels is None
        and any(name.startswith(SGLANG_PREFIX) for name in types)
    )
    ray_sglang = is_ray and any(name.startswith(RAY_SGLANG) for name in types)
    if is_sglang:
        identity = SGLANG_IDENTITY_LABELS
    else:
        identity = identity_labels or (RAY_IDENTITY_LABELS if is_ray else vllm_identity)

    # families of counters, for Ray's OpenCensus "bare DEPRECATED gauge + _total" pairs
    counter_bases = {
        f[:-6] if f.endswith("_total") else f for f, t in types.items() if t == "counter"
    }
    sg: SGLangBody | None = None
    if is_sglang:
        sg = sglang_pass(lines, types, counter_bases, identity, keep, escaped)
    elif ray_sglang:  # the same rules per Ray server; engines `{Ray ids}/{dp_rank}`
        ray_ids = tuple(k for k in identity if k not in (*vllm_identity, *SGLANG_IDENTITY_LABELS))
        sg = sglang_pass(lines, types, counter_bases, identity, keep, escaped, ray_ids)
    return identity, counter_bases, sg


def _note_comment(line: str, types_by_head: dict[str, str], ordinal: dict[str, int]) -> None:
    """A comment line's ordinal: a TYPE line (its type checked by the fast path), or skipped."""
    head, _, v = line.rpartition(" ")
    head = sys.intern(head)
    if head in types_by_head and types_by_head[head] == v:
        ordinal[head] = TYPE_LINE
    elif head not in ordinal:
        ordinal[head] = SKIP
    else:
        # a comment whose head collides with a sample: cannot use the fast path
        ordinal[head] = MISS


def _engine_key(
    s: Sample,
    draft: SeriesDraft,
    i: int,
    sg: SGLangBody | None,
    identity: tuple[str, ...],
) -> str:
    """The engine a sample belongs to ("" = the endpoint's)."""
    if sg is not None and i in sg.engine_of_line:  # every engine sample of a native body
        return sg.engine_of_line[i]
    if identity[-1] in s.labels:
        return "/".join(s.labels[k] for k in identity if s.labels.get(k))
    if len(identity) > 1 and draft.family.startswith(_ENGINE_PREFIXES):
        # an engine sample without the primary label but with other identity labels (Ray
        # Serve replicas without an `engine` tag): one engine per identity, engine "0"
        ids = [s.labels[k] for k in identity[:-1] if s.labels.get(k)]
        if ids:
            return "/".join([*ids, "0"])
    return ""


def build_template(
    lines: list[str],
    identity_labels: tuple[str, ...] | None,
    keep: tuple[str, ...] | None,
    vllm_identity: tuple[str, ...],
) -> tuple[Template, np.ndarray]:
    """The full parser: every line checked. Returns the template and the body's values."""
    types, types_by_head = _declared_types(lines)
    escaped = escaped_names(lines, types)
    identity, counter_bases, sg = _engines_of_body(
        lines, types, identity_labels, keep, vllm_identity, escaped
    )

    ordinal: dict[str, int] = {}
    n_skip = 0
    samples: list[tuple[int, str, SeriesDraft, float, int]] = []  # (ord, engine, draft, v, ln)
    seen_series: set[tuple[str, Labels]] = set()
    children: dict[tuple[str, Labels], list[tuple[float, int]]] = {}  # histogram children
    eof_seen = False
    for i, line in enumerate(lines, 1):
        if eof_seen:
            raise ExpositionError("content after # EOF", i, line)
        if not line or line[0] == "#":
            if line.startswith("# EOF") or line == "#EOF":
                eof_seen = True
            _note_comment(line, types_by_head, ordinal)
            n_skip += 1
            continue
        if not line.strip():
            raise ExpositionError("blank line with whitespace", i, line)
        pre = sg.parsed.get(i) if sg is not None else None
        if pre is not None:
            s, draft = pre
        else:
            s = parse_sample(line, i)
            draft = classify(s, types, counter_bases, identity, keep, escaped)
        key = (s.name, tuple(sorted(s.labels.items())))
        if key in seen_series:
            raise ExpositionError("duplicate series", i, line)
        seen_series.add(key)
        if sg is not None and i in sg.repeats:
            draft = None  # another rank of the same engine wrote it (docs/sglang.md)
        if draft is None:
            if s.head is not None:
                ordinal.setdefault(s.head, SKIP)
            n_skip += 1
            continue
        engine_key = _engine_key(s, draft, i, sg, identity)
        o = len(samples)
        if s.head is not None and s.head not in ordinal:
            ordinal[s.head] = o
        else:
            # exemplars, odd spacing: this body cannot use the fast path
            ordinal[s.head or f"\x00{o}"] = MISS
        samples.append((o, engine_key, draft, s.value, i))
        if draft.le is not None:  # a bucket: its child is the series without `le`
            child = (s.name, tuple(kv for kv in key[1] if kv[0] != "le"))
            children.setdefault(child, []).append((draft.le, o))
    values = np.array([v for _o, _e, _d, v, _ln in samples], dtype=np.float64)
    tpl = _assemble(lines, samples, ordinal, n_skip, types, types_by_head, children.values())
    if sg is not None:
        tpl.engine_roles = {
            e: r for e, r in sg.roles.items() if any(b.engine == e for b in tpl.blocks)
        }
    return tpl, values


def _assemble(
    lines: list[str],
    samples: list[tuple[int, str, SeriesDraft, float, int]],
    ordinal: dict[str, int],
    n_skip: int,
    types: dict[str, str],
    types_by_head: dict[str, str],
    children: Iterable[list[tuple[float, int]]],
) -> Template:
    by_engine: dict[str, list[tuple[int, SeriesDraft, float, int]]] = {}
    current: set[tuple[str, str]] = {
        (e, _series_id(d)) for _, e, d, _, _ in samples if not d.renamed
    }
    for o, eng, draft, v, ln in samples:
        if draft.renamed and (eng, _series_id(draft)) in current:
            if draft.original not in KEEP_OWN_NAME:
                continue  # both old and new names exported: count the current one only
            assert draft.original is not None
            draft.family, draft.renamed = draft.original, False  # superseded: its own name
        by_engine.setdefault(eng, []).append((o, draft, v, ln))
    if not any(by_engine) and "" in by_engine:
        by_engine = {"0": by_engine.pop("")}  # no identity labels at all: one engine

    slot_of_ordinal = np.full(len(samples), -1, dtype=np.intp)
    check: list[int] = []
    lower: list[float] = []
    summable: list[int] = []  # ordinals of counters, buckets, `_sum`, `_count`
    blocks: list[EngineBlock] = []
    endpoint_block = None
    process_start_slot = -1
    n = 0
    for eng, rows in by_engine.items():
        layout, slot_map = build_layout(rows)
        for o, draft, _v, _ln in rows:
            slot = slot_map[id(draft)]
            slot_of_ordinal[o] = n + slot
            if draft.kind in CUMULATIVE_KINDS or draft.kind == "created":
                check.append(o)
                lower.append(FINITE if draft.kind in ("sum", "created") else NONNEG)
                if draft.kind != "created":
                    summable.append(o)
            if draft.family == PROCESS_START and draft.kind == "gauge":
                process_start_slot = n + slot
        block = EngineBlock(eng, n, n + len(layout.slot_ids), layout, incomplete(layout))
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
    all_blocks = blocks + ([endpoint_block] if endpoint_block is not None else [])
    # several samples summed into one slot (labels not kept): their sum must stay finite
    per_slot = np.bincount(slot_of_ordinal[summable], minlength=n + 1)[:n]
    bucket_seq, bucket_step = bucket_chain(children, slot_of_ordinal < n)
    return Template(
        n_lines=len(lines),
        n_skip=n_skip,
        ordinal=ordinal,
        types_by_head=types_by_head,
        slot_of_ordinal=slot_of_ordinal,
        n_slots=n,
        blocks=blocks,
        endpoint=endpoint_block,
        process_start_slot=process_start_slot,
        check_ords=np.array(check, dtype=np.intp),
        check_lower=np.array(lower, dtype=np.float64),
        bucket_seq=bucket_seq,
        bucket_step=bucket_step,
        summed_slots=np.flatnonzero(per_slot > 1).astype(np.intp),
        types=types,
        min_ordinals=np.array(min_ords, dtype=np.intp),
        any_incomplete=any(b.incomplete for b in all_blocks),
        engine_roles={},
    )
