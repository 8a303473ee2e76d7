"""The ``fleetscope`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fleetscope import __version__


def _read_source(source: str, timeout: float) -> tuple[bytes, float, float]:
    """A body from a file or a URL, with the (monotonic, wall) time it arrived."""
    if source.startswith(("http://", "https://")):
        import httpx

        url = source if source.rstrip("/").endswith("/metrics") else source.rstrip("/") + "/metrics"
        r = httpx.get(url, timeout=timeout)
        r.raise_for_status()
        return r.content, time.monotonic(), time.time()
    data = Path(source).read_bytes()
    return data, time.monotonic(), time.time()


def cmd_inspect(args: argparse.Namespace) -> int:
    from fleetscope.exposition import Parser
    from fleetscope.fleet import FleetState, ScrapeResult
    from fleetscope.keys import KeyOptions

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
            body, mono, wall = _read_source(src, args.timeout)
            if not is_url:  # saved files: the interval is what the user says it was
                mono = i * args.interval
            expo = parser.parse(body, time=mono, wall_time=wall)
        except Exception as e:
            print(f"fleetscope inspect: cannot read {src}: {e}", file=sys.stderr)
            return 2
        results.append(ScrapeResult(name, expo, mono, wall, role=role))
    state.observe([results[0]])
    poll = state.observe([results[1]])
    keys = dict(sorted(poll.keys.items()))
    if args.json:
        json.dump(keys, sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
        return 0
    _print_table(keys, args)
    return 0


def _print_table(keys: dict[str, float], args: argparse.Namespace) -> None:
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
    pattern = args.filter
    for k, v in keys.items():
        if pattern and pattern not in k:
            continue
        table.add_row(k, f"{v:.6g}")
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetscope",
        description="Correct fleet statistics for vLLM inference engines from their /metrics.",
    )
    p.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    ins = sub.add_parser(
        "inspect",
        help="keys and values the collector would log between two expositions",
        description=(
            "Compute, from two saved expositions (files) or two scrapes of one URL, exactly the "
            "keys and values the collector would log for that interval."
        ),
    )
    ins.add_argument("prev", help="earlier exposition: a file, or a URL (scraped twice)")
    ins.add_argument("cur", help="later exposition: a file, or the same URL")
    ins.add_argument("--interval", type=float, default=5.0, help="seconds between them (5)")
    ins.add_argument("--json", action="store_true", help="one flat JSON object {key: value}")
    ins.add_argument("--compact", action="store_true", help="with --json: on one line")
    ins.add_argument("--schema", choices=["prime-rl", "skyrl"], default="prime-rl")
    ins.add_argument("--role", choices=["prefill", "decode"], default=None)
    ins.add_argument("--name", default=None, help="endpoint name (server0)")
    ins.add_argument("--filter", default=None, help="only keys containing this text")
    ins.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout for URLs")
    ins.set_defaults(func=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
