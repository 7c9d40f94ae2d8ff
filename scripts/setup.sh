#!/usr/bin/env bash
# Set up throughway in .venv inside this checkout. Idempotent: when pyproject.toml has not changed
# since the last successful run it only checks the stamp and returns (about a second).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: throughway needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

stamp=.venv/.throughway-setup-stamp
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing into .venv (torch 2.13.0 first, so that nothing pulls another build)" >&2
  .venv/bin/python -m pip install --quiet torch==2.13.0
  .venv/bin/python -m pip install --quiet -e ".[dev]"  # tests, docs build, ruff and mypy (.ci/run)
  echo "$want" > "$stamp"
fi
