#!/usr/bin/env bash
# Session 11, device call 1, from the repo root with carry [".whl", ".dev/hopper"] (kernels prebuilt by
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper <the names below>; old_ from d7b4888's tree):
# the snake walk (SN: odd rounds of the persistent grid in reverse CTA order) beside the production walk (cur), each
# checked first, bf16, N = 512 ... 16k; causal d64 / d128 / d256 at the production tiles, plain d128 and window 256
# as controls, causal d64 128x128 and causal d256 128x80 under SN (the tiles a choice by N would take), and
# d7b4888's causal d128 kernel (the walk as a loop over rounds must cost nothing). cuDNN and FLASH beside cur_.
set -u
K="old_causal_bf16_d128_128x128s2 cur_causal_bf16_d128_128x128s2 SN_causal_bf16_d128_128x128s2
cur_causal_bf16_d256_128x64s2 SN_causal_bf16_d256_128x64s2 SN_causal_bf16_d256_128x80s2
cur_causal_bf16_d64_192x128s2 SN_causal_bf16_d64_192x128s2 SN_causal_bf16_d64_128x128s2
cur_plain_bf16_d128_128x128s2 SN_plain_bf16_d128_128x128s2 cur_window256_bf16_d128 SN_window256_bf16_d128"
KERNELS="$K" BASELINES=cur_ KTIMEOUT=60 FULL="SN_causal_bf16_d128_128x128s2" \
  timeout 540 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -v "quick ok" "$OUT/ab.txt" | grep -E "^[a-zA-Z]|N=|verify|TIMEOUT" | head -150
