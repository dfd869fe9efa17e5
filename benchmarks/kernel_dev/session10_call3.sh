#!/usr/bin/env bash
# Session 10, device call 3, from the repo root with carry [".whl", ".dev/hopper"]:
# 1. A/B of the score-function changes (bf16 d128, N = 512 ... 16k, each kernel checked, three through the harness's
#    whole verification, the new cos kernel under racecheck and synccheck): old_* = the kernels at 79016f8 (built from
#    a worktree); cur_* = this tree: the key-only addends shared as one term, log2 e folded into the exponent's FFMA,
#    and (score_cos) the term once per column and warpgroup through shared memory; KW_* = the same with the
#    per-warp shuffles; cur_plain beside them
# 2. the GPU tests of the kernels the kernel-hash test says changed: the grids (head dims, FlashAttention-2's forward
#    grid, V's head dim), call-time tensors, sanitizer, two CTAs, tile parameters
# 3. the mods benchmark and `flashgen generate --score-mod 's + 0.25 * cos(k_idx)'`, with what is left
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
K="old_score_cos_bf16_d128 KW_score_cos_bf16_d128 cur_score_cos_bf16_d128 cur_plain_bf16_d128_128x128s2
old_softcap30_bf16_d128 cur_softcap30_bf16_d128 old_alibi_bf16_d128 cur_alibi_bf16_d128"
KERNELS="$K" BASELINES=none_ KTIMEOUT=60 FULL="cur_score_cos_bf16_d128 cur_softcap30_bf16_d128 cur_alibi_bf16_d128" \
  SANITIZE="cur_score_cos_bf16_d128" timeout 230 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B: exit $?"; grep -v "quick ok" "$OUT/ab.txt" | grep -E "^[a-zA-Z]|N=|verify|TIMEOUT|racecheck|synccheck" | head -90
NO_WHEELS=1 . benchmarks/device_prelude.sh || exit 1
timeout -s INT -k 15 250 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/test_head_dims_gpu.py \
  tests/test_fa2_grid_gpu.py tests/test_head_dim_v_gpu.py tests/test_call_time_gpu.py tests/test_sanitizer_gpu.py \
  tests/test_sm90_two_ctas_gpu.py tests/test_tile_params_gpu.py > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | head -30
left=$((575 - SECONDS))
[ "$left" -gt 30 ] && timeout -k 10 "$((left > 60 ? 60 : left))" python3 benchmarks/mods_bench.py --out "$OUT/mods.json" \
  > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -7
left=$((575 - SECONDS))
[ "$left" -gt 30 ] && timeout -k 10 "$left" python3 -m flashgen.cli generate --gpu h200 --dtype bf16 --head-dim 128 \
  --score-mod 's + 0.25 * cos(k_idx)' --out "$OUT/gen_score" > "$OUT/gen_score.log" 2>&1
echo "[$SECONDS s] generate --score-mod: exit $?"; tail -14 "$OUT/gen_score.log"
