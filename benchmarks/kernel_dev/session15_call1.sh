#!/usr/bin/env bash
# Session 15, device call 1, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper cur_score_cos_bf16_d128 KW_score_cos_bf16_d128 \
#     PP_score_cos_bf16_d128 KN_score_cos_bf16_d128 cur_two_terms_bf16_d128 KW_two_terms_bf16_d128
# 1. cos (bf16 d128): production (cur) against KW (the key-term warp: terms once per CTA, read from shared memory),
#    PP (pingpong) and KN (terms not shared), interleaved; the two-term function cur against KW; every KW and PP
#    kernel through the harness's whole verification;
# 2. compute-sanitizer racecheck and synccheck on KW's cos kernel (the ring's barriers).
set -u
K="cur_score_cos_bf16_d128 KW_score_cos_bf16_d128 PP_score_cos_bf16_d128 KN_score_cos_bf16_d128
cur_two_terms_bf16_d128 KW_two_terms_bf16_d128 cur_score_cos_bf16_d128 KW_score_cos_bf16_d128
cur_two_terms_bf16_d128 KW_two_terms_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=40 SANITIZE="KW_score_cos_bf16_d128" \
  FULL="KW_score_cos_bf16_d128 PP_score_cos_bf16_d128 KW_two_terms_bf16_d128" \
  timeout 420 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error|racecheck|synccheck" "$OUT/ab.txt" | head -20
