#!/usr/bin/env bash
# Session 12, device call 2, from the repo root with carry [".whl", ".dev/hopper"] (hopper_build.py .dev/hopper
#   $(names below)): ping-pong (PP) for ALiBi at d64 (three consumer warpgroups), d256 (64-key tiles), causal, and
# the d128 kernel again, interleaved with production (cur); PP's kernels through the harness's whole verification.
set -u
K="cur_alibi_bf16_d64 PP_alibi_bf16_d64 cur_alibi_bf16_d256 PP_alibi_bf16_d256 cur_causal_alibi_bf16_d128
PP_causal_alibi_bf16_d128 cur_causal_alibi_bf16_d64 PP_causal_alibi_bf16_d64 cur_alibi_bf16_d128 PP_alibi_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=60 \
  FULL="PP_alibi_bf16_d64 PP_alibi_bf16_d256 PP_causal_alibi_bf16_d128 PP_causal_alibi_bf16_d64" \
  timeout 400 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/ab.txt" | head
cd "$OUT" && tar czf session12-call2.tgz ab.txt hopper-dev.json hopper-dev.log
