"""The alert rules' PromQL building blocks: catalog-checked selectors, and every engine's series
brought to one shape (per engine, or per role) whatever engine wrote them.

Every family a rule reads goes through :class:`Series`, which refuses (:class:`RuleError`) a
family the catalog lacks, one of another engine, one not defined in an engine version the rules
target (``first`` / ``last`` in ``families.tsv``), and any label a rule matches or groups by that
the family does not carry. So a typo or a removed name is a build error, never a silent rule.

Shapes (:class:`RulePromql`): ``per_engine`` sums an engine's children (``model_name``, SGLang's
``priority``...) into one series labelled ``job, instance, engine`` and the role label; SGLang
has no ``engine`` label, so its ``dp_rank`` becomes ``engine`` (``"0"`` when absent, as the parser
names it), only rank 0 of ``tp_rank`` / ``pp_rank`` / ``moe_ep_rank`` is read (the other ranks
repeat it, docs/sglang.md), and a target without the role label takes SGLang's own
``engine_type`` when it says ``prefill`` or ``decode``. ``per_role`` sums by ``job`` and the role
label the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleetscope import catalog

ENGINE_KINDS = ("vllm", "sglang")
#: labels every scraped series gets from Prometheus (the role label is the target's too)
TARGET_LABELS = ("job", "instance")
#: the helper label SGLang's role is built in (dropped by every aggregation)
_ROLE_JOIN = "fleetscope_role"


class RuleError(ValueError):
    """A rule reads a family or label that the catalog does not have for the targeted engine
    versions, or an option the rules cannot honour."""


@dataclass(frozen=True)
class Target:
    """What the rules are written for: engines and their versions, names as stored, role label."""

    versions: Mapping[str, str]  # engine kind -> version, for every engine the fleet runs
    metric_prefix: str | None = None  # None: vllm:x and vllm_x alike; "vllm:" / "vllm_": exact
    role_label: str = "role"

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(e for e in ENGINE_KINDS if e in self.versions)


class Series:
    """One family of one engine, as the rules select it (``suffix``: ``_total``, ``_bucket``...)."""

    def __init__(self, target: Target, family: str, suffix: str = "") -> None:
        self.target = target
        self.family = family
        self.suffix = suffix
        fam = catalog.FAMILY_BY_NAME.get(family)
        if fam is None:
            raise RuleError(f"the rules read {family}, which the catalog does not have")
        self.engine = fam.engine
        version = target.versions.get(fam.engine)
        if version is None:
            raise RuleError(f"the rules read {family}, but the fleet runs no {fam.engine}")
        if not catalog.in_versions(fam.first, fam.last, version):
            span = f"{fam.first or '...'} to {fam.last or '...'}"
            raise RuleError(f"{family} is not in {fam.engine} {version} (the catalog: {span})")
        self.labels = frozenset(fam.labels.split()) | {*TARGET_LABELS, target.role_label}
        if suffix == "_bucket":
            self.labels |= {"le"}

    def need(self, *labels: str) -> None:
        missing = [label for label in labels if label not in self.labels]
        if missing:
            raise RuleError(f"the rules read label(s) {missing} of {self.family}, which has none")

    @property
    def name(self) -> str:
        return self.family.split(":", 1)[1] + self.suffix

    def sel(
        self, eq: Mapping[str, str] | None = None, match: Mapping[str, str] | None = None
    ) -> str:
        """The selector, with ``label="value"`` for ``eq`` and ``label=~"regex"`` for ``match``
        (SGLang: rank 0 of every rank label the family has)."""
        eq, match = dict(eq or {}), dict(match or {})
        self.need(*eq, *match)
        if self.engine == "sglang":
            for rank in catalog.SGLANG_RANK_LABELS:
                if rank in self.labels:
                    match.setdefault(rank, "|0")
        prefix = self.target.metric_prefix
        matchers = []
        head = ""
        if prefix is None:
            matchers.append(f'__name__=~"{self.engine}[:_]{self.name}"')
        else:
            head = f"{self.engine}{prefix[-1]}{self.name}"
        matchers += [f'{k}="{v}"' for k, v in eq.items()]
        matchers += [f'{k}=~"{v}"' for k, v in match.items()]
        return head + ("{" + ",".join(matchers) + "}" if matchers else "")


def native(target: Target, engine: str, canonical: str, suffix: str = "") -> Series:
    """``engine``'s family for the vLLM family ``canonical`` (its own name for vLLM)."""
    if engine == "vllm":
        return Series(target, canonical, suffix)
    try:
        return Series(target, catalog.native_name(canonical, engine), suffix)
    except KeyError:
        raise RuleError(f"the catalog maps no {engine} family to {canonical}") from None


class RulePromql:
    """Per-engine and per-role shapes of the series, for one :class:`Target`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.role = target.role_label
        self.engine_labels = f"job, instance, engine, {self.role}"

    def _sglang_role(self, s: Series, inner: str) -> str:
        """``inner`` with the role label set from ``engine_type`` where the target has none."""
        s.need(catalog.SGLANG_ROLE_LABEL)
        roles = "|".join(catalog.SGLANG_ROLES)
        joined = (
            f'label_join({inner}, "{_ROLE_JOIN}", ";", "{self.role}", '
            f'"{catalog.SGLANG_ROLE_LABEL}")'
        )
        return f'label_replace({joined}, "{self.role}", "$1", "{_ROLE_JOIN}", ";({roles})")'

    def per_engine(self, s: Series, inner: str) -> str:
        """``inner`` (a vector of ``s``'s series) as one series per engine."""
        if s.engine == "vllm":
            s.need(*catalog.VLLM_IDENTITY_LABELS)
            return f"sum by ({self.engine_labels}) ({inner})"
        (dp,) = catalog.SGLANG_IDENTITY_LABELS
        s.need(dp)
        named = f'label_replace({self._sglang_role(s, inner)}, "engine", "0", "{dp}", "")'
        named = f'label_replace({named}, "engine", "$1", "{dp}", "(.+)")'
        return f"sum by ({self.engine_labels}) ({named})"

    def per_role(self, parts: Sequence[tuple[Series, str]], by: Iterable[str] = ()) -> str:
        """The sum of every ``(series, vector)`` part by ``job``, the role label and ``by``.

        The parts are joined with ``or`` inside the sum: a vLLM series always has ``engine``
        and an SGLang one ``engine_type``, so no two parts' series share a label set and the
        union is every series (a sum of sums would vanish where one engine kind is absent)."""
        by = tuple(by)
        inner = []
        for s, vector in parts:
            s.need(*by)
            inner.append(vector if s.engine == "vllm" else self._sglang_role(s, vector))
        labels = ", ".join(("job", self.role, *by))
        return f"sum by ({labels}) (\n" + indent("\nor\n".join(inner)) + "\n)"


def union(parts: Sequence[str]) -> str:
    """Vectors with disjoint series (one per engine kind) as one: ``(a) or (b)``."""
    if len(parts) == 1:
        return parts[0]
    return "\nor\n".join("(\n" + indent(p) + "\n)" for p in parts)


def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.split("\n"))


def le_regex(bounds: Iterable[float], inf: bool = False) -> str:
    """A regex matching the ``le`` texts of ``bounds`` (``2.5``, ``2.50``; ``1``, ``1.0``)."""
    alternatives = [_le_text(b) for b in bounds] + (["\\\\+Inf"] if inf else [])
    return "|".join(alternatives)


def _le_text(bound: float) -> str:
    text = format(bound, "f").rstrip("0")
    whole, _, frac = text.partition(".")
    if not frac:
        return f"{whole}(\\\\.0*)?"
    return f"{whole}\\\\.{frac}0*"


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: ``1h``, ``5m``, ``30s``, ``1500ms``, ``0s``."""
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
