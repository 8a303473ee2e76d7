"""The fast path: a body of a known shape read into its template's order, and every path's
finish (values -> snapshots, bad values judged the same way everywhere: docs/bad-data.md).

A template (``_template.py``) maps each line's head (``name{labels}``) to the ordinal of its
value; a body whose every line is the template's (same heads, same count of skipped lines,
same declared types) is read without parsing a label: ~10x faster than the full parser.
Anything else returns None and the full parser judges the body.
"""

from __future__ import annotations

import numpy as np

from fleetscope.exposition._syntax import Exposition, InvalidSeries
from fleetscope.exposition._template import MISS, SKIP, TYPE_LINE, EngineBlock, Template
from fleetscope.exposition._values import OVERFLOW, bad_ordinals, overflowed
from fleetscope.exposition.snapshot import EngineSnapshot, without_groups

__all__ = ["fill", "finish"]


def fill(tpl: Template, lines: list[str]) -> np.ndarray | None:
    """The fast path: the body's values in template order, or None if the shape differs."""
    if len(lines) != tpl.n_lines:
        return None
    get = tpl.ordinal.get
    vals: list[str | None] = [None] * len(tpl.slot_of_ordinal)
    skipped = 0
    stamps: list[str] | None = None
    for line in lines:
        head, _, v = line.rpartition(" ")
        o = get(head, MISS)
        if o >= 0:
            vals[o] = v
        elif o == SKIP:
            if v and not head:
                return None  # one word where the template had a blank line
            skipped += 1
        elif o == TYPE_LINE:
            if tpl.types_by_head[head] != v:
                return None  # a family whose type changed: a full parse, a new layout
            skipped += 1
        else:
            # `head value timestamp` (docs/rules.md §3.9: sample timestamps are valid input)
            head, _, value = head.rpartition(" ")
            # not `get("")`: a sample line new to the template is no blank line's twin
            o = get(head, MISS) if head else MISS
            if o >= 0:
                vals[o] = value
            elif o == SKIP:
                skipped += 1
            else:
                return None
            if stamps is None:
                stamps = []
            stamps.append(v)
    if skipped != tpl.n_skip:
        return None
    return _as_values(vals, stamps)


def _as_values(vals: list[str | None], stamps: list[str] | None) -> np.ndarray | None:
    """The fast path's value texts as numbers, or None where the full parser must judge."""
    try:
        arr = np.array(vals, dtype=np.float64)
        if stamps is not None:
            np.array(stamps, dtype=np.float64)
    except (TypeError, ValueError):
        return None  # a missing or malformed value: let the full parser say which line
    if "_" in "".join([v for v in vals if v is not None]) or (stamps and "_" in "".join(stamps)):
        return None  # numpy, like Python, reads 1_000; Prometheus does not
    # a series line written twice in place of another leaves that other one unfilled
    # (None converts to NaN): a duplicate series, which the full parser reports
    nan_at = np.flatnonzero(np.isnan(arr))
    if len(nan_at) and any(vals[i] is None for i in nan_at.tolist()):
        return None
    return arr


def finish(tpl: Template, arr: np.ndarray, now: float, wall: float) -> Exposition:
    """Values in template order -> snapshots; bad series left out and reported."""
    bad = bad_ordinals(arr, tpl.check_ords, tpl.check_lower, tpl.bucket_seq, tpl.bucket_step)
    slots = np.bincount(tpl.slot_of_ordinal, weights=arr, minlength=tpl.n_slots + 1)
    if len(tpl.min_ordinals):
        targets = tpl.slot_of_ordinal[tpl.min_ordinals]
        slots[targets] = np.inf
        with np.errstate(invalid="ignore"):  # a NaN `_created` stays NaN (judged as bad)
            np.minimum.at(slots, targets, arr[tpl.min_ordinals])
    over = overflowed(slots, tpl.summed_slots) if len(tpl.summed_slots) else []
    pstart = float(slots[tpl.process_start_slot]) if tpl.process_start_slot >= 0 else None
    if not bad and not over and not tpl.any_incomplete:
        engines = {
            b.engine: EngineSnapshot(b.engine, b.layout, slots[b.start : b.stop], now, wall, pstart)
            for b in tpl.blocks
        }
        endpoint = None
        if tpl.endpoint is not None:
            b = tpl.endpoint
            endpoint = EngineSnapshot("", b.layout, slots[b.start : b.stop], now, wall, pstart)
        return Exposition(engines, endpoint, tpl.types, (), tpl.engine_roles)
    # the rare path: some series are invalid for this scrape (docs/rules.md §3.9)
    bad_slot_reason: dict[int, str] = {}
    for o, why in bad.items():
        bad_slot_reason.setdefault(int(tpl.slot_of_ordinal[o]), why)
    for slot in over:
        bad_slot_reason.setdefault(slot, OVERFLOW)
    invalid: list[InvalidSeries] = []

    def snap(b: EngineBlock, name: str) -> EngineSnapshot:
        data = slots[b.start : b.stop]
        drop = dict(b.incomplete)
        for s, why in bad_slot_reason.items():
            if b.start <= s < b.stop:
                g = int(b.layout.group_of_slot[s - b.start])
                if g >= 0:
                    drop.setdefault(g, why)
        if not drop:
            return EngineSnapshot(name, b.layout, data, now, wall, pstart)
        groups = tuple(sorted(drop))
        sub, keep, removed = without_groups(b.layout, groups)
        names = b.layout.group_names
        invalid.extend(InvalidSeries(name, names[g], drop[g]) for g in groups)
        return EngineSnapshot(name, sub, data[keep], now, wall, pstart, invalid=removed)

    engines = {b.engine: snap(b, b.engine) for b in tpl.blocks}
    endpoint = snap(tpl.endpoint, "") if tpl.endpoint is not None else None
    return Exposition(engines, endpoint, tpl.types, tuple(invalid), tpl.engine_roles)
