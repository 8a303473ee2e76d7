"""One simulated vLLM engine core: a continuous-batching scheduler with a paged KV cache.

The model is simple but keeps every relation a real engine's metrics obey:

* requests arrive (Poisson, ``LoadProfile.arrival_rate`` per engine), wait (FIFO, preempted
  requests go back to the front), are admitted while there are free sequence slots, token budget
  and KV blocks, are prefilled in one iteration (which produces their first token) and then
  decode one token per iteration until they stop (``stop``), hit ``max_tokens`` (``length``) or
  are aborted by the client (``abort``);
* an iteration lasts ``base + per_seq * seqs + per_prefill_token * prefill_tokens`` seconds
  (times the engine's slowdown factor); every observation happens at the end of an iteration;
* KV blocks are allocated per request (``ceil(tokens / block_size)``); when a decode step needs a
  block and none is free, the most recently admitted request is preempted (recompute mode);
* prefix-cache hits are block aligned and always leave at least one token to compute; on a
  ``decode`` engine the prompt's KV arrives from a prefill server (``external_kv_transfer`` /
  ``p2p``) after ``kv_transfer_seconds`` (counted as ``deferred`` waiting meanwhile); a
  ``prefill`` engine serves requests with ``max_tokens=1`` (one generation token, ``length``).

Counters obey what vLLM guarantees: ``prompt_tokens == prefix_cache_queries ==
sum(prompt_tokens_by_source)``, ``prompt_tokens_cached == sum(prompt_tokens_cached_by_source) ==
prefix_cache_hits + external_prefix_cache_hits``, ``request_success`` (all reasons) ==
``_count`` of every per-request histogram, ``inter_token_latency_seconds_count ==
generation_tokens - time_to_first_token_seconds_count``, and without preemptions
``iteration_tokens_total_sum == prompt_tokens_by_source{local_compute} + generation_tokens``.
Simplification: tokens recomputed after a preemption count in ``iteration_tokens_total`` but are
not queried against the prefix cache again.

Runs of identical decode-only iterations are computed in one go (``_fused_decode``) with exactly
the results of iterating one by one, which keeps 256 simulated engines cheap.

All state changes happen in ``step()`` (or in the fault methods); nothing depends on the wall
clock, so a seed and a sequence of steps give identical values.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from . import rl_sleep
from .ledger import Ledger, SeriesKey, Truth
from .vllm_families import FAMILIES, FAMILIES_BY_NAME, bucket_bounds

if TYPE_CHECKING:
    from .endpoint import SimEndpoint

Role = Literal["prefill", "decode"] | None

FINISHED_REASONS = FAMILIES_BY_NAME["vllm:request_success_total"].label_values

#: Families that ``add_lazy_series`` can grow a new child in, and the existing child whose
#: increments the new one takes a share of (so sums over the family stay exact).
LAZY_SERIES_DONORS: dict[str, str] = {
    "vllm:request_success_total": "stop",
    "vllm:prompt_tokens_by_source_total": "local_compute",
    "vllm:prompt_tokens_cached_by_source_total": "device",
}


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


class SimEngine:
    """One vLLM engine core behind an API server (``engine="<index>"``).

    Attributes:
        index: the ``engine`` label value, as an int.
        engine_id: ``"{endpoint name}.{index}"``.
        exported: the counters/histograms ``/metrics`` shows (reset by ``restart()``).
        truth: exact totals added since creation, never reset (see ``ledger.Truth``).
        created: ``_created`` timestamp of every exported series: (family, key) -> unix time.
        gauges: gauge values set by the latest step (family -> key -> value).
        has_stepped: whether a step ran since the (re)start (multiprocess gauges need it).
        start_wall: unix time this engine (re)started.
        stalled / slowdown: fault state, see the methods.
        scheduler_paused / sleeping_tags / sleep_state: vLLM's pause and sleep mode (the
            scheduler paused by ``/pause`` or ``/sleep``; the executor's sleeping tags
            ``weights``, ``kv_cache``; the ``engine_sleep_state`` gauge as ``(awake,
            weights_offloaded, discard_all)``): see :mod:`fleetscope.simulate.rl_sleep`.
    """

    def __init__(
        self,
        endpoint: SimEndpoint,
        index: int,
        load: LoadProfile,
        seed: int | str,
        start_wall: float,
        record_observations: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.index = index
        self.label = str(index)
        self.engine_id = f"{endpoint.name}.{index}"
        self.load = load
        self.record_observations = record_observations
        self._rng = random.Random(f"fleetscope-sim/{seed}/{endpoint.name}/{index}")
        self.bounds: dict[str, tuple[float, ...]] = {
            f.name: bucket_bounds(f, endpoint.max_model_len)
            for f in FAMILIES
            if f.kind == "histogram"
        }
        self.total_blocks = load.num_gpu_blocks
        min_blocks = math.ceil((endpoint.max_model_len + 1) / load.block_size) + 1
        if self.total_blocks < min_blocks:
            raise ValueError(
                f"num_gpu_blocks={self.total_blocks} cannot hold one max_model_len request "
                f"(needs >= {min_blocks} blocks of {load.block_size})"
            )
        self.truth = Truth(record_observations)
        self.arrival_rate = load.arrival_rate
        self.stalled = False
        self.slowdown = 1.0
        self.scheduler_paused = False
        self.sleeping_tags: set[str] = set()
        self.sleep_state: tuple[float, float, float] = rl_sleep.AWAKE
        #: lazy series: family -> list of (new label value, share)
        self.lazy_routes: dict[str, list[tuple[str, float]]] = {}
        self._reset_state(start_wall)

    # -- lifecycle ---------------------------------------------------------------------------
    def _reset_state(self, start_wall: float) -> None:
        """Fresh process: empty queues, new exported ledger with new ``_created`` times."""
        self.start_wall = start_wall
        self._created_seq = 0
        self.now = self.endpoint._last_step_sim
        self._pending: deque[SimRequest] = deque()
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self.used_blocks = 0
        self._step_acc = [0.0, 0.0, 0.0, 0.0]
        self._next_arrival = self._draw_next_arrival(self.now)
        self.has_stepped = False
        self.exported = Ledger(self.record_observations)
        self.created: dict[tuple[str, SeriesKey], float] = {}
        self._create_series()
        self.gauges: dict[str, dict[SeriesKey, float]] = {}
        self._update_gauges()

    def _create_series(self) -> None:
        """The series a fresh engine process exports before any request (vLLM pre-creates
        every per-engine counter child and histogram; another engine kind overrides this)."""
        for spec in FAMILIES:
            if not spec.per_engine:
                continue
            if spec.kind == "counter":
                keys: list[tuple[str, ...]] = [(v,) for v in spec.label_values] or [()]
                for key in keys:
                    self.exported.ensure_counter(spec.name, key)
                    self.truth.ensure_counter(spec.name, key)
                    self._note_created(spec.name, key)
            elif spec.kind == "histogram":
                self.exported.ensure_histogram(spec.name, self.bounds[spec.name])
                self.truth.ensure_histogram(spec.name, self.bounds[spec.name])
                self._note_created(spec.name, ())

    def _note_created(self, family: str, key: SeriesKey) -> None:
        self.created[(family, key)] = self.start_wall + 1e-6 * self._created_seq
        self._created_seq += 1

    def restart(self, start_wall: float | None = None) -> None:
        """Restart this engine's process: in-flight requests are lost, every exported series
        starts again from 0 with a new ``_created``; in multiprocess mode the per-step gauges
        vanish until the next step. Truth keeps counting (and records the restart)."""
        if start_wall is None:
            start_wall = max(self.endpoint._wall_now(), self.start_wall + 0.01)
        self.truth.restarts += 1
        self.truth.restart_times.append(self.endpoint._last_step_sim)
        self.truth.lost_at_restart.append({f: dict(s) for f, s in self.exported.counters.items()})
        self.stalled = False
        self.scheduler_paused = False
        self.sleeping_tags = set()
        self.sleep_state = rl_sleep.AWAKE
        self._reset_state(start_wall)

    def _draw_next_arrival(self, after: float) -> float:
        if self.arrival_rate <= 0:
            return math.inf
        return after + self._rng.expovariate(self.arrival_rate)

    def set_arrival_rate(self, rate: float) -> None:
        """Change the request rate (requests per second) from now on."""
        self.arrival_rate = max(0.0, float(rate))
        self._next_arrival = self._draw_next_arrival(max(self.now, self.endpoint._last_step_sim))

    # -- recording ---------------------------------------------------------------------------
    def _inc(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        routes = self.lazy_routes.get(family)
        if routes and key and key[0] == LAZY_SERIES_DONORS[family]:
            for value, share in routes:
                if amount == 1:
                    moved = 1.0 if self._rng.random() < share else 0.0
                else:
                    moved = float(round(amount * share))
                if moved:
                    amount -= moved
                    self._add(family, moved, (value,))
        if amount:
            self._add(family, amount, key)

    def _add(self, family: str, amount: float, key: SeriesKey) -> None:
        if key not in self.exported.counters.get(family, ()):
            # a series created on first use (lazy): its _created is the simulated now
            self.created[(family, key)] = self.endpoint.clock.wall_start + self.now
        self.exported.add(family, amount, key)
        self.truth.add(family, amount, key)

    def _observe(self, family: str, value: float, times: int = 1) -> None:
        self.exported.histograms[family][()].observe(value, times)
        self.truth.histograms[family][()].observe(value, times)

    # -- the load model ----------------------------------------------------------------------
    def _new_request(self, arrival: float) -> SimRequest:
        lp = self.load
        rng = self._rng
        role = self.endpoint.role
        mml = self.endpoint.max_model_len
        bs = lp.block_size
        r = SimRequest()
        r.arrival = arrival
        prompt = int(rng.lognormvariate(math.log(lp.prompt_tokens_median), lp.prompt_tokens_sigma))
        r.prompt_len = prompt = min(max(prompt, 4), mml - 1)
        if role == "prefill":
            r.max_tokens = 1
        else:
            r.max_tokens = max(1, min(rng.choice(lp.max_tokens_choices), mml - prompt))
        natural = int(rng.lognormvariate(math.log(lp.output_tokens_median), lp.output_tokens_sigma))
        natural = max(1, natural)
        if natural >= r.max_tokens:
            r.end_at, r.end_reason = r.max_tokens, "length"
        else:
            r.end_at, r.end_reason = natural, "stop"
        if r.end_at > 1 and rng.random() < lp.abort_probability:
            r.end_at, r.end_reason = rng.randint(1, r.end_at - 1), "abort"
        hit = 0
        if rng.random() < lp.prefix_hit_probability:
            hit = int(prompt * rng.uniform(0.3, 0.95)) // bs * bs
            hit = min(hit, (prompt - 1) // bs * bs)
        r.cached_local = hit
        if role == "decode":
            r.cached_external = prompt - hit
            r.computed = 0
            r.ready_at = arrival + lp.kv_transfer_seconds
        else:
            r.computed = prompt - hit
            r.ready_at = arrival
        r.handler = 1 if rng.random() < lp.chat_fraction else 0
        return r

    def _enqueue_arrivals(self, until: float) -> None:
        pending = self._pending
        limit = self.load.max_num_queued_reqs
        while pending and pending[0].arrival <= until:
            r = pending.popleft()
            if len(self._waiting) >= limit:
                self.endpoint._record_rejection("max_num_queued_reqs")
            else:
                self._waiting.append(r)

    def step(self, t_end: float) -> None:
        """Run the engine until simulated time ``t_end`` (called by the fleet's ``step``)."""
        while self._next_arrival < t_end:
            self._pending.append(self._new_request(self._next_arrival))
            self._next_arrival = self._draw_next_arrival(self._next_arrival)
        if not (self.stalled or self.scheduler_paused or self.sleeping_tags):
            while self.now < t_end:
                self._enqueue_arrivals(self.now)
                waiting = self._waiting
                if not self._running and not (waiting and waiting[0].ready_at <= self.now):
                    nxt = t_end
                    if self._pending:
                        nxt = min(nxt, self._pending[0].arrival)
                    if waiting:
                        nxt = min(nxt, waiting[0].ready_at)
                    self.now = max(nxt, self.now)
                    if nxt >= t_end:
                        break
                    continue
                if not self._fused_decode(t_end):
                    self._iterate()
        self.now = max(self.now, t_end)
        self._enqueue_arrivals(self.now)
        self._flush_step()
        self.has_stepped = True
        self._update_gauges()

    _STEP_COUNTERS = (
        "vllm:generation_tokens_total",
        "vllm:estimated_flops_per_gpu_total",
        "vllm:estimated_read_bytes_per_gpu_total",
        "vllm:estimated_write_bytes_per_gpu_total",
    )

    def _flush_step(self) -> None:
        for family, amount in zip(self._STEP_COUNTERS, self._step_acc, strict=True):
            if amount:
                self._inc(family, amount)
        self._step_acc = [0.0, 0.0, 0.0, 0.0]

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.load.block_size)

    def _iterate(self) -> None:
        """One engine iteration (schedule, run, emit tokens, finish requests)."""
        lp = self.load
        now = self.now
        running = self._running
        waiting = self._waiting
        # 1. KV blocks for this step's decode tokens; preempt (LIFO) when they do not fit.
        bs = lp.block_size
        preempted = 0
        while running:
            growing = [r for r in running if r.prompt_len + r.generated + 1 > r.blocks * bs]
            if len(growing) <= self.total_blocks - self.used_blocks:
                for r in growing:  # one more token needs at most one more block
                    r.blocks += 1
                self.used_blocks += len(growing)
                break
            victim = running.pop()
            self.used_blocks -= victim.blocks
            victim.blocks = 0
            victim.preemptions += 1
            victim.needs_recompute = True
            waiting.appendleft(victim)
            preempted += 1
        decode_reqs = list(running)
        # 2. admit waiting requests (FIFO) within slots, token budget and free blocks.
        budget = lp.max_num_batched_tokens - len(decode_reqs)
        watermark = max(1, self.total_blocks // 100)
        prefill_reqs: list[SimRequest] = []
        prefill_tokens = 0
        while waiting and len(running) < lp.max_num_seqs:
            r = waiting[0]
            if r.ready_at > now:
                break
            compute = r.prompt_len + r.generated if r.needs_recompute else r.computed
            if compute > budget and (decode_reqs or prefill_reqs):
                break
            nb = self._blocks_for(r.prompt_len + r.generated + 1)
            if self.total_blocks - self.used_blocks - nb < watermark and (
                decode_reqs or prefill_reqs or nb > self.total_blocks - self.used_blocks
            ):
                break
            waiting.popleft()
            running.append(r)
            r.blocks = nb
            self.used_blocks += nb
            budget -= compute
            prefill_tokens += compute
            prefill_reqs.append(r)
            if r.scheduled_at is None:
                r.scheduled_at = now
        if preempted:
            self._inc("vllm:num_preemptions_total", preempted)
        if not decode_reqs and not prefill_reqs:
            self.now = now + lp.step_seconds_base
            return
        # 3. run the iteration.
        n_seqs = len(decode_reqs) + len(prefill_reqs)
        duration = (
            lp.step_seconds_base
            + lp.step_seconds_per_seq * n_seqs
            + lp.step_seconds_per_prefill_token * prefill_tokens
        ) * self.slowdown
        t = now + duration
        self.now = t
        # 4. emit one token per scheduled request.
        gaps: dict[float, int] = {}
        context_tokens = 0
        for r in decode_reqs:
            gap = t - r.last_token_at
            gaps[gap] = gaps.get(gap, 0) + 1
            context_tokens += r.prompt_len + r.generated
            r.generated += 1
            r.last_token_at = t
        for r in prefill_reqs:
            context_tokens += r.prompt_len + r.generated
            if r.first_token_at is None:
                self._count_prompt(r)
                r.first_token_at = t
                self._observe("vllm:time_to_first_token_seconds", t - r.arrival)
            else:
                gap = t - r.last_token_at
                gaps[gap] = gaps.get(gap, 0) + 1
            r.generated += 1
            r.last_token_at = t
            r.needs_recompute = False
        for gap, times in gaps.items():
            self._observe("vllm:inter_token_latency_seconds", gap, times)
        step_tokens = prefill_tokens + n_seqs
        self._observe("vllm:iteration_tokens_total", step_tokens)
        # plain counters are summed over the step and recorded once at its end (_flush_step)
        acc = self._step_acc
        acc[0] += n_seqs
        acc[1] += 2.0 * lp.model_params * step_tokens
        acc[2] += 2.0 * lp.model_params + float(context_tokens * lp.kv_bytes_per_token)
        acc[3] += float(step_tokens * lp.kv_bytes_per_token)
        # 5. finish requests.
        if any(r.generated >= r.end_at for r in running):
            self._finish_done(t)

    def _fused_decode(self, t_end: float) -> bool:
        """Run k > 1 identical decode-only iterations at once, when nothing can change the
        batch in between (no admission possible before an arrival or a KV transfer completes,
        enough free KV blocks, finishes only at the last one). Same results as k
        ``_iterate()`` calls, at a fraction of the cost."""
        running = self._running
        waiting = self._waiting
        if not running or (waiting and waiting[0].ready_at <= self.now):
            return False
        lp = self.load
        n = len(running)
        d = (lp.step_seconds_base + lp.step_seconds_per_seq * n) * self.slowdown
        horizon = t_end
        if self._pending:
            horizon = min(horizon, self._pending[0].arrival)
        if waiting:
            horizon = min(horizon, waiting[0].ready_at)
        k = math.ceil((horizon - self.now) / d)
        if k < 2:
            return False
        bs = lp.block_size
        context = 0
        room_min = k
        for r in running:
            used = r.prompt_len + r.generated
            room = r.blocks * bs - used
            left = r.end_at - r.generated
            if room < room_min:
                room_min = room
            if left < k:
                k = left
            context += used
        # KV blocks the k iterations need: allocated up front (what k _iterate() calls end up
        # with) when free; otherwise stop before the first block boundary.
        extra = 0
        if room_min < k:
            extra = sum(
                max(0, -(-(r.prompt_len + r.generated + k) // bs) - r.blocks) for r in running
            )
            if extra > self.total_blocks - self.used_blocks:
                k, extra = room_min, 0
        if k < 2:
            return False
        if extra:
            for r in running:
                need = -(-(r.prompt_len + r.generated + k) // bs)
                if need > r.blocks:
                    r.blocks = need
            self.used_blocks += extra
        t = self.now + k * d
        self.now = t
        self._observe("vllm:inter_token_latency_seconds", d, n * k)
        self._observe("vllm:iteration_tokens_total", n, k)
        acc = self._step_acc
        acc[0] += n * k
        acc[1] += 2.0 * lp.model_params * n * k
        acc[2] += k * 2.0 * lp.model_params + float(
            (k * context + n * k * (k - 1) // 2) * lp.kv_bytes_per_token
        )
        acc[3] += float(n * k * lp.kv_bytes_per_token)
        done = False
        for r in running:
            r.generated += k
            r.last_token_at = t
            if r.generated >= r.end_at:
                done = True
        if done:
            self._finish_done(t)
        return True

    def _finish_done(self, t: float) -> None:
        still: list[SimRequest] = []
        for r in self._running:
            if r.generated >= r.end_at:
                self._finish(r, t)
            else:
                still.append(r)
        self._running = still

    def _count_prompt(self, r: SimRequest) -> None:
        prompt = r.prompt_len
        local = r.cached_local
        external = r.cached_external
        self._inc("vllm:prompt_tokens_total", prompt)
        self._inc("vllm:prefix_cache_queries_total", prompt)
        self._inc("vllm:prompt_tokens_by_source_total", r.computed, ("local_compute",))
        if local:
            self._inc("vllm:prefix_cache_hits_total", local)
            self._inc("vllm:prompt_tokens_by_source_total", local, ("local_cache_hit",))
            self._inc("vllm:prompt_tokens_cached_by_source_total", local, ("device",))
        if external:
            self._inc("vllm:external_prefix_cache_queries_total", prompt - local)
            self._inc("vllm:external_prefix_cache_hits_total", external)
            self._inc("vllm:prompt_tokens_by_source_total", external, ("external_kv_transfer",))
            self._inc("vllm:prompt_tokens_cached_by_source_total", external, ("p2p",))
        if local + external:
            self._inc("vllm:prompt_tokens_cached_total", local + external)

    def _finish(self, r: SimRequest, t: float) -> None:
        assert r.scheduled_at is not None and r.first_token_at is not None
        decode_time = t - r.first_token_at
        e2e = t - r.arrival
        obs = self._observe
        obs("vllm:e2e_request_latency_seconds", e2e)
        obs("vllm:request_queue_time_seconds", r.scheduled_at - r.arrival)
        obs("vllm:request_inference_time_seconds", t - r.scheduled_at)
        obs("vllm:request_prefill_time_seconds", r.first_token_at - r.scheduled_at)
        obs("vllm:request_decode_time_seconds", decode_time)
        obs(
            "vllm:request_time_per_output_token_seconds",
            decode_time / (r.generated - 1) if r.generated > 1 else 0.0,
        )
        obs("vllm:request_prompt_tokens", r.prompt_len)
        obs("vllm:request_generation_tokens", r.generated)
        obs("vllm:request_max_num_generation_tokens", r.generated)
        obs("vllm:request_params_n", 1)
        obs("vllm:request_params_max_tokens", r.max_tokens)
        obs("vllm:request_num_preemptions", r.preemptions)
        obs("vllm:request_prefill_kv_computed_tokens", r.computed)
        self._inc("vllm:request_success_total", 1, (r.end_reason,))
        self.used_blocks -= r.blocks
        r.blocks = 0
        self.endpoint._record_http(r.handler, r.prompt_len, r.generated, e2e)

    def _update_gauges(self) -> None:
        waiting = self._waiting
        deferred = sum(1 for r in waiting if r.ready_at > self.now)
        self.gauges = {
            "vllm:num_requests_running": {(): float(len(self._running))},
            "vllm:num_requests_waiting": {(): float(len(waiting))},
            "vllm:num_requests_waiting_by_reason": {
                ("capacity",): float(len(waiting) - deferred),
                ("deferred",): float(deferred),
            },
            "vllm:kv_cache_usage_perc": {(): self.used_blocks / self.total_blocks},
        }
        self._update_sleep_gauge()
        self.truth.gauges = {f: dict(s) for f, s in self.gauges.items()}
        if self.record_observations and self.has_stepped:
            self.truth.gauge_history.append((self.now, self.truth.gauges))

    def _update_sleep_gauge(self) -> None:
        awake, offloaded, discarded = self.sleep_state
        gauge: dict[SeriesKey, float] = {
            ("awake",): awake,
            ("weights_offloaded",): offloaded,
            ("discard_all",): discarded,
        }
        self.gauges["vllm:engine_sleep_state"] = gauge
        truth = self.truth.gauges
        if "vllm:engine_sleep_state" in truth:  # ground truth follows at once (a new dict:
            # gauge_history keeps the previous one)
            self.truth.gauges = {**truth, "vllm:engine_sleep_state": dict(gauge)}

    # -- faults and controls (call through SimEndpoint, which takes the lock) --------------
    def stall(self, stalled: bool = True) -> None:
        """Stop (or resume) iterating: running requests stay running, no token is generated,
        arrivals pile up in the waiting queue."""
        self.stalled = stalled

    def set_slowdown(self, factor: float) -> None:
        """Make every iteration ``factor`` times longer (a degraded engine)."""
        if factor <= 0:
            raise ValueError("slowdown factor must be > 0")
        self.slowdown = float(factor)

    def sleep(self, level: int = 1) -> None:
        """vLLM's ``/sleep?level=``: the scheduler pauses (level 0: nothing else), level 1
        offloads the weights, level 2 discards them; no iteration runs until a full wake-up."""
        rl_sleep.sleep(self, level)
        self._update_sleep_gauge()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's ``/wake_up`` (``tags`` as its query; ``None``: all): whether fully awake."""
        awake = rl_sleep.wake_up(self, tags)
        self._update_sleep_gauge()
        return awake

    @property
    def is_sleeping(self) -> bool:
        """What ``EngineCore.is_sleeping`` says: scheduler paused or executor asleep."""
        return self.scheduler_paused or bool(self.sleeping_tags)

    def add_lazy_series(self, family: str, value: str, share: float) -> None:
        """From now on ``share`` of the increments of the family's donor child go to a new
        child ``value`` (created, with its ``_created``, at its first increment)."""
        if family not in LAZY_SERIES_DONORS:
            raise ValueError(f"lazy series supported in {sorted(LAZY_SERIES_DONORS)}")
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        self.lazy_routes.setdefault(family, []).append((value, float(share)))

    def change_buckets(self, family: str, bounds: tuple[float, ...]) -> None:
        """Use another bucket layout for histogram ``family``; existing observations are
        re-counted in the new layout (which needs ``record_observations``)."""
        spec = FAMILIES_BY_NAME.get(family)
        if spec is None or spec.kind != "histogram":
            raise ValueError(f"{family!r} is not a vLLM histogram")
        bounds = tuple(float(b) for b in bounds)
        exported = self.exported.histograms[family][()].rebinned(bounds)
        truth = self.truth.histograms[family][()].rebinned(bounds)
        self.exported.histograms[family][()] = exported
        self.truth.histograms[family][()] = truth
        self.bounds[family] = bounds

    # -- reading -----------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        """Requests in the running batch now."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue now."""
        return len(self._waiting)

    def __repr__(self) -> str:
        return (
            f"SimEngine({self.engine_id}, running={len(self._running)}, "
            f"waiting={len(self._waiting)}, kv={self.used_blocks}/{self.total_blocks})"
        )
