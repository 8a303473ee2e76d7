"""What the version-skew bookkeeping sums per interval, per role, and per window or run label.

:class:`TokenSums` are generated tokens split by version status (stale, known, all);
:class:`LabelSpan` is what one window or run label saw: per endpoint the oldest, newest and
latest announced version it served (indices in announcement order), per scope (``rl`` for the
fleet, or a role) the largest lag of any of its engines, and per role the token sums. Pure
data, no clock; :class:`fleetscope.rl.versions.PolicyVersions` feeds them (docs/rl-lifecycle.md §3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RL = "rl"  # the pseudo scope of RL keys: inference/rl/..., inference/{window}/rl/...


@dataclass
class TokenSums:
    """Generated tokens: of stale engines, of engines whose version was known (stale, current or
    ahead), and of every engine (the rest: unknown version, or before the first announcement)."""

    stale: float = 0.0
    known: float = 0.0
    total: float = 0.0

    def add(self, stale: float, known: float, total: float) -> None:
        self.stale += stale
        self.known += known
        self.total += total

    def merge(self, other: TokenSums) -> None:
        self.add(other.stale, other.known, other.total)

    @property
    def unknown(self) -> float:
        return max(0.0, self.total - self.known)

    def share(self) -> float | None:
        """Stale tokens over the tokens whose version status was known."""
        return self.stale / self.known if self.known > 0 else None

    def unknown_share(self) -> float | None:
        """Tokens of unknown version status over every generated token."""
        return self.unknown / self.total if self.total > 0 else None

    def to_list(self) -> list[float]:
        return [self.stale, self.known, self.total]

    @classmethod
    def from_list(cls, v: Sequence[Any]) -> TokenSums:
        if len(v) == 2:  # a checkpoint from before the known sums: every token counted known
            return cls(float(v[0]), float(v[1]), float(v[1]))
        return cls(float(v[0]), float(v[1]), float(v[2]))


def token_keys(base: str, sums: TokenSums) -> dict[str, float]:
    """Stale tokens and their share of the tokens of known version status; the tokens of
    unknown status (and their share of every generated token) beside them."""
    out = {
        base + "stale_generation_tokens": sums.stale,
        base + "unknown_version_generation_tokens": sums.unknown,
    }
    share, unknown_share = sums.share(), sums.unknown_share()
    if share is not None:
        out[base + "stale_generation_share"] = share
    if unknown_share is not None:
        out[base + "unknown_version_generation_share"] = unknown_share
    return out


def share_keys(base: str, sums: TokenSums) -> dict[str, float]:
    return {**token_keys(base, sums), base + "generation_tokens": sums.total}


@dataclass
class PollVersions:
    """One poll's version facts: per endpoint its served index and lag (known ones), per
    endpoint its role, per role its token sums."""

    served: dict[str, int] = field(default_factory=dict)
    lags: dict[str, int] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # endpoint -> role (roles only)
    role_sums: dict[str, TokenSums] = field(default_factory=dict)

    def scope_lags(self) -> dict[str, int]:
        """Scope (``rl`` = fleet, or a role) -> its largest lag, engines ahead counting 0."""
        out: dict[str, int] = {}
        for ep, lag in self.lags.items():
            for scope in (RL, self.roles.get(ep)):
                if scope is not None:
                    out[scope] = max(out.get(scope, 0), max(0, lag))
        return out


@dataclass
class LabelSpan:
    """What one window or run label saw of the versions (see the module docs)."""

    versions: dict[str, list[int]] = field(default_factory=dict)  # ep -> [oldest, newest, last]
    max_lag: dict[str, int] = field(default_factory=dict)  # scope -> largest lag
    role_sums: dict[str, TokenSums] = field(default_factory=dict)

    def observe(self, poll: PollVersions) -> None:
        for ep, idx in poll.served.items():
            span = self.versions.get(ep)
            if span is None:
                self.versions[ep] = [idx, idx, idx]
            else:
                span[0], span[1], span[2] = min(span[0], idx), max(span[1], idx), idx
        for scope, lag in poll.scope_lags().items():
            self.max_lag[scope] = max(self.max_lag.get(scope, 0), lag)
        for role, sums in poll.role_sums.items():
            self.role_sums.setdefault(role, TokenSums()).merge(sums)

    def merge(self, other: LabelSpan) -> None:
        """Add a later span (a stopped window into its run label)."""
        for ep, (lo, hi, last) in other.versions.items():
            span = self.versions.get(ep)
            self.versions[ep] = [lo, hi, last] if span is None else [
                min(span[0], lo),
                max(span[1], hi),
                last,
            ]  # fmt: skip
        for scope, lag in other.max_lag.items():
            self.max_lag[scope] = max(self.max_lag.get(scope, 0), lag)
        for role, sums in other.role_sums.items():
            self.role_sums.setdefault(role, TokenSums()).merge(sums)

    def keys(self, base: str) -> dict[str, float]:
        """``{base}/{endpoint}/weight_version_index/{oldest,newest,last}``, ``{base}/rl/
        max_version_lag``, and per role ``{base}/rl/{role}/max_version_lag`` and its shares."""
        out: dict[str, float] = {}
        for ep, (lo, hi, last) in sorted(self.versions.items()):
            head = f"{base}/{ep}/weight_version_index/"
            out.update(
                {head + "oldest": float(lo), head + "newest": float(hi), head + "last": float(last)}
            )
        for scope, lag in self.max_lag.items():
            head = f"{base}/{RL}/" if scope == RL else f"{base}/{RL}/{scope}/"
            out[head + "max_version_lag"] = float(lag)
        for role, sums in self.role_sums.items():
            out.update(share_keys(f"{base}/{RL}/{role}/", sums))
        return out

    def to_data(self) -> dict[str, Any]:
        return {
            "versions": {ep: list(v) for ep, v in self.versions.items()},
            "max_lag": dict(self.max_lag),
            "role_sums": {r: s.to_list() for r, s in self.role_sums.items()},
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> LabelSpan:
        return cls(
            {ep: [int(x) for x in v] for ep, v in data.get("versions", {}).items()},
            {s: int(v) for s, v in data.get("max_lag", {}).items()},
            {r: TokenSums.from_list(v) for r, v in data.get("role_sums", {}).items()},
        )
