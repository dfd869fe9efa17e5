#!/usr/bin/env bash
# Session 17, device call 3, from the repo root with carry [".whl"], under one deadline (BUDGET, default 570 s), with
# pingpong on for causal d64 in two warpgroups (its N <= 1k tile) and for one shared key-only term (cos(k_idx)):
# 1. the GPU tests of every sm90 kernel of the modules whose kernels the change touched (the kernel-hash test's list:
#    causal d64 of the FA2-grid, head-dim, V-head-dim, kernel, sanitizer and tiles-by-size modules, the cos kernels
#    of the call-time module), session 11's selection;
# 2. only if they pass: the Hopper grid (beside cuDNN, FLASH and Flex), the variants suite and the mods benchmark
#    (cos(k_idx) against the plain kernel, bf16 d128 4k).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-570}"
timeout -s INT -k 15 "$(cap 220 330)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  tests/test_call_time_gpu.py tests/test_fa2_grid_gpu.py tests/test_head_dim_v_gpu.py tests/test_head_dims_gpu.py \
  tests/test_kernel_gpu.py tests/test_sanitizer_gpu.py -k "h200 or sm90 or size_params" \
  tests/test_size_params_gpu.py > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
[ "$rc" = 0 ] || exit 1
timeout -k 10 "$(cap 200 120)" python3 -m flashgen.cli bench --suite hopper --gpu h200 --min-time 0.1 \
  --out "$OUT/hopper.json" > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$OUT/hopper.log"
timeout -k 10 "$(cap 60 60)" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -10 "$OUT/variants.log"
timeout -k 10 "$(cap 120 0)" python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -8
