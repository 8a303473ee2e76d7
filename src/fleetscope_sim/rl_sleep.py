"""vLLM 0.32's sleep mode on simulated engines, and its routes ``/sleep``, ``/wake_up``,
``/release_kv_cache_memory`` (timed: ``vllm:sleep_mode_operation_duration_seconds``).

As the installed wheel does it (``v1/engine/core.py``, ``v1/executor/abstract.py``,
``v1/engine/async_llm.py``; recorded in ``tests/data/real-vllm-rl/``):

* ``sleep(level)`` pauses the scheduler (``/is_paused`` and ``/is_sleeping`` say true); level
  1 and 2 also put the executor to sleep (tags ``weights`` and ``kv_cache``); then
  ``engine_sleep_state`` is set: level 1 -> ``awake`` 0, ``weights_offloaded`` 1; level 2 ->
  ``awake`` 0, ``discard_all`` 1; **level 0 -> all three 0**.
* ``wake_up(tags)``: ``tags=None`` wakes every tag, ``["scheduling"]`` none (the level-0 wake);
  once no executor tag sleeps the scheduler resumes and the gauge says ``awake`` 1 (answer
  ``"awake"``), else nothing resumes (answer ``"sleeping"``).
* ``release_kv_cache_memory`` needs a completed pause (scheduler paused, no request left) and
  a resident executor, else a 500; then the executor's ``kv_cache`` sleeps and, on success,
  every gauge child is 0 (``SimRL.cpu``: the discard fails, as recorded on CPU: a 500, the gauge
  unchanged, ``kv_cache`` asleep all the same, so ``/is_sleeping`` stays true until a wake-up).
* ``/resume`` resumes the scheduler only: an executor still asleep keeps the engine from
  generating and ``/is_sleeping`` true.

The simulator's pause is always a keep-pause (running requests freeze, nothing is aborted),
whatever ``mode`` says; ``mode`` is validated as vLLM does. DP broadcasts every call: a route
acts on every engine of the endpoint.
"""

from __future__ import annotations

from typing import Protocol

from .hosts import RLEngine, RLHost
from .rl_http import Answer, Request, Timed, engine_error, int_param, pause_mode

#: ``engine_sleep_state`` as ``(awake, weights_offloaded, discard_all)``
AWAKE = (1.0, 0.0, 0.0)
SLEEP_TAGS = frozenset({"weights", "kv_cache"})
_NOT_PAUSED = "release_kv_cache_memory() requires a completed pause first"
_NOT_RESIDENT = "release_kv_cache_memory() requires all executor memory to be resident"
_CPU_DISCARD = "Selective discard is not supported on CPU."


class SleepRL(Protocol):
    """What the sleep-mode routes read of ``SimRL``."""

    endpoint: RLHost
    cpu: bool

    def pause(self) -> None: ...


def _asleep_state(level: int) -> tuple[float, float, float]:
    """``PrometheusStatLogger.record_sleep_state(1, level)``."""
    return (0.0, 1.0 if level == 1 else 0.0, 1.0 if level == 2 else 0.0)


# -- one engine core ----------------------------------------------------------------------------
def sleep(engine: RLEngine, level: int) -> None:
    """``EngineCore.sleep(level)`` and the gauge ``AsyncLLM.sleep`` sets after it."""
    if level not in (0, 1, 2):
        raise ValueError("sleep level must be 0, 1 or 2")
    engine.scheduler_paused = True
    if level >= 1 and "weights" not in engine.sleeping_tags:  # else: "already sleeping"
        engine.sleeping_tags |= SLEEP_TAGS
    engine.sleep_state = _asleep_state(level)


def wake_up(engine: RLEngine, tags: list[str] | None = None) -> bool:
    """``EngineCore.wake_up(tags)``: whether fully awake (then the scheduler resumes)."""
    if tags is not None and "scheduling" in tags:
        tags = [t for t in tags if t != "scheduling"]
    if (tags is None or tags) and engine.sleeping_tags:
        if not tags:
            engine.sleeping_tags = set()
        elif all(t in engine.sleeping_tags for t in tags):  # else a warning, nothing woken
            engine.sleeping_tags = engine.sleeping_tags - set(tags)
    if engine.sleeping_tags:
        return False
    engine.scheduler_paused = False
    engine.sleep_state = AWAKE
    return True


def release_error(engine: RLEngine) -> str | None:
    """Why ``release_kv_cache_memory`` fails on this engine (None: it succeeds)."""
    if not engine.scheduler_paused or engine.num_running or engine.num_waiting:
        return _NOT_PAUSED
    if engine.sleeping_tags:
        return _NOT_RESIDENT
    return None


# -- routes --------------------------------------------------------------------------------------
def route_sleep(rl: SleepRL, req: Request) -> Answer | Timed:
    error, level = int_param(req, "level", 1, 0, 2)
    error = error or pause_mode(req)
    if error is not None:
        return error

    def begin() -> None:  # the pause starts at once (mode=wait: /is_paused true meanwhile)
        rl.pause()

    def run() -> Answer:
        for engine in rl.endpoint.engines:
            engine.sleep(level)
        return 200, {"status": "sleeping", "level": level}

    return Timed("sleep", run, begin)


def route_wake_up(rl: SleepRL, req: Request) -> Answer | Timed:
    tags = req.query.get("tags") or None

    def run() -> Answer:
        awake = [engine.wake_up(tags) for engine in rl.endpoint.engines]
        return 200, {"status": "awake" if all(awake) else "sleeping", "tags": tags}

    return Timed("wake", run)


def route_release_kv_cache_memory(rl: SleepRL, req: Request) -> Answer | Timed:
    def run() -> Answer:
        engines = rl.endpoint.engines
        for engine in engines:
            error = release_error(engine)
            if error is not None:
                return engine_error(error, "release_kv_cache_memory", worker=False)
        for engine in engines:  # Executor.discard adds the tag in a finally
            engine.sleeping_tags = engine.sleeping_tags | {"kv_cache"}
        if rl.cpu:
            return engine_error(_CPU_DISCARD, "release_kv_cache_memory")
        for engine in engines:
            engine.sleep_state = (0.0, 0.0, 0.0)
            engine._update_sleep_gauge()
        return 200, {"status": "kv_cache_released"}

    return Timed("release_kv_cache_memory", run)


def route_is_sleeping(rl: SleepRL, req: Request) -> Answer:
    return 200, {"is_sleeping": any(e.is_sleeping for e in rl.endpoint.engines)}
