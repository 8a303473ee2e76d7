"""Prometheus text (0.0.4) and OpenMetrics expositions -> per-engine snapshots. The hot path.

Two paths share one result:

* the **full parser** (``_template.build_template``) reads every line (escapes, timestamps,
  exemplars, TYPE lines), groups samples by engine, maps names to current vLLM names, and
  records a *template* of the body;
* the **fast path** (``_fastpath.fill``) reuses the template while the body keeps its shape
  (vLLM writes the same series in the same order every poll): per line one ``rpartition``
  (two with a sample timestamp), one dict lookup, and the value strings are converted in bulk.
  Any mismatch falls back to the full parser, which is also the one that reports errors, with
  line numbers.

Both end in ``_fastpath.finish``, which validates cumulative values in bulk (docs/rules.md
§3.9, docs/bad-data.md): a counter or histogram child with a non-finite or negative value, or
a histogram child cut short, is left out of that scrape and listed in
:attr:`Exposition.invalid`; the rest of the scrape is valid.
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence

from fleetscope.catalog import VLLM_IDENTITY_LABELS
from fleetscope.exposition._classify import LAYOUTS as _LAYOUTS
from fleetscope.exposition._fastpath import fill, finish
from fleetscope.exposition._syntax import (
    MAX_BODY_BYTES,
    Exposition,
    ExpositionError,
    InvalidSeries,
)
from fleetscope.exposition._template import Template, build_template

__all__ = [
    "MAX_BODY_BYTES",
    "Exposition",
    "ExpositionError",
    "InvalidSeries",
    "Parser",
    "parse",
]

# The last template built per (parser settings, line count), offered to parsers that have none
# yet: engines of one fleet mostly serve line-for-line identical bodies, so a fleet's first poll
# costs one full parse per shape, not per endpoint. The fast path checks every line's head, so a
# template that does not fit is simply not used.
# (identity labels, kept labels, line count)
_SHARED_TEMPLATES: dict[tuple[tuple[str, ...] | None, tuple[str, ...] | None, int], Template] = {}
_MAX_SHARED_TEMPLATES = 256


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
        self._template: Template | None = None
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
            arr = fill(tpl, lines)
            if arr is not None:
                self.fast_hits += 1
                return finish(tpl, arr, now, wall)
        shared_key = (self._identity, self._keep, len(lines))
        shared = _SHARED_TEMPLATES.get(shared_key) if self._share else None
        if shared is not None and shared is not tpl:
            arr = fill(shared, lines)
            if arr is not None:
                self._template = shared
                self.fast_hits += 1
                return finish(shared, arr, now, wall)
        tpl, values = build_template(lines, self._identity, self._keep, VLLM_IDENTITY_LABELS)
        self._template = tpl
        self.full_parses += 1
        if self._share:
            if len(_SHARED_TEMPLATES) >= _MAX_SHARED_TEMPLATES:
                _SHARED_TEMPLATES.pop(next(iter(_SHARED_TEMPLATES)), None)
            _SHARED_TEMPLATES[shared_key] = tpl
        return finish(tpl, values, now, wall)


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
