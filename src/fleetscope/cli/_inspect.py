"""``fleetscope inspect``: the keys the collector would log between two expositions."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands

from fleetscope.cli._common import add_usage_check, positive_float


class SourceError(Exception):
    """A body that could not be read within the bounds (size, time)."""


def read_source(
    source: str, timeout: float, *, max_bytes: int | None = None
) -> tuple[bytes, float, float]:
    """A body from a file or a URL, with the (monotonic, wall) time it arrived.

    Bounded like the collector's scrapes: at most ``max_bytes`` (default
    ``fleetscope.exposition.MAX_BODY_BYTES``), and a URL's whole download (connect, headers,
    body) within ``timeout`` seconds, not just per read."""
    from fleetscope.exposition import MAX_BODY_BYTES

    cap = MAX_BODY_BYTES if max_bytes is None else max_bytes
    if source.startswith(("http://", "https://")):
        import asyncio

        from fleetscope.util.redact import redact

        url = source if source.rstrip("/").endswith("/metrics") else source.rstrip("/") + "/metrics"
        try:
            body = asyncio.run(_download(url, timeout, cap))
        except TimeoutError:  # the whole exchange, headers included (they may trickle too)
            raise SourceError(
                f"{redact(url)}: response not complete after {timeout:g} s (--timeout)"
            ) from None
        return body, time.monotonic(), time.time()
    path = Path(source)
    with path.open("rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise SourceError(f"file larger than the {cap} byte cap")
    return data, time.monotonic(), time.time()


async def _download(url: str, timeout: float, cap: int) -> bytes:
    """``url``'s body, at most ``cap`` bytes; ``TimeoutError`` unless the whole exchange
    (connect, headers, body) ends within ``timeout`` seconds."""
    import asyncio

    import httpx

    chunks: list[bytes] = []
    size = 0
    async with (
        asyncio.timeout(timeout),
        httpx.AsyncClient(timeout=timeout) as client,
        client.stream("GET", url) as r,
    ):
        r.raise_for_status()
        declared = r.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise SourceError(f"body of {int(declared)} bytes exceeds the {cap} byte cap")
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            if size > cap:
                raise SourceError(f"body exceeds the {cap} byte cap")
            chunks.append(chunk)
    return b"".join(chunks)


def cmd_inspect(args: argparse.Namespace) -> int:
    from fleetscope.exposition import Parser
    from fleetscope.fleet.state import FleetState
    from fleetscope.keys import KeyOptions
    from fleetscope.sources.base import ScrapeResult

    parser = Parser()
    state = FleetState(key_options=KeyOptions(schema=args.schema))
    role = args.role
    name = args.name or (f"{role}0" if role else "server0")
    is_url = args.prev.startswith(("http://", "https://"))
    results = []
    for i, src in enumerate((args.prev, args.cur)):
        if i == 1 and is_url and args.prev == args.cur:
            time.sleep(args.interval)
        try:
            body, mono, wall = read_source(src, args.timeout)
            if not is_url:  # saved files: the interval is what the user says it was
                mono = i * args.interval
            expo = parser.parse(body, time=mono, wall_time=wall)
        except Exception as e:
            from fleetscope.util.redact import redact

            print(
                f"fleetscope inspect: cannot read {redact(src)}: {redact(str(e))}", file=sys.stderr
            )
            return 2
        results.append(ScrapeResult(name, expo, mono, wall, role=role))
    state.observe([results[0]])
    poll = state.observe([results[1]])
    keys = {k: v for k, v in sorted(poll.keys.items()) if not args.filter or args.filter in k}
    if args.json:
        json.dump(keys, sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
        return 0
    print_table(keys, args)
    return 0


def print_table(keys: dict[str, float], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"fleetscope inspect — {len(keys)} keys over {args.interval:g} s",
        show_lines=False,
        header_style="bold",
    )
    table.add_column("key", overflow="fold")
    table.add_column("value", justify="right")
    pattern = getattr(args, "filter", None)  # cmd_inspect applied it already
    for k, v in keys.items():
        if pattern and pattern not in k:
            continue
        table.add_row(k, f"{v:.6g}")
    console.print(table)


def add_inspect_parser(sub: Subcommands) -> None:
    """``inspect``."""
    ins = sub.add_parser(
        "inspect",
        help="keys and values the collector would log between two expositions",
        usage="%(prog)s [options] PREV CUR",
        description=(
            "Compute, from two saved expositions (files) or two scrapes of one URL, exactly the "
            "keys and values the collector would log for that interval."
        ),
    )
    ins.add_argument("prev", help="earlier exposition: a file, or a URL (scraped twice)")
    ins.add_argument("cur", help="later exposition: a file, or the same URL")
    ins.add_argument(
        "--interval",
        type=positive_float,
        default=5.0,
        help="seconds between them (5); with one URL, the pause between its two scrapes",
    )
    ins.add_argument("--json", action="store_true", help="one flat JSON object {key: value}")
    ins.add_argument("--compact", action="store_true", help="with --json: on one line")
    ins.add_argument("--schema", choices=["prime-rl", "skyrl"], default="prime-rl")
    ins.add_argument("--role", choices=["prefill", "decode"], default=None)
    ins.add_argument("--name", default=None, help="endpoint name (server0)")
    ins.add_argument("--filter", default=None, help="only keys containing this text")
    ins.add_argument(
        "--timeout",
        type=positive_float,
        default=5.0,
        help="for URLs: seconds for each whole download (5); bodies are capped like scrapes",
    )
    ins.set_defaults(func=cmd_inspect)
    add_usage_check(ins, _inspect_usage_problem)


def _inspect_usage_problem(args: argparse.Namespace) -> str | None:
    """Options of ``inspect`` that would silently do nothing (a usage error)."""
    if args.compact and not args.json:
        return "--compact needs --json (it puts the JSON object on one line)"
    return None
