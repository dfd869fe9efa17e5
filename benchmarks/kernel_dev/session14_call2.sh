#!/usr/bin/env bash
# Session 14, device call 2, from the repo root with carry [".whl", ".dev/hopper"] (hopper_build.py .dev/hopper
#   $(names below)), on the tree with fg::cos_approx in production:
# 1. the two-key-term score function (two_terms: 60 bytes of spills with fg::cos_approx, none with cosf) and the mods
#    suite's cos, production (cur) against cosf (CF), interleaved; cur_two_terms through the whole verification;
# 2. benchmarks/h200_mods.sh under a 470 s deadline: the GPU tests of the tile-skipping, call-time (every kernel with
#    cos) and two-CTA modules, the mods benchmark on both paths, `flashgen generate --score-mod` and `--mask-mod`,
#    ncu of the cos kernel at 4k.
set -u
K="cur_plain_bf16_d128_128x128s2 cur_two_terms_bf16_d128 CF_two_terms_bf16_d128 cur_score_cos_bf16_d128
CF_score_cos_bf16_d128 cur_two_terms_bf16_d128 CF_two_terms_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=50 FULL="cur_two_terms_bf16_d128" \
  timeout 150 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/ab.txt" | head
NO_WHEELS=1 MEASURE_BUDGET_S=470 NCU_SPECS="cur_score_cos_bf16_d128 4096" bash benchmarks/h200_mods.sh
echo "[$SECONDS s] h200_mods.sh: exit $?"
cd "$OUT" && tar czf session14-call2-ab.tgz ab.txt hopper-dev.json hopper-dev.log
