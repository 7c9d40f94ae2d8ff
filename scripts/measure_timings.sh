#!/usr/bin/env bash
# Measure what the README's first lines quote, into results/timings/ (the README renders them:
# `python -m tools.readme`):
#   main-job.txt    the README's main command on a fresh clone of this checkout's HEAD, set-up included;
#   test-suite.txt  the README's test command in this checkout, once set up.
# Usage: scripts/measure_timings.sh [main-job|test-suite|all]. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=results/timings
mkdir -p "$out"
stamp() { echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "machine: $(nproc) cores, $(uname -m)"; }

if [ "$what" = main-job ] || [ "$what" = all ]; then
  clone=$(mktemp -d)
  git clone -q . "$clone/throughway"
  start=$(date +%s.%N)
  load=$(cut -d' ' -f1 /proc/loadavg)
  (cd "$clone/throughway" && ./scripts/setup.sh && .venv/bin/throughway reproduce mnist-depth --quick) > "$clone/log" 2>&1
  end=$(date +%s.%N)
  { echo "command: ./scripts/setup.sh && .venv/bin/throughway reproduce mnist-depth --quick"
    echo "where: a fresh git clone of $(git rev-parse --short HEAD), set-up included"
    echo "wall_s: $(python3 -c "print(round($end - $start, 1))")"
    echo "load_average_at_start: $load"
    stamp; } > "$out/main-job.txt"
  rm -rf "$clone"
  # the README quotes this file: render it now, or the suite measured next fails its own README check
  ./scripts/setup.sh && .venv/bin/python -m tools.readme README.md
fi

if [ "$what" = test-suite ] || [ "$what" = all ]; then
  ./scripts/setup.sh
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  set +e
  .venv/bin/python -m pytest -q -p no:cacheprovider > /tmp/throughway-suite.log 2>&1
  code=$?
  set -e
  end=$(date +%s.%N)
  { echo "command: ./scripts/setup.sh && .venv/bin/python -m pytest -q"
    echo "summary: $(grep -E '^[0-9]+ (passed|failed)' /tmp/throughway-suite.log | tail -1)"
    echo "exit_code: $code"
    echo "wall_s: $(python3 -c "print(round($end - $start, 1))")"
    echo "load_average_at_start: $load"
    stamp; } > "$out/test-suite.txt"
fi
cat "$out"/*.txt
