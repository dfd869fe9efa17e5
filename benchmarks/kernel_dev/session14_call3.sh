#!/usr/bin/env bash
# Session 14, device call 3, carry [".whl", ".dev/hopper"]: cos (bf16 d128) production against PP (pingpong) and
# KN (key terms not shared), interleaved, PP and KN through the harness's whole verification.
set -u
K="cur_score_cos_bf16_d128 PP_score_cos_bf16_d128 KN_score_cos_bf16_d128 cur_score_cos_bf16_d128 PP_score_cos_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=40 FULL="PP_score_cos_bf16_d128 KN_score_cos_bf16_d128" \
  timeout 110 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/ab.txt" | head
