"""SGLang bodies: engines by ``dp_rank``, repeated ranks counted once, roles from
``engine_type``, the same through Ray's metrics agent (``ray_sglang_*``, engines prefixed by
the Ray identity); and OpenMetrics bodies whose sample names escape ``:`` (docs/sglang.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope.catalog import (
    RAY_PREFIXES,
    SGLANG_PREFIX,
    SGLANG_RANK_LABELS,
    SGLANG_ROLE_LABEL,
    SGLANG_ROLES,
    SGLANG_SHARED_DP_LABELS,
)
from fleetscope.exposition._classify import SeriesDraft, classify
from fleetscope.exposition._syntax import Sample, parse_sample
from fleetscope.identity import Role

_ENGINE_PREFIXES = tuple(RAY_PREFIXES.values())  # "vllm:", "sglang:" (names after mapping)
RAY_SGLANG = next(k for k, v in RAY_PREFIXES.items() if v == SGLANG_PREFIX)  # "ray_sglang_"
# identity labels SGLang writes itself: not a Ray server's identity (radix-cache families have
# no model_name, yet belong to the server of the same ReplicaId / WorkerId)
_SGLANG_OWN_LABELS = frozenset({"model_name"})


def escaped_names(lines: list[str], types: dict[str, str]) -> dict[str, str] | None:
    """OpenMetrics bodies whose sample names escape ``:`` but whose TYPE lines do not.

    prometheus_client 0.26's OpenMetrics encoder writes ``# TYPE sglang:queue_time_seconds
    histogram`` followed by ``sglang_queue_time_seconds_bucket{...}`` (vLLM's ``vllm:`` names
    alike): the samples are read as the TYPE line's family (tests/data/sglang-0.5.23/README.md).
    Adds the escaped names to ``types``; returns escaped -> declared name (None: not needed).
    """
    if not lines or not lines[-1].startswith("# EOF"):
        return None
    out = {}
    for fam in list(types):
        if ":" in fam:
            esc = fam.replace(":", "_")
            if esc not in types:
                types[esc] = types[fam]
                out[esc] = fam
    return out or None


@dataclass(slots=True)
class SGLangBody:
    parsed: dict[int, tuple[Sample, SeriesDraft | None]]  # line number -> sample, draft
    engine_of_line: dict[int, str]  # line number -> engine label ("" = the endpoint)
    repeats: set[int]  # lines written by a higher rank of an engine: counted once
    roles: dict[str, Role]


# (0, rank, "") per rank label, (1, 0, text) when not a number: ordered numerically first
RankKey = tuple[tuple[int, int, str], ...]


def _rank_key(labels: dict[str, str]) -> RankKey:
    return tuple(
        (0, int(v), "") if v.isdigit() else (1, 0, v)
        for v in (labels.get(k, "") for k in SGLANG_RANK_LABELS)
    )


def _parse_lines(
    lines: list[str],
    types: dict[str, str],
    counter_bases: set[str],
    identity: tuple[str, ...],
    keep: tuple[str, ...] | None,
    escaped: dict[str, str] | None,
) -> dict[int, tuple[Sample, SeriesDraft | None]]:
    """Every sample line up to ``# EOF`` (or a blank line), parsed and classified."""
    parsed: dict[int, tuple[Sample, SeriesDraft | None]] = {}
    for i, line in enumerate(lines, 1):
        if not line or line[0] == "#":
            if line.startswith("# EOF") or line == "#EOF":
                break
            continue
        if not line.strip():
            break  # the main loop reports it
        s = parse_sample(line, i)
        parsed[i] = (s, classify(s, types, counter_bases, identity, keep, escaped))
    return parsed


_Mine = list[tuple[int, Sample, SeriesDraft, tuple[str, ...]]]  # (line, sample, draft, server)


def _replicas(
    mine: _Mine,
) -> tuple[set[tuple[str, ...]], dict[tuple[str, ...], str], set[tuple[tuple[str, ...], str]]]:
    """Per Ray server (``()`` for a native body): the servers with several DP replicas, the
    only replica of the others, and the (server, family) pairs of a server with several that
    belong to its endpoint (radix-cache / storage families with ``dp_rank`` 0 everywhere)."""
    dp_values: dict[tuple[str, ...], set[str]] = {}  # server -> its DP replicas
    shared_dp: dict[tuple[tuple[str, ...], str], set[str]] = {}  # (server, family) -> dp_ranks
    for _i, s, d, server in mine:
        dp = s.labels.get("dp_rank")
        if dp is not None and d.family.startswith(_ENGINE_PREFIXES):
            dp_values.setdefault(server, set()).add(dp)
        if not SGLANG_SHARED_DP_LABELS.isdisjoint(s.labels):
            shared_dp.setdefault((server, d.family), set()).add(dp or "")
    several = {srv for srv, dps in dp_values.items() if len(dps) > 1}
    only = {srv: next(iter(dps)) for srv, dps in dp_values.items() if len(dps) == 1}
    endpoint_families = {k for k, dps in shared_dp.items() if k[0] in several and dps <= {"0", ""}}
    return several, only, endpoint_families


def _single_roles(roles_seen: dict[str, set[str]]) -> dict[str, Role]:
    """An engine's role: its samples' one ``engine_type`` (none when they disagree)."""
    roles: dict[str, Role] = {}
    for eng, seen in roles_seen.items():
        if len(seen) == 1:
            r = SGLANG_ROLES.get(next(iter(seen)))
            if r is not None:
                roles[eng] = r
    return roles


def sglang_pass(
    lines: list[str],
    types: dict[str, str],
    counter_bases: set[str],
    identity: tuple[str, ...],
    keep: tuple[str, ...] | None,
    escaped: dict[str, str] | None,
    ray: tuple[str, ...] | None = None,
) -> SGLangBody:
    """Engines of an SGLang body (docs/sglang.md "Engines, TP and DP ranks").

    * an engine is a DP replica: its ``dp_rank`` label, "0" when the body has none;
    * every scheduler rank of one replica (``tp_rank``, ``pp_rank``, ``moe_ep_rank``) writes
      the same series (``--enable-metrics-for-all-schedulers``, and the pre-seeded counters and
      startup constants of the ranks that do not log): per family and replica, only the lowest
      rank's samples are kept;
    * samples without ``dp_rank`` (the tokenizer's TTFT, e2e, tokens, ...; process families)
      belong to the body's only replica when it has one, else to the endpoint (never split);
      so do radix-cache / storage families whose ``dp_rank`` is 0 on every replica;
    * ``engine_type="prefill"|"decode"`` of an engine's samples is its role.

    ``ray``: the identity labels of a Ray agent body (``ray_sglang_*``, docs/sglang.md
    "Through Ray"). Only its ``ray_sglang_*`` samples are SGLang's (the rest is left to the
    caller: not in ``engine_of_line``); the rules above hold per Ray server (its ``ReplicaId``
    / ``WorkerId``), and an engine label is the sample's non-empty ``ray`` values and the
    replica joined by "/" (``r1/{worker id}/0``).
    """
    parsed = _parse_lines(lines, types, counter_bases, identity, keep, escaped)
    ids = ray or ()
    server_labels = tuple(k for k in ids if k not in _SGLANG_OWN_LABELS)
    mine: _Mine = []
    for i, (s, d) in parsed.items():
        if d is not None and (ray is None or s.name.startswith(RAY_SGLANG)):
            mine.append((i, s, d, tuple(s.labels.get(k, "") for k in server_labels)))
    several, only, endpoint_families = _replicas(mine)
    engine_of_line: dict[int, str] = {}
    # (family, engine, server) -> the lowest rank
    lowest: dict[tuple[str, str, tuple[str, ...]], RankKey] = {}
    ranked: dict[int, tuple[tuple[str, str, tuple[str, ...]], RankKey]] = {}
    roles_seen: dict[str, set[str]] = {}
    for i, s, d, server in mine:
        labels = s.labels
        if (server, d.family) in endpoint_families:
            eng = ""
        elif "dp_rank" in labels:
            eng = labels["dp_rank"] or "0"
        else:
            eng = "" if server in several else only.get(server, "0")
        if eng and ids:
            eng = "/".join([*(labels[k] for k in ids if labels.get(k)), eng])
        engine_of_line[i] = eng
        if any(k in labels for k in SGLANG_RANK_LABELS):
            fam_key = (d.family, eng, server)  # the endpoint's: per Ray server too
            rk = _rank_key(labels)
            ranked[i] = (fam_key, rk)
            cur = lowest.get(fam_key)
            if cur is None or rk < cur:
                lowest[fam_key] = rk
        role = labels.get(SGLANG_ROLE_LABEL)
        if role is not None and eng:
            roles_seen.setdefault(eng, set()).add(role)
    repeats = {i for i, (fk, rk) in ranked.items() if rk != lowest[fk]}
    return SGLangBody(parsed, engine_of_line, repeats, _single_roles(roles_seen))
