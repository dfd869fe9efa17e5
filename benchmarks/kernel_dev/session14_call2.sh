#!/usr/bin/env bash
# Session 14, device call 2, from the repo root with carry [".whl", ".dev/hopper"] (hopper_build.py .dev/hopper
#   $(names below)), on the tree with fg::cos_approx in production:
# 1. the two-key-term score function (two_terms: 60 bytes of spills with fg::cos_approx, none with cosf) and the mods
#    suite's cos, production (cur) against cosf (CF), interleaved; cur_two_terms through the whole verification;
# 2. the GPU tests of every kernel with cos or sin (tests/test_call_time_gpu.py: the kernel-hash test's list);
# 3. the mods benchmark on both paths; 4. `flashgen generate --score-mod 's + 0.25 * cos(k_idx)'`, as a user runs it.
set -u
K="cur_plain_bf16_d128_128x128s2 cur_two_terms_bf16_d128 CF_two_terms_bf16_d128 cur_score_cos_bf16_d128
CF_score_cos_bf16_d128 cur_two_terms_bf16_d128 CF_two_terms_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=50 FULL="cur_two_terms_bf16_d128" \
  timeout 130 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/ab.txt" | head
NO_WHEELS=1 . benchmarks/device_prelude.sh || exit 1
timeout -s INT -k 10 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_call_time_gpu.py > "$OUT/pytest.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -v "^\.*\s*\[" "$OUT/pytest.log" | tail -4
timeout -k 10 100 python3 benchmarks/mods_bench.py --gpu h200 a100 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -6
timeout -k 10 120 python3 -m flashgen.cli generate --gpu h200 --dtype bf16 --head-dim 128 \
  --score-mod 's + 0.25 * cos(k_idx)' --out /tmp/gen_score > "$OUT/gen_score.log" 2>&1
echo "[$SECONDS s] generate --score-mod: exit $?"; tail -16 "$OUT/gen_score.log"
