#!/usr/bin/env bash
# Session 11, device call 5, from the repo root with carry [".whl"], under one deadline (BUDGET, default 480 s):
# 1. the GPU tests of every kernel the L2-bounded groups changed (the kernel-hash test's list: the sm90 kernels of
#    the call-time, FA2-grid, V-head-dim, head-dim, kernel, sanitizer and tile-skipping modules, the two-CTA and
#    tiles-by-size modules whole)
# 2. only if they pass: the Hopper grid (`flashgen bench --suite hopper`, beside cuDNN, FLASH and Flex)
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-480}"
timeout -s INT -k 15 "$(cap 260 200)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  tests/test_call_time_gpu.py tests/test_fa2_grid_gpu.py tests/test_head_dim_v_gpu.py tests/test_head_dims_gpu.py \
  tests/test_kernel_gpu.py tests/test_sanitizer_gpu.py tests/test_tile_skipping_gpu.py -k "h200 or sm90 or size_params" \
  tests/test_sm90_two_ctas_gpu.py tests/test_size_params_gpu.py > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
[ "$rc" = 0 ] || exit 1
timeout -k 10 "$(cap 230 5)" python3 -m flashgen.cli bench --suite hopper --gpu h200 --min-time 0.1 \
  --out "$OUT/hopper.json" > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$OUT/hopper.log"
