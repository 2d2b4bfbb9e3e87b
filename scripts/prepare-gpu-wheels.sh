#!/usr/bin/env bash
# Fetch, on a machine with a network, the wheels bench/gpu_check.py needs on a GPU machine without one, into .whl/
# (git-ignored; it travels with the working tree when named in the device tool's `carry`, 64 MiB at most in all).
# bench/gpu_check.py installs them there with `pip install --no-index --no-deps --target DIR` and puts DIR on
# PYTHONPATH (`--wheels`, default .whl/ when it exists). docs/engine.md, "On a GPU", says how it is run.
#
# Which: bench/gpu_preflight.py --fetch-list, declared there once (NEEDED: every module the engine and the check
# import beyond the standard library and torch; IMAGE_HAS: what the lent image, 'cuda': CPython 3.12, x86-64,
# torch 2.11 + CUDA 13, already holds), at the versions this checkout runs. Today msgspec and rustbpe. The check's
# preflight names any module still missing there, before anything runs on it.
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
# a command substitution, not `< <(...)`: set -e stops the script when the list cannot be made (a process
# substitution's failure is ignored, and the script would fetch nothing and say it prepared what was asked)
needed_text="$("$python" bench/gpu_preflight.py --fetch-list)"
mapfile -t needed <<< "$needed_text"
wanted=("${needed[@]}" "${extra[@]}")

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
