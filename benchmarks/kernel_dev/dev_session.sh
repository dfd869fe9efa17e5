#!/usr/bin/env bash
# One device call of kernel development on the H200: GPU tests of the translator (TESTS), tile sweeps beside
# FLASH (SWEEP_D64 / SWEEP_D128: comma-separated BMxBNwWqQsS configs, empty to skip) and Nsight Compute's
# warp-state view of one of our kernels next to FLASH (NCU_CONFIG, empty to skip). Everything lands in $OUT.
#   run(command="SWEEP_D128=... bash benchmarks/kernel_dev/dev_session.sh", carry=[".whl"])
set -u
cd "$(dirname "$0")/../.." || exit 1
START=$SECONDS
OUT=${OUT:-/tmp/flashgen-dev}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || { echo "wheel install failed"; exit 1; }
export PYTHONUNBUFFERED=1 FLASHGEN_HOME=/tmp/flashgen-home
t() { echo "[$((SECONDS - START)) s] $*"; }

TESTS=${TESTS-tests/test_tile_params_gpu.py tests/test_kernel_gpu.py}
if [ -n "$TESTS" ]; then
  t "pytest -m gpu $TESTS"
  timeout -s INT -k 10 "${TESTS_LIMIT:-200}" python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$OUT/pytest.log" 2>&1
  echo "pytest exit $?" >> "$OUT/pytest.log"; tail -3 "$OUT/pytest.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head
fi
for d in 64 128; do
  var="SWEEP_D$d"; configs=${!var-}
  [ -n "$configs" ] || continue
  t "sweep d$d: $configs"
  timeout -k 10 "${SWEEP_LIMIT:-150}" python3 benchmarks/kernel_dev/sweep.py --d "$d" --configs "$configs" \
    --n "${SWEEP_N:-512,2048,8192}" --masks "${SWEEP_MASKS:-plain,causal}" --dtypes "${SWEEP_DTYPES:-bf16}" \
    --out "$OUT/sweep_d$d.json" > "$OUT/sweep_d$d.log" 2>&1
  echo "exit $?" >> "$OUT/sweep_d$d.log"; grep -E "geomean|exit|Error" "$OUT/sweep_d$d.log"
done
if [ -n "${NCU_CONFIG-}" ] && command -v ncu > /dev/null; then
  t "ncu $NCU_CONFIG"
  for k in fg_ flash_fwd; do
    timeout -k 10 "${NCU_LIMIT:-90}" ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:$k" \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      python3 benchmarks/kernel_dev/ncu_one.py --config "$NCU_CONFIG" --d "${NCU_D:-128}" --n "${NCU_N:-4096}" --flash
  done > "$OUT/ncu.txt" 2>&1
  echo "ncu exit $?" >> "$OUT/ncu.txt"; tail -2 "$OUT/ncu.txt"
fi
t "done; files: $(ls "$OUT" | tr '\n' ' ')"
