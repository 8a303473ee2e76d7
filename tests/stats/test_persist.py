"""Accumulator persistence (_persist.py): float arrays round-trip exactly through strict JSON,
non-finite values as the strings the docs name, and a layout shared by many engines is written
once (the same data for each)."""

from __future__ import annotations

import json

import numpy as np

from fleetscope.exposition import Parser
from fleetscope.stats.persist import (
    floats_from_json,
    floats_to_json,
    layout_from_data,
    layout_to_data,
)
from support.paths import fixture_text


def test_float_arrays_round_trip_exactly_through_strict_json() -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 17, 500):
        a = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, size=n)
        if n:
            a[rng.random(n) < 0.3] = np.nan
            a[rng.random(n) < 0.05] = np.inf
            a[rng.random(n) < 0.05] = -np.inf
            a[0] = -0.0 if n > 1 else a[0]
        data = floats_to_json(a)
        text = json.dumps(data, allow_nan=False)  # strict JSON: no NaN / Infinity literals
        assert all(type(x) in (float, str) for x in data)
        assert {x for x in data if isinstance(x, str)} <= {"NaN", "+Inf", "-Inf"}
        back = floats_from_json(json.loads(text))
        assert back.dtype == float and back.shape == a.shape
        np.testing.assert_array_equal(back, a)  # NaN == NaN here; values bit-exact
        assert np.array_equal(np.signbit(back), np.signbit(a))
    assert floats_to_json(np.array([1.5, 2.0])) == [1.5, 2.0]


def test_a_shared_layout_is_written_once_and_restored_as_one_object() -> None:
    body = fixture_text("dp2_load.prom")
    expo = Parser().parse(body)
    lay = expo["0"].layout
    assert expo["1"].layout is lay
    first, second = layout_to_data(lay), layout_to_data(expo["1"].layout)
    assert first is second
    restored = layout_from_data(json.loads(json.dumps(first)))
    assert restored.slot_ids == lay.slot_ids
    assert layout_from_data(json.loads(json.dumps(second))) is restored


def test_the_isolation_childs_state_blob_round_trips_and_is_compressed() -> None:
    import pickle

    from fleetscope.collector.child import decode_state, encode_state

    rng = np.random.default_rng(3)
    a = rng.normal(size=400)
    a[rng.random(400) < 0.6] = np.nan  # as gauge peaks and unknown deltas are
    state = {
        "windows": {
            f"server{i}.0": {"delta": floats_to_json(a), "peak": floats_to_json(a)}
            for i in range(64)
        }
    }
    blob = encode_state(state)
    assert decode_state(blob) == state
    assert len(blob) * 3 < len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
