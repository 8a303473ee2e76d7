"""Options and helpers shared by the ``fleetscope`` commands."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias, cast

if TYPE_CHECKING:
    from fleetscope.identity import Role
    from fleetscope.sinks.base import Sink

    #: what ``ArgumentParser.add_subparsers`` returns (generic only in typeshed)
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def role_and_url(spec: str) -> tuple[Role | None, str]:
    """``URL`` (no role), or ``prefill=URL`` / ``decode=URL``."""
    role, sep, url = spec.partition("=")
    if not sep or "://" in role:
        return None, spec.strip()
    if role not in ("prefill", "decode") or not url.strip():
        raise ValueError("expected URL, prefill=URL or decode=URL")
    return cast("Role", role), url.strip()


def headers_from_args(args: argparse.Namespace) -> dict[str, str]:
    import os

    headers = {}
    token = args.bearer_token or (os.environ.get(args.bearer_env) if args.bearer_env else None)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def build_sinks(args: argparse.Namespace, *, terminal: bool) -> list[Sink]:
    sinks: list[Sink] = []
    if terminal:
        from fleetscope.sinks.terminal import TerminalSink

        sinks.append(TerminalSink())
    if args.jsonl:
        from fleetscope.sinks.jsonl import JsonlSink

        sinks.append(JsonlSink(args.jsonl))
    if args.wandb_project:
        from fleetscope.sinks.wandb import WandbSink

        sinks.append(
            WandbSink(
                project=args.wandb_project,
                entity=args.wandb_entity,
                mode=args.wandb_mode,
                name=args.wandb_name,
                dir=args.wandb_dir,
                alerts=args.wandb_alerts,
                keys=getattr(args, "wandb_keys", "compact"),
            )
        )
    return sinks


def add_sink_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jsonl", default=None, help="append every poll to this JSONL file")
    p.add_argument("--wandb-project", default=None, help="log to this W&B project")
    p.add_argument("--wandb-entity", default=None)
    p.add_argument("--wandb-name", default=None, help="W&B run name")
    p.add_argument("--wandb-dir", default=None, help="where W&B writes its run files")
    p.add_argument("--wandb-alerts", action="store_true", help="send health events as W&B alerts")
    p.add_argument(
        "--wandb-keys",
        choices=["compact", "full"],
        default="compact",
        help="W&B key set: compact (default; docs/sinks.md) or full (prime-rl's pass-through, "
        "as in --jsonl)",
    )
    p.add_argument(
        "--wandb-mode",
        choices=["online", "offline", "disabled"],
        default=None,
        help="default: online when an API key is configured, else offline",
    )
