#!/usr/bin/env bash
# Make `.venv` point at a virtual environment built from requirements-dev.txt.
# The environment lives under ~/.cache/trash-panda, keyed by the hash of the pins,
# so a fresh clone reuses it instead of downloading torch again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
hash=$( (cat requirements-dev.txt; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
cache=${TRASH_PANDA_VENV_CACHE:-$HOME/.cache/trash-panda}
venv="$cache/venv-$hash"
if [ ! -f "$venv/.complete" ]; then
  echo "venv: building $venv (torch is large: a few minutes the first time)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r requirements-dev.txt
  touch "$venv/.complete"
fi
if [ -e .venv ] && [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
fi
[ -e .venv ] || ln -s "$venv" .venv
