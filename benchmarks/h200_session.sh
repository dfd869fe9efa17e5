#!/usr/bin/env bash
# The one H200 session: GPU tests, then the FA2 suite on the sm_80 and sm_75 code paths, then the report.
#   run(command="bash benchmarks/h200_session.sh", carry=[".whl"], timeout_s=600)
# (The whole GPU test suite, in one call of its own: benchmarks/gpu_suite.sh.)
# Optional: FLASHGEN_GIT_COMMIT=<sha> (the device copy has no .git), SESSION_BUDGET_S (default 540),
#   PHASE=tests|bench|all (default all): two back-to-back calls (the machine stays warm 30 s) fit more
#   than one 10-minute call. PYTEST_TARGETS (default: tests) narrows the GPU tests to what changed.
# Every stage runs under `timeout` cut from one deadline, and a failing stage does not stop the next.
# $OUT receives at most 8 files (all at its top level):
#   env.txt  pytest-gpu.log  pytest-gpu.xml  suite.log  <date>-h200-fa2-sm_80.json  <date>-h200-fa2-sm_75.json
#   performance.md
# Copy the two JSON files to benchmarks/results/ and performance.md to docs/ here.
set -u
cd "$(dirname "$0")/.." || exit 1
. benchmarks/device_prelude.sh || exit 1
START=$SECONDS
BUDGET=${SESSION_BUDGET_S:-540}
PHASE=${PHASE:-all}
want() { [ "$PHASE" = all ] || [ "$PHASE" = "$1" ]; }
FG="python3 -m flashgen.cli"
DAY=$(date -u +%F)
J80="benchmarks/results/$DAY-h200-fa2-sm_80.json"
J75="benchmarks/results/$DAY-h200-fa2-sm_75.json"
mkdir -p benchmarks/results

# ---- environment ------------------------------------------------------------------------------
{
  echo "# date: $(date -u +%FT%TZ)  commit: ${FLASHGEN_GIT_COMMIT:-unknown}"
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  nvcc --version | tail -2
  python3 -c "import sys, torch, cupy, triton; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('cupy', cupy.__version__); print('triton', triton.__version__)"
  nproc
} > "$OUT/env.txt" 2>&1
echo "[$((SECONDS - START)) s] environment written"

# ---- warm the compile cache: every suite kernel of both paths, nvcc in parallel (no GPU work) ----
want bench && {
  echo "== compile-only sm_80 path"; timeout 60 $FG bench --suite fa2 --gpu h200 --arch-path sm_80 --compile-only --jobs 8
  echo "== compile-only sm_75 path"; timeout 60 $FG bench --suite fa2 --gpu h200 --arch-path sm_75 --compile-only --jobs 8
} > "$OUT/suite.log" 2>&1
echo "[$((SECONDS - START)) s] suite kernels compiled (see suite.log)"

# ---- GPU tests ---------------------------------------------------------------------------------
if want tests; then
if [ "$PHASE" = tests ]; then T=$(cap 560 0); else T=$(cap 260 230); fi
echo "[$((SECONDS - START)) s] pytest -m gpu (limit ${T} s)"
timeout -s INT -k 15 "$T" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/pytest-gpu.xml" ${PYTEST_TARGETS:-tests} \
  > "$OUT/pytest-gpu.log" 2>&1
echo "pytest exit $? (124: cut at ${T} s)" >> "$OUT/pytest-gpu.log"
tail -3 "$OUT/pytest-gpu.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | head -20
fi
want bench || { echo "[$((SECONDS - START)) s] done (phase $PHASE); files: $(ls "$OUT" | tr '\n' ' ')"; exit 0; }

# ---- FA2 suite, sm_80 code path (the H200's own kernels) ----------------------------------------
if [ "$PHASE" = bench ]; then T=$(cap 330 170); else T=$(cap 150 80); fi
echo "[$((SECONDS - START)) s] fa2 suite, sm_80 path (limit ${T} s)"
{ echo "== fa2 sm_80 path"; timeout -k 10 "$T" $FG bench --suite fa2 --gpu h200 --arch-path sm_80 --min-time 0.1 \
    --out "$J80"; echo "exit $?"; } >> "$OUT/suite.log" 2>&1
tail -4 "$OUT/suite.log"

# ---- FA2 suite, sm_75 code path compiled for sm_90, same shapes (Flex is the same as above: off) ---
T=$(cap 75 10)
echo "[$((SECONDS - START)) s] fa2 suite, sm_75 path (limit ${T} s)"
{ echo "== fa2 sm_75 path"; timeout -k 10 "$T" $FG bench --suite fa2 --gpu h200 --arch-path sm_75 --min-time 0.1 \
    --no-flex --out "$J75"; echo "exit $?"; } >> "$OUT/suite.log" 2>&1
tail -4 "$OUT/suite.log"

# ---- report (the JSON files are rewritten after every kernel, so a cut run still reports) --------
for f in "$J80" "$J75"; do [ -s "$f" ] && cp "$f" "$OUT/"; done
REPORT=()
for f in "$J80" "$J75"; do [ -s "$f" ] && [ "$(head -c 2 "$f")" != "{}" ] && REPORT+=("$f"); done
if [ ${#REPORT[@]} -gt 0 ]; then
  timeout 30 $FG bench report "${REPORT[@]}" --doc "$OUT/performance.md" 2>&1 | tail -12
else
  echo "no suite results to report"
fi
echo "[$((SECONDS - START)) s] done; files: $(ls "$OUT" | tr '\n' ' ')"
