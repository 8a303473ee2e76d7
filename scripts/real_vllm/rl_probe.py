"""Probe a running vLLM server's RL endpoints (pause/resume, weight version, sleep, weight
transfer) and record what they answer, what they do to in-flight generation and what
``/metrics`` shows before, during and after. Runs with the main Python (only ``httpx``):

    python scripts/real_vllm/rl_probe.py --url http://127.0.0.1:8000 --out DIR [--phases ...]

The server must run with ``VLLM_SERVER_DEV_MODE=1`` (the RL and sleep routes exist only then);
``--enable-scale-out`` adds ``/inference/v1/generate``, whose answers carry ``weight_versions``
(the probe falls back to ``/v1/completions`` when it answers 403). Phases (default:
``basics pause version sleep transfer``):

``basics``   read-only endpoints (``/is_paused``, ``/is_sleeping``, ``/weight_info``, ...)
``pause``    ``/pause`` in each mode (default=abort, wait, keep, a legacy query parameter,
             ``clear_cache=false``, an invalid mode) with long generations in flight and
             short ones sent during the pause; ``/resume``; pausing twice, resuming twice
``pause_short`` only the default and keep rounds of ``pause``
``version``  ``/update_weight_version`` (during a keep-pause that splits generations across
             two versions, and outside a pause), bad bodies, ``/weight_info``
``sleep``    ``/sleep`` levels 0, 1, 2 (and level 1 with ``mode=wait``) with a generation in
             flight, ``/wake_up`` (and ``tags=scheduling``), ``/release_kv_cache_memory``
``transfer`` the weight-transfer endpoints as an RL trainer calls them (they fail with
             HTTP 500 unless the server has ``--weight-transfer-config``)
``ipc``      a full transfer cycle for ``--weight-transfer-config '{"backend":"ipc"}'``
             (init, start, an empty update chunk, finish with a version, the error paths)
``ipc_fail`` (destructive, run it last) a chunk that fails in the worker mid-update, then
             finish, resume and generate: on vLLM 0.32 CPU this kills the engine

It writes into DIR: ``calls.json`` (every HTTP call: method, path, query, body, status,
response, start time from the probe's start, UTC wall time, duration), ``load.json`` (every
generation request: kind, max_tokens, start/first-token/end times, status, finish reason,
tokens, weight_versions; for streams the largest gap between chunks), ``NN_<label>.prom``
(raw ``/metrics`` bodies of the KEEP_BODIES snapshots, or all with ``--save-all``) and
``summary.json`` (per snapshot: the RL/sleep/pause-related family types, the selected series
and their change from the previous snapshot).
Every call is bounded in time; traffic goes only to the given URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

PHASES = ("basics", "pause", "pause_short", "version", "sleep", "transfer", "ipc", "ipc_fail")
DEFAULT_PHASES = ("basics", "pause", "version", "sleep", "transfer")
LONG = 500  # tokens of a long generation (--max-model-len 512, a 4-token prompt)
MIN_CHUNKS = 20  # a long stream counts as in flight once it has this many chunks
SHORT = 8
PROMPT = "the fleet engine"
PROMPT_IDS = [1, 50, 60, 70]  # for /inference/v1/generate

# the series the summary keeps (and diffs) from every /metrics snapshot
SELECTED = re.compile(
    r"^vllm:(rl_weight_update_\w+|sleep_mode_\w+|engine_sleep_state|num_requests_running"
    r"|num_requests_waiting|num_requests_waiting_by_reason|request_success_total"
    r"|generation_tokens_total|prompt_tokens_total|prefix_cache_queries_total"
    r"|prefix_cache_hits_total|num_preemptions_total|admission_rejections_total"
    r"|lora_requests_info|e2e_request_latency_seconds_count|request_queue_time_seconds_count"
    r"|request_queue_time_seconds_sum)(\{.*\})?$"
)
# the snapshots whose raw bodies are written by default (--save-all writes every one)
KEEP_BODIES = {
    "before",
    "pause_default_during_pause",
    "pause_default_after_resume",
    "pause_wait_while_pause_pending",
    "pause_keep_during_pause",
    "after_update_weight_version",
    "sleep_l1_asleep",
    "sleep_l1_after_wake",
    "sleep_l1_wait_pending",
    "ipc_done",
    "ipcf_done",
    "final",
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) (\S+)(?: \S+)?$")


def parse_selected(body: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        # histogram buckets stay in the raw bodies; the summary keeps _count and _sum
        if m and SELECTED.match(m.group(1)) and "_bucket{" not in m.group(1):
            out[m.group(1)] = float(m.group(2))
    return out


def families(body: str) -> dict[str, str]:
    """``# TYPE`` of every family whose name matches RL / sleep / pause / weight / lora."""
    found = {}
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            if re.search(r"rl_|sleep|pause|weight|lora|admission", name):
                found[name] = typ
    return found


class Probe:
    def __init__(self, url: str, out: Path, model: str | None, save_all: bool = False):
        self.save_all = save_all
        self.url = url.rstrip("/")
        self.out = out
        self.model = model
        self.t0 = time.monotonic()
        self.calls: list[dict[str, Any]] = []
        self.load: list[dict[str, Any]] = []
        self.snapshots: list[dict[str, Any]] = []
        self.tasks: list[asyncio.Task[dict[str, Any]]] = []
        self.generate_ok = True  # /inference/v1/generate answers (needs --enable-scale-out)
        self.live: dict[str, dict[str, Any]] = {}  # label -> record of a running generation
        timeout = httpx.Timeout(120.0, connect=5.0)
        self.client = httpx.AsyncClient(timeout=timeout)  # generation requests, /metrics
        # control calls get a fresh connection each: after some HTTP 500 answers the server
        # closes the kept-alive connection and the next request on it fails with ReadError
        self.control = httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0)
        )

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def note(self, text: str) -> None:
        print(f"[{self.now():8.3f}] {text}", flush=True)
        self.calls.append({"note": text, "t": self.now()})

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        body: Any = None,
        label: str = "",
        watch: list[str] | None = None,
    ) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "label": label,
            "method": method,
            "path": path,
            "query": params,
            "body": body,
            "t_start": self.now(),
            "wall_utc": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        if watch:  # what the watched generations had received when this call was sent
            rec["in_flight_when_sent"] = {g: self._progress(g) for g in watch}
        t = time.monotonic()
        try:
            r = await self.control.request(
                method,
                self.url + path,
                params=params,
                json=body if body is not None else None,
            )
            rec["status"] = r.status_code
            try:
                rec["response"] = r.json()
            except ValueError:
                rec["response"] = r.text[:2000]
        except httpx.HTTPError as e:
            rec["status"] = None
            rec["response"] = f"{type(e).__name__}: {e}"
        rec["duration_s"] = round(time.monotonic() - t, 4)
        rec["t_end"] = self.now()
        if watch:
            rec["in_flight_when_answered"] = {g: self._progress(g) for g in watch}
        self.calls.append(rec)
        resp = json.dumps(rec["response"])
        print(
            f"[{rec['t_start']:8.3f}] {method} {path} {params or ''} {body if body else ''} -> "
            f"{rec['status']} {resp[:160]} ({rec['duration_s']} s)",
            flush=True,
        )
        return rec

    async def metrics(self, label: str) -> dict[str, float]:
        idx = len(self.snapshots)
        t = self.now()
        r = await self.client.get(self.url + "/metrics")
        r.raise_for_status()
        name = f"{idx:02d}_{label}.prom"
        if self.save_all or label in KEEP_BODIES:
            (self.out / name).write_text(r.text)
        else:
            name += " (not saved)"
        sel = parse_selected(r.text)
        prev = self.snapshots[-1]["selected"] if self.snapshots else {}
        delta = {
            k: round(v - prev.get(k, 0.0), 6)
            for k, v in sel.items()
            if v != prev.get(k, 0.0) and not k.endswith("_created")
        }
        gone = sorted(k for k in prev if k not in sel)
        self.snapshots.append(
            {
                "file": name,
                "label": label,
                "t": t,
                "families": families(r.text),
                "selected": sel,
                "delta_from_previous": delta,
                "series_gone": gone,
            }
        )
        self.calls.append({"metrics_snapshot": name, "t": t})
        print(f"[{t:8.3f}] /metrics -> {name} ({len(delta)} changed series)", flush=True)
        return sel

    # -- generation load -------------------------------------------------------------------

    def _progress(self, label: str) -> dict[str, Any]:
        r = self.live.get(label, {})
        return {"chunks": r.get("chunks_so_far", 0), "finished": "t_end" in r}

    async def wait_in_flight(self, labels: list[str], timeout: float = 60.0) -> None:
        """Until every watched stream has MIN_CHUNKS chunks (so it is surely running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.live.get(g, {}).get("chunks_so_far", 0) >= MIN_CHUNKS for g in labels):
                return
            await asyncio.sleep(0.005)
        self.note(f"WARNING: {labels} not all at {MIN_CHUNKS} chunks after {timeout} s")

    def gen(
        self, label: str, max_tokens: int, kind: str = "stream"
    ) -> asyncio.Task[dict[str, Any]]:
        """Start one generation request in the background; its record goes to load.json.

        kind: ``stream`` / ``plain`` (``/v1/completions``), ``generate``
        (``/inference/v1/generate``, non-streamed, returns weight_versions)."""
        task = asyncio.create_task(self._gen(label, max_tokens, kind))
        self.tasks.append(task)
        return task

    async def _gen(self, label: str, max_tokens: int, kind: str) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "label": label,
            "kind": kind,
            "max_tokens": max_tokens,
            "t_start": self.now(),
        }
        self.load.append(rec)
        self.live[label] = rec
        sampling: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        body: dict[str, Any]
        try:
            if kind == "generate":
                body = {"token_ids": PROMPT_IDS, "sampling_params": sampling, "model": self.model}
                r = await self.client.post(self.url + "/inference/v1/generate", json=body)
                rec["status"] = r.status_code
                d = r.json()
                if r.status_code == 200:
                    ch = d["choices"][0]
                    rec["finish_reason"] = ch.get("finish_reason")
                    rec["completion_tokens"] = len(ch.get("token_ids") or [])
                    rec["weight_versions"] = ch.get("weight_versions")
                else:
                    rec["error"] = d
            elif kind == "plain":
                body = {"model": self.model, "prompt": PROMPT, **sampling}
                r = await self.client.post(self.url + "/v1/completions", json=body)
                rec["status"] = r.status_code
                d = r.json()
                if r.status_code == 200:
                    rec["finish_reason"] = d["choices"][0].get("finish_reason")
                    rec["completion_tokens"] = d["usage"]["completion_tokens"]
                else:
                    rec["error"] = d
            else:
                body = {
                    "model": self.model,
                    "prompt": PROMPT,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    **sampling,
                }
                chunks = 0
                times: list[float] = []
                async with self.client.stream("POST", self.url + "/v1/completions", json=body) as r:
                    rec["status"] = r.status_code
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        d = json.loads(line[6:])
                        if d.get("usage"):
                            rec["completion_tokens"] = d["usage"]["completion_tokens"]
                        for ch in d.get("choices", []):
                            chunks += 1
                            rec["chunks_so_far"] = chunks
                            times.append(self.now())
                            if ch.get("finish_reason"):
                                rec["finish_reason"] = ch["finish_reason"]
                        if "error" in d:
                            rec["error"] = d["error"]
                rec["chunks"] = chunks
                if times:
                    rec["t_first_chunk"], rec["t_last_chunk"] = times[0], times[-1]
                    gaps = [(b - a, i + 1, a, b) for i, (a, b) in enumerate(pairwise(times))]
                    if gaps:
                        g, n, a, b = max(gaps)
                        rec["max_chunk_gap_s"] = round(g, 4)
                        rec["max_chunk_gap"] = {"after_chunk": n, "from": a, "to": b}
        except (httpx.HTTPError, ValueError, KeyError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["t_end"] = self.now()
        rec["duration_s"] = round(rec["t_end"] - rec["t_start"], 4)
        spans = f" {rec.get('weight_versions')}" if kind == "generate" else ""
        print(
            f"[{rec['t_end']:8.3f}] gen {label}: {rec.get('status')} "
            f"{rec.get('finish_reason')} {rec.get('completion_tokens')} tok "
            f"({rec['duration_s']} s){spans}",
            flush=True,
        )
        return rec

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.wait_for(asyncio.gather(*self.tasks), timeout=180)
        self.tasks = []

    # -- phases ----------------------------------------------------------------------------

    async def basics(self) -> None:
        for path in ("/version", "/is_paused", "/is_sleeping", "/weight_info", "/get_world_size"):
            await self.call("GET", path, label="basics")
        r = await self.gen("probe_generate", SHORT, "generate")
        if r.get("status") == 403:
            self.generate_ok = False
            self.note("/inference/v1/generate answered 403 (no --enable-scale-out): skipped")
        await self.drain()
        for i in range(3):
            self.gen(f"warm{i}", SHORT, "plain")
        await self.drain()

    async def _pause_round(self, name: str, params: dict[str, Any] | None) -> None:
        """Two long streamed + one long plain generation in flight, then /pause, then short
        ones sent during the pause, then /resume."""
        self.note(f"pause round {name}: params {params}")
        await self.metrics(f"{name}_before")
        watch = [f"{name}_long_stream0", f"{name}_long_stream1"]
        self.gen(watch[0], LONG)
        self.gen(watch[1], LONG)
        self.gen(f"{name}_long_plain", LONG, "plain")
        watch.append(f"{name}_long_plain")
        await self.wait_in_flight(watch[:2])
        pause = asyncio.create_task(
            self.call("POST", "/pause", params=params, label=f"{name}_pause", watch=watch)
        )
        await asyncio.sleep(0.3)
        if not pause.done():
            self.note(f"{name}: /pause still pending 0.3 s after it was sent")
            await self.call("GET", "/is_paused", label=f"{name}_while_pause_pending")
            await self.metrics(f"{name}_while_pause_pending")
        rec = await pause
        await self.call("GET", "/is_paused", label=f"{name}_paused")
        await self.call("GET", "/is_sleeping", label=f"{name}_paused")
        await self.metrics(f"{name}_during_pause")
        if rec["status"] == 200:
            self.gen(f"{name}_short_during_pause_plain", SHORT, "plain")
            self.gen(f"{name}_short_during_pause_stream", SHORT)
            await asyncio.sleep(2.0)
            await self.metrics(f"{name}_during_pause_queued")
        await self.call("POST", "/resume", label=f"{name}_resume")
        await self.drain()
        await self.call("GET", "/is_paused", label=f"{name}_after_resume")
        await self.metrics(f"{name}_after_resume")

    async def pause(self) -> None:
        await self._pause_round("pause_default", None)
        await self._pause_round("pause_abort_keepcache", {"mode": "abort", "clear_cache": "false"})
        await self._pause_round("pause_wait", {"mode": "wait"})
        await self._pause_round("pause_keep", {"mode": "keep"})
        # the docstring says clear_cache is ignored with mode=keep; the preemptions say not
        await self._pause_round("pause_keep_keepcache", {"mode": "keep", "clear_cache": "false"})
        # an older API's query parameter: FastAPI ignores unknown ones, so this is mode=abort
        await self._pause_round("pause_legacy_param", {"wait_for_inflight_requests": "true"})
        await self._pause_round("pause_bad_mode", {"mode": "drain"})
        self.note("pause twice, resume twice (idle)")
        await self.call("POST", "/pause", label="double_pause1")
        await self.call("POST", "/pause", params={"mode": "wait"}, label="double_pause2")
        await self.call("POST", "/resume", label="double_resume1")
        await self.call("POST", "/resume", label="double_resume2")
        await self.call("GET", "/is_paused", label="double_after")
        await self.metrics("pause_done")

    async def pause_short(self) -> None:
        """Only the default (abort) and keep rounds of ``pause``."""
        await self._pause_round("pause_default", None)
        await self._pause_round("pause_keep", {"mode": "keep"})

    async def version(self) -> None:
        await self.call("GET", "/weight_info", label="version_before")
        kind = "generate" if self.generate_ok else "plain"
        self.note(
            f"keep-pause with generations in flight ({kind} x2 + a stream), new version, resume"
        )
        watch = ["version_long_stream", "version_long_a", "version_long_b"]
        self.gen(watch[0], LONG)
        self.gen(watch[1], LONG, kind)
        self.gen(watch[2], LONG, kind)
        await self.wait_in_flight(watch[:1])
        await self.call(
            "POST", "/pause", params={"mode": "keep"}, label="version_pause_keep", watch=watch
        )
        await self.call(
            "POST", "/update_weight_version", body={"new_version": "step-1"}, label="version_set"
        )
        await self.call("GET", "/weight_info", label="version_after_set")
        await self.metrics("version_during_pause")
        await self.call("POST", "/resume", label="version_resume")
        await self.drain()
        await self.metrics("after_update_weight_version")
        self.note("update_weight_version outside a pause, with generations in flight")
        watch = ["version_unpaused_stream", "version_unpaused_long"]
        self.gen(watch[0], LONG)
        self.gen(watch[1], LONG, kind)
        await self.wait_in_flight(watch[:1])
        await self.call(
            "POST",
            "/update_weight_version",
            body={"new_version": "step-2"},
            label="version_set2",
            watch=watch,
        )
        await self.drain()
        await self.call("GET", "/weight_info", label="version_after_set2")
        self.note("bad bodies")
        await self.call("POST", "/update_weight_version", body={}, label="version_bad_empty")
        await self.call(
            "POST", "/update_weight_version", body={"new_version": 3}, label="version_bad_int"
        )
        await self.call(
            "POST", "/update_weight_version", body={"version": "x"}, label="version_bad_key"
        )
        await self.call("GET", "/weight_info", label="version_final")
        await self.metrics("version_done")

    async def sleep(self) -> None:
        for level in (1, 0, 2):
            name = f"sleep_l{level}"
            self.note(f"{name}: /sleep?level={level} with one long generation in flight")
            self.gen(f"{name}_long", LONG)
            await self.wait_in_flight([f"{name}_long"])
            await self.call(
                "POST", "/sleep", params={"level": level}, label=name, watch=[f"{name}_long"]
            )
            await self.call("GET", "/is_sleeping", label=f"{name}_state")
            await self.call("GET", "/is_paused", label=f"{name}_state")
            self.gen(f"{name}_short_during_sleep", SHORT, "plain")
            await asyncio.sleep(1.5)
            await self.metrics(f"{name}_asleep")
            params = [("tags", "scheduling")] if level == 0 else None
            await self.call("POST", "/wake_up", params=params, label=f"{name}_wake")
            await self.call("GET", "/is_sleeping", label=f"{name}_after_wake")
            await self.drain()
            await self.metrics(f"{name}_after_wake")
        self.note("sleep level 1 with mode=wait")
        self.gen("sleep_l1_wait_long", LONG)
        await self.wait_in_flight(["sleep_l1_wait_long"])
        sleep = asyncio.create_task(
            self.call(
                "POST",
                "/sleep",
                params={"level": 1, "mode": "wait"},
                label="sleep_l1_wait",
                watch=["sleep_l1_wait_long"],
            )
        )
        await asyncio.sleep(0.3)
        if not sleep.done():  # sleep_mode_operations_in_flight{operation="sleep"} is 1 now
            await self.call("GET", "/is_sleeping", label="sleep_l1_wait_pending")
            await self.metrics("sleep_l1_wait_pending")
        await sleep
        await self.call("GET", "/is_sleeping", label="sleep_l1_wait_state")
        await self.call("POST", "/wake_up", label="sleep_l1_wait_wake")
        await self.drain()
        self.note("sleep level 3 (out of range), wake_up when awake")
        await self.call("POST", "/sleep", params={"level": 3}, label="sleep_bad_level")
        await self.call("POST", "/wake_up", label="wake_when_awake")
        self.note("release_kv_cache_memory: without a pause, then after a pause")
        await self.call("POST", "/release_kv_cache_memory", label="release_unpaused")
        await self.call("POST", "/pause", label="release_pause")
        await self.call("POST", "/release_kv_cache_memory", label="release_paused")
        await self.call("GET", "/is_sleeping", label="release_state")
        await self.call("POST", "/resume", label="release_resume")
        self.gen("after_release", SHORT, "plain")
        await self.drain()
        await self.call("GET", "/is_sleeping", label="release_state_after")
        await self.metrics("release_failed")
        # the failed discard left "kv_cache" in the executor's sleeping tags
        await self.call("POST", "/wake_up", label="release_wake")
        await self.call("GET", "/is_sleeping", label="release_state_after_wake")
        await self.metrics("sleep_done")

    async def transfer(self) -> None:
        """The calls an RL trainer makes, in order; without --weight-transfer-config each one
        fails in the worker (HTTP 500) but is still timed by the rl_weight_update metrics."""
        await self.call("POST", "/pause", label="transfer_pause")
        await self.call(
            "POST", "/init_weight_transfer_engine", body={"init_info": {}}, label="transfer_init"
        )
        await self.call("POST", "/start_weight_update", label="transfer_start")
        await self.call("POST", "/start_draft_weight_update", label="transfer_start_draft")
        await self.call(
            "POST", "/update_weights", body={"update_info": {}}, label="transfer_update"
        )
        await self.call(
            "POST",
            "/finish_weight_update",
            body={"weight_version": "step-3"},
            label="transfer_finish",
        )
        await self.call("GET", "/weight_info", label="transfer_version_after_failed_finish")
        await self.call("POST", "/shutdown_weight_transfer_engine", label="transfer_shutdown")
        await self.call("POST", "/init_weight_transfer_engine", body={}, label="transfer_bad_body")
        await self.call("POST", "/resume", label="transfer_resume")
        await self.metrics("transfer_done")

    async def ipc(self) -> None:
        """A full cycle with the ipc backend, but for the data: one empty update chunk."""
        await self.call(
            "POST", "/update_weights", body={"update_info": {}}, label="ipc_update_before_start"
        )
        await self.call("POST", "/finish_weight_update", label="ipc_finish_before_start")
        await self.call(
            "POST",
            "/init_weight_transfer_engine",
            body={"init_info": {"bogus": 1}},
            label="ipc_init_bad",
        )
        await self.call(
            "POST",
            "/init_weight_transfer_engine",
            body={"init_info": {"packed": False}},
            label="ipc_init",
        )
        watch = ["ipc_long_stream", "ipc_long"]
        self.gen(watch[0], LONG)
        self.gen(watch[1], LONG, "generate" if self.generate_ok else "plain")
        await self.wait_in_flight(watch[:1])
        await self.call("POST", "/pause", params={"mode": "keep"}, label="ipc_pause", watch=watch)
        await self.call("POST", "/start_weight_update", label="ipc_start")
        await self.call("POST", "/start_weight_update", label="ipc_start_again")
        await self.call(
            "POST",
            "/update_weights",
            body={"update_info": {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}},
            label="ipc_update_empty",
        )
        await self.call(
            "POST", "/finish_weight_update", body={"weight_version": "ipc-1"}, label="ipc_finish"
        )
        await self.call("GET", "/weight_info", label="ipc_version")
        await self.metrics("ipc_during_pause")
        await self.call("POST", "/resume", label="ipc_resume")
        await self.drain()
        self.gen("ipc_after", SHORT, "generate" if self.generate_ok else "plain")
        await self.drain()
        await self.call("POST", "/shutdown_weight_transfer_engine", label="ipc_shutdown")
        await self.metrics("ipc_done")

    async def ipc_fail(self) -> None:
        """Destructive, so last: a chunk that fails in the worker (CUDA IPC handles on a CPU
        build) in the middle of an update, then finish, resume and generate."""
        await self.call(
            "POST",
            "/init_weight_transfer_engine",
            body={"init_info": {"packed": False}},
            label="ipcf_init",
        )
        await self.call("POST", "/pause", params={"mode": "keep"}, label="ipcf_pause")
        await self.call("POST", "/start_weight_update", label="ipcf_start")
        await self.call(
            "POST",
            "/update_weights",
            body={
                "update_info": {
                    "names": ["lm_head.weight"],
                    "dtype_names": ["float32"],
                    "shapes": [[512, 128]],
                    "ipc_handles": [{"GPU-0": []}],
                }
            },
            label="ipcf_update_cuda_handle",
        )
        await self.call(
            "POST", "/finish_weight_update", body={"weight_version": "ipc-2"}, label="ipcf_finish"
        )
        await self.call("GET", "/weight_info", label="ipcf_version")
        await self.call("POST", "/resume", label="ipcf_resume")
        self.gen("ipcf_after", SHORT, "plain")
        await self.drain()
        await asyncio.sleep(1.0)
        await self.call("GET", "/health", label="ipcf_health")
        await self.call("GET", "/is_paused", label="ipcf_is_paused")
        with contextlib.suppress(httpx.HTTPError):
            await self.metrics("ipcf_done")

    async def run(self, phases: list[str]) -> int:
        try:
            if self.model is None:
                r = await self.client.get(self.url + "/v1/models")
                self.model = r.json()["data"][0]["id"]
            await self.metrics("before")
            for ph in phases:
                self.note(f"=== phase {ph}")
                await getattr(self, ph)()
            await self.drain()
            if "ipc_fail" not in phases:
                await self.metrics("final")
            return 0
        finally:
            for t in self.tasks:
                t.cancel()
            await self.client.aclose()
            await self.control.aclose()
            self.write()

    def write(self) -> None:
        (self.out / "calls.json").write_text(json.dumps(self.calls, indent=1) + "\n")
        (self.out / "load.json").write_text(json.dumps(self.load, indent=1) + "\n")
        (self.out / "summary.json").write_text(json.dumps(self.snapshots, indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(DEFAULT_PHASES))
    p.add_argument("--save-all", action="store_true", help="write every /metrics body")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return asyncio.run(Probe(args.url, args.out, args.model, args.save_all).run(args.phases))


if __name__ == "__main__":
    sys.exit(main())
