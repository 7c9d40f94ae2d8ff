#!/usr/bin/env bash
# One GPU window of issue 35, every output under $OUT (docs/benchmarks.md, "On a GPU"):
#   (a) the GPU-marked tests, (b) a WRN-28-10 gated step against a hand-written loop, (c) the Table 1
#   protocol timed per depth and projected, (d) the next unfinished shard of the conv highway table,
#   then summary.md. Each part runs under its own `timeout`, so one failure cannot eat the window;
#   the highway shard gets what is left of the budget and stops its runs at an epoch's end before it.
#
#   OUT=/some/folder scripts/device_check.sh [--budget-s=480] [--data-dir=.throughway-data] [--tests=EXPR] [--compile-protocol]
#                                            [--parts=LIST] [--studies-s=SECONDS] [--resume-studies=DIR]
#                                            [--study-options=defaults|baby-gpt] [--dry-run]
#
# --parts=LIST: the parts to run, comma-separated, in this script's order whatever the list's
#   (default device,gpu-tests,wrn,protocol,highway,summary); also: profile (one captured protocol epoch
#   profiled at d = 50 and 100), conv (the conv highway step in fp32, channels_last and bf16), studies
#   (the layer-dropping studies trained on the GPU, --studies-s seconds, default what is left less 20;
#   resumed from --resume-studies=DIR, a former window's unpacked studies.tar.gz; --study-options=baby-gpt
#   trains the language-model study at nanoGPT's baby-GPT scale instead of its defaults).
#
# --tests=EXPR: only the GPU tests pytest's `-k EXPR` selects (a later window re-checks what changed).
# --compile-protocol: the protocol's step compiled by torch.compile inside the captured graph, one block
#   compiled and reused by every block (`compile="blocks"`: compilation about constant in depth).
# --dry-run: every part with tiny sizes on the CPU in seconds (tests/test_device_check.py), no GPU tests.
#
# A relative OUT is relative to the folder the script is started from (resolved before the script
# changes to the repository's root). An OUT that already holds a window's outputs is refused (exit 2):
# a second window would overwrite the first one's log, summary and run archive.
set -u
: "${OUT:?set OUT to the folder the outputs go to}"
case $OUT in /*) ;; *) OUT="$PWD/$OUT" ;; esac
cd "$(dirname "$0")/.."
BUDGET_S=480
DATA_DIR=${THROUGHWAY_DATA:-.throughway-data}
DRY=""
TESTS=""
COMPILE=""
PARTS=device,gpu-tests,wrn,protocol,highway,summary
STUDIES_S=""
RESUME_STUDIES=""
STUDY_OPTIONS=defaults
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=--dry-run ;;
    --budget-s=*) BUDGET_S=${arg#*=} ;;
    --data-dir=*) DATA_DIR=${arg#*=} ;;
    --tests=*) TESTS=${arg#*=} ;;
    --compile-protocol) COMPILE="--compile blocks" ;;
    --parts=*) PARTS=${arg#*=} ;;
    --studies-s=*) STUDIES_S=${arg#*=} ;;
    --resume-studies=*) RESUME_STUDIES=${arg#*=} ;;
    --study-options=*) STUDY_OPTIONS=${arg#*=} ;;
    *) echo "device_check.sh: unknown argument '$arg'; accepted: --budget-s=SECONDS --data-dir=PATH --tests=EXPR --compile-protocol --parts=LIST --studies-s=SECONDS --resume-studies=DIR --study-options=NAME --dry-run" >&2; exit 2 ;;
  esac
done
case $BUDGET_S in ''|*[!0-9]*) echo "device_check.sh: --budget-s=$BUDGET_S: accepted: a whole number of seconds" >&2; exit 2 ;; esac
case $STUDIES_S in *[!0-9]*) echo "device_check.sh: --studies-s=$STUDIES_S: accepted: a whole number of seconds" >&2; exit 2 ;; esac
for name in ${PARTS//,/ }; do
  case $name in device|gpu-tests|wrn|protocol|highway|profile|conv|studies|summary) ;;
    *) echo "device_check.sh: --parts: unknown part '$name'; accepted: device gpu-tests wrn protocol highway profile conv studies summary" >&2; exit 2 ;;
  esac
done
case $STUDY_OPTIONS in defaults|baby-gpt) ;; *) echo "device_check.sh: --study-options=$STUDY_OPTIONS: accepted: defaults baby-gpt" >&2; exit 2 ;; esac
want() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# A window's outputs (device_check.py's OUTPUT_FILES; tests/test_device_check.py checks the two lists agree).
OUTPUT_FILES="device.json device_check.log protocol.json wrn.json highway_shard.json highway_runs.tar.gz summary.md profile.json conv.json studies.tar.gz"
for name in $OUTPUT_FILES; do
  if [ -e "$OUT/$name" ] || [ -L "$OUT/$name" ]; then
    echo "device_check.sh: OUT=$OUT already holds $name, a window's output; refused, nothing was changed: give an empty or new folder" >&2
    exit 2
  fi
done
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: >"$LOG"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
smaller() { if (( $1 < $2 )); then echo "$1"; else echo "$2"; fi; }

part() {  # part NAME LIMIT_S COMMAND...: run COMMAND under `timeout`, its output into the log
  local name=$1 limit=$2 began
  shift 2
  if (( limit < 5 )); then
    echo "== $name: skipped, $limit s of the budget left" >>"$LOG"
    return
  fi
  echo "== $name: limit $limit s, started $(date -u +%H:%M:%S)" >>"$LOG"
  began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local code=$?
  echo "== $name: exit $code after $(( $(date +%s) - began )) s$([ $code = 124 ] && echo ' (time limit)')" >>"$LOG"
}

want device && part device 30 "$PY" scripts/device_check.py device --out "$OUT" $DRY
if [ -n "$DRY" ]; then
  echo "== gpu-tests: not run in a dry run" >>"$LOG"
elif want gpu-tests; then
  part gpu-tests "$(smaller 110 "$(left)")" "$PY" -m pytest -q -n 0 -m gpu -p no:cacheprovider ${TESTS:+-k "$TESTS"} \
    tests/test_cuda_path.py tests/test_lagged_loss_read.py
fi
# The WRN step first: it takes seconds. The protocol times every depth alone, then all of them at once
# (--concurrent: one CUDA stream each). Its step is captured with eager kernels unless
# --compile-protocol: window h200-2026-11-26-b compiled the whole unrolled step, 17-65 s per depth, about
# what it saves over 100 epochs, and it ate that window (results/device-check/COMMAND.txt).
want wrn && part wrn "$(smaller 100 $(( $(left) - 60 )))" "$PY" scripts/device_check.py wrn --out "$OUT" $DRY
want profile && part profile "$(smaller 60 $(( $(left) - 60 )))" "$PY" scripts/device_check.py profile --out "$OUT" $DRY
want conv && part conv "$(smaller 60 $(( $(left) - 60 )))" "$PY" scripts/device_check.py conv --out "$OUT" $DRY
want protocol && part protocol "$(smaller 150 $(( $(left) - 60 )))" "$PY" scripts/device_check.py protocol --out "$OUT" --concurrent $COMPILE $DRY
DATA_ARG=()
[ -z "$DRY" ] && DATA_ARG=(--data-dir "$DATA_DIR")
if want studies; then
  STUDY_BUDGET=${STUDIES_S:-$(( $(left) - 20 ))}
  (( STUDY_BUDGET > $(left) - 20 )) && STUDY_BUDGET=$(( $(left) - 20 ))
  part studies "$(( STUDY_BUDGET + 15 ))" "$PY" scripts/device_check.py studies --out "$OUT" --budget-s "$STUDY_BUDGET" \
    "${DATA_ARG[@]}" ${RESUME_STUDIES:+--resume-from "$RESUME_STUDIES"} --study-options "$STUDY_OPTIONS" $DRY
fi
HIGHWAY_S=$(( $(left) - 25 ))
(( HIGHWAY_S < 30 )) && HIGHWAY_S=-15  # under half a minute left: skipped (no run could finish an epoch)
want highway && part highway "$(( HIGHWAY_S + 15 ))" "$PY" scripts/device_check.py highway --out "$OUT" --budget-s "$HIGHWAY_S" \
  "${DATA_ARG[@]}" $DRY
want summary && part summary 15 "$PY" scripts/device_check.py summary --out "$OUT" --parts "$PARTS"
echo "== done after $(( $(date +%s) - START )) s of a $BUDGET_S s budget" >>"$LOG"
cat "$OUT/summary.md" 2>/dev/null
