"""The simulator's RL routes against the real vLLM 0.32 recordings (``tests/data/real-vllm-rl``).

Every recorded RL call (``calls.json``: method, path, query, body) is replayed, in the order of
its start and end times, against a simulated server built like the recorded one (DP, weight
transfer configured or not, a CPU build): each answer must be the recorded status and JSON
body, and at every saved ``/metrics`` snapshot the simulator's RL / sleep-mode families and
``engine_sleep_state`` must have the real body's families, HELP/TYPE lines, label names,
series, counts, in-flight values and gauge values.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.exposition import Parser
from fleetscope_sim import FleetServer, LoadProfile, SimEndpoint, SimFleet
from fleetscope_sim.rl import ROUTES, PendingCall
from fleetscope_sim.rl_metrics import FAMILIES_OF, SLEEP_MODE, WEIGHT_UPDATE
from support.paths import DATA

RL_DIR = DATA / "real-vllm-rl"
# run -> (DP, weight-transfer backend)
RUNS = {"single": (1, None), "single-rerun": (1, None), "dp2": (2, None), "single-ipc": (1, "ipc")}
FAMILIES = {
    WEIGHT_UPDATE.name,
    WEIGHT_UPDATE.in_flight,
    SLEEP_MODE.name,
    SLEEP_MODE.in_flight,
    "vllm:engine_sleep_state",
}
TIMED = {
    "/init_weight_transfer_engine": "init",
    "/shutdown_weight_transfer_engine": "shutdown",
    "/start_weight_update": "start",
    "/start_draft_weight_update": "start_draft",
    "/update_weights": "update",
    "/finish_weight_update": "finish",
    "/sleep": "sleep",
    "/wake_up": "wake",
    "/release_kv_cache_memory": "release_kv_cache_memory",
}
EXACT_SAMPLES = ("_count", "_operations_in_flight", "engine_sleep_state")


def _query(q: Any) -> str:
    if not q:
        return ""
    pairs = q if isinstance(q, list) else list(q.items())
    return urlencode([(k, str(v)) for k, v in pairs])


def _body(b: Any) -> bytes:
    return b"" if b is None else json.dumps(b).encode()


def _families(text: str) -> dict[str, Any]:
    """The RL / sleep families of a body (and their ``_created`` families)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in FAMILIES or fam.name.removesuffix("_created") in FAMILIES:
            out[fam.name] = fam
    return out


def _series(fam: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}


def _meta_lines(text: str) -> set[str]:
    names = FAMILIES | {f + "_created" for f in FAMILIES}
    return {ln for ln in text.splitlines() if ln.startswith("#") and ln.split(" ")[2] in names}


def _compare_snapshot(real_text: str, sim_text: str, where: str) -> int:
    real, sim = _families(real_text), _families(sim_text)
    assert set(sim) == set(real), where
    assert _meta_lines(sim_text) == _meta_lines(real_text), where
    for name, fam in real.items():
        other = sim[name]
        assert (other.type, other.documentation) == (fam.type, fam.documentation), (where, name)
        real_series, sim_series = _series(fam), _series(other)
        assert set(sim_series) == set(real_series), (where, name)  # labels, children, buckets
        if name.endswith("_created"):
            continue
        for key, v in real_series.items():
            if key[0].endswith(EXACT_SAMPLES) or dict(key[1]).get("le") == "+Inf":
                assert sim_series[key] == v, (where, key)
    return len(real)


def _endpoint(run: str) -> SimEndpoint:
    dp, backend = RUNS[run]
    ep = SimEndpoint("server0", dp=dp, load=LoadProfile(arrival_rate=0.0), seed=1)
    ep.step(1.0)  # a multiprocess body has its per-step gauges (engine_sleep_state) after a step
    ep.rl.cpu = True
    ep.rl.transfer.backend = backend
    return ep


@pytest.mark.parametrize("run", sorted(RUNS))
def test_replayed_calls_answer_and_expose_what_the_real_server_did(run: str) -> None:
    calls = json.loads((RL_DIR / run / "calls.json").read_text(encoding="utf-8"))
    ep = _endpoint(run)
    rl = ep.rl
    events: list[tuple[float, int, int]] = []  # (time, 0 end / 1 snapshot / 2 start, index)
    for i, c in enumerate(calls):
        if c.get("path") in ROUTES and c.get("status") is not None:
            assert c["t_end"] > c["t_start"]
            events += [(c["t_start"], 2, i), (c["t_end"], 0, i)]  # ends first at a tie
        elif (RL_DIR / run / str(c.get("metrics_snapshot"))).exists():
            events.append((c["t"], 1, i))
    events.sort()
    started: dict[int, Any] = {}
    answered = snapshots = 0
    seen_ops: set[str] = set()
    for _, kind, i in events:
        c = calls[i]
        if kind == 1:
            real_text = (RL_DIR / run / c["metrics_snapshot"]).read_text(encoding="utf-8")
            body = ep.render(use_cache=False)
            assert ep.render_fast(use_cache=False) == body  # what /metrics serves
            snapshots += _compare_snapshot(real_text, body.decode(), c["metrics_snapshot"])
        elif kind == 2:  # a timed call stays in flight until its recorded end
            op = TIMED.get(c["path"])
            hold = rl.hold(op) if op else None
            result = rl.answer(c["method"], c["path"], _body(c["body"]), _query(c["query"]))
            if hold is not None and not isinstance(result, PendingCall):
                hold.release()  # a 400: never reached the handler
            started[i] = result
        else:
            result = started.pop(i)
            if isinstance(result, PendingCall):
                result.hold.release()
                result = result.finish()
                seen_ops.add(TIMED[c["path"]])
            assert result == (c["status"], c["response"]), (i, c["path"], c.get("query"))
            answered += 1
    assert answered >= 50 and snapshots >= 3
    assert not started
    # ground truth counts every observed call: the recorded 400s are not in it
    for op in seen_ops:
        want = sum(
            1
            for c in calls
            if TIMED.get(c.get("path", "")) == op and c.get("status") not in (None, 400)
        )
        truth = rl.truth(op)
        assert truth is not None and truth.count == want, op
        assert ep.truth.histogram(FAMILIES_OF[op].name, op) is truth
    by_status = {k: n for k, n in rl.call_counts.items() if k[1] == "/sleep"}
    assert by_status.get(("POST", "/sleep", 400)) == 1  # level=3


def test_every_route_is_404_without_dev_mode() -> None:
    recorded = json.loads((RL_DIR / "no-dev-mode.json").read_text(encoding="utf-8"))["calls"]
    ep = _endpoint("single")
    ep.rl.dev_mode = False
    checked = 0
    for c in recorded:
        if c["path"] in ROUTES:
            assert ep.rl.answer(c["method"], c["path"]) == (c["status"], c["response"]), c
            checked += 1
    assert checked >= 10
    assert "sleep_mode" not in ep.render().decode()


def _catalogue(
    text: str,
) -> dict[str, tuple[str, str, frozenset[str], tuple[float, ...], frozenset[str]]]:
    """family -> (type, help, label names, bucket bounds, operations) of the RL / sleep ones."""
    out = {}
    for name, fam in _families(text).items():
        labels = frozenset(k for smp in fam.samples for k in smp.labels if k != "le")
        bounds = tuple(
            sorted({float(smp.labels["le"]) for smp in fam.samples if "le" in smp.labels})
        )
        ops = frozenset(smp.labels.get("operation") for smp in fam.samples) - {None}
        out[name] = (fam.type, fam.documentation, labels, bounds, ops)
    return out


def test_bodies_served_over_http_have_the_real_families_and_labels() -> None:
    """After every timed route was called over HTTP, the served bodies' RL / sleep families are
    the real final bodies' (single process, and DP=2 multiprocess): names, types, HELP, label
    names, buckets and operations; the first call of a kind, held in flight, already shows."""
    fleet = SimFleet(seed=2)
    fleet.add_endpoint(dp=1, name="single", load=LoadProfile(arrival_rate=0.0))
    fleet.add_endpoint(dp=2, name="dp2", load=LoadProfile(arrival_rate=0.0))
    fleet.step(2.0)
    sequence: list[tuple[str, dict[str, str], dict[str, Any] | None]] = [
        ("/sleep", {"level": "1"}, None),
        ("/wake_up", {}, None),
        ("/release_kv_cache_memory", {}, None),  # 500: not paused (observed all the same)
        ("/init_weight_transfer_engine", {}, {"init_info": {}}),
        ("/start_weight_update", {}, None),
        ("/start_draft_weight_update", {}, None),  # 500: no draft model
        (
            "/update_weights",
            {},
            {"update_info": {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}},
        ),
        ("/finish_weight_update", {}, {"weight_version": "v1"}),
        ("/shutdown_weight_transfer_engine", {}, None),
    ]
    with FleetServer(fleet) as server, httpx.Client(timeout=30.0) as h:
        ep = fleet.endpoint("single")
        hold = ep.rl.hold("sleep")
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(h.post, server.url("single") + "/sleep")
            assert hold.entered.wait(60.0)
            body = h.get(server.url("single") + "/metrics").text
            assert not pending.done()
            hold.release()
            assert pending.result().status_code == 200
        fam = _families(body)
        assert set(fam) - {"vllm:engine_sleep_state"} == {SLEEP_MODE.name, SLEEP_MODE.in_flight}
        assert fam[SLEEP_MODE.name].samples == []  # created, no child until the observation
        assert _series(fam[SLEEP_MODE.in_flight]) == {
            (SLEEP_MODE.in_flight, (("operation", "sleep"),)): 1.0
        }
        parsed = Parser().parse(body, time=0.0)  # fleetscope reads it as it is
        assert list(parsed) == ["0"] and not parsed.invalid
        assert parsed.types.get(SLEEP_MODE.name) == "histogram"
        for name in ("single", "dp2"):
            for path, query, payload in sequence:
                resp = h.post(server.url(name) + path, params=query, json=payload)
                assert resp.status_code in (200, 500), (path, resp.text)
            served = h.get(server.url(name) + "/metrics").text
            run, final = {"single": ("single", "41_final"), "dp2": ("dp2", "20_final")}[name]
            real = (RL_DIR / run / f"{final}.prom").read_text(encoding="utf-8")
            assert _catalogue(served) == _catalogue(real), name
            assert _meta_lines(served) == _meta_lines(real), name


def test_ground_truth_follows_each_call_and_outlives_a_restart() -> None:
    ep = SimEndpoint("server0", dp=2, load=LoadProfile(arrival_rate=0.0), seed=3)
    ep.step(1.0)
    e0 = ep.engines[0]
    before = e0.truth.gauge_history[-1][1]
    ep.rl.operation_seconds["sleep"] = 2.5
    assert ep.rl.call("POST", "/sleep", query="level=2") == (
        200,
        {"status": "sleeping", "level": 2},
    )
    state = {k[0]: v for k, v in e0.truth.gauges["vllm:engine_sleep_state"].items()}
    assert state == {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}
    assert before["vllm:engine_sleep_state"][("awake",)] == 1.0  # the step's history is kept
    assert all(e.is_sleeping and e.scheduler_paused for e in ep.engines)
    assert (
        ep.rl.call("POST", "/init_weight_transfer_engine", {"init_info": {"packed": True}})[0]
        == 200
    )
    assert ep.rl.call("POST", "/start_weight_update")[0] == 200
    ep.restart()  # a new process: no RL family, awake, no transfer session; truth stays
    body = ep.render().decode()
    assert SLEEP_MODE.name not in body and WEIGHT_UPDATE.name not in body
    assert not ep.rl.transfer.active and not any(e.is_sleeping for e in ep.engines)
    hist = ep.rl.truth("sleep")
    assert hist is not None and (hist.count, hist.sum) == (1, 2.5)
    assert [c.path for c in ep.rl.calls] == [
        "/sleep",
        "/init_weight_transfer_engine",
        "/start_weight_update",
    ]
    assert ep.rl.call("POST", "/update_weights", {"update_info": CHUNK_EMPTY})[0] == 500
    update = ep.rl.truth("update")
    assert update is not None
    assert update.count == 1  # the failed call is observed


CHUNK_EMPTY: dict[str, list[Any]] = {
    "names": [],
    "dtype_names": [],
    "shapes": [],
    "ipc_handles": [],
}


def test_sglang_endpoints_have_no_vllm_sleep_or_transfer_routes() -> None:
    fleet = SimFleet(seed=1)
    ep = fleet.add_endpoint(engine_kind="sglang")
    for path in ("/sleep", "/wake_up", "/init_weight_transfer_engine", "/update_weights"):
        assert ep.rl.answer("POST", path) == (404, {"detail": "Not Found"}), path
