#!/usr/bin/env bash
# On a machine with one GPU: every GPU and kernel test, the ahead-of-time builds, and every
# benchmark, in one go (a few minutes), written to a report.
#   bash scripts/gpu_check.sh [REPORT]     (default: artifacts/gpu_report.txt)
# Uses ./.venv when present (made by ./course test), else the current python.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}; [ -x .venv/bin/python ] && PY=.venv/bin/python
REPORT=${1:-artifacts/gpu_report.txt}
mkdir -p "$(dirname "$REPORT")"
status=0
{
  echo "== memlab GPU check, $(date -u +%FT%TZ)"
  "$PY" -m memlab doctor || status=1
  echo; echo "== kernel and GPU tests"
  timeout 150 "$PY" -m pytest -q -m "kernel or gpu" -p no:cacheprovider || status=1
  for b in "bench/bench_alloc.py --sweep" "bench/bench_engine.py --attention triton" "bench/bench_engine.py" \
           "bench/bench_block_pool.py"; do
    [ -f "${b%% *}" ] || continue
    echo; echo "== $b"
    timeout 60 "$PY" $b || status=1
  done
  echo; echo "== exit status $status"
} 2>&1 | tee "$REPORT"
exit $status
