#!/usr/bin/env bash
# Session 16, device call 3, from the repo root with carry [".whl"], under one deadline (BUDGET, default 560 s), with
# causal_pairs on in production (causal rows of up to 32 query blocks walk in complementary couples):
# 1. the GPU tests of every sm90 kernel of the modules whose kernels the change touched (the kernel-hash test's list:
#    111 causal kernels of the call-time, FA2-grid, V-head-dim, head-dim, kernel, sanitizer, tile-skipping,
#    two-CTA and tiles-by-size modules), session 11's selection;
# 2. only if they pass: the Hopper grid (`flashgen bench --suite hopper`, beside cuDNN, FLASH and Flex) and the
#    variants suite.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-560}"
timeout -s INT -k 15 "$(cap 300 250)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  tests/test_call_time_gpu.py tests/test_fa2_grid_gpu.py tests/test_head_dim_v_gpu.py tests/test_head_dims_gpu.py \
  tests/test_kernel_gpu.py tests/test_sanitizer_gpu.py tests/test_tile_skipping_gpu.py -k "h200 or sm90 or size_params" \
  tests/test_sm90_two_ctas_gpu.py tests/test_size_params_gpu.py > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
[ "$rc" = 0 ] || exit 1
timeout -k 10 "$(cap 200 60)" python3 -m flashgen.cli bench --suite hopper --gpu h200 --min-time 0.1 \
  --out "$OUT/hopper.json" > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$OUT/hopper.log"
timeout -k 10 "$(cap 60 0)" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -10 "$OUT/variants.log"
