"""``fleetscope inspect PREV CUR --interval S --json`` on the real captures.

The true values are computed here from the two bodies' text: token deltas, the prefix-cache
hit rate, and p50/p90/p99 by the independent PromQL reference on the bucket deltas.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetscope import cli
from support.bodies import bucket_values, sample_value
from support.loopback import LoopbackServer, Reply, Request
from support.paths import VLLM_DIR, fixture_text
from support.promql import promql_bucket_quantile

LOAD_PATH = VLLM_DIR / "single_load.prom"
AFTER_PATH = VLLM_DIR / "single_after.prom"
LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
INTERVAL = 10.0
HISTOGRAMS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prompt_tokens",
    "iteration_tokens_total",
)


def truth() -> dict[str, float]:
    def d(family: str) -> float:
        pat = rf"^vllm:{family}\{{engine=\"0\""
        return sample_value(AFTER, pat) - sample_value(LOAD, pat)

    out = {
        "prompt": d("prompt_tokens_total"),
        "generation": d("generation_tokens_total"),
        "hits": d("prefix_cache_hits_total"),
        "queries": d("prefix_cache_queries_total"),
    }
    for h in HISTOGRAMS:
        a = bucket_values(LOAD, f"vllm:{h}")
        b = bucket_values(AFTER, f"vllm:{h}")
        deltas = [(le, cb - ca) for (le, ca), (_, cb) in zip(a, b, strict=True)]
        for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            out[f"{h}/{label}"] = promql_bucket_quantile(q, deltas)
        out[f"{h}/count"] = d(f"{h}_count")
        out[f"{h}/sum"] = d(f"{h}_sum")
    return out


def run_inspect(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, float]:
    rc = cli.main(
        ["inspect", str(LOAD_PATH), str(AFTER_PATH), "--interval", str(INTERVAL), "--json", *extra]
    )
    out = capsys.readouterr().out
    assert rc == 0
    keys: dict[str, float] = json.loads(out)
    return keys


def test_inspect_single_load_to_after_gives_the_true_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = run_inspect(capsys)
    t = truth()
    assert t["generation"] == 1998 - 25 and t["prompt"] == 15472 - 2550  # sanity of the text
    agg, eng = "inference/agg", "inference/server0.0"
    assert keys[f"{agg}/generation_tokens_total/delta"] == t["generation"]
    assert keys[f"{agg}/prompt_tokens_total/delta"] == t["prompt"]
    assert keys[f"{eng}/generation_tokens_total:rate"] == pytest.approx(t["generation"] / INTERVAL)
    assert keys[f"{eng}/prompt_tokens_total:rate"] == pytest.approx(t["prompt"] / INTERVAL)
    assert keys[f"{agg}/generation_tokens_total:rate/sum"] == pytest.approx(t["generation"] / 10)
    hit = t["hits"] / t["queries"]
    assert keys[f"{eng}/prefix_cache_hit_rate"] == pytest.approx(hit)
    assert keys[f"{agg}/prefix_cache_hit_rate/pooled"] == pytest.approx(hit)
    for h in HISTOGRAMS:
        for label in ("p50", "p90", "p99"):
            assert keys[f"{agg}/{h}/{label}"] == pytest.approx(t[f"{h}/{label}"], rel=1e-12), (
                h,
                label,
            )
        assert keys[f"{agg}/{h}:mean/pooled"] == pytest.approx(t[f"{h}/sum"] / t[f"{h}/count"])
        assert keys[f"{agg}/{h}:rate/sum"] == pytest.approx(t[f"{h}/count"] / INTERVAL)
    assert keys[f"{agg}/engines_reporting"] == 1.0
    assert keys[f"{agg}/engine_restarts_total"] == 0.0
    assert keys[f"{eng}/kv_cache_capacity_tokens"] == 524288.0


def test_inspect_cli_as_a_subprocess() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetscope.cli",
            "inspect",
            str(LOAD_PATH),
            str(AFTER_PATH),
            "--interval",
            "10",
            "--json",
            "--compact",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    keys = json.loads(proc.stdout)
    t = truth()
    assert keys["inference/agg/generation_tokens_total/delta"] == t["generation"]
    assert keys["inference/agg/time_to_first_token_seconds/p99"] == pytest.approx(
        t["time_to_first_token_seconds/p99"], rel=1e-12
    )


def test_inspect_dp2_idle_to_load_reports_both_engines(capsys: pytest.CaptureFixture[str]) -> None:
    keys = json.loads(
        _run(capsys, VLLM_DIR / "dp2_idle.prom", VLLM_DIR / "dp2_load.prom", "--interval", "30")
    )
    body = fixture_text("dp2_load.prom")
    for e in "01":
        gen = sample_value(body, rf'^vllm:generation_tokens_total\{{engine="{e}"')
        assert keys[f"inference/server0.{e}/generation_tokens_total:rate"] == pytest.approx(
            gen / 30
        )
    assert keys["inference/agg/engines_reporting"] == 2.0


def _run(capsys: pytest.CaptureFixture[str], prev: Path, cur: Path, *extra: str) -> str:
    rc = cli.main(["inspect", str(prev), str(cur), "--json", *extra])
    assert rc == 0
    return capsys.readouterr().out


def test_inspect_skyrl_schema_and_role(capsys: pytest.CaptureFixture[str]) -> None:
    keys = run_inspect(capsys, "--schema", "skyrl", "--role", "decode")
    t = truth()
    assert keys["vllm/generation_throughput_tok_s"] == pytest.approx(t["generation"] / INTERVAL)
    assert keys["vllm/decode/generation_throughput_tok_s"] == pytest.approx(
        t["generation"] / INTERVAL
    )
    assert keys["vllm/ttft_seconds_p90"] == pytest.approx(
        t["time_to_first_token_seconds/p90"], rel=1e-12
    )


def test_inspect_bad_input_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.prom"
    bad.write_bytes(AFTER.encode()[:-40])  # truncated
    rc = cli.main(["inspect", str(LOAD_PATH), str(bad), "--json"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "bad.prom" in err and "truncated" in err
    rc = cli.main(["inspect", str(tmp_path / "missing.prom"), str(AFTER_PATH), "--json"])
    assert rc == 2


def test_inspect_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["inspect", str(LOAD_PATH), str(AFTER_PATH), "--filter", "generation_tokens_total:rate"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "generation_tokens_total:rate" in out and "prefix_cache" not in out


# --------------------------------------------------------------------------- bounded downloads


def test_inspect_endless_body_stops_at_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """An endless body: inspect stops at the collector's cap (MAX_BODY_BYTES) and exits 2."""
    import time

    from fleetscope.exposition import MAX_BODY_BYTES

    line = b"# HELP x y\n" * 6000

    def endless(request: Request) -> Reply:
        return Reply(itertools.repeat(line), chunked=True)

    with LoopbackServer({"/metrics": endless}, protocol="HTTP/1.1") as server:
        url = server.url
        t0 = time.monotonic()
        rc = cli.main(["inspect", url, url, "--interval", "0.01", "--timeout", "60"])
        took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"exceeds the {MAX_BODY_BYTES} byte cap" in err
    assert took < 60  # stopped by the cap, not the deadline


def test_inspect_trickling_body_stops_at_the_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    """A body that never ends but never stalls long enough for a read timeout: the total
    deadline (--timeout) stops it."""
    import time

    def trickle(request: Request) -> Reply:  # a chunk every 50 ms until the server closes
        return Reply(itertools.repeat(b"# x\n"), chunked=True, interval=0.05)

    with LoopbackServer({"/metrics": trickle}, protocol="HTTP/1.1") as server:
        url = server.url
        t0 = time.monotonic()
        rc = cli.main(["inspect", url, url, "--interval", "0.01", "--timeout", "1"])
        took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "not complete after 1 s" in err
    assert took < 10
