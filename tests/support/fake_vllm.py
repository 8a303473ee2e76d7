"""A stand-in for vLLM's offline engine (``vllm.LLM``), without a model: ``generate()`` records
vLLM 0.32's metric names through prometheus_client the way vLLM's ``PrometheusStatLogger`` does
for an ``LLM(..., disable_log_stats=False)``: in the caller's thread, once per engine step,
labelled ``model_name`` and ``engine``, into ``prometheus_client.REGISTRY`` unless told
otherwise. With ``disable_log_stats=True`` (vLLM's default for ``LLM``) it records nothing.

Each request of ``generate(prompts, SamplingParams(max_tokens=n))`` is admitted in the first
step, gets one token per step and finishes after ``n`` steps (``finished_reason="length"``);
its prompt tokens count once (one per word). :func:`install` makes ``import vllm`` give this
module's ``LLM`` and ``SamplingParams`` (the README's in-process block runs against it).
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

LABELS = ["model_name", "engine"]
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 10.0)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0


@dataclass
class CompletionOutput:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"


@dataclass
class RequestOutput:
    prompt: str
    outputs: list[CompletionOutput]


class Families:
    """vLLM's families in one registry (one stat logger; engines are label values)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.running = Gauge("vllm:num_requests_running", "Running.", LABELS, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", LABELS, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", LABELS, registry=r)
        self.gen = Counter("vllm:generation_tokens", "Generation tokens.", LABELS, registry=r)
        reason = [*LABELS, "finished_reason"]
        self.ok = Counter("vllm:request_success", "Finished.", reason, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT.", LABELS, buckets=TTFT_BUCKETS, registry=r
        )


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, Families] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class EngineMetrics:
    """vLLM's series for one engine label."""

    def __init__(self, registry: CollectorRegistry, model: str, engine: str) -> None:
        with _LOCK:
            f = _FAMILIES.get(registry)
            if f is None:
                f = _FAMILIES[registry] = Families(registry)
        lab = (model, engine)
        self.prompt, self.gen, self.ttft = (
            f.prompt.labels(*lab),
            f.gen.labels(*lab),
            f.ttft.labels(*lab),
        )
        self.ok = f.ok.labels(*lab, "length")
        self.running_now, self.waiting_now = f.running.labels(*lab), f.waiting.labels(*lab)
        self.running_now.set(0)
        self.waiting_now.set(0)


class LLM:
    """``LLM(model, disable_log_stats=False)``; ``registry`` / ``engine`` are the stand-in's."""

    def __init__(
        self,
        model: str,
        *,
        disable_log_stats: bool = True,
        registry: CollectorRegistry | None = None,
        engine: str = "0",
        **_: Any,
    ) -> None:
        self.model = model
        self.metrics = (
            None
            if disable_log_stats
            else EngineMetrics(REGISTRY if registry is None else registry, model, engine)
        )

    def generate(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | None = None,
        *,
        on_step: Callable[[int], None] | None = None,
    ) -> list[RequestOutput]:
        """Every request to the end; ``on_step(step)`` after each engine step's metrics."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        n = (params or SamplingParams()).max_tokens
        outputs = [RequestOutput(p, [CompletionOutput()]) for p in prompts]
        m = self.metrics
        if m is not None:
            m.prompt.inc(sum(len(p.split()) for p in prompts))
            m.running_now.set(len(prompts))
        for step in range(n):
            for out in outputs:
                out.outputs[0].token_ids.append(step)
            if m is not None:
                m.gen.inc(len(prompts))
                if step == 0:
                    for _ in prompts:
                        m.ttft.observe(0.02)
                if step == n - 1:
                    m.ok.inc(len(prompts))
                    m.running_now.set(0)
            if on_step is not None:
                on_step(step)
        return outputs


def install() -> None:
    """``import vllm`` gives this stand-in from now on (this process only)."""
    module = types.ModuleType("vllm")
    module.LLM = LLM  # type: ignore[attr-defined]
    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    module.__version__ = "0.32.0+fake"  # type: ignore[attr-defined]
    sys.modules["vllm"] = module
