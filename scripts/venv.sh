#!/usr/bin/env bash
# Make `.venv` point at a virtual environment built from requirements-dev.txt, or, given
# `docs`, make `.venv-docs` point at one built from requirements-docs.txt (the site's
# generator only: no torch, so `make docs` needs no 5 GB download).
# Each environment lives under ~/.cache/trash-panda, keyed by the hash of its pins,
# so a fresh clone reuses it instead of downloading again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
case "${1:-dev}" in
  dev) reqs=requirements-dev.txt link=.venv prefix=venv note=" (torch is large: a few minutes the first time)" ;;
  docs) reqs=requirements-docs.txt link=.venv-docs prefix=docs-venv note="" ;;
  *) echo "venv.sh: unknown environment '$1' (dev or docs)" >&2; exit 2 ;;
esac
hash=$( (cat "$reqs"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
cache=${TRASH_PANDA_VENV_CACHE:-$HOME/.cache/trash-panda}
venv="$cache/$prefix-$hash"
if [ ! -f "$venv/.complete" ]; then
  echo "venv: building $venv$note"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$reqs"
  touch "$venv/.complete"
fi
if [ -e "$link" ] && [ "$(readlink "$link" 2>/dev/null)" != "$venv" ]; then
  rm -rf "$link"
fi
[ -e "$link" ] || ln -s "$venv" "$link"
