#!/usr/bin/env bash
# Session 18, device call 2, from the repo root with carry [".whl"], under one deadline (BUDGET, default 570 s), with
# row_key_limits on (a masked tile's visibility against its rows' key limits from plan.key_range):
# 1. the GPU tests of every sm90 kernel of the modules whose kernels the change touched (the kernel-hash test's
#    list: the FA2-grid, head-dim, kernel, two-CTA, call-time, V-head-dim, tile-skipping, size-params and sanitizer
#    modules);
# 2. only if they pass: the Hopper grid (beside cuDNN, FLASH and Flex), the variants suite and the mods benchmark
#    (now in rounds, the plain kernel first then last: cos(k_idx), the document and length masks against the plain
#    kernel, bf16 d128 4k).
TESTS_K="h200 or sm90 or size_params" TESTS="tests/test_fa2_grid_gpu.py tests/test_head_dims_gpu.py
tests/test_kernel_gpu.py tests/test_sm90_two_ctas_gpu.py tests/test_call_time_gpu.py tests/test_head_dim_v_gpu.py
tests/test_tile_skipping_gpu.py tests/test_size_params_gpu.py tests/test_sanitizer_gpu.py" \
  MODS=1 exec bash benchmarks/kernel_dev/checked_grid.sh
