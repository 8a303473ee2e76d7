"""Simulator loads shared by several tests."""

from __future__ import annotations

from typing import TypedDict


class LoadSettings(TypedDict, total=False):
    """Keyword arguments of ``fleetscope_sim.LoadProfile`` (the ones these loads set)."""

    arrival_rate: float
    num_gpu_blocks: int
    prompt_tokens_median: float
    output_tokens_median: float
    output_tokens_sigma: float
    max_tokens_choices: tuple[int, ...]


# a simulated KV cache small enough to fill up (256 blocks of 16 tokens) with long outputs: KV
# pressure, and preemptions by the dozen every few seconds
KV_PRESSURE_LOAD = LoadSettings(
    arrival_rate=6.0,
    num_gpu_blocks=256,
    prompt_tokens_median=32.0,
    output_tokens_median=200.0,
    output_tokens_sigma=0.1,
    max_tokens_choices=(480,),
)
