#!/usr/bin/env python3
"""Statically list the `vllm:` metric families a vLLM source tree defines.

    python scripts/vllm_families/extract.py VLLM_PKG_DIR VERSION > out.json

Reads every .py file under the package with `ast` (nothing is imported) and records each
place a family is *defined*:

* a prometheus constructor call (`Counter(`, `Gauge(`, `Histogram(`, `self._counter_cls(`,
  `prometheus_client.Gauge(` ...) whose `name=` / first argument resolves to a `vllm:` string
  (string constants, module / class constants, f-strings are resolved within the file);
* a metadata table entry `{NAME: SomethingCounterMetadata(...)}` (KV offload, tiering, CPU
  offload connectors build their metrics from such tables);
* `("vllm:name", "help")` tuples handed to a constructor loop (spec decode counters).

For each: type, help text, labelnames and buckets as source text (`ast.unparse`), file and line.
`labelnames` of PrometheusStatLogger (`["model_name", "engine"]`) is substituted where a call
passes that variable. The output needs a human pass for dynamic cases; README.md says which.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, overload

TYPE_RE = re.compile(r"(counter|gauge|histogram|summary|info)", re.I)
CTOR_RE = re.compile(
    r"(^|\.)(_?(counter|gauge|histogram|summary|info)(_cls)?|Counter|Gauge|Histogram|Summary|Info)$",
    re.I,
)

# one family definition found in the source (JSON: name, type, help, labelnames, buckets...)
Definition = dict[str, Any]


def _str_consts(tree: ast.Module) -> dict[str, str]:
    """name -> string for module-level and class-level NAME = "..." assignments."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if (
                    isinstance(st, ast.Assign)
                    and isinstance(st.value, ast.Constant)
                    and isinstance(st.value.value, str)
                ):
                    for t in st.targets:
                        if isinstance(t, ast.Name):
                            out[f"{node.name}.{t.id}"] = st.value.value
                            out.setdefault(t.id, st.value.value)
    for st in tree.body:
        if (
            isinstance(st, ast.Assign)
            and isinstance(st.value, ast.Constant)
            and isinstance(st.value.value, str)
        ):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = st.value.value
    return out


GLOBAL_CONSTS: dict[str, str] = {}


def _resolve(node: ast.expr | None, consts: dict[str, str]) -> str | None:
    if node is None:
        return None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "_vllm_metric_name"
        and node.args
    ):
        inner = _resolve(node.args[0], consts)
        return None if inner is None else "vllm:" + inner  # tiering/kvcr: f"vllm:{name}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id) or GLOBAL_CONSTS.get(node.id)
    if isinstance(node, ast.Attribute):
        base = node.value
        if isinstance(base, ast.Name):
            key = f"{base.id}.{node.attr}"
            return consts.get(key) or GLOBAL_CONSTS.get(key)
        return consts.get(node.attr)
    if isinstance(node, ast.JoinedStr):
        return ast.unparse(node)[2:-1]  # f"..." -> text with {expr}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _resolve(node.left, consts), _resolve(node.right, consts)
        if a is not None and b is not None:
            return a + b
    return None


def _literals(tree: ast.Module) -> dict[str, list[Any]]:
    """NAME = (literal tuple/list) at module or class level, for bucket constants."""
    out: dict[str, list[Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):
            try:
                val = ast.literal_eval(node.value)
            except Exception:
                continue
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = list(val)
    return out


def _buckets(node: ast.expr | None, lits: dict[str, list[Any]]) -> list[Any] | str | None:
    if node is None:
        return None
    try:
        return list(ast.literal_eval(node))
    except Exception:
        pass
    if isinstance(node, ast.Name) and node.id in lits:
        return lits[node.id]
    return _src(node)


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


@overload
def _src(node: ast.AST) -> str: ...
@overload
def _src(node: ast.AST | None) -> str | None: ...
def _src(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _doc(node: ast.expr | None, consts: dict[str, str]) -> object:
    if node is None:
        return None
    v = _resolve(node, consts)
    if v is not None:
        return v
    if isinstance(node, ast.Constant):
        return str(node.value)
    try:
        return ast.literal_eval(node)
    except Exception:
        return _src(node)


def _py_files(pkg: str) -> Iterator[str]:
    for root, _, files in os.walk(pkg):
        for fn in sorted(files):
            if fn.endswith(".py"):
                yield os.path.join(root, fn)


def _read_tree(path: str) -> ast.Module | None:
    """The file's syntax tree, None when it does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except SyntaxError:
        return None


def _collect_global_consts(pkg: str) -> None:
    """Pass 1: class constants of every file (Metric-name classes are imported across files)."""
    for path in _py_files(pkg):
        tree = _read_tree(path)
        if tree is None:
            continue
        for k, v in _str_consts(tree).items():
            if ("." in k and v.startswith("vllm:")) or v.startswith("vllm:"):
                GLOBAL_CONSTS.setdefault(k, v)


def _definition(
    name: str,
    typ: str,
    call: ast.Call,
    consts: dict[str, str],
    lits: dict[str, list[Any]],
    rel: str,
    line: int,
    how: str,
    multiprocess_mode: str | None = None,
) -> Definition:
    """One family definition found in the source."""
    return dict(
        name=name,
        type=typ,
        help=_doc(_kw(call, "documentation"), consts),
        labelnames=_src(_kw(call, "labelnames")),
        buckets=_buckets(_kw(call, "buckets"), lits),
        multiprocess_mode=multiprocess_mode,
        file=rel,
        line=line,
        how=how,
    )


def _from_constructor(
    node: ast.Call, consts: dict[str, str], lits: dict[str, list[Any]], rel: str
) -> list[Definition]:
    """``Counter(name=..., documentation=..., labelnames=...)`` (or positional arguments)."""
    f = _src(node.func)
    if not CTOR_RE.search(f):
        return []
    nm = _kw(node, "name")
    if nm is None and node.args:
        nm = node.args[0]
    name = _resolve(nm, consts)
    if not name or not name.startswith("vllm:"):
        return []
    tm = TYPE_RE.search(f.split(".")[-1])
    assert tm is not None  # CTOR_RE matched: the last part names the type
    typ = tm.group(1).lower()
    doc = _kw(node, "documentation")
    if doc is None and len(node.args) > 1:
        doc = node.args[1]
    ln = _kw(node, "labelnames")
    if ln is None and len(node.args) > 2:
        ln = node.args[2]
    return [
        dict(
            name=name,
            type=typ,
            help=_doc(doc, consts),
            labelnames=_src(ln),
            buckets=_buckets(_kw(node, "buckets"), lits),
            multiprocess_mode=_src(_kw(node, "multiprocess_mode")),
            file=rel,
            line=node.lineno,
            how="constructor",
        )
    ]


def _from_dict(
    node: ast.Dict, consts: dict[str, str], lits: dict[str, list[Any]], rel: str
) -> list[Definition]:
    """A metadata table: ``{name: Counter(...)}``."""
    out: list[Definition] = []
    for k, v in zip(node.keys, node.values, strict=False):
        name = _resolve(k, consts) if k is not None else None
        if not name or not name.startswith("vllm:") or not isinstance(v, ast.Call):
            continue
        m = TYPE_RE.search(_src(v.func))
        if not m:
            continue
        assert k is not None  # a name was resolved from it
        out.append(
            _definition(name, m.group(1).lower(), v, consts, lits, rel, k.lineno, "metadata table")
        )
    return out


def _from_subscript(
    node: ast.Assign, consts: dict[str, str], lits: dict[str, list[Any]], rel: str
) -> list[Definition]:
    """A metadata table filled one entry at a time: ``table[name] = Counter(...)``."""
    target = node.targets[0]
    assert isinstance(target, ast.Subscript) and isinstance(node.value, ast.Call)  # _definitions
    name = _resolve(target.slice, consts)
    m = TYPE_RE.search(_src(node.value.func))
    if not (name and name.startswith("vllm:") and m):
        return []
    typ = m.group(1).lower()
    return [_definition(name, typ, node.value, consts, lits, rel, node.lineno, "metadata table")]


def _from_tuple(node: ast.Tuple, consts: dict[str, str], rel: str) -> list[Definition]:
    """A ``(name, help)`` tuple."""
    name = _resolve(node.elts[0], consts)
    if not (name and name.startswith("vllm:") and isinstance(node.elts[1], ast.Constant)):
        return []
    return [
        dict(
            name=name,
            type="?",
            help=node.elts[1].value,
            labelnames=None,
            buckets=None,
            multiprocess_mode=None,
            file=rel,
            line=node.lineno,
            how="(name, help) tuple",
        )
    ]


def _definitions(
    node: ast.AST, consts: dict[str, str], lits: dict[str, list[Any]], rel: str
) -> list[Definition]:
    """The family definitions one syntax node makes (none for most)."""
    if isinstance(node, ast.Call):
        return _from_constructor(node, consts, lits, rel)
    if isinstance(node, ast.Dict):
        return _from_dict(node, consts, lits, rel)
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Subscript)
        and isinstance(node.value, ast.Call)
    ):
        return _from_subscript(node, consts, lits, rel)
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        return _from_tuple(node, consts, rel)
    return []


def extract(pkg: str) -> list[Definition]:
    _collect_global_consts(pkg)
    fams: list[Definition] = []
    for root, _, files in os.walk(pkg):
        for fn in sorted(files):
            if not fn.endswith(".py"):
                continue
            path = os.path.join(root, fn)
            rel = os.path.relpath(path, os.path.dirname(pkg))
            tree = _read_tree(path)
            if tree is None:
                continue
            consts = _str_consts(tree)
            lits = _literals(tree)
            for node in ast.walk(tree):
                fams.extend(_definitions(node, consts, lits, rel))
    return fams


def main() -> None:
    pkg, version = sys.argv[1], sys.argv[2]
    fams = extract(os.path.abspath(pkg))
    json.dump({"version": version, "definitions": fams}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
