"""Remove secrets from text before it is logged or raised: ``redact(text) -> text``.

Applied to every warning fleetscope emits (``RateLimitedWarner.warn``), to the Grafana
annotator's errors and warnings, and to the CLI's error messages. What is replaced by ``***``:

* userinfo in URLs: ``http://user:pass@host`` -> ``http://***@host`` (any scheme);
* ``Authorization: Bearer X`` / ``Basic X`` / ``Token X`` (header text, reprs of header dicts,
  JSON: ``"Authorization": "Bearer X"``), and a bare ``Bearer X``;
* query parameters, form fields, ``key=value`` and ``key: value`` text and JSON fields whose
  name contains ``token``, ``api_key``/``apikey``/``api-key``, ``password``/``passwd``/``pwd``,
  ``secret``, ``auth``, ``credential``, ``session`` or ``signature`` (``access_token=``,
  ``"password": "..."``, ``X-Api-Key: ...``);
* 40-hex-digit strings (W&B API keys) after a word containing ``key`` (``WANDB_API_KEY=...``,
  ``key 0123...``), and any ``local-``-prefixed W&B key.

It errs on the side of hiding: a harmless value under such a name is hidden too. Metric names
are not field names: ``vllm:time_to_first_token_seconds: ...`` (namespaced, or ending in a
unit or type suffix such as ``_seconds``, ``_total``) is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

_SECRET_NAME = (
    r"(?<!:)"  # a namespaced metric name (``vllm:...token...``) is not a field name
    r"(?![A-Za-z0-9_.\-]*tokens(?![A-Za-z0-9]))"  # counts of tokens are not secrets
    # nor is a metric name with a unit or type suffix (``time_to_first_token_seconds``)
    r"(?![A-Za-z0-9_.\-]*_(?:seconds|total|bucket|count|sum|bytes|perc|ratio|info)"
    r"(?![A-Za-z0-9]))"
    r"[A-Za-z0-9_.\-]*(?:token|api[_\-]?key|password|passwd|pwd|secret|auth|credential"
    r"|session|signature|private[_\-]?key)[A-Za-z0-9_.\-]*"
)

# scheme://user[:password]@  (the userinfo part, up to the last @ before the host)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#'\"<>]+@")
# Authorization: Bearer X, 'Authorization': 'Bearer X', "authorization":"Basic X"
_AUTH_HEADER = re.compile(
    r"(?i)(['\"]?(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
    r"(?:(bearer|basic|token|digest|negotiate)\s+)?([^\s'\",;}]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9\-._~+/]{8,}=*)")
# JSON / repr fields: "api_key": "X", 'password': 'X'
_QUOTED_FIELD = re.compile(rf"(?i)(['\"]{_SECRET_NAME}['\"]\s*:\s*)(['\"])((?:\\.|(?!\2).)*)\2")
# query params, form fields, env-style and header-style text: token=X, X-Api-Key: X
_PLAIN_FIELD = re.compile(
    rf"(?i)(\b{_SECRET_NAME}\s*(?:=|:\s)\s*)(?!(?:bearer|basic|token|digest)\s)"
    r"([^\s&'\",;}\]>)]+)"
)
_WANDB_KEY = re.compile(r"(?i)(\b\w*key\w*['\"]?\s*[:= ]\s*['\"]?)([0-9a-f]{40})\b")
_LOCAL_KEY = re.compile(r"\blocal-[0-9a-f]{40}\b")


def redact(text: object, secrets: Iterable[str | None] = ()) -> str:
    """``text`` (anything; ``str()`` is taken) with secrets replaced by ``***``.

    ``secrets``: literal values known to be secret (e.g. the token a client sends), replaced
    wherever they appear, whatever surrounds them (values shorter than 4 characters are
    ignored, not to mask ordinary text)."""
    s = text if isinstance(text, str) else str(text)
    if not s:
        return s
    for secret in secrets:
        if secret and len(secret) >= 4:
            s = s.replace(secret, MASK)
    s = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", s)
    s = _AUTH_HEADER.sub(lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + MASK, s)
    s = _BEARER.sub(lambda m: m.group(1) + " " + MASK, s)
    s = _QUOTED_FIELD.sub(lambda m: m.group(1) + m.group(2) + MASK + m.group(2), s)
    s = _PLAIN_FIELD.sub(lambda m: m.group(1) + MASK, s)
    s = _WANDB_KEY.sub(lambda m: m.group(1) + MASK, s)
    s = _LOCAL_KEY.sub("local-" + MASK, s)
    return s
