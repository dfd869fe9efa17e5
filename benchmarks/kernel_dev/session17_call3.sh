#!/usr/bin/env bash
# Session 17, device call 3, from the repo root with carry [".whl"], under one deadline (BUDGET, default 570 s), with
# pingpong on for causal d64 in two warpgroups (its N <= 1k tile) and for one shared key-only term (cos(k_idx)):
# 1. the GPU tests of every sm90 kernel of the modules whose kernels the change touched (the kernel-hash test's list:
#    causal d64 of the FA2-grid, head-dim, V-head-dim, kernel, sanitizer and tiles-by-size modules, the cos kernels
#    of the call-time module), session 11's selection;
# 2. only if they pass: the Hopper grid (beside cuDNN, FLASH and Flex), the variants suite and the mods benchmark
#    (cos(k_idx) against the plain kernel, bf16 d128 4k).
TESTS_K="h200 or sm90 or size_params" TESTS="tests/test_call_time_gpu.py tests/test_fa2_grid_gpu.py
tests/test_head_dim_v_gpu.py tests/test_head_dims_gpu.py tests/test_kernel_gpu.py
tests/test_sanitizer_gpu.py tests/test_size_params_gpu.py" \
  MODS=1 exec bash benchmarks/kernel_dev/checked_grid.sh
