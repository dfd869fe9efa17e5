#!/usr/bin/env bash
# Session 18, device call 3, from the repo root with carry [".whl"], under one deadline (BUDGET, default 300 s): the
# row_key_limits kernels as they are rendered now (the rows' limits substituted into plan.key_range's C, where call
# 2's had lambdas: the same arithmetic, other source) through the GPU tests of the modules call 2 ran, then the mods
# benchmark (in rounds) a second time.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-300}"
timeout -s INT -k 15 "$(cap 220 60)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  -k "h200 or sm90 or size_params" tests/test_fa2_grid_gpu.py tests/test_head_dims_gpu.py tests/test_kernel_gpu.py \
  tests/test_sm90_two_ctas_gpu.py tests/test_call_time_gpu.py tests/test_head_dim_v_gpu.py \
  tests/test_tile_skipping_gpu.py tests/test_size_params_gpu.py tests/test_sanitizer_gpu.py > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
[ "$rc" = 0 ] || exit 1
timeout -k 10 "$(cap 60 0)" python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -8
