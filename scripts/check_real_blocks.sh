#!/usr/bin/env bash
# Build a separate virtual environment with the real timm, torchvision and transformers (timm and
# torchvision pull a torch of their own, so never the project's .venv, never CI), install this checkout's
# package into it without dependencies, and run scripts/check_real_blocks.py there: its report goes to
# results/real-blocks/<date>/ (or --out=DIR).
#
#   scripts/check_real_blocks.sh [--venv=/tmp/real-blocks-venv] [--out=DIR] [--models=NAME,NAME] [--update]
#
# --update reruns only --models and replaces their rows in DIR/report.json (needs --out=DIR).
#
# The pip install downloads torch 2.14.1 with its CUDA libraries (a few GB) the first time; a venv that
# already has the pinned versions is reused.
set -euo pipefail
INVOKED_FROM=$PWD
cd "$(dirname "$0")/.."
VENV=/tmp/real-blocks-venv
ARGS=()
for arg in "$@"; do
  case $arg in
    --venv=*) VENV=${arg#*=} ;;
    --out=*) ARGS+=("--out" "$(cd "$INVOKED_FROM" && realpath -m "${arg#*=}")") ;;
    --models=*) ARGS+=("--models" "${arg#*=}") ;;
    --update) ARGS+=("--update") ;;
    *) echo "check_real_blocks.sh: unknown argument '$arg'; accepted: --venv=PATH --out=DIR --models=NAME,NAME --update" >&2; exit 2 ;;
  esac
done
case $VENV in
  "$PWD"|"$PWD"/.venv|"$PWD"/.venv/*) echo "check_real_blocks.sh: --venv=$VENV: give a path outside the project's .venv" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$python" -m venv "$VENV"
PINS=(torch==2.14.1 torchvision==0.29.1 timm==1.0.31 transformers==5.24.0)
if ! "$VENV/bin/python" -m pip freeze 2>/dev/null | grep -qx "timm==1.0.31"; then
  "$VENV/bin/python" -m pip install --quiet "${PINS[@]}"
fi
# the package only (its own dependencies numpy, safetensors, tqdm, filelock come with the pins above)
"$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall .
export REAL_BLOCKS_COMMAND="scripts/check_real_blocks.sh $*"
cd /tmp  # import the installed package, not ./src
exec "$VENV/bin/python" "$OLDPWD/scripts/check_real_blocks.py" "${ARGS[@]}"
