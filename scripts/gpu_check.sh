#!/usr/bin/env bash
# memlab's GPU check: on any machine with a CUDA GPU, in under 4 minutes, everything that needs
# one, written to one report.
#
#   bash scripts/gpu_check.sh [REPORT]          run it (default report: artifacts/gpu_report.txt)
#   bash scripts/gpu_check.sh --dry-run         show each command and check that it exists (no GPU needed)
#   bash scripts/gpu_check.sh --fetch-wheels [X.Y] [DIR]   download the extra packages as wheels (see below)
#
# Phases 1-3 run at once, each under its own time limit; phase 4 runs alone afterwards so that
# its timings are not disturbed:
#   1. every kernel and GPU-only test      pytest -m "kernel or gpu": the kernels compiled against
#                                           their references, the ahead-of-time compile check
#                                           (tests/tools/compile_kernels.py, sm_75 and sm_90) and the
#                                           JIT's own count of compiled variants
#   2. the graded GPU points, solutions     python -m memlab.grade --solutions
#   3. every chapter headless               scripts/run_notebooks.py --jobs 6
#   4. the kernel benchmarks                bench/bench_kernels.py: triton.testing.do_bench,
#                                           microseconds, each kernel beside its torch reference
#                                           and SGLang 0.5.23's allocator kernels beside memlab's
# The report ends with a summary: each phase's status and seconds, the GPU points, the table.
# Exit status: 0 everything passed; 1 a phase failed or timed out; 2 no CUDA device (nothing
# run); 3 a command is missing.
#
# Python: $PYTHON, else ./.venv/bin/python, else python3. Phases 1, 2 and 4 need torch, triton,
# pytest and hypothesis; phase 3 also needs nbclient, nbformat, ipykernel, jupytext, ipywidgets,
# tqdm and matplotlib, and phase 1 uses pytest-xdist when it is there. A GPU machine without
# network (torch, Triton, pytest, hypothesis and matplotlib installed, nothing else) gets the
# rest as wheels:
#   1. on a machine with network, for the GPU machine's Python version (python3 -V there):
#        bash scripts/gpu_check.sh --fetch-wheels 3.12        # pip download into ./gpu-wheels/
#      (unsure of the version? --fetch-wheels "3.10 3.11 3.12 3.13": about 20 MB more per version)
#      It also puts SGLang 0.5.23's wheel (39 MB, any Python: only its Triton file is read) in
#      gpu-wheels/engines/, the cache of tests/tools/engines/wheels.py for phases 1 and 4; it is never
#      installed. Without it the benchmark times memlab's kernels only and says so.
#   2. bring gpu-wheels/ along (it is in .gitignore: carry it with the working tree);
#   3. this script installs them without network before it starts:
#        python -m pip install --no-index --no-deps --find-links gpu-wheels --target .gpu-site NAMES...
#      and puts .gpu-site on PYTHONPATH, ahead of the installed packages: keep the folder to
#      these packages and their dependencies (--fetch-wheels never brings torch or numpy).
# A phase whose packages are missing is reported as skipped, not failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WHEELS=${MEMLAB_GPU_WHEELS:-$ROOT/gpu-wheels}
SITE=${MEMLAB_GPU_SITE:-$ROOT/.gpu-site}
EXTRA=(nbclient nbformat ipykernel jupytext ipywidgets tqdm pytest-xdist)
# Seconds: phases 1-3 together, then phase 4, leave a minute to spare in the 4-minute budget.
T_TESTS=${MEMLAB_T_TESTS:-150}; T_GRADE=${MEMLAB_T_GRADE:-150}; T_CHAPTERS=${MEMLAB_T_CHAPTERS:-150}
T_BENCH=${MEMLAB_T_BENCH:-45}

PY=${PYTHON:-}
if [ -z "$PY" ]; then PY=python3; [ -x .venv/bin/python ] && PY=$ROOT/.venv/bin/python; fi

if [ "${1:-}" = --fetch-wheels ]; then
  versions=${2:-3.12}; dest=${3:-$WHEELS}
  mkdir -p "$dest"
  # Every dependency too (no --no-deps here), as binary wheels for each Python on x86-64 Linux;
  # one folder may hold several versions ("3.11 3.12"): the install below picks the right one.
  for v in $versions; do
    "$PY" -m pip download -q --only-binary=:all: --implementation cp --python-version "$v" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      --platform any -d "$dest" "${EXTRA[@]}" || exit 1
  done
  # SGLang's wheel for the benchmark, through the engines' own download (tests/tools/engines/wheels.py).
  MEMLAB_ENGINES_CACHE="$dest/engines" "$PY" -c 'import runpy; wheels = runpy.run_path("tests/tools/engines/wheels.py")
print("gpu_check: SGLang for the benchmark:", wheels["wheel"]("sglang"))' || exit 1
  echo "gpu_check: $(ls "$dest" | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1)) for Python $versions"
  exit 0
fi

DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
REPORT=${1:-artifacts/gpu_report.txt}

# The extra packages from the wheels folder, when there is one (no network needed).
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  if [ ! -f "$SITE/.done" ] || [ "$(ls "$WHEELS" | cksum)" != "$(cat "$SITE/.done")" ]; then
    rm -rf "$SITE"
    # By name from the folder, so that pip picks each package's wheel for this Python.
    names=$(ls "$WHEELS"/*.whl | sed 's#.*/##; s/-.*//' | sort -u)
    # shellcheck disable=SC2086
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$SITE" $names \
      && ls "$WHEELS" | cksum > "$SITE/.done" || echo "gpu_check: installing $WHEELS failed" >&2
  fi
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
  export JUPYTER_PATH="$SITE/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
fi
# memlab without installing it: PYTHONPATH gets a folder holding only a link named memlab, never
# the repository itself (its kernels/ folder would hide an installed package of that name).
LINKS=$(mktemp -d)
ln -s "$ROOT/memlab" "$LINKS/memlab"
export PYTHONPATH="$LINKS${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
# SGLang's wheel, brought along (--fetch-wheels), is the engines' cache; pip gives up at once
# rather than retrying for a minute where there is no network.
compgen -G "$WHEELS/engines/sglang-*.whl" >/dev/null && export MEMLAB_ENGINES_CACHE="$WHEELS/engines"
export PIP_RETRIES=${PIP_RETRIES:-0} PIP_TIMEOUT=${PIP_TIMEOUT:-5}

has() { "$PY" -c "import $1" >/dev/null 2>&1; }
# One Python start for every optional package (each start imports little, but machines are busy).
read -r NB_OK XDIST_OK < <("$PY" - <<'EOF' 2>/dev/null || echo "0 0"
import importlib.util as u
have = lambda *ms: all(u.find_spec(m) for m in ms)
print(int(have("nbclient", "nbformat", "ipykernel", "jupytext", "ipywidgets", "tqdm", "matplotlib")), int(have("xdist")))
EOF
)
XDIST=(); [ "$XDIST_OK" = 1 ] && XDIST=(-n 6)
TEST_CMD=("$PY" -m pytest -q -m "kernel or gpu" -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"})
GRADE_CMD=("$PY" -m memlab.grade --solutions --quiet)
CHAPTERS_CMD=("$PY" scripts/run_notebooks.py --jobs 6 --timeout 120)
BENCH_CMD=("$PY" bench/bench_kernels.py)

if [ $DRY = 1 ]; then
  missing=0
  check() { if "$@" >/dev/null 2>&1; then echo "  ok       $label"; else echo "  MISSING  $label"; missing=1; fi; }
  echo "gpu_check dry run: python $PY; report would go to $REPORT"
  label="python ($PY) with torch, triton, pytest, hypothesis"; check has "torch, triton, pytest, hypothesis"
  label="timeout (coreutils)"; check command -v timeout
  for f in scripts/run_notebooks.py bench/bench_kernels.py tests/exercises; do label=$f; check test -e "$f"; done
  label="memlab.grade, memlab.common.env"; check has "memlab.grade, memlab.common.env"
  label="tests marked kernel or gpu"; check grep -rqlE "mark\.(kernel|gpu)|pytestmark.*(kernel|gpu)" tests
  label="compile check: tests/tools/compile_kernels.py, tests/kernels/test_compile.py"
  check test -e tests/tools/compile_kernels.py -a -e tests/kernels/test_compile.py
  if sglang=$("$PY" -c 'import runpy, sys; wheels = runpy.run_path("tests/tools/engines/wheels.py")
found = sorted(wheels["cache_dir"]().glob("sglang-%s-*.whl" % wheels["ENGINES"]["sglang"]))
print(found[0]) if found else sys.exit(1)' 2>/dev/null); then echo "  ok       SGLang's wheel for the benchmark: $sglang"
  else echo "  skip     SGLang's wheel missing: the benchmark would time memlab's kernels only (bash $0 --fetch-wheels)"; fi
  if [ $NB_OK = 1 ]; then echo "  ok       chapter packages (nbclient, ipykernel, jupytext, ipywidgets...)"
  else echo "  skip     chapter packages missing: phase 3 would be skipped (bash $0 --fetch-wheels)"; fi
  [ ${#XDIST[@]} -gt 0 ] && echo "  ok       pytest-xdist" || echo "  note     no pytest-xdist: the tests run in one process"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "  ok       $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS installed in $SITE (on PYTHONPATH)"
  fi
  echo "phases:"
  printf '  1 (%ss) at once:  %s\n' "$T_TESTS" "$(printf '%q ' "${TEST_CMD[@]}")"
  printf '  2 (%ss) at once:  %s\n' "$T_GRADE" "$(printf '%q ' "${GRADE_CMD[@]}")"
  printf '  3 (%ss) at once:  %s\n' "$T_CHAPTERS" "$(printf '%q ' "${CHAPTERS_CMD[@]}")"
  printf '  4 (%ss) alone:    %s\n' "$T_BENCH" "$(printf '%q ' "${BENCH_CMD[@]}")"
  [ $missing = 0 ] && echo "every command is there" || echo "some commands are missing"
  exit $((missing ? 3 : 0))
fi

mkdir -p "$(dirname "$REPORT")"
HEAD="== memlab GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  { echo "$HEAD"
    echo "no CUDA device here (or no torch in $PY): nothing was run. This check needs a GPU;"
    echo "without one, ./course test runs the kernels in Triton's interpreter."; } | tee "$REPORT"
  exit 2
fi
{ echo "$HEAD"; "$PY" -m memlab doctor; } > "$REPORT" 2>&1
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

phase() {  # phase NAME LIMIT CMD...: run CMD under a time limit, log it, record status and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$rc $((SECONDS - t0))" > "$LOGS/$name.rc"
}
phase tests "$T_TESTS" "${TEST_CMD[@]}" &
phase grade "$T_GRADE" "${GRADE_CMD[@]}" &
if [ $NB_OK = 1 ]; then phase chapters "$T_CHAPTERS" "${CHAPTERS_CMD[@]}" &
else echo "skipped: nbclient, ipykernel, jupytext or ipywidgets missing (bash $0 --fetch-wheels)" > "$LOGS/chapters.log"; fi
wait
phase bench "$T_BENCH" "${BENCH_CMD[@]}"

failed=0
{
  for name in tests grade chapters bench; do
    echo; echo "== $name"; cat "$LOGS/$name.log"
  done
  echo; echo "== summary"
  for name in tests grade chapters bench; do
    if [ -f "$LOGS/$name.rc" ]; then
      read -r prc psecs < "$LOGS/$name.rc"
      # The grader exits 1 when points are lost: for the solutions that is a failure too.
      case $prc in 0) st=passed ;; 124|137) st="TIMED OUT"; failed=1 ;; *) st="FAILED (exit $prc)"; failed=1 ;; esac
      printf '%-10s %-18s %4ss\n' "$name" "$st" "$psecs"
    else
      printf '%-10s %-18s\n' "$name" "skipped"
    fi
  done
  grep -E "total \(CPU\)|GPU-only" "$LOGS/grade.log" | sed 's/^ */grade: /'
  gpu=$(sed -n 's/^ *GPU-only *\([0-9]*\)\/\([0-9]*\).*/\1 \2/p' "$LOGS/grade.log")
  if [ -z "$gpu" ] || [ "${gpu% *}" != "${gpu#* }" ]; then echo "grade: the solutions did not earn every GPU point"; failed=1; fi
  grep -E "passed|failed" "$LOGS/tests.log" | tail -1 | sed 's/^/tests: /'
  grep -E "^total" "$LOGS/chapters.log" | sed 's/^/chapters: /'
  echo "kernel benchmarks:"; sed 's/^/  /' "$LOGS/bench.log"
  echo "== exit status $failed"
} >> "$REPORT" 2>&1
echo "gpu_check: report in $REPORT"
sed -n '/^== summary/,$p' "$REPORT"
exit $failed
