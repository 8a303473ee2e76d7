#!/usr/bin/env python3
"""Check every body in tests/data/sglang-0.5.23 against truth.json.

1. prometheus_client's own text parser: every sample of the body must be in the truth
   and every truth value must be in the body, exactly (counts, sums, cumulative buckets).
2. fleetscope's parser: prints what it makes of each body (engines, selected series), so
   the README's "what fleetscope reads / loses" section can be checked.

    PYTHONPATH=src python scripts/sglang_bodies/verify.py [data-dir]
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = (
    sys.argv[1]
    if len(sys.argv) > 1
    else os.path.join(HERE, "..", "..", "tests", "data", "sglang-0.5.23")
)

# (sample name, sorted (label, value) pairs)
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def _fmt_le(b: str | float) -> str:
    if b == "+Inf":
        return "+Inf"
    return repr(float(b))


def expected_samples(t: dict[str, Any]) -> dict[SampleKey, float]:
    """``t``: one body's entry of truth.json."""
    exp: dict[SampleKey, float] = {}

    def put(name: str, labels: dict[str, str], v: float) -> None:
        exp[(name, tuple(sorted(labels.items())))] = v

    for c in t["counters"]:
        put(c["name"], c["labels"], float(c["value"]))
    for g in t["gauges"]:
        v = g["value"]
        put(g["name"], g["labels"], float("nan") if v == "NaN" else float(v))
    for h in t["histograms"]:
        for le, n in h["buckets"]:
            put(h["name"] + "_bucket", {**h["labels"], "le": _fmt_le(le)}, float(n))
        put(h["name"] + "_count", h["labels"], float(h["count"]))
        put(h["name"] + "_sum", h["labels"], float(h["sum"]))
    return exp


def body_samples(text: str) -> dict[SampleKey, float]:
    got: dict[SampleKey, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            if "le" in labels and s.name.endswith("_bucket"):
                labels["le"] = _fmt_le(labels["le"]) if labels["le"] != "+Inf" else "+Inf"
            got[(s.name, tuple(sorted(labels.items())))] = s.value
    return got


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> int:
    truth = json.loads(_read(os.path.join(DATA, "truth.json")))
    bad = 0
    for body, t in sorted(truth.items()):
        text = _read(os.path.join(DATA, body))
        got = body_samples(text)
        exp = expected_samples(t)
        missing = [k for k in exp if k not in got]
        extra = [k for k in got if k not in exp]
        wrong = [k for k in exp if k in got and not same(exp[k], got[k])]
        status = "OK" if not (missing or extra or wrong) else "MISMATCH"
        bad += status != "OK"
        print(f"{body}: {len(got)} samples, prometheus_client parse {status}")
        for lbl, ks in (("missing", missing), ("extra", extra), ("wrong", wrong)):
            for k in ks[:5]:
                print(f"   {lbl}: {k} exp={exp.get(k)} got={got.get(k)}")
    om = os.path.join(DATA, "single_after.openmetrics.txt")
    if os.path.exists(om):
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

        try:
            # prometheus_client leaves its OpenMetrics parser unannotated
            families = om_parse(_read(om))  # type: ignore[no-untyped-call]
            n = sum(len(f.samples) for f in families)
            print(f"single_after.openmetrics.txt: OpenMetrics parser OK, {n} samples")
        except Exception as err:
            print(f"single_after.openmetrics.txt: OpenMetrics parser FAILS: {err}")

    try:
        from fleetscope.exposition import parse
    except ImportError:
        print("fleetscope not importable (set PYTHONPATH=src)")
        return bad
    for body in [*sorted(truth), "single_after.openmetrics.txt"]:
        path = os.path.join(DATA, body)
        if not os.path.exists(path):
            continue
        try:
            e = parse(_read_bytes(path), time=0.0, wall_time=0.0)
        except Exception as ex:
            print(f"fleetscope {body}: ERROR {ex}")
            continue
        fams: set[str] = set()
        for snap in e.values():
            for sid in snap:
                fams.add(sid.split("{")[0])
        n_series = sum(len(s) for s in e.values())
        print(f"fleetscope {body}: engines={list(e)} series={n_series} families~{len(fams)}")
    return bad


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
