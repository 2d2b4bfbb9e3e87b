#!/usr/bin/env bash
# Create ./.venv and install undervolt-tuner into it (editable), with its stress engine (the `engine` extra: torch
# and the tokenizer). `--test` adds the test tools. A system-wide install is scripts/install-system.sh.
#
# torch: by default the CPU wheel (small, enough for the simulated GPU and for the test suite). On a GPU box,
# install the torch build for your GPU into .venv first and run with TUNER_TORCH=keep (see README).
set -euo pipefail
cd "$(dirname "$0")/.."

extras="[engine]"
if [ "${1:-}" = "--test" ]; then extras="[engine,test]"; fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

torch_pin="torch==2.13.0+cpu"
case "${TUNER_TORCH:-cpu}" in
  keep) ;;  # use the torch already installed in .venv (CUDA or ROCm build)
  cpu)
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
      # A local wheel or mirror first (fast, offline CI); else PyTorch's CPU index. A bare `torch` from PyPI
      # would pull a multi-GB CUDA build.
      pip install -q "$torch_pin" 2>/dev/null \
        || pip install -q --index-url https://download.pytorch.org/whl/cpu "$torch_pin"
    fi ;;
  *) echo "scripts/setup.sh: TUNER_TORCH must be 'cpu' or 'keep'" >&2; exit 2 ;;
esac
pip install -q -e ".${extras}"
# Byte-compile the package now: an editable install leaves it to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (CI images, some containers) every `tuner` and engine process would compile it
# again (about half of a CLI start: 0.28 -> 0.14 CPU-s). A stale file is only ever ignored, never used.
.venv/bin/python -m compileall -q -j 0 tuner >/dev/null
echo "installed: $(.venv/bin/tuner --version) in $(pwd)/.venv" >&2
