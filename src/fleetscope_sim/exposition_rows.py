"""Sample rows of the ``/metrics`` writers, shared by the endpoint's exposition and the RL
families (:mod:`~fleetscope_sim.rl_metrics`): a row is ``(sample name, labels, value)``."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.utils import floatToGoString

from .ledger import HistogramCounts

_INF = float("inf")

LabelPairs = tuple[tuple[str, str], ...]
SampleRow = tuple[str, LabelPairs, float]  # sample name, labels, value


def histogram_rows(
    rows: list[SampleRow],
    base: str,
    labels: LabelPairs,
    hist: HistogramCounts,
    created: float | None,
    single: bool,
) -> None:
    """Append one histogram child's samples in the order the two writers use."""
    buckets = [
        (base + "_bucket", (*labels, ("le", _le(bound))), float(cum))
        for bound, cum in zip((*hist.bounds, _INF), hist.cumulative(), strict=True)
    ]
    if single:
        rows.extend(buckets)
        rows.append((base + "_count", labels, float(hist.count)))
        rows.append((base + "_sum", labels, hist.sum))
        if created is not None:
            rows.append((base + "_created", labels, created))
    else:
        rows.append((base + "_sum", labels, hist.sum))
        rows.extend(buckets)
        rows.append((base + "_count", labels, float(hist.count)))


# prometheus_client's formatter is untyped: a typed name for it (the same function)
go_string: Callable[[float], str] = floatToGoString
_LE_STRINGS: dict[float, str] = {}


def _le(bound: float) -> str:
    text = _LE_STRINGS.get(bound)
    if text is None:
        text = _LE_STRINGS[bound] = go_string(bound)
    return text
