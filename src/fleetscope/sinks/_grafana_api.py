"""Grafana annotation API pieces: the base URL check and the regions annotations describe."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fleetscope.util.redact import redact


def validate_grafana_url(url: str) -> str:
    """Return the base URL without a trailing ``/``, or raise ``ValueError`` saying why not.

    Accepted: ``http://host[:port][/path]`` and ``https://...``. Rejected: other schemes,
    credentials in the URL (``http://user:pass@host``: use the token environment variable),
    a query string or fragment, no host, a bad port.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("Grafana URL must be a non-empty string such as https://grafana:3000")
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise ValueError(redact(f"Grafana URL {url!r} is not a valid URL: {e}")) from None
    try:
        port = parts.port  # raises ValueError for a non-numeric / out-of-range port
    except ValueError:
        # the "port" may well be a password typed where it does not belong: never shown
        shown = f"{parts.scheme}://{parts.hostname or ''}:<port not shown>"
        raise ValueError(
            f"Grafana URL {shown} is not a valid URL: the port must be an integer 1-65535"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise ValueError(f"Grafana URL must start with http:// or https:// (got {shown})")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError(
            "Grafana URL must not contain credentials (user:password@); put a service "
            "account token in the environment variable named by token_env instead"
        )
    if not parts.hostname:
        raise ValueError(redact(f"Grafana URL {url!r} has no host"))
    if parts.query or parts.fragment:
        raise ValueError(
            redact(
                f"Grafana URL {urlunsplit(parts._replace(query='', fragment=''))!r} must not "
                "have a query string or fragment (they are not shown: they may hold secrets)"
            )
        )
    del port
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Region:
    """One annotation region: what was (or should have been) created."""

    time_ms: int
    text: str
    tags: list[str]
    id: int | None = None  # None: the POST failed, the end will POST the whole region
    extra: dict[str, Any] = field(default_factory=dict)
