"""SGLang through Ray's metrics agent (``ray_sglang_*``) parses exactly like SGLang's own body.

The recorded SGLang 0.5.23 bodies (tests/data/sglang-0.5.23) are rewritten as Ray's agent
serves them (:func:`ray_body`, mirroring tests/data/sglang-0.5.23/README.md "Through Ray" and
the real Ray 2.60 captures in tests/data/fixtures/ray-2.60-vllm-0.32): names ``sglang:x`` ->
``ray_sglang_x``; Ray's tags on every sample (``Component``, ``NodeAddress``, ``ReplicaId``,
``SessionName``, ``Version``, ``WorkerId``, ``otel_scope_*``; labels sorted); bucket bounds
<= 0 dropped; one HELP/TYPE per family with every server's samples under it; the OpenCensus
backend's bare "DEPRECATED" gauge twin of every counter; Ray's own system metrics around them.

Expectations come from the native parse of the same body (itself checked against truth.json in
test_sglang.py), with the same buckets dropped, and from truth.json directly for the headline
numbers the audit found wrong (running 6 / preemptions 2 / queue-time count 24 on the all-TP-
ranks body; DP replicas collapsed; no roles).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import numpy as np
import pytest

from fleetscope.exposition import Exposition, Parser, parse
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.identity import Role
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.http.wire import Response
from fleetscope.sources.ray.source import RAY_AGENT_IDENTITY, RayIdentity, RaySource
from support.paths import DATA, RAY_DIR

SG = DATA / "sglang-0.5.23"
TRUTH = json.loads((SG / "truth.json").read_text())
RAY_VLLM = (RAY_DIR / "ray_vllm_default.prom").read_text()
VLLM_META = json.loads((RAY_DIR / "ray_vllm_default_meta.json").read_text())
_FIRST = next(ln for ln in RAY_VLLM.split("\n") if ln.startswith("ray_vllm_"))


def _first_tag(pattern: str) -> str:
    m = re.search(pattern, _FIRST)
    assert m is not None, pattern
    return m.group(1)


NODE_ADDRESS = _first_tag(r'NodeAddress="([^"]*)"')
SESSION = _first_tag(r'SessionName="([^"]*)"')
OTEL = {
    "otel_scope_name": "ray._private.telemetry.open_telemetry_metric_recorder",
    "otel_scope_schema_url": "",
    "otel_scope_version": "",
}
RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")
CASES = [
    "single_after.prom",
    "single_idle.prom",
    "dp2_after.prom",
    "dp2_idle.prom",
    "all_tp_ranks_after.prom",
    "tp2_default_after.prom",
    "pd_prefill_after.prom",
    "pd_decode_after.prom",
    "custom_buckets_after.prom",
]


def body(name: str) -> str:
    return (SG / name).read_text()


def wid(replica: str) -> str:
    """A Ray WorkerId (56 hex digits) per replica."""
    return hashlib.sha224(replica.encode()).hexdigest()


_LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"')


def _sample(line: str) -> tuple[str, dict[str, str], str]:
    head, _, value = line.rpartition(" ")
    name, _, rest = head.partition("{")
    return name, dict(_LABEL.findall(rest)), value


def _families(text: str) -> list[tuple[str, str, str, list[str]]]:
    """(family, type, help, sample lines) of a body, in body order."""
    out: list[tuple[str, str, str, list[str]]] = []
    helps: dict[str, str] = {}
    for ln in text.split("\n"):
        if ln.startswith("# HELP "):
            fam, _, h = ln[7:].partition(" ")
            helps[fam] = h
        elif ln.startswith("# TYPE "):
            fam, typ = ln[7:].split(" ")
            out.append((fam, typ, helps.get(fam, ""), []))
        elif ln and not ln.startswith("#"):
            out[-1][3].append(ln)
    return out


def _nonpositive_bucket(name: str, labels: dict[str, str]) -> bool:
    le = labels.get("le")
    return name.endswith("_bucket") and le is not None and le != "+Inf" and float(le) <= 0


def without_nonpositive_buckets(text: str) -> str:
    """The native body with the buckets Ray's wrapper drops (bounds <= 0): the reference."""
    return "".join(
        ln + "\n"
        for ln in text.split("\n")[:-1]
        if ln.startswith("#") or not _nonpositive_bucket(*_sample(ln)[:2])
    )


def ray_body(servers: dict[str, str], *, opencensus: bool = False, vllm_actor: bool = False) -> str:
    """Ray's agent body for SGLang servers recording through Ray (ReplicaId -> native body).

    ``opencensus``: the older backend (legacy cardinality, so WorkerId stays): no otel_scope
    labels, and every counter also as a bare "DEPRECATED" gauge. ``vllm_actor``: the node also
    runs the real vLLM actor of ray_vllm_default.prom (otherwise only Ray's system metrics).
    """
    lines = RAY_VLLM.rstrip("\n").split("\n")
    out = lines if vllm_actor else [ln for ln in lines if "ray_vllm_" not in ln]
    fams: dict[str, tuple[str, str, list[str]]] = {}
    for rid, text in servers.items():
        tags = {
            "Component": "core_worker",
            "NodeAddress": NODE_ADDRESS,
            "ReplicaId": rid,
            "SessionName": SESSION,
            "Version": "2.60.0",
            "WorkerId": wid(rid),
            **({} if opencensus else OTEL),
        }
        for fam, typ, help_, samples in _families(text):
            _, _, rows = fams.setdefault(fam, (typ, help_, []))
            for ln in samples:
                name, labels, value = _sample(ln)
                if _nonpositive_bucket(name, labels):
                    continue
                labels = dict(sorted({**labels, **tags}.items()))
                ray = "ray_" + name.replace(":", "_")
                rows.append(ray + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}")
                rows[-1] += " " + value
    for fam, (typ, help_, rows) in fams.items():
        ray = "ray_" + fam.replace(":", "_")
        out += [f"# HELP {ray} {help_}", f"# TYPE {ray} {typ}", *rows]
        if opencensus and typ == "counter":
            bare = ray.removesuffix("_total")
            out += [
                f"# HELP {bare} (DEPRECATED, use {ray} metric instead) {help_}",
                f"# TYPE {bare} gauge",
                *(bare + r[len(ray) :] for r in rows),
            ]
    return "\n".join(out) + "\n"


def items(sn: EngineSnapshot) -> dict[str, float]:
    return {k: float(v) for k, v in sn.items()}


def assert_same(a: EngineSnapshot, b: EngineSnapshot) -> None:
    """Exactly the same series with exactly the same values (NaN: a gauge without samples);
    the slot order follows the body's family order, which Ray's one block per family changes."""
    x, y = items(a), items(b)
    assert x.keys() == y.keys()
    diff = [k for k in x if x[k] != y[k] and not (math.isnan(x[k]) and math.isnan(y[k]))]
    assert not diff, [(k, x[k], y[k]) for k in diff]
    assert len(x) == len(a.layout.slot_ids) == len(b.layout.slot_ids)


def ray_label(rid: str, engine: str) -> str:
    return f"{rid}/{wid(rid)}/{engine}"  # RAY_IDENTITY_LABELS: ReplicaId, WorkerId, dp_rank


def dp_of(case: str) -> int:
    return TRUTH[case]["case"].get("dp") or 1


def test_the_rewrite_is_a_ray_body() -> None:
    text = ray_body({"r1": body("all_tp_ranks_after.prom")}, opencensus=True)
    assert not re.search(r"^(# TYPE )?sglang:", text, re.M) and 'le="0.0"' not in text
    line = next(ln for ln in text.split("\n") if ln.startswith("ray_sglang_num_running_reqs{"))
    assert 'ReplicaId="r1"' in line and f'WorkerId="{wid("r1")}"' in line
    assert 'tp_rank="1"' in text  # every scheduler rank is still there
    assert "# TYPE ray_sglang_num_retracted_requests_total counter" in text
    assert "# TYPE ray_sglang_num_retracted_requests gauge" in text  # OpenCensus' twin


# --------------------------------------------------------------------------- engines, values


@pytest.mark.parametrize("case", CASES)
def test_engines_are_replica_and_dp_rank_pairs(case: str) -> None:
    expo = parse(ray_body({"r1": body(case), "r2": body(case)}))
    dp = dp_of(case)
    want = {ray_label(r, str(i)) for r in ("r1", "r2") for i in range(dp)}
    assert set(expo) == want


@pytest.mark.parametrize("other", ["single_after.prom", "dp2_after.prom"])
@pytest.mark.parametrize("case", CASES)
def test_every_series_equals_the_native_parse(case: str, other: str) -> None:
    """Two different servers on one node: each engine is exactly its native self."""
    servers = {"r1": body(case), "r2": body(other)}
    expo = parse(ray_body(servers))
    native = {r: parse(without_nonpositive_buckets(t)) for r, t in servers.items()}
    assert len(expo) == sum(len(n) for n in native.values())
    for rid, nat in native.items():
        for e, sn in nat.items():
            assert_same(expo[ray_label(rid, e)], sn)
    # the endpoint: Ray's own system metrics, plus the tokenizer families of servers with
    # several DP replicas (no dp_rank: not split), summed over such servers
    assert expo.endpoint is not None
    ep = items(expo.endpoint)
    engine_series = {k: v for k, v in ep.items() if k.startswith(("vllm:", "sglang:"))}
    want: dict[str, float] = {}
    for nat in native.values():
        if nat.endpoint is not None:
            for k, v in items(nat.endpoint).items():
                want[k] = want.get(k, 0.0) + v
    assert engine_series.keys() == want.keys()
    for k, v in want.items():
        assert engine_series[k] == v or (math.isnan(v) and math.isnan(engine_series[k])), k
    assert any(k.startswith("ray_") for k in ep)  # Ray's system metrics stay there


def test_only_the_bucket_ray_drops_differs_from_the_untouched_body() -> None:
    nat = parse(body("single_after.prom"))["0"]
    ref = parse(without_nonpositive_buckets(body("single_after.prom")))["0"]
    assert set(ref.layout.slot_ids) < set(nat.layout.slot_ids)
    (gone,) = set(nat.layout.slot_ids) - set(ref.layout.slot_ids)
    assert gone.startswith("vllm:request_queue_time_seconds_bucket{")

    def bounds(sn: EngineSnapshot) -> tuple[float, ...]:
        (h,) = [h for h in sn.layout.histograms if h.name == "vllm:request_queue_time_seconds"]
        return h.bounds

    assert bounds(nat) == (0.0, *bounds(ref))


def _truth(case: str, kind: str, name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        s
        for s in TRUTH[case][kind]
        if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items())
    ]


def test_tp_repeats_counted_once() -> None:
    """all_tp_ranks: every scheduler rank writes the scheduler series; rank 0's count."""
    case = "all_tp_ranks_after.prom"
    running = _truth(case, "gauges", "sglang:num_running_reqs")
    retracted = _truth(case, "counters", "sglang:num_retracted_requests_total")
    queue = _truth(case, "histograms", "sglang:queue_time_seconds")
    assert {s["labels"]["tp_rank"] for s in running + retracted + queue} == {"0", "1"}
    rank0 = {k: v for k, v in zip(RANKS, ("0", "0", "0"), strict=True)}
    want_running = sum(s["value"] for s in running if s["labels"].items() >= rank0.items())
    want_retracted = sum(s["value"] for s in retracted if s["labels"].items() >= rank0.items())
    want_queue = sum(s["count"] for s in queue if s["labels"].items() >= rank0.items())
    assert (want_running, want_retracted, want_queue) == (3, 1, 12)  # the audit's numbers
    # ... and summing the ranks would give what the audit saw
    assert (sum(s["value"] for s in running), sum(s["count"] for s in queue)) == (6, 24)
    expo = parse(ray_body({"r1": body(case)}))
    sn = expo[ray_label("r1", "0")]
    assert sn.value("vllm:num_requests_running") == want_running
    assert sn.value("vllm:num_preemptions_total") == want_retracted
    assert sn.value("vllm:request_queue_time_seconds_count") == want_queue
    gen = _truth(case, "counters", "sglang:generation_tokens_total")  # tokenizer: no ranks
    assert sn.value("vllm:generation_tokens_total") == sum(s["value"] for s in gen)


def test_dp_replicas_stay_apart_and_kv_usage_is_not_added_up() -> None:
    case = "dp2_after.prom"
    expo = parse(ray_body({"r1": body(case), "r2": body("single_after.prom")}))
    for s in _truth(case, "gauges", "sglang:full_token_usage"):
        dp = s["labels"]["dp_rank"]
        assert expo[ray_label("r1", dp)].value("vllm:kv_cache_usage_perc") == s["value"]
    for s in _truth(case, "histograms", "sglang:queue_time_seconds", tp_rank="0"):
        dp = s["labels"]["dp_rank"]
        assert (
            expo[ray_label("r1", dp)].value("vllm:request_queue_time_seconds_count") == (s["count"])
        )
    # the tokenizer's counts (no dp_rank) of the DP server are the endpoint's; the single
    # server's belong to its one engine, though the body has several DP ranks overall
    gen = sum(s["value"] for s in _truth(case, "counters", "sglang:generation_tokens_total"))
    assert expo.endpoint is not None
    assert expo.endpoint.value("vllm:generation_tokens_total") == gen
    for dp in "01":
        assert expo[ray_label("r1", dp)].value("vllm:generation_tokens_total") is None
    single = _truth("single_after.prom", "counters", "sglang:generation_tokens_total")
    got = expo[ray_label("r2", "0")].value("vllm:generation_tokens_total")
    assert got == sum(s["value"] for s in single)
    # radix-cache families: dp_rank 0 on both replicas (summed by SGLang): the endpoint's
    ev = _truth(case, "counters", "sglang:evicted_tokens_total")
    assert expo.endpoint.value("sglang:evicted_tokens_total") == ev[0]["value"]
    assert expo[ray_label("r1", "0")].value("sglang:evicted_tokens_total") is None


def test_roles_from_engine_type() -> None:
    expo = parse(
        ray_body(
            {
                "p": body("pd_prefill_after.prom"),
                "d": body("pd_decode_after.prom"),
                "u": body("single_after.prom"),
            }
        )
    )
    assert expo.engine_roles == {ray_label("p", "0"): "prefill", ray_label("d", "0"): "decode"}


def test_opencensus_counters_exported_twice_are_counted_once() -> None:
    case = "all_tp_ranks_after.prom"
    text = ray_body({"r1": body(case)}, opencensus=True)
    assert re.search(r"^ray_sglang_prompt_tokens\{", text, re.M)  # the bare twin is there
    sn = parse(text)[ray_label("r1", "0")]
    ref = parse(without_nonpositive_buckets(body(case)))["0"]
    assert_same(sn, ref)
    prompt = _truth(case, "counters", "sglang:prompt_tokens_total")
    assert sn.value("vllm:prompt_tokens_total") == sum(s["value"] for s in prompt)
    assert sn.value("vllm:num_preemptions_total") == 1


def test_a_vllm_actor_on_the_same_node_is_unchanged() -> None:
    alone = parse(RAY_VLLM)
    expo = parse(ray_body({"r1": body("dp2_after.prom")}, vllm_actor=True))
    assert expo.endpoint is not None
    vllm = [e for e in alone if e not in expo.endpoint]
    assert vllm and all(e in expo for e in vllm)
    for e in alone:
        assert_same(expo[e], alone[e])
    ref = parse(without_nonpositive_buckets(body("dp2_after.prom")))
    for e in ref:
        assert_same(expo[ray_label("r1", e)], ref[e])
    assert len(expo) == len(alone) + len(ref)


def test_fast_path_gives_the_same_result() -> None:
    text = ray_body({"r1": body("all_tp_ranks_after.prom"), "r2": body("pd_decode_after.prom")})
    p = Parser(share_templates=False)
    a, b = p.parse(text), p.parse(text)
    assert p.fast_hits == 1 and p.full_parses == 1
    assert list(a) == list(b)
    for e in a:
        assert a[e].layout is b[e].layout
        assert np.array_equal(a[e].data, b[e].data, equal_nan=True)
    assert b.engine_roles == a.engine_roles == {ray_label("r2", "0"): "decode"}


# --------------------------------------------------------------------------- RaySource


def _filtered(
    ident: RayIdentity, servers: dict[str, str]
) -> tuple[Exposition, dict[str, Role], int]:
    expo = Parser(identity_labels=RAY_AGENT_IDENTITY).parse(ray_body(servers, vllm_actor=True))
    return RaySource(ident).filter(expo)


def test_ray_source_keeps_own_sglang_servers_by_worker_id() -> None:
    """Own servers by WorkerId (the vLLM actor and a third SGLang server are foreign): each own
    engine, its pieces joined (radix-cache families carry no model_name), is its native self."""
    servers = {
        "r1": body("dp2_after.prom"),
        "r2": body("all_tp_ranks_after.prom"),
        "r3": body("single_after.prom"),
    }
    kept, roles, dropped = _filtered(RayIdentity(worker_ids={wid("r1"), wid("r2")}), servers)
    assert dropped == 2  # r3 and the vLLM actor
    assert roles == {}
    want = {f"{wid('r1')[:8]}-0", f"{wid('r1')[:8]}-1", f"{wid('r2')[:8]}-0"}
    assert set(kept) == want
    for rid in ("r1", "r2"):
        ref = parse(without_nonpositive_buckets(servers[rid]))
        for e, sn in ref.items():
            assert items(kept[f"{wid(rid)[:8]}-{e}"]) == pytest.approx(items(sn), nan_ok=True)
    assert kept[f"{wid('r2')[:8]}-0"].value("vllm:num_requests_running") == 3


def test_ray_source_passes_the_roles_the_body_reports_and_the_identity_wins() -> None:
    servers = {"p": body("pd_prefill_after.prom"), "d": body("pd_decode_after.prom")}
    kept, roles, dropped = _filtered(RayIdentity(worker_ids={wid("p"), wid("d")}), servers)
    assert roles == {f"{wid('p')[:8]}-0": "prefill", f"{wid('d')[:8]}-0": "decode"}
    assert set(kept) == set(roles) and dropped == 1  # the vLLM actor
    ident = RayIdentity(worker_ids={wid("p"), wid("d")}, roles={wid("d"): "prefill"})
    _, roles, _ = _filtered(ident, servers)
    assert roles == {f"{wid('p')[:8]}-0": "prefill", f"{wid('d')[:8]}-0": "prefill"}
    # a replica id identity (Ray Serve) works the same
    _, roles, dropped = _filtered(RayIdentity(replica_ids={"p"}), servers)
    assert roles == {f"{wid('p')[:8]}-0": "prefill"} and dropped == 2


class _Agent(HttpSource):
    def __init__(self, *bodies: str) -> None:
        super().__init__(identity_labels=RAY_AGENT_IDENTITY)
        self.bodies = list(bodies)

    async def _fetch(self, ep: Endpoint) -> Response:
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return Response(200, {}, body.encode())


async def test_two_polls_through_a_collector_count_the_own_increase() -> None:
    """Own: a server going idle -> after, and an all-TP-ranks server (unchanged); foreign: a
    decode server. Deltas are the own increase, running sums rank 0 of each own server."""
    from fleetscope.collector.core import Collector

    tp = body("all_tp_ranks_after.prom")
    foreign = body("pd_decode_after.prom")
    first = ray_body({"r1": body("single_idle.prom"), "r2": tp, "x": foreign})
    second = ray_body({"r1": body("single_after.prom"), "r2": tp, "x": foreign})
    src = RaySource(
        RayIdentity(worker_ids={wid("r1"), wid("r2")}),
        nodes=lambda: [VLLM_META["node"]],
        http=_Agent(first, second),
    )
    c = Collector(source=src, interval=3600)
    try:
        await c.poll()
        view = await c.poll()
    finally:
        await c.stop()

    def total(case: str, kind: str, name: str, **labels: str) -> float:
        summed: float = sum(s["value"] for s in _truth(case, kind, name, **labels))
        return summed

    gen = "sglang:generation_tokens_total"
    want = total("single_after.prom", "counters", gen) - total("single_idle.prom", "counters", gen)
    assert want > 0
    k = view.keys
    assert k["inference/agg/engines_reporting"] == 2
    assert k["inference/agg/generation_tokens_total/delta"] == want
    running = total("single_after.prom", "gauges", "sglang:num_running_reqs") + total(
        "all_tp_ranks_after.prom", "gauges", "sglang:num_running_reqs", tp_rank="0"
    )
    assert k["inference/agg/num_requests_running/sum"] == running == 6
