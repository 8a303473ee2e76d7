"""Everything fleetscope knows about vLLM's and SGLang's metric families, in one place.

:data:`FAMILIES` is the table: every family of vLLM 0.32/0.33 and SGLang 0.5.23 (plus the older
names fleetscope maps), with its type, unit, labels, the labels kept as breakdowns, and the
vLLM 0.32 name it maps to. The parser's renames (:func:`canonical_family`), the per-family
breakdowns, which labels name an engine, Ray's rewriting, the families the collector reads for
admission control and role discovery, the derived ratios and how per-engine metric names are
formed are all read from here. The parser, the statistics, the view, the health checks, the
keys, the terminal and both dashboards read these tables and the metric-name constants below
(the Grafana dashboard also checks every name it queries against the table, and takes SGLang's
names from its mapping: :func:`native_name`). The simulator keeps its own family definitions,
tested row by row against this table. docs/sglang.md explains the SGLang rows (what each gauge
measures, tp/dp handling, what is not mapped and why).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

Labels = tuple[tuple[str, str], ...]

# --------------------------------------------------------------------------- the family table

#: label roles (:meth:`Family.label_roles`)
IDENTITY, RANK, BREAKDOWN, SUMMED = "identity", "rank", "breakdown", "summed"


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as an engine exposes it.

    ``name``: the exposed base name (counters without ``_total``). ``canonical``: the vLLM 0.32
    name it is parsed as (None: kept under its own name). ``rename``: an older name of the
    canonical family; dropped when the body also has the canonical one (vLLM renames, SGLang
    0.5.x renames). ``fallback``: like ``rename``, but when the canonical family is present this
    one is kept under its own name (``sglang:token_usage``, superseded by ``full_token_usage``).
    ``first``/``last``: the first/last version known to define it (None: not checked).
    ``labels``: its labels, space separated; ``breakdown``: those kept apart per engine (the
    others are identity, repeated ranks counted once, or summed: :meth:`label_roles`).
    ``role_evidence``: what the family tells of the engine's role: ``decode: ...`` (its presence
    marks a decode server), ``label L: ...`` (label ``L`` names the role).
    ``evidence``: where the mapping or the role comes from.
    """

    name: str
    engine: str  # "vllm" | "sglang"
    type: str  # counter | gauge | histogram | summary
    unit: str
    canonical: str | None = None
    rename: bool = False
    fallback: bool = False
    deprecated: bool = False
    first: str | None = None
    last: str | None = None
    labels: str = ""
    breakdown: str = ""
    role_evidence: str = ""  # what this family says of the engine's role (see roles below)
    evidence: str = ""

    @property
    def parsed_name(self) -> str:
        """The family name the parser files its samples under."""
        return self.canonical or self.name

    def label_roles(self) -> dict[str, str]:
        """label -> identity | rank (repeats counted once) | breakdown | summed."""
        kept = set(self.breakdown.split())
        ident = VLLM_IDENTITY_LABELS if self.engine == "vllm" else SGLANG_IDENTITY_LABELS
        out = {}
        for label in self.labels.split():
            if label in ident:
                out[label] = IDENTITY
            elif self.engine == "sglang" and label in SGLANG_RANK_LABELS:
                out[label] = RANK
            elif label in kept:
                out[label] = BREAKDOWN
            else:
                out[label] = SUMMED
        return out


def _load_families() -> tuple[Family, ...]:
    """The family table, ``families.tsv`` next to this module (one row per family)."""
    text = resources.files("fleetscope").joinpath("families.tsv").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = csv.DictReader(lines, delimiter="\t")
    out = []
    for row in rows:
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(Family):
            v = row[f.name]
            if f.type in ("bool", bool):
                kw[f.name] = v == "yes"
            elif f.name in ("canonical", "first", "last"):
                kw[f.name] = v or None
            else:
                kw[f.name] = v
        out.append(Family(**kw))
    return tuple(out)


#: every family fleetscope knows: vLLM 0.32/0.33 (tests/data/vllm-families/) and SGLang 0.5.x
#: (tests/data/sglang-0.5.23/), with the evidence for each mapping
FAMILIES: tuple[Family, ...] = _load_families()


# Labels that name an engine core. The last one is the primary: a sample without it belongs to
# the endpoint as a whole (API-server counters, process_ and http_ families).
VLLM_IDENTITY_LABELS: tuple[str, ...] = ("engine",)
RAY_IDENTITY_LABELS: tuple[str, ...] = ("ReplicaId", "WorkerId", "engine")

# Label breakdowns users need; every other non-identity label is summed per engine.
BREAKDOWN_LABELS: frozenset[str] = frozenset(
    {"finished_reason", "reason", "source", "position", "sleep_state", "quantile", "operation"}
)

# Labels that only describe where a sample came from; never a breakdown.
DESCRIPTIVE_LABELS: frozenset[str] = frozenset({"model_name"})

# Family name prefixes logged by default (everything is parsed and kept in snapshots).
DEFAULT_LOGGED_PREFIXES: tuple[str, ...] = ("vllm:", "sglang:")

# Ray's metrics agent prefixes `ray_` and turns `:` into `_`.
RAY_PREFIXES: dict[str, str] = {"ray_vllm_": "vllm:", "ray_sglang_": "sglang:"}

PROCESS_START = "process_start_time_seconds"


#: SGLang: ``dp_rank`` names an engine (a DP replica, its own scheduler); absent -> "0"
SGLANG_IDENTITY_LABELS: tuple[str, ...] = ("dp_rank",)
#: SGLang ranks of one engine: every scheduler rank of a replica writes the same series; the
#: lowest (pp_rank, tp_rank, moe_ep_rank) is kept, the others are repeats (docs/sglang.md)
SGLANG_RANK_LABELS: tuple[str, ...] = ("pp_rank", "tp_rank", "moe_ep_rank")
SGLANG_PREFIX = "sglang:"
#: SGLang's disaggregation role label -> fleetscope role (``unified`` / ``dynamic``: none)
SGLANG_ROLE_LABEL = next(  # "engine_type", from the table's role evidence
    f.role_evidence.split()[1].rstrip(":")
    for f in FAMILIES
    if f.engine == "sglang" and f.role_evidence.startswith("label ")
)
SGLANG_ROLES: dict[str, Literal["prefill", "decode"]] = {"prefill": "prefill", "decode": "decode"}
#: labels of SGLang's radix-cache and storage collectors, whose ``dp_rank`` is 0 on every DP
#: replica unless DP attention is on (``radix_cache_metric_labels``): in a body with several
#: DP replicas, such a family with only ``dp_rank="0"`` is the sum of all replicas (endpoint)
SGLANG_SHARED_DP_LABELS: frozenset[str] = frozenset({"cache_type", "storage_backend"})

FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
#: every vLLM family name (base names, without ``_total``): another engine's family whose
#: name without its prefix is one of these keeps its prefix in keys unless it is mapped
VLLM_FAMILY_NAMES: frozenset[str] = frozenset(
    f.name.removesuffix("_total") for f in FAMILIES if f.engine == "vllm"
)
# Family base name -> the vLLM 0.32 name it is parsed as (renames and SGLang equivalents).
RENAMES: dict[str, str] = {
    f.name: f.canonical for f in FAMILIES if f.canonical is not None and f.canonical != f.name
}
# older names: dropped when the body also has the canonical family ...
SUPERSEDED: frozenset[str] = frozenset(f.name for f in FAMILIES if f.rename or f.fallback)
# ... except these, which are then kept under their own name
KEEP_OWN_NAME: frozenset[str] = frozenset(f.name for f in FAMILIES if f.fallback)
# per-family breakdowns (parsed name -> labels kept apart) where the global rule does not
# apply: SGLang's own families and vLLM's deprecated ``transfer_type`` families
FAMILY_BREAKDOWNS: dict[str, frozenset[str]] = {
    f.parsed_name: BREAKDOWN_LABELS | frozenset(f.breakdown.split())
    for f in FAMILIES
    if (f.engine == "sglang" and f.canonical is None) or f.deprecated
}


def canonical_family(name: str) -> tuple[str, bool]:
    """Map a family base name to the name it is parsed as. Returns (name, superseded): a
    superseded name's samples give way to the canonical family's when both are present."""
    for ray_prefix, prefix in RAY_PREFIXES.items():
        if name.startswith(ray_prefix):
            name = prefix + name[len(ray_prefix) :]
            break
    renamed = RENAMES.get(name)
    if renamed is not None:
        return renamed, name in SUPERSEDED
    return name, False


_KIND_PREFIXES = {p: p[:-1] for p in RAY_PREFIXES.values()} | {
    ray: mapped[:-1] for ray, mapped in RAY_PREFIXES.items()
}  # "vllm:" -> "vllm", "ray_sglang_" -> "sglang", ...


def engine_kind(families: Iterable[str]) -> str | None:
    """``"vllm"`` or ``"sglang"`` from a body's declared family names, Ray's prefixes too
    (None: neither). SGLang bodies never carry ``vllm:`` families; a Ray body mixing both is
    called SGLang."""
    seen: set[str] = set()
    for name in families:
        for prefix, kind in _KIND_PREFIXES.items():
            if name.startswith(prefix):
                seen.add(kind)
                break
        if "sglang" in seen:
            return "sglang"
    return "vllm" if "vllm" in seen else None


# ----------------------------------------------------------------- families the code reads

#: vLLM's KV-consumer gauge: present on servers that fetch KV from a prefill server (decode)
KV_CONSUMER_FAMILY = next(
    f.name for f in FAMILIES if f.engine == "vllm" and f.role_evidence.startswith("decode:")
)
#: preemptions counter family (base name, without ``_total``)
PREEMPTIONS_FAMILY = "vllm:num_preemptions"
#: the waiting-queue gauge broken down by reason; prime-rl names its children
#: ``num_requests_waiting_reason_{reason}``
WAITING_BY_REASON_FAMILY = "vllm:num_requests_waiting_by_reason"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: vLLM's engine-less operation histograms (RL weight updates, sleep mode; per ``operation``)
#: -> their in-flight gauges: keyed per endpoint (fleetscope.rl.operations)
RL_OPERATIONS = "vllm:rl_weight_update_operation_duration_seconds"
#: vLLM's sleep state per engine (``sleep_state`` = awake / weights_offloaded / discard_all)
SLEEP_STATE_FAMILY = "vllm:engine_sleep_state"
#: SGLang's own count of the seconds its scheduler had nothing runnable or queued (per engine)
SCHEDULER_IDLE_FAMILY = "sglang:scheduler_idle_seconds"
OPERATION_FAMILIES: dict[str, str] = {
    RL_OPERATIONS: "vllm:rl_weight_update_operations_in_flight",
    "vllm:sleep_mode_operation_duration_seconds": "vllm:sleep_mode_operations_in_flight",
}

# metric names (after the ``vllm:`` prefix is stripped) the view, health, the terminal and the
# dashboards read; an SGLang engine's equivalents are parsed under these names too
KV_USAGE = "kv_cache_usage_perc"
RUNNING = "num_requests_running"
WAITING = "num_requests_waiting"
WAITING_FOR_CAPACITY = "num_requests_waiting_reason_capacity"
GENERATION_TOKENS = "generation_tokens_total"
PROMPT_TOKENS = "prompt_tokens_total"
PREEMPTIONS = "num_preemptions_total"
REQUEST_SUCCESS = "request_success_total"
GENERATION_RATE = GENERATION_TOKENS + ":rate"
PROMPT_RATE = PROMPT_TOKENS + ":rate"
PREEMPTION_RATE = PREEMPTIONS + ":rate"
KV_CAPACITY_TOKENS = "kv_cache_capacity_tokens"
#: tokens/s an engine decodes, counted as they are generated: SGLang counts its
#: ``generation_tokens_total`` when a request finishes (tokenizer side; one counter per server
#: with DP > 1), its scheduler counts ``realtime_tokens_total{mode="decode"}`` per engine per
#: log interval; vLLM's generation counter is per engine and per step. First present wins.
DECODE_RATES: tuple[str, ...] = ("realtime_tokens_total{mode=decode}:rate", GENERATION_RATE)
PREFIX_HIT_RATE = "prefix_cache_hit_rate"
LENGTH_SHARE = "length_finished_share"
TTFT = "time_to_first_token_seconds"
TPOT = "request_time_per_output_token_seconds"
ITL = "inter_token_latency_seconds"
E2E = "e2e_request_latency_seconds"
#: the seconds each finished request spent running (prefill + decode), per engine
INFERENCE_TIME = "request_inference_time_seconds"

_SERIES_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")


def family_of_series(name: str) -> Family | None:
    """The catalog's family of an exposed series name (``vllm:x_total``, ``sglang:y_bucket``)."""
    family = FAMILY_BY_NAME.get(name)
    if family is not None:
        return family
    for suffix in _SERIES_SUFFIXES:
        if name.endswith(suffix):
            family = FAMILY_BY_NAME.get(name[: -len(suffix)])
            if family is not None:
                return family
    return None


def native_name(canonical: str, engine: str) -> str:
    """The current family ``engine`` exposes for the vLLM family ``canonical`` (both with their
    prefixes): ``native_name("vllm:num_requests_running", "sglang")`` is
    ``"sglang:num_running_reqs"``. Raises ``KeyError`` when the engine has no equivalent."""
    for family in FAMILIES:
        if family.engine != engine or family.rename or family.fallback:
            continue
        if family.parsed_name == canonical:
            return family.name
    raise KeyError(f"{engine} has no family for {canonical}")


def gauge_metric_name(family_metric: str, labels: Labels) -> str:
    """The per-engine metric name of one gauge child (``family_metric`` has no prefix)."""
    if "vllm:" + family_metric == WAITING_BY_REASON_FAMILY:
        return f"num_requests_waiting_reason_{dict(labels).get('reason', 'unknown')}"
    return family_metric + label_suffix(labels)


def label_suffix(labels: Labels) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else ""


# --------------------------------------------------------------------------- derived metrics


@dataclass(frozen=True, slots=True)
class RatioSpec:
    """A derived ratio: offset + scale * Δnumerator / Δdenominator (both sums of counters)."""

    name: str
    numerator: tuple[str, Mapping[str, str] | None]  # (family metric name, label filter)
    denominator: tuple[str, Mapping[str, str] | None]
    scale: float = 1.0
    offset: float = 0.0
    per_label: str | None = None  # one ratio per value of this numerator label
    numerator_plus: tuple[str, ...] = ()  # families added to the numerator (unfiltered)


RATIOS: tuple[RatioSpec, ...] = (
    RatioSpec("prefix_cache_hit_rate", ("prefix_cache_hits", None), ("prefix_cache_queries", None)),
    # SGLang: prompt tokens served from a cache (device, host, storage) over prompt tokens, of
    # finished requests (tokenizer side); no engine has both, so vLLM and SGLang pool together
    RatioSpec("prefix_cache_hit_rate", ("cached_tokens", None), ("prompt_tokens", None)),
    RatioSpec(
        "external_prefix_cache_hit_rate",
        ("external_prefix_cache_hits", None),
        ("external_prefix_cache_queries", None),
    ),
    RatioSpec("mm_cache_hit_rate", ("mm_cache_hits", None), ("mm_cache_queries", None)),
    RatioSpec(
        "preemptions_per_million_output_tokens",
        ("num_preemptions", None),
        ("generation_tokens", None),
        scale=1e6,
    ),
    RatioSpec(
        "length_finished_share",
        ("request_success", {"finished_reason": "length"}),
        ("request_success", None),
    ),
    RatioSpec(
        "spec_decode_acceptance_rate",
        ("spec_decode_num_accepted_tokens", None),
        ("spec_decode_num_draft_tokens", None),
    ),
    # tokens per verification step, the bonus token included. vLLM: 1 + accepted / drafts,
    # written (drafts + accepted) / drafts so that it pools with SGLang's own definition,
    # completion tokens / verify steps (its per-request spec_accept_length; both counters
    # counted when a request finishes); no engine has both
    RatioSpec(
        "spec_decode_mean_acceptance_length",
        ("spec_decode_num_accepted_tokens", None),
        ("spec_decode_num_drafts", None),
        numerator_plus=("spec_decode_num_drafts",),
    ),
    RatioSpec(
        "spec_decode_mean_acceptance_length",
        ("generation_tokens", None),
        ("spec_verify_calls", None),
    ),
    RatioSpec(
        "spec_decode_acceptance_rate_per_position",
        ("spec_decode_num_accepted_tokens_per_pos", None),
        ("spec_decode_num_drafts", None),
        per_label="position",
    ),
)


def ratio_offset(metric: str) -> float:
    """The constant a pooled ratio adds (a per-label ratio shares its spec's offset)."""
    base = metric.split("{", 1)[0]
    for spec in RATIOS:
        if spec.name == base:
            return spec.offset
    return 0.0


#: engine-imbalance metrics: also get `cv` (population std / mean across engines)
SPREAD_METRICS: frozenset[str] = frozenset(
    {RUNNING, WAITING, KV_USAGE, PROMPT_RATE, GENERATION_RATE}
)
#: metrics a prefill engine keeps at ~0 by design: in a scope mixing roles, their tails and
#: averages come from the other engines (the sum still covers every engine)
DECODE_ONLY_METRICS: frozenset[str] = frozenset(
    {GENERATION_RATE, "inter_token_latency_seconds:mean"}
)


def kv_capacity_tokens(info: Mapping[str, Mapping[str, str]]) -> float | None:
    """KV cache capacity in tokens: ``kv_cache_size_tokens``, else blocks x block size."""
    import math

    cfg = info.get(CACHE_CONFIG_INFO)
    if not cfg:
        return None

    def num(key: str) -> float | None:
        try:
            v = float(cfg.get(key, "nan"))
        except ValueError:
            return None
        return v if math.isfinite(v) else None

    size = num("kv_cache_size_tokens")
    if size is not None:
        return size
    blocks, block = num("num_gpu_blocks"), num("block_size")
    if blocks is not None and block is not None:
        return blocks * block
    return None


# ------------------------------------------------------------------ versions and bucket bounds

#: the versions the table was checked against (tests/data), oldest first; rules target the last
CHECKED_VERSIONS: dict[str, tuple[str, ...]] = {"vllm": ("0.32.0", "0.33.0"), "sglang": ("0.5.23",)}


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)``: the leading numeric parts (``rc1``, ``+cu121`` dropped)."""
    out = []
    for part in version.split("+", 1)[0].split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        out += [int(part[:digits])] if digits else []
        if not digits or digits != len(part):
            break
    return tuple(out)


def in_versions(first: str | None, last: str | None, version: str) -> bool:
    """Whether ``version`` is within ``first``..``last`` (None: that end is open)."""
    v = version_tuple(version)
    return (first is None or v >= version_tuple(first)) and (
        last is None or v <= version_tuple(last)
    )


def bucket_bounds(family: str, version: str) -> tuple[float, ...] | None:
    """The finite default bucket bounds of ``family`` (base name) at ``version``, from
    ``buckets.tsv`` (the latency histograms: what an SLO threshold may be); None: not known."""
    text = resources.files("fleetscope").joinpath("buckets.tsv").read_text(encoding="utf-8")
    rows = csv.DictReader(
        [ln for ln in text.splitlines() if ln[:1] not in ("", "#")], delimiter="\t"
    )
    for r in rows:
        if r["family"] == family and in_versions(r["first"] or None, r["last"] or None, version):
            return tuple(float(b) for b in r["bounds"].split())
    return None
