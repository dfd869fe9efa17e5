#!/usr/bin/env bash
# Session 9's last device call (the device was lent twice in about ten tries; each try costs device time), from the repo
# root with carry [".whl", ".dev/hopper"]:
# 1. the cross_tile A/B: session-8 kernels (cur_*) against the stream (XT_*), prebuilt by hopper_build.py, each
#    checked, four through the harness's whole verification, two under racecheck and synccheck (hopper_session.sh)
# 2. the GPU tests of the kernels the kernel-hash test says changed with cross_tile on (tests/kernel_hashes.json):
#    the sm90 / h200 cases of the head-dim, FA2-grid, V-head-dim, kernel, call-time and tile-skipping modules, the
#    sanitizer module, the two-CTA module
# 3. the variants suite (bf16 d128 4k), with what time is left
# Logs land in $OUT (hopper-dev.log/json, tests.log, variants.log/json).
set -u
K="cur_causal_bf16_d128_128x128s2 XT_causal_bf16_d128_128x128s2 cur_causal_bf16_d64_192x128s2 XT_causal_bf16_d64_192x128s2
cur_plain_bf16_d128_128x128s2 XT_plain_bf16_d128_128x128s2 cur_window256_bf16_d128 XT_window256_bf16_d128
cur_document512_bf16_d128 XT_document512_bf16_d128 cur_plain_bf16_d64_192x128s2 XT_plain_bf16_d64_192x128s2
cur_score_cos_bf16_d128 XT_score_cos_bf16_d128"
KERNELS="$K" BASELINES=cur KTIMEOUT=60 \
  FULL="XT_causal_bf16_d128_128x128s2 XT_document512_bf16_d128 XT_causal_bf16_d64_192x128s2 XT_plain_bf16_d64_192x128s2" \
  SANITIZE="XT_causal_bf16_d128_128x128s2 XT_document512_bf16_d128" \
  timeout 200 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done"; grep -v "quick ok" "$OUT/ab.txt" | grep -E "^[a-zX]|N=|verify|TIMEOUT" | head -120
NO_WHEELS=1 . benchmarks/device_prelude.sh || exit 1
{
  timeout -s INT -k 15 240 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/test_fa2_grid_gpu.py \
    tests/test_head_dims_gpu.py tests/test_head_dim_v_gpu.py tests/test_kernel_gpu.py tests/test_call_time_gpu.py \
    tests/test_tile_skipping_gpu.py -k "sm90 or h200"
  echo "exit $?"
  timeout -s INT -k 15 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_sanitizer_gpu.py \
    tests/test_sm90_two_ctas_gpu.py
  echo "exit $?"
} > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] tests done"; grep -E "passed|failed|error|^exit|FAILED" "$OUT/tests.log" | head -30
left=$((560 - SECONDS))
[ "$left" -gt 40 ] && timeout -k 10 "$left" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -12 "$OUT/variants.log"
