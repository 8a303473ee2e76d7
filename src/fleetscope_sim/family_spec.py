"""How the simulator describes a vLLM metric family (``FamilySpec``) and resolves its buckets.

Plain data shared by the family catalogues (:mod:`~fleetscope_sim.vllm_families`,
:mod:`~fleetscope_sim.vllm_server_families`) and the exposition writer.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram", "summary"]

#: Bucket-layout marker: 1-2-5 steps up to the server's ``max_model_len`` (vLLM's
#: ``build_1_2_5_buckets(max_model_len)``); 512 gives ``1, 2, 5, ..., 200, 500``.
MAX_MODEL_LEN_BUCKETS = "1-2-5 up to max_model_len"


class FamilySpec(NamedTuple):
    """One metric family as vLLM exposes it.

    Attributes:
        name: the name on the ``# TYPE`` line (counters keep ``_total``).
        kind: ``counter``, ``gauge``, ``histogram`` or ``summary``.
        help: the HELP text, exactly.
        label: the one breakdown label besides ``engine``/``model_name`` (``finished_reason``,
            ``source``...), or ``None``.
        label_values: the values vLLM creates for ``label`` at start-up, in exposition order.
        per_engine: whether the family carries the ``engine`` label (``admission_rejections``
            is per API server, not per engine).
        buckets: finite bucket bounds of a histogram, or ``MAX_MODEL_LEN_BUCKETS``.
        set_each_step: gauge written by the per-step stats logger (absent in multiprocess mode
            until the engine's first step).
    """

    name: str
    kind: Kind
    help: str
    label: str | None = None
    label_values: tuple[str, ...] = ()
    per_engine: bool = True
    buckets: tuple[float, ...] | str = ()
    set_each_step: bool = False


#: Order of family types in a multiprocess-mode body.
MULTIPROCESS_KIND_ORDER: dict[str, int] = {"counter": 0, "gauge": 1, "summary": 2, "histogram": 3}


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... while ``<= max_value``.

    >>> build_1_2_5_buckets(512)
    (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
    """
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def bucket_bounds(spec: FamilySpec, max_model_len: int) -> tuple[float, ...]:
    """The finite bucket bounds of histogram ``spec`` on a server with ``max_model_len``."""
    if spec.buckets == MAX_MODEL_LEN_BUCKETS:
        return build_1_2_5_buckets(max_model_len)
    assert isinstance(spec.buckets, tuple)
    return spec.buckets
