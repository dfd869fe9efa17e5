#!/usr/bin/env bash
# Session 11, device call 4, from the repo root with carry [".whl", ".dev/hopper"] (kernels prebuilt by
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper <the names below>):
# 1. L2 (grid_groups of as many (batch, head) pairs as keep their K and V within half the L2) beside the production
#    kernel (cur: groups of gridDim.x pairs), causal bf16 d64 (both tiles), d128, d256, N = 512 ... 16k, each checked
#    first, the L2 d128 one through the harness's whole verification; cuDNN beside cur_
# 2. plain d64 with the snake walk (cur) and without (NS), interleaved twice: the grid read plain 1-5 % lower
set -u
K="cur_causal_bf16_d128_128x128s2 L2_causal_bf16_d128_128x128s2 cur_causal_bf16_d256_128x64s2 L2_causal_bf16_d256_128x64s2
cur_causal_bf16_d64_128x128s2 L2_causal_bf16_d64_128x128s2 cur_causal_bf16_d64_192x128s2 L2_causal_bf16_d64_192x128s2
cur_plain_bf16_d64_192x128s2 NS_plain_bf16_d64_192x128s2"
KERNELS="$K" BASELINES=cur_causal KTIMEOUT=45 FULL="L2_causal_bf16_d128_128x128s2" \
  timeout 300 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-1.json"
KERNELS="cur_plain_bf16_d64_192x128s2 NS_plain_bf16_d64_192x128s2" BASELINES=none_ KTIMEOUT=30 NO_WHEELS=1 \
  timeout 80 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab2.txt" 2>&1
echo "[$SECONDS s] A/B done"; cat "$OUT/ab.txt" "$OUT/ab2.txt" | grep -v "quick ok" | grep -E "^[a-zA-Z]|N=|verify|TIMEOUT" | head -150
