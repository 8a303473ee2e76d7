"""The Ray path on real agent bodies (Ray 2.60 + vLLM 0.32 captures), without Ray.

* ``ray_default.prom``: the run's two engines are kept, the twin (identical tags, another
  worker) and the foreign actor are dropped, also when model names are part of the identity;
  ``ray_default_after_kill_twin.prom`` continues the same engines, and through a Collector
  the deltas are exactly the own workers' increases;
* ``ray_vllm_default.prom``: one engine per vLLM actor (``cache_config_info``, which carries no
  ``model_name``, joins it), every ``ray_vllm_*`` family under its ``vllm:`` name;
* ``ray_vllm_ocdefault.prom`` (OpenCensus): counters counted once, the WorkerId-less piece joined
  to the engine, identity by model name works;
* filtering everything away warns; a failed identity lookup disables only the source.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.exposition import Exposition, Parser
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.http.wire import Response
from fleetscope.sources.ray.source import (
    RAY_AGENT_IDENTITY,
    AgentEngine,
    RayIdentity,
    RaySource,
    decode_label,
    discover_agents,
)
from support.bodies import drop_lines, sample_value, set_values
from support.paths import RAY_DIR, fixture_text

META = json.loads((RAY_DIR / "ray_default_meta.json").read_text())
IDS = {name: v["worker_id"] for name, v in META["identities"].items()}
OWN0, OWN1, TWIN, FOREIGN = IDS["own0"], IDS["own1"], IDS["twin_of_own0"], IDS["foreign"]
NODE = META["node"]
NODE_NAME = f"node-{NODE['NodeID'][:8]}"
VLLM_META = json.loads((RAY_DIR / "ray_vllm_default_meta.json").read_text())
OC_META = json.loads((RAY_DIR / "ray_vllm_ocdefault_meta.json").read_text())


def parse(body: str) -> Exposition:
    return Parser(identity_labels=RAY_AGENT_IDENTITY).parse(body)


def own_value(body: str, family: str, worker_id: str) -> float:
    return sample_value(body, rf'^{family}\{{.*WorkerId="{worker_id}"')


async def polls(src: RaySource, n: int) -> list[FleetView]:
    """``n`` polls of a Collector reading ``src`` (no background loop), then its shutdown."""
    c = Collector(source=src, interval=3600)
    try:
        return [await c.poll() for _ in range(n)]
    finally:
        await c.stop()


class FakeAgents(HttpSource):
    """The real HttpSource (parser, fast path) with bodies served from memory, per node."""

    def __init__(self, *bodies: str) -> None:
        super().__init__(identity_labels=RAY_AGENT_IDENTITY)
        self.bodies = list(bodies)
        self.fetched: list[str] = []

    async def _fetch(self, ep: Endpoint) -> Response:
        self.fetched.append(ep.metrics_url)
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return Response(200, {}, body.encode())


def source(identity: RayIdentity | None, *bodies: str, **kw: Any) -> RaySource:
    return RaySource(identity, nodes=lambda: [NODE], http=FakeAgents(*bodies), **kw)


# --------------------------------------------------------------------------- plain actors


@pytest.mark.parametrize(
    "identity",
    [
        RayIdentity(worker_ids={OWN0, OWN1}),
        # model names as a fallback must not let the twin (same tags, foreign WorkerId) in
        RayIdentity(worker_ids={OWN0, OWN1}, model_names={"tiny-llama"}),
    ],
    ids=["worker-ids", "worker-ids+model-name"],
)
@pytest.mark.parametrize("name", ["ray_default.prom", "ray_default_after_kill_twin.prom"])
def test_own_engines_kept_twin_and_foreign_dropped(name: str, identity: RayIdentity) -> None:
    body = fixture_text(name)
    kept, roles, dropped = RaySource(identity).filter(parse(body))
    assert sorted(kept) == sorted([f"{OWN0[:8]}-0", f"{OWN1[:8]}-1"])
    assert dropped == 2 and roles == {}
    assert kept.endpoint is None  # Ray's own system metrics are not engines
    for wid, engine in ((OWN0, "0"), (OWN1, "1")):
        snap = kept[f"{wid[:8]}-{engine}"]
        assert snap["vllm:prompt_tokens_total"] == own_value(
            body, "ray_vllm_prompt_tokens_total", wid
        )
        assert snap["vllm:num_requests_running"] == own_value(
            body, "ray_vllm_num_requests_running", wid
        )
        assert snap["vllm:e2e_request_latency_seconds_count"] == own_value(
            body, "ray_vllm_e2e_request_latency_seconds_count", wid
        )
        assert snap.process_start is None  # the agent's start is not the engine's
    # the twin's and the foreign actor's numbers appear nowhere
    values = {float(v) for s in kept.values() for v in s.data}
    assert 1000.0 not in values and 5.0 not in values


async def test_two_polls_count_exactly_the_own_increase(caplog: pytest.LogCaptureFixture) -> None:
    """ray_default -> after_kill_twin, edited: own engines +10 / +3 prompt tokens, the dead
    twin's left-over counter +500 and the foreign one +5. Only the own +13 counts."""
    second = fixture_text("ray_default_after_kill_twin.prom")
    for wid, inc in ((OWN0, 10), (OWN1, 3), (TWIN, 500), (FOREIGN, 5)):

        def grown(v: float, i: int = inc) -> float:
            return v + i

        second = set_values(second, rf'^ray_vllm_prompt_tokens_total\{{.*WorkerId="{wid}"', grown)
    ident = RayIdentity(worker_ids={OWN0, OWN1}, roles={OWN0: "prefill", OWN1: "decode"})
    src = source(ident, fixture_text("ray_default.prom"), second)
    with caplog.at_level(logging.INFO, logger="fleetscope"):
        _, view = await polls(src, 2)
    k = view.keys
    assert k["inference/agg/prompt_tokens_total/delta"] == 13
    assert k["inference/prefill/prompt_tokens_total/delta"] == 10
    assert k["inference/decode/prompt_tokens_total/delta"] == 3
    assert k["inference/agg/engines_reporting"] == 2
    assert k["inference/prefill/engines_reporting"] == k["inference/decode/engines_reporting"] == 1
    assert k["inference/agg/num_requests_running/sum"] == 50 + 7
    assert k["inference/agg/endpoints_reporting"] == 1
    e0, e1 = f"{NODE_NAME}.{OWN0[:8]}-0", f"{NODE_NAME}.{OWN1[:8]}-1"
    assert set(view.engines) == {e0, e1}
    assert view.engines[e0].role == "prefill" and view.engines[e1].role == "decode"
    assert view.engines[e0].running == 50
    assert src.foreign_engines == 2 and src.missing == set()
    # what the filter drops is said (once, and again when it changes), never silent
    said = [r.getMessage() for r in caplog.records if "foreign filtered out" in r.getMessage()]
    assert said == ["fleetscope: Ray agents: 2 own vLLM engine(s) kept, 2 foreign filtered out"]
    assert isinstance(src.http, FakeAgents)
    assert (
        src.http.fetched[0]
        == f"http://{NODE['NodeManagerAddress']}:{NODE['MetricsExportPort']}/metrics"
    )


# --------------------------------------------------------------------------- real vLLM


def _vllm_families(body: str) -> dict[str, str]:
    """`ray_vllm_*` TYPE lines -> the `vllm:` family names fleetscope should give them."""
    out: dict[str, str] = {}
    for fam, typ in re.findall(r"^# TYPE ray_vllm_(\S+) (\S+)$", body, re.M):
        if typ == "counter":
            fam = fam.removesuffix("_total")
        elif typ == "gauge" and f"# TYPE ray_vllm_{fam}_total counter" in body:
            continue  # OpenCensus' deprecated bare twin of a counter
        out["vllm:" + fam] = typ
    return out


@pytest.mark.parametrize(
    ("name", "meta"), [("ray_vllm_default.prom", VLLM_META), ("ray_vllm_ocdefault.prom", OC_META)]
)
def test_vllm_actor_is_one_engine_under_vllm_names(name: str, meta: dict[str, Any]) -> None:
    body = fixture_text(name)
    wid = meta["identity"]["worker_id"]
    kept, _, dropped = RaySource(RayIdentity(worker_ids={wid})).filter(parse(body))
    assert list(kept) == [f"{wid[:8]}-0"] and dropped == 0
    lay = kept[f"{wid[:8]}-0"].layout
    have = (
        {c.name: "counter" for c in lay.counters}
        | {g.name: "gauge" for g in lay.gauges}
        | {h.name: "histogram" for h in lay.histograms}
        | {f: "gauge" for f in lay.info}
    )
    want = _vllm_families(body)
    assert len(want) >= 25
    assert have == want
    assert "vllm:cache_config_info" in lay.info  # the piece without model_name joined
    snap = kept[f"{wid[:8]}-0"]
    # counted once, also where OpenCensus writes the bare gauge twin next to `_total`
    assert snap["vllm:generation_tokens_total"] == meta["load"]["total_out"] == 640
    assert snap["vllm:prompt_tokens_total"] == sample_value(
        body, r"^ray_vllm_prompt_tokens_total\{"
    )


def test_opencensus_counters_lack_worker_id_and_model_name_fallback_works() -> None:
    body = fixture_text("ray_vllm_ocdefault.prom")
    gen = r"^ray_vllm_generation_tokens(_total)?\{"
    assert "WorkerId" not in next(ln for ln in body.splitlines() if re.match(gen, ln))
    kept, _, dropped = RaySource(RayIdentity(model_names={"tiny-llama"})).filter(parse(body))
    assert len(kept) == 1 and dropped == 0
    (snap,) = kept.values()
    assert snap["vllm:generation_tokens_total"] == 640
    assert snap["vllm:num_requests_running"] == 0
    assert snap["vllm:time_to_first_token_seconds_count"] == sample_value(
        body, r"^ray_vllm_time_to_first_token_seconds_count\{"
    )
    assert [c.name for c in snap.layout.counters].count("vllm:generation_tokens") == 1
    kept, _, dropped = RaySource(RayIdentity(model_names={"another"})).filter(parse(body))
    assert len(kept) == 0 and dropped == 1


async def test_vllm_two_polls_through_collector() -> None:
    wid = VLLM_META["identity"]["worker_id"]
    src = RaySource(
        RayIdentity(worker_ids={wid}, roles={wid: "decode"}),
        nodes=lambda: [VLLM_META["node"]],
        http=FakeAgents(
            fixture_text("ray_vllm_default_midload.prom"), fixture_text("ray_vllm_default.prom")
        ),
    )
    _, view = await polls(src, 2)
    k = view.keys
    assert k["inference/agg/engines_reporting"] == 1
    assert k["inference/agg/e2e_request_latency_seconds/delta"] == 18  # 2 -> 20 requests
    assert k["inference/decode/e2e_request_latency_seconds/delta"] == 18
    assert k["inference/agg/kv_cache_capacity_tokens/sum"] > 0  # from cache_config_info
    (eng,) = view.engines.values()
    assert (
        eng.role == "decode"
        and eng.kv_capacity_tokens == k["inference/agg/kv_cache_capacity_tokens/sum"]
    )


def test_pieces_merge_into_one_stable_layout() -> None:
    body = fixture_text("ray_vllm_default.prom")
    wid = VLLM_META["identity"]["worker_id"]
    src = RaySource(RayIdentity(worker_ids={wid}))
    parser = Parser(identity_labels=RAY_AGENT_IDENTITY)
    a, _, _ = src.filter(parser.parse(body))
    b, _, _ = src.filter(parser.parse(body))
    assert a[f"{wid[:8]}-0"].layout is b[f"{wid[:8]}-0"].layout  # deltas stay on the fast path


# --------------------------------------------------------------------------- never silent


async def test_filtering_everything_away_warns(caplog: pytest.LogCaptureFixture) -> None:
    src = source(RayIdentity(worker_ids={"f" * 56}), fixture_text("ray_default.prom"))
    with caplog.at_level(logging.WARNING, logger="fleetscope"):
        results = await src.scrape()
    assert results[0].exposition is not None
    assert [r.ok for r in results] == [True] and len(results[0].exposition) == 0
    assert src.foreign_engines == 4 and src.missing == {"f" * 56}
    assert any("identity filter removed everything" in r.getMessage() for r in caplog.records)


async def test_no_vllm_metrics_at_all_warns_after_a_few_polls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = drop_lines(fixture_text("ray_default.prom"), r"^ray_vllm_")
    src = source(RayIdentity(worker_ids={OWN0}), body)
    with caplog.at_level(logging.WARNING, logger="fleetscope"):
        for _ in range(3):
            await src.scrape()
    assert any("without any vLLM metric" in r.getMessage() for r in caplog.records)


async def test_opencensus_without_usable_identity_warns(caplog: pytest.LogCaptureFixture) -> None:
    # WorkerId-less counters and gauges that no engine's histograms (with WorkerId) explain:
    # a worker-id identity cannot match them, and says so
    body = drop_lines(fixture_text("ray_vllm_ocdefault.prom"), r"^ray_vllm_.*WorkerId=")
    src = source(RayIdentity(worker_ids={OC_META["identity"]["worker_id"]}), body)
    with caplog.at_level(logging.WARNING, logger="fleetscope"):
        await src.scrape()
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "carry no WorkerId" in msgs and "identity filter removed everything" in msgs


def _boom() -> RayIdentity:
    raise RuntimeError("GCS unreachable")


def _slow() -> RayIdentity:
    time.sleep(0.8)
    return RayIdentity(worker_ids={OWN0})


@pytest.mark.parametrize(
    ("lookup", "why"),
    [
        (_boom, "RuntimeError: GCS unreachable"),
        (_slow, "timed out after 0.3 s"),
        (RayIdentity, "no worker ids"),
    ],
)
async def test_identity_lookup_failure_disables_only_the_source(
    caplog: pytest.LogCaptureFixture, lookup: Callable[[], RayIdentity], why: str
) -> None:
    src = source(None, fixture_text("ray_default.prom"), identity_lookup=lookup, lookup_timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="fleetscope"):
        t0 = time.monotonic()
        v1, v2 = await polls(src, 2)
        assert time.monotonic() - t0 < 1.5
    assert why in (src.disabled or "")
    assert v1.engines == {} and v2.step == v1.step + 1
    assert v2.keys["inference/agg/engines_reporting"] == 0
    disabled = [r for r in caplog.records if "Ray metrics disabled" in r.getMessage()]
    assert len(disabled) == 1 and disabled[0].levelno == logging.WARNING
    assert isinstance(src.http, FakeAgents)
    assert src.http.fetched == []  # nothing scraped without an identity


async def test_identity_lookup_success_runs_once() -> None:
    calls: list[int] = []

    def lookup() -> RayIdentity:
        calls.append(1)
        return RayIdentity(worker_ids={OWN0, OWN1})

    src = source(None, fixture_text("ray_default.prom"), identity_lookup=lookup)
    assert len(await src.scrape()) == 1
    results = await src.scrape()
    assert results[0].exposition is not None
    assert calls == [1] and len(results[0].exposition) == 2


# --------------------------------------------------------------------------- pieces


def test_discover_agents() -> None:
    dead = dict(NODE, NodeID="00" * 28, Alive=False, alive=False)
    v6 = dict(NODE, NodeID="ff" * 28, NodeManagerAddress="fd00::2")
    eps = discover_agents([v6, dead, NODE])
    assert [e.name for e in eps] == [NODE_NAME, "node-ffffffff"]
    assert eps[0].metrics_url == f"http://192.0.2.2:{NODE['MetricsExportPort']}/metrics"
    assert eps[1].url == f"http://[fd00::2]:{NODE['MetricsExportPort']}"


def test_decode_label() -> None:
    w = OWN0
    assert decode_label(f"{w}/tiny-llama/0") == AgentEngine("", w, "tiny-llama", "0")
    assert decode_label(f"rep1/{w}/Qwen/Qwen2.5-0.5B/1") == AgentEngine(
        "rep1", w, "Qwen/Qwen2.5-0.5B", "1"
    )
    assert decode_label(f"{w}/0") == AgentEngine("", w, "", "0")  # cache_config_info
    # without WorkerId: a model name with "/" stays whole; a known replica id is split off
    ident = RayIdentity(replica_ids={"rep1"}, model_names={"Qwen/Qwen2.5-0.5B"})
    assert decode_label("Qwen/Qwen2.5-0.5B/0", ident) == AgentEngine(
        "", "", "Qwen/Qwen2.5-0.5B", "0"
    )
    assert decode_label("rep1/Qwen/Qwen2.5-0.5B/0", ident).replica_id == "rep1"
    assert decode_label("rep9/Qwen/Qwen2.5-0.5B/0", ident) == AgentEngine(
        "rep9", "", "Qwen/Qwen2.5-0.5B", "0"
    )


def test_labels_are_safe_engine_ids() -> None:
    """A model-name identity must not put "." or "/" in engine ids (the collector splits
    `{endpoint}.{label}` at the last "."; keys are "/" paths)."""
    body = fixture_text("ray_vllm_ocdefault.prom").replace("tiny-llama", "org/model-1.5B")
    body = re.sub(r'WorkerId="[0-9a-f]+",', "", body)  # the whole engine without WorkerId
    kept, _, _ = RaySource(RayIdentity(model_names={"org/model-1.5B"})).filter(parse(body))
    (label,) = kept
    assert "." not in label and "/" not in label and label.endswith("-0")


async def test_a_steady_foreign_count_after_a_dead_first_poll_is_no_restart() -> None:
    """Re-lookups are for restarts: own ids missing, or *new* foreign engines. Foreign engines
    that were there all along are not new, even when the agents did not answer the first
    poll (nothing was counted then, not zero)."""
    calls: list[int] = []

    def lookup() -> RayIdentity:
        calls.append(1)
        return RayIdentity(worker_ids={OWN0, OWN1})

    class FirstPollDead(FakeAgents):
        async def _fetch(self, ep: Endpoint) -> Response:
            if not self.fetched:
                self.fetched.append(ep.metrics_url)
                raise httpx.ConnectError("agent not up yet")
            return await super()._fetch(ep)

    body = fixture_text("ray_default.prom")
    src = RaySource(
        None,
        nodes=lambda: [NODE],
        http=FirstPollDead(body),
        identity_lookup=lookup,
        relookup_after=1,
    )
    first = await src.scrape()
    assert not first[0].ok
    for _ in range(3):
        results = await src.scrape()
        assert results[0].exposition is not None
        assert results[0].ok and len(results[0].exposition) == 2
    assert src.foreign_engines > 0 and src.missing == set()
    assert calls == [1]  # the first lookup only


# --------------------------------------------------------------------------- bad data (Ray)

_WID_RX = re.compile(r'WorkerId="[0-9a-f]*",?')


def _value(snap: EngineSnapshot, name: str) -> float:
    v = snap.value(name)
    assert v is not None, name
    return v


def _strip_worker_id(line: str) -> str:
    return _WID_RX.sub("", line).replace(",}", "}")


def _replicas_body(workers: dict[str, str | None], kv: dict[str, float]) -> str:
    """ray_vllm_default.prom as two Serve replicas whose samples carry no `engine` tag: each
    replica's vLLM lines with its ReplicaId, its WorkerId (None: none, as with OpenCensus)."""
    lines = fixture_text("ray_vllm_default.prom").split("\n")
    vllm = [ln for ln in lines if ln.startswith("ray_vllm_")]
    out = [ln for ln in lines if not ln.startswith("ray_vllm_") and ln]
    for rid, wid in workers.items():
        for ln in vllm:
            ln = ln.replace('ReplicaId=""', f'ReplicaId="{rid}"')
            ln = re.sub(r',?engine="0"', "", ln).replace("{,", "{")
            ln = _strip_worker_id(ln) if wid is None else _WID_RX.sub(f'WorkerId="{wid}",', ln)
            if ln.startswith("ray_vllm_kv_cache_usage_perc{"):
                ln = f"{ln.rpartition(' ')[0]} {kv[rid]}"
            out.append(ln)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    "workers",
    [{"r1": "a" * 56, "r2": "b" * 56}, {"r1": None, "r2": None}],
    ids=["worker-ids", "no-worker-ids"],
)
def test_replicas_without_an_engine_tag_stay_separate_engines(
    workers: dict[str, str | None],
) -> None:
    """Distinct ReplicaIds whose samples have no `engine` tag were one engine (KV usage
    summed: 0.9); each replica is its own engine."""
    body = _replicas_body(workers, {"r1": 0.25, "r2": 0.65})
    ident = (
        RayIdentity(worker_ids={w for w in workers.values() if w})
        if all(workers.values())
        else RayIdentity(replica_ids=set(workers))
    )
    kept, _, dropped = RaySource(ident).filter(parse(body))
    assert dropped == 0 and len(kept) == 2
    assert sorted(_value(s, "vllm:kv_cache_usage_perc") for s in kept.values()) == [0.25, 0.65]
    gen = sample_value(
        fixture_text("ray_vllm_default.prom"), r"^ray_vllm_generation_tokens_total\{"
    )
    assert [s.value("vllm:generation_tokens_total") for s in kept.values()] == [gen, gen]
    # one replica's identity keeps only it, and the other counts as one foreign engine
    one = (
        RayIdentity(worker_ids={workers["r1"]})
        if workers["r1"]
        else RayIdentity(replica_ids={"r1"})
    )
    kept, _, dropped = RaySource(one).filter(parse(body))
    assert [s.value("vllm:kv_cache_usage_perc") for s in kept.values()] == [0.25]
    assert dropped == 1


def _opencensus_default(body: str) -> str:
    """``body`` as the OpenCensus backend in its default cardinality writes it: counters and
    gauges lose WorkerId (same-tag series of several workers summed), histograms keep it."""
    hist = set(re.findall(r"^# TYPE (\S+) histogram$", body, re.M))
    out: list[str] = []
    summed: dict[str, int] = {}
    for ln in body.split("\n"):
        name = re.match(r"[\w:]+", ln)
        if not ln.startswith("ray_vllm_") or not name:
            out.append(ln)
            continue
        fam = re.sub(r"_(bucket|count|sum)$", "", name.group(0))
        if fam in hist:
            out.append(ln)
            continue
        head, _, v = _strip_worker_id(ln).rpartition(" ")
        if head in summed:
            i = summed[head]
            out[i] = f"{head} {float(out[i].rpartition(' ')[2]) + float(v)}"
        else:
            summed[head] = len(out)
            out.append(f"{head} {v}")
    return "\n".join(out)


def test_opencensus_foreign_engines_are_counted_once() -> None:
    """The OpenCensus case of ray_default: the truth (ray_default_meta.json) is 4 actors, 2 of
    them the run's own, so 2 foreign. The WorkerId-less piece that own0 and its twin share
    (Ray summed them) is not a third foreign engine."""
    body = _opencensus_default(fixture_text("ray_default.prom"))
    truth = {n for n in META["identities"]} - {"own0", "own1"}
    kept, _, dropped = RaySource(RayIdentity(worker_ids={OWN0, OWN1})).filter(parse(body))
    assert dropped == len(truth) == 2
    assert sorted(kept) == sorted([f"{OWN0[:8]}-0", f"{OWN1[:8]}-1"])
