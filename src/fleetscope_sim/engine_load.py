"""What a simulated vLLM engine core is loaded with: ``LoadProfile`` and ``SimRequest``.

``LoadProfile`` is the traffic and capacity of one engine (the load model's parameters, see
:mod:`~fleetscope_sim.engine_scheduler`); ``SimRequest`` is one request drawn from it, with
its progress through the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoadProfile:
    """Traffic and capacity of one simulated engine (rates are per engine).

    Attributes:
        arrival_rate: requests per second (Poisson arrivals).
        prompt_tokens_median / prompt_tokens_sigma: log-normal prompt length (clipped so that
            prompt + 1 fits ``max_model_len``).
        output_tokens_median / output_tokens_sigma: log-normal length at which a request would
            stop by itself; above ``max_tokens`` it finishes with ``length``.
        max_tokens_choices: ``max_tokens`` values requests ask for (clipped to the context).
        prefix_hit_probability: chance a prompt shares a cached prefix (30-95 % of it).
        abort_probability: chance the client aborts a request during decode.
        chat_fraction: share of requests sent to ``/v1/chat/completions`` (HTTP families).
        max_num_seqs / max_num_batched_tokens / max_num_queued_reqs: scheduler limits (an
            arrival finding ``max_num_queued_reqs`` waiting is rejected by the API server).
        num_gpu_blocks / block_size: KV cache capacity (``cache_config_info``).
        step_seconds_base / step_seconds_per_seq / step_seconds_per_prefill_token: iteration time.
        kv_transfer_seconds: on a decode engine, delay before a request's KV has arrived.
        model_params / kv_bytes_per_token: feed the ``estimated_*_per_gpu`` counters.
    """

    arrival_rate: float = 4.0
    prompt_tokens_median: float = 160.0
    prompt_tokens_sigma: float = 0.6
    output_tokens_median: float = 60.0
    output_tokens_sigma: float = 0.9
    max_tokens_choices: tuple[int, ...] = (32, 64, 128, 256)
    prefix_hit_probability: float = 0.5
    abort_probability: float = 0.01
    chat_fraction: float = 0.3
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_num_queued_reqs: int = 512
    num_gpu_blocks: int = 512
    block_size: int = 16
    step_seconds_base: float = 0.025
    step_seconds_per_seq: float = 0.0004
    step_seconds_per_prefill_token: float = 0.00002
    kv_transfer_seconds: float = 0.05
    model_params: float = 1.0e9
    kv_bytes_per_token: int = 131072


class SimRequest:
    """One request inside a simulated engine (times are simulated seconds)."""

    __slots__ = (
        "abort",
        "arrival",
        "blocks",
        "cached_external",
        "cached_local",
        "computed",
        "end_at",
        "end_reason",
        "first_token_at",
        "generated",
        "handler",
        "last_token_at",
        "max_tokens",
        "needs_recompute",
        "preemptions",
        "prompt_len",
        "ready_at",
        "scheduled_at",
    )

    def __init__(self) -> None:
        self.arrival = 0.0
        self.ready_at = 0.0
        self.prompt_len = 0
        self.cached_local = 0
        self.cached_external = 0
        self.computed = 0
        self.max_tokens = 1
        self.end_at = 1
        self.end_reason = "stop"
        self.abort = False
        self.handler = 0
        self.generated = 0
        self.blocks = 0
        self.scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.preemptions = 0
        self.needs_recompute = False
