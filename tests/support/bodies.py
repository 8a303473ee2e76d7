"""Editing and reading exposition bodies as text: the captures are never edited on disk, tests
that need a different state edit the text in memory with :func:`set_values` /
:func:`drop_lines`."""

from __future__ import annotations

import re
from collections.abc import Callable


def _split_sample(line: str) -> tuple[str, str]:
    head, _, value = line.rpartition(" ")
    return head, value


def set_values(body: str, pattern: str, fn: Callable[[float], float] | float) -> str:
    """Replace the value of every sample line whose text before the value matches ``pattern``
    (a regex searched in the line head). ``fn`` maps the old value to the new one."""
    rx = re.compile(pattern)
    out = []
    hits = 0
    for line in body.split("\n"):
        if line and not line.startswith("#"):
            head, value = _split_sample(line)
            if rx.search(head):
                new = fn(float(value)) if callable(fn) else fn
                line = f"{head} {new!r}" if not isinstance(new, str) else f"{head} {new}"
                hits += 1
        out.append(line)
    assert hits, f"no sample line matches {pattern!r}"
    return "\n".join(out)


def drop_lines(body: str, pattern: str) -> str:
    """Remove every sample line whose head matches ``pattern``."""
    rx = re.compile(pattern)
    out = []
    hits = 0
    for line in body.split("\n"):
        if line and not line.startswith("#") and rx.search(_split_sample(line)[0]):
            hits += 1
            continue
        out.append(line)
    assert hits, f"no sample line matches {pattern!r}"
    return "\n".join(out)


def sample_values(body: str, pattern: str) -> list[float]:
    """Values of the sample lines whose head matches ``pattern``, in body order."""
    rx = re.compile(pattern)
    vals = []
    for line in body.split("\n"):
        if line and not line.startswith("#"):
            head, value = _split_sample(line)
            if rx.search(head):
                vals.append(float(value))
    return vals


def sample_value(body: str, pattern: str) -> float:
    vals = sample_values(body, pattern)
    assert len(vals) == 1, (pattern, vals)
    return vals[0]


_LE_RE = re.compile(r'le="([^"]*)"')


def bucket_values(body: str, family: str, extra: str = "") -> list[tuple[float, float]]:
    """[(le, cumulative count)] of one histogram child, read straight from the text."""
    out = []
    for line in body.split("\n"):
        if line.startswith(family + "_bucket{") and extra in line:
            head, value = _split_sample(line)
            m = _LE_RE.search(head)
            assert m
            out.append((float(m.group(1)), float(value)))
    assert out, family
    return out
