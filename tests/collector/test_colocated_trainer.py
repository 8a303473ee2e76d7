"""A synchronous trainer that runs its engine itself (``llm.generate()`` in its own thread), with
``Collector(source=InProcessSource(registry)).start_background()``: the documented pattern
(README "Colocated engines").

The engine is a stand-in (``support.fake_vllm``) recording vLLM's metric names through
prometheus_client in the trainer's thread, step by step, as vLLM's stat logger does; a second
engine is driven from another thread without pause. While both generate:

* the collector polls in its own thread, and the registry is read in the source's worker
  thread, never in the trainer's (each trainer step waits for a poll that read the registry
  after it: polls and generation interleave by construction, not by timing luck);
* no poll sees a counter go backwards, nothing is counted as a restart;
* the window around the generation holds exactly the tokens and requests the engines recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector

import fleetscope as fs
from fleetscope.fleet.view import FleetView
from support.fake_vllm import LLM, SamplingParams

DEADLINE_S = 120.0  # a bound for a loaded machine, not a pace
TOKENS = "generation_tokens_total/delta"


class _ReadsSpy(PromCollector):
    """Counts the registry's reads and notes their threads."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.reads = 0
        self.threads: set[str] = set()

    def collect(self) -> Iterable[Metric]:
        with self.cond:
            self.reads += 1
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()
        return []

    def wait_beyond(self, reads: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.reads > reads, DEADLINE_S), "no poll came"


def test_a_synchronous_trainer_generating_while_the_collector_reads() -> None:
    reg = CollectorRegistry()
    spy = _ReadsSpy()
    reg.register(spy)
    trainer_llm = LLM("tiny", disable_log_stats=False, registry=reg, engine="0")
    other_llm = LLM("tiny", disable_log_stats=False, registry=reg, engine="1")
    views: list[FleetView] = []
    collector = fs.Collector(source=fs.InProcessSource(reg), interval=0.05, on_poll=views.append)
    collector.start_background()
    try:
        trainer_llm.generate(["warm up"], SamplingParams(max_tokens=2))  # every series exists
        other_llm.generate(["warm up"], SamplingParams(max_tokens=2))
        spy.wait_beyond(spy.reads + 1)  # a poll after the warm-up: the baseline
        rollout = collector.window("rollout")
        rollout.start()
        polls_before = len(views)

        other_done = threading.Event()

        def other_engine() -> None:  # another thread, no pause: reads land mid-write
            for _ in range(20):
                other_llm.generate(["a b c"] * 4, SamplingParams(max_tokens=25))
            other_done.set()

        worker = threading.Thread(target=other_engine, name="other-engine")
        worker.start()

        def step(_i: int) -> None:  # each step of the trainer's generate waits for a read
            spy.wait_beyond(spy.reads)

        prompts = ["one two three four"] * 8
        outputs = trainer_llm.generate(prompts, SamplingParams(max_tokens=30), on_step=step)
        worker.join(DEADLINE_S)
        assert other_done.is_set()
        keys = rollout.stop()
        polls_during = len(views) - polls_before
        summary = collector.summary()
    finally:
        collector.stop_background()

    assert polls_during >= 30  # at least one poll per step of the trainer's generate
    assert "MainThread" not in spy.threads and threading.current_thread().name == "MainThread"
    assert all(t.startswith("fleetscope-inprocess") for t in spy.threads), spy.threads
    generated = sum(len(o.outputs[0].token_ids) for o in outputs) + 20 * 4 * 25
    assert keys[f"inference/rollout/agg/{TOKENS}"] == generated
    assert keys["inference/rollout/agg/request_success_total/delta"] == 8 + 20 * 4
    assert keys["inference/rollout/agg/prompt_tokens_total/delta"] == 8 * 4 + 20 * 4 * 3
    assert keys["inference/rollout/agg/time_to_first_token_seconds/delta"] == 8 + 20 * 4
    assert keys["inference/rollout/engine_restarts"] == 0
    assert keys["inference/rollout/coverage"] == 1.0
    for view in views:  # mid-write reads: never a counter going backwards
        assert view.keys.get(f"inference/agg/{TOKENS}", 0.0) >= 0
        assert view.result.scrapes[0].ok
    assert summary["inference_summary/rollout/agg/" + TOKENS] == generated
