"""Parser speed on real vLLM 0.32 bodies (prints; not a test).

For ``single_after.prom`` and ``dp2_load.prom``:

* fleetscope, warmed ``Parser`` (template fast path): bytes -> one ``EngineSnapshot`` per engine;
* prometheus_client's ``text_string_to_metric_families`` + grouping every sample by its
  ``engine`` label (what a collector built on it would do), on the already-decoded text;
* the floor: ``split('\\n')`` + ``float()`` of every sample value;
* fleetscope's full parse (the first scrape of a body shape: ``Parser(share_templates=False)``);
* a new endpoint's first scrape when another endpoint already served that shape (a fresh
  ``Parser`` starting from the shared template).

Medians over >= 7 runs (each run times a batch of calls). Target: fast path >= 20x faster
than prometheus_client.

    python benchmarks/bench_parse.py [--runs 9]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fleetscope.exposition import Parser

_HERE = Path(__file__).resolve()
FIXTURES = _HERE.parents[1] / "tests" / "data" / "fixtures"
BODIES = ("single_after.prom", "dp2_load.prom")
TARGET_RATIO = 20.0


def per_call(fn: Callable[[], object], runs: int, min_batch_seconds: float = 0.05) -> list[float]:
    """Seconds per call of ``fn()``, one figure per run (each run a calibrated batch)."""
    fn()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t >= min_batch_seconds:
            break
        n *= 2
    out: list[float] = []
    for _ in range(runs):
        gc.collect()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
    return out


# (sample name, sorted labels) -> value
SampleValues = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def client_grouped(text: str) -> dict[str | None, SampleValues]:
    by_engine: dict[str | None, SampleValues] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            by_engine[s.labels.get("engine")][(s.name, tuple(sorted(s.labels.items())))] = s.value
    return by_engine


def split_and_float(text: str) -> list[float]:
    return [float(ln.rpartition(" ")[2]) for ln in text.split("\n") if ln and ln[0] != "#"]


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.3f} ms"
    return f"{seconds * 1e6:8.1f} us"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="runs per measurement (>= 7)")
    args = ap.parse_args(argv)
    runs = max(7, args.runs)
    print(f"python {sys.version.split()[0]}; medians over {runs} runs; fixtures {FIXTURES}")
    ok = True
    for name in BODIES:
        raw = (FIXTURES / "vllm-0.32.0-cpu" / name).read_bytes()
        text = raw.decode()
        n_lines = text.count("\n")
        n_samples = sum(1 for ln in text.split("\n") if ln and ln[0] != "#")

        warm = Parser()
        first = warm.parse(raw)
        warm.parse(raw)
        assert warm.fast_hits >= 1
        engines = len(first)

        fast = statistics.median(per_call(lambda: warm.parse(raw), runs))  # noqa: B023
        assert warm.full_parses == 1, "the benchmark body left the fast path"
        client = statistics.median(per_call(lambda: client_grouped(text), runs))  # noqa: B023
        floor = statistics.median(per_call(lambda: split_and_float(text), runs))  # noqa: B023
        full = statistics.median(
            per_call(lambda: Parser(share_templates=False).parse(raw), runs)  # noqa: B023
        )
        shared = statistics.median(per_call(lambda: Parser().parse(raw), runs))  # noqa: B023
        ratio = client / fast
        ok &= ratio >= TARGET_RATIO
        print(
            f"\n{name}: {len(raw) / 1024:.1f} KiB, {n_lines} lines, {n_samples} samples, "
            f"{engines} engine(s)"
        )
        per_engine = fmt(fast / engines).strip()
        print(f"  fleetscope fast path (parse + snapshots)  {fmt(fast)}   {per_engine} per engine")
        print(f"  prometheus_client parse + group by engine {fmt(client)}")
        print(f"  split('\\n') + float() of every value      {fmt(floor)}")
        print(f"  fleetscope full parse (first of a shape)  {fmt(full)}")
        print(f"  new endpoint, shape already seen          {fmt(shared)}")
        verdict = "OK" if ratio >= TARGET_RATIO else "MISSED"
        target = f"(target >= {TARGET_RATIO:g}x: {verdict})"
        print(f"  ratio prometheus_client / fast path       {ratio:8.1f}x   {target}")
        print(f"  ratio fast path / split+float floor       {fast / floor:8.2f}x")
        print(f"  ratio full parse / fast path              {full / fast:8.1f}x")
        print(f"  ratio full parse / shared-template first  {full / shared:8.1f}x")
    print("\nall targets met" if ok else "\nTARGET MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
