"""The load model of a simulated vLLM engine core: continuous batching over a paged KV cache.

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

Runs of identical decode-only iterations are computed in one go (``_fused_decode``) with exactly
the results of iterating one by one, which keeps 256 simulated engines cheap.

``EngineScheduler`` is the scheduling part of :class:`~fleetscope_sim.engine.SimEngine`; what
it observes goes through the ``EngineMetrics`` hooks (:mod:`~fleetscope_sim.engine_metrics`).
"""

from __future__ import annotations

import math
from collections import deque

from .engine_load import LoadProfile, SimRequest
from .engine_metrics import EngineMetrics
from .ledger import SATURATED_KV


class EngineScheduler(EngineMetrics):
    """The scheduling part of ``SimEngine``: arrivals, admission, iterations, finishes."""

    # set by SimEngine
    load: LoadProfile
    arrival_rate: float
    stalled: bool
    slowdown: float
    scheduler_paused: bool
    sleeping_tags: set[str]
    _pending: deque[SimRequest]
    _next_arrival: float

    # -- the load model ----------------------------------------------------------------------
    def _draw_next_arrival(self, after: float) -> float:
        if self.arrival_rate <= 0:
            return math.inf
        return after + self._rng.expovariate(self.arrival_rate)

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
        phases = self.truth.phases
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
                    phases.add("idle", nxt - self.now)
                    self.now = max(nxt, self.now)
                    if nxt >= t_end:
                        break
                    continue
                t0 = self.now
                if self._fused_decode(t_end):
                    phases.add(self._step_phase(False), self.now - t0)
                else:
                    self._iterate()
        else:
            phases.add(self._held_phase(), t_end - self.now)
        self.now = max(self.now, t_end)
        self._enqueue_arrivals(self.now)
        self._flush_step()
        self.has_stepped = True
        self._update_gauges()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.load.block_size)

    def _iterate(self) -> None:
        """One engine iteration (schedule, run, emit tokens, finish requests)."""
        lp = self.load
        now = self.now
        running = self._running
        # 1. KV blocks for this step's decode tokens; preempt (LIFO) when they do not fit.
        preempted = self._reserve_decode_blocks()
        decode_reqs = list(running)
        # 2. admit waiting requests (FIFO) within slots, token budget and free blocks.
        prefill_reqs, prefill_tokens = self._admit(now, decode_reqs)
        if preempted:
            self._inc("vllm:num_preemptions_total", preempted)
        phase = self._step_phase(bool(preempted))
        if not decode_reqs and not prefill_reqs:
            self.truth.phases.add("idle" if phase == "busy" else phase, lp.step_seconds_base)
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
        self.truth.phases.add(phase, duration)
        # 4. emit one token per scheduled request.
        context_tokens = self._emit_tokens(t, decode_reqs, prefill_reqs)
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

    def _step_phase(self, preempted: bool) -> str:
        """The truth's phase of an engine step, after its admission: ``saturated`` when it
        preempted, a request ready to run is still waiting (no capacity for it) or the KV cache
        is at least ``SATURATED_KV`` full; else ``busy``."""
        waiting = self._waiting
        blocked = bool(waiting) and waiting[0].ready_at <= self.now
        full = self.used_blocks >= SATURATED_KV * self.total_blocks
        return "saturated" if preempted or blocked or full else "busy"

    def _held_phase(self) -> str:
        """The truth's phase of a step that runs nothing: ``paused`` (paused or asleep);
        stalled (a fault: nothing generated), what its queues hold."""
        if self.scheduler_paused or self.sleeping_tags:
            return "paused"
        return self._step_phase(False) if self._running or self._waiting else "idle"

    def _reserve_decode_blocks(self) -> int:
        """One more token for every running request needs at most one more KV block each;
        while they do not fit, the last admitted request is preempted (back to the front of
        the queue, to be recomputed). Returns how many were preempted."""
        running = self._running
        bs = self.load.block_size
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
            self._waiting.appendleft(victim)
            preempted += 1
        return preempted

    def _admit(self, now: float, decode_reqs: list[SimRequest]) -> tuple[list[SimRequest], int]:
        """Waiting requests (FIFO) admitted within slots, the token budget and free blocks
        (above a watermark); returns them and their prefill tokens."""
        lp = self.load
        running = self._running
        waiting = self._waiting
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
        return prefill_reqs, prefill_tokens

    def _emit_tokens(
        self, t: float, decode_reqs: list[SimRequest], prefill_reqs: list[SimRequest]
    ) -> int:
        """One token per scheduled request at ``t`` (a prefill's first one is its TTFT);
        observes the inter-token gaps; returns the context tokens the step attended to."""
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
        return context_tokens

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
        k, context = self._fused_iterations(k)
        if k < 2:
            return False
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

    def _fused_iterations(self, k: int) -> tuple[int, int]:
        """How many of the ``k`` decode iterations can run fused: none past a request's end,
        none past a KV block boundary unless the blocks they need are free (then allocated up
        front, what k ``_iterate()`` calls end up with). Returns that count and the running
        requests' context tokens."""
        running = self._running
        bs = self.load.block_size
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
        if k >= 2 and extra:
            for r in running:
                need = -(-(r.prompt_len + r.generated + k) // bs)
                if need > r.blocks:
                    r.blocks = need
            self.used_blocks += extra
        return k, context

    def _finish_done(self, t: float) -> None:
        still: list[SimRequest] = []
        for r in self._running:
            if r.generated >= r.end_at:
                self._finish(r, t)
            else:
                still.append(r)
        self._running = still
