#!/usr/bin/env bash
# Session 10, device call 4, from the repo root with carry [".whl", ".dev/hopper"], under one deadline (560 s):
# 1. the GPU tests of the kernels changed since call 3's (the kernel-hash test: kernel, Turing and call-time modules)
# 2. the Hopper grid (`flashgen bench --suite hopper`, every kernel verified first, beside cuDNN, FLASH and Flex)
# 3. softcap and `s + 0.25 * cos(k_idx)` at 79016f8 (old) against this tree (cur), interleaved old, cur, old, cur
# 4. `flashgen generate --score-mod 's + 0.25 * cos(k_idx)'` from the CLI, then the variants suite, with what is left
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" 560
timeout -s INT -k 15 "$(cap 250 300)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  tests/test_kernel_gpu.py tests/test_turing_gpu.py tests/test_call_time_gpu.py > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | head -30
FG="python3 -m flashgen.cli"
timeout -k 10 "$(cap 200 100)" $FG bench --suite hopper --gpu h200 --min-time 0.1 --out "$OUT/hopper.json" \
  > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -30 "$OUT/hopper.log"
KERNELS="a_old_softcap30_bf16_d128 b_cur_softcap30_bf16_d128 c_old_softcap30_bf16_d128 d_cur_softcap30_bf16_d128
a_old_score_cos_bf16_d128 b_cur_score_cos_bf16_d128 c_old_score_cos_bf16_d128 d_cur_score_cos_bf16_d128
cur_plain_bf16_d128_128x128s2" BASELINES=none_ KTIMEOUT=30 NO_WHEELS=1 \
  timeout "$(cap 80 30)" bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B: exit $?"; grep -E "^[a-zA-Z]|N=" "$OUT/ab.txt" | grep -v "quick ok" | head -50
timeout -k 10 "$(cap 100 5)" $FG generate --gpu h200 --dtype bf16 --head-dim 128 --score-mod 's + 0.25 * cos(k_idx)' \
  --out "$OUT/gen_score" > "$OUT/gen_score.log" 2>&1
echo "[$SECONDS s] generate --score-mod: exit $?"; tail -14 "$OUT/gen_score.log"
left=$((BUDGET - SECONDS))
[ "$left" -gt 40 ] && timeout -k 10 "$left" $FG bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -12 "$OUT/variants.log"
