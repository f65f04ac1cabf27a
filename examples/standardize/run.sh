#!/usr/bin/env bash
# Raw-scale features, privately released statistics, standardised by hand: one JSON line of
# test R^2 (README.md). Runs compare.py with $PYTHON, else the first .venv/bin/python in the
# folders above this one, else python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  dir="$here"
  while [[ "$dir" != / && -z "$python" ]]; do
    [[ -x "$dir/.venv/bin/python" ]] && python="$dir/.venv/bin/python"
    dir="$(dirname "$dir")"
  done
fi
cd "$here"
exec "${python:-python3}" compare.py "$@"
