"""Options and helpers shared by the ``fleetscope`` commands."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

if TYPE_CHECKING:
    from fleetscope.identity import Role
    from fleetscope.sinks.base import Sink

    #: what ``ArgumentParser.add_subparsers`` returns (generic only in typeshed)
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: a check of the parsed options that argparse cannot make alone (options that only mean
#: something together): the problem in one line, or ``None``
UsageCheck = Callable[[argparse.Namespace], "str | None"]


def positive_float(text: str) -> float:
    """argparse ``type=`` for seconds and other amounts that must be > 0 (and finite): argparse
    then prints the usage and this one line, exit code 2."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse ``type=`` for a share: a number above 0 and at most 1."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be at most 1, not {text!r}")
    return value


def add_usage_check(parser: argparse.ArgumentParser, check: UsageCheck) -> None:
    """Run ``check`` on the options ``parser`` parsed (``main`` calls ``args.usage_check``):
    a problem it returns is a usage error of ``parser`` (its usage line and the problem on
    stderr, exit code 2)."""

    def usage_check(args: argparse.Namespace) -> None:
        problem = check(args)
        if problem is not None:
            parser.error(problem)

    parser.set_defaults(usage_check=usage_check)


def url_problem(url: str, shown: str | None = None) -> str | None:
    """Why ``url`` is not an endpoint's base URL (``http(s)://host[:port]...``), or ``None``;
    the problem names it as ``shown`` (default: ``url``)."""
    import httpx

    shown = url if shown is None else shown
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError) as e:
        return f"{shown!r} is not a URL ({e})"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return f"{shown!r} is not an http(s) URL"
    if port is not None and not 0 < port < 65536:
        return f"{shown!r} has no valid port"
    return None


def endpoint_url(text: str) -> str:
    """argparse ``type=`` for an endpoint URL on the command line: refused like a line of an
    endpoints file that is not an http(s) URL (a URL with no scheme would fail every scrape)."""
    from fleetscope.util.redact import redact

    url = text.strip()
    # a user:password@ with no scheme is hidden too (redact knows it after a scheme)
    shown = url if "://" in url else redact(f"http://{url}").removeprefix("http://")
    problem = url_problem(url, redact(shown))
    if problem is None:
        return url
    hint = f"; write it as http://{shown}" if "://" not in url else ""
    raise argparse.ArgumentTypeError(redact(problem + hint))


def role_spec(text: str) -> str:
    """argparse ``type=`` for ``--role``: ``prefill=URL`` or ``decode=URL``, URL as in
    :func:`endpoint_url`; returns ``text`` as given."""
    try:
        role, url = role_and_url(text)
    except ValueError:
        role, url = None, text
    if role is None:
        head, sep, rest = text.partition("=")
        given = f"{head}={'URL' if rest.strip() else ''}" if sep else "a URL alone"
        raise argparse.ArgumentTypeError(f"expected prefill=URL or decode=URL, not {given}")
    endpoint_url(url)
    return text


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

        try:
            sinks.append(JsonlSink(args.jsonl))
        except OSError as e:
            raise SystemExit(
                f"fleetscope: cannot write --jsonl {args.jsonl}: {_reason(e)}; "
                "give a path you can write to"
            ) from None
    if args.wandb_project:
        from fleetscope.sinks.wandb import WandbSink

        try:
            sinks.append(
                WandbSink(
                    project=args.wandb_project,
                    entity=args.wandb_entity,
                    mode=args.wandb_mode,
                    name=args.wandb_name,
                    dir=args.wandb_dir,
                    alerts=args.wandb_alerts,
                    keys=getattr(args, "wandb_keys", None) or "compact",
                )
            )
        except ImportError as e:  # the message names the extra: fleetscope[wandb]
            raise SystemExit(f"fleetscope: --wandb-project: {e}") from None
    return sinks


def _reason(e: OSError) -> str:
    """An ``OSError`` in a few words: its message and the path it names."""
    if e.strerror is None:
        return str(e)
    return f"{e.strerror} ({e.filename})" if e.filename is not None else e.strerror


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
        default=None,
        help="W&B key set: compact (default; docs/sinks.md) or full (prime-rl's pass-through, "
        "as in --jsonl)",
    )
    p.add_argument(
        "--wandb-mode",
        choices=["online", "offline", "disabled"],
        default=None,
        help="default: online when an API key is configured, else offline",
    )


def write_out(text: str, out: str | None, command: str) -> int:
    """``text`` to the file ``--out`` names (``-`` or none: stdout); the exit code. A file that
    cannot be written is one line on stderr naming ``command``, exit code 1."""
    if out in (None, "-"):
        sys.stdout.write(text)
        return 0
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"fleetscope {command}: cannot write --out {out}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0
