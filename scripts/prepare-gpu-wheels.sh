#!/usr/bin/env bash
# Fetch, on a machine with a network, the wheels bench/gpu_check.py needs on a GPU machine without one, into .whl/
# (git-ignored; it travels with the working tree when named in the device tool's `carry`, 64 MiB at most in all).
# bench/gpu_check.py installs them there with `pip install --no-index --no-deps --target DIR` and puts DIR on
# PYTHONPATH (`--wheels`, default .whl/ when it exists). docs/engine.md, "On a GPU", says how it is run.
#
# Which: every module the engine and the check import beyond the standard library and torch, less what the GPU
# image already has. The engine imports torch, rustbpe and tiktoken (tiktoken needs regex and requests); the check's
# NVML probe imports pynvml (nvidia-ml-py). The lent image ('cuda': CPython 3.12, x86-64, torch 2.11 + CUDA 13;
# its package list read 2026-11-17) has tiktoken 0.14.0, regex, requests, nvidia-ml-py and psutil, but not
# rustbpe: so rustbpe, at the version this checkout runs (the tokenizer it trains is part of the references'
# fingerprint). The check's preflight names any module still missing there, before anything runs on it.
#
#   scripts/prepare-gpu-wheels.sh [--python-version 3.12] [--dest DIR] [NAME==VERSION ...]
#
# Extra NAME==VERSION arguments are fetched too (without their dependencies: name each one). One version of each
# name is kept (two would stop the whole install there).
set -euo pipefail
cd "$(dirname "$0")/.."

py_version="3.12"
dest=".whl"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) py_version="$2"; shift 2 ;;
    --dest) dest="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "prepare-gpu-wheels.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done

python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
# the rustbpe this checkout runs (scripts/setup.sh installs it), else the one pyproject.toml asks for at least
rustbpe_version="$("$python" -c 'import importlib.metadata as m; print(m.version("rustbpe"))' 2>/dev/null || echo 0.1.0)"
wanted=("rustbpe==${rustbpe_version}" "${extra[@]}")

mkdir -p "$dest"
for req in "${wanted[@]}"; do
  name="${req%%==*}"
  if [ "$name" = "$req" ]; then
    echo "prepare-gpu-wheels.sh: '$req' has no version: give NAME==VERSION" >&2; exit 2
  fi
  # one version of each: drop what an earlier run fetched for this name (wheel names use _ for - and .)
  norm="$(echo "$name" | tr '.-' '__')"
  rm -f "$dest/${norm}"-*.whl
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$py_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dest" "$req"
done

bytes="$(du -cb "$dest"/*.whl | tail -1 | cut -f1)"
ls -l "$dest"/*.whl | awk '{print "  " $NF " (" $5 " bytes)"}'
echo "prepared $(ls "$dest"/*.whl | wc -l) wheel(s) in $dest/: ${bytes} bytes ($((bytes / 1024)) KiB) for CPython ${py_version} x86-64"
if [ "$bytes" -gt $((48 * 1024 * 1024)) ]; then
  echo "prepare-gpu-wheels.sh: $dest holds more than 48 MiB; the whole working tree that travels must stay under 64 MiB" >&2
  exit 1
fi
