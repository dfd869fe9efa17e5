#!/usr/bin/env bash
# Session 10, device call 1, from the repo root with carry [".whl", ".dev/hopper"] (kernels prebuilt by
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper <the names below>):
# 1. the tile A/B behind a choice of tiles by sequence length: each production kernel beside the tile that measured
#    faster at the other end of N in sessions 4 and 6 (plain d256 128x80 from registers / 128x64 with O through TMA
#    two chunks or one at a time; causal d256 128x64 two chunks / 128x80 from registers; causal d64 192x128 /
#    128x128), bf16, N = 512 ... 16k, each checked first, cuDNN and FLASH beside (hopper_session.sh)
# 2. Nsight Compute (--set full, SASS source counters) of the production causal d64 kernel at N = 512 beside cuDNN's
# Logs land in $OUT (ab.txt, hopper-dev.log/json, ncu-*).
set -u
K="cur_plain_bf16_d256_128x80s2 cur_plain_bf16_d256_128x64s2 T1_plain_bf16_d256_128x64s2
cur_causal_bf16_d256_128x64s2 cur_causal_bf16_d256_128x80s2 cur_causal_bf16_d64_192x128s2 cur_causal_bf16_d64_128x128s2"
KERNELS="$K" BASELINES=cur_ KTIMEOUT=80 NCU="cur_causal_bf16_d64_192x128s2" NCU_N=512 \
  FULL="cur_causal_bf16_d256_128x80s2 cur_causal_bf16_d64_128x128s2" \
  timeout 520 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -v "quick ok" "$OUT/ab.txt" | grep -E "^[a-zA-Z]|N=|verify|TIMEOUT|ncu" | head -150
