#!/usr/bin/env bash
# Session 16, device call 3, from the repo root with carry [".whl"], under one deadline (BUDGET, default 560 s), with
# causal_pairs on in production (causal rows of up to 32 query blocks walk in complementary couples):
# 1. the GPU tests of every sm90 kernel of the modules whose kernels the change touched (the kernel-hash test's list:
#    111 causal kernels of the call-time, FA2-grid, V-head-dim, head-dim, kernel, sanitizer, tile-skipping,
#    two-CTA and tiles-by-size modules), session 11's selection;
# 2. only if they pass: the Hopper grid (`flashgen bench --suite hopper`, beside cuDNN, FLASH and Flex) and the
#    variants suite.
TESTS_K="h200 or sm90 or size_params" TESTS="tests/test_call_time_gpu.py tests/test_fa2_grid_gpu.py
tests/test_head_dim_v_gpu.py tests/test_head_dims_gpu.py tests/test_kernel_gpu.py
tests/test_sanitizer_gpu.py tests/test_tile_skipping_gpu.py
tests/test_sm90_two_ctas_gpu.py tests/test_size_params_gpu.py" BUDGET=${BUDGET:-560} \
  exec bash benchmarks/kernel_dev/checked_grid.sh
