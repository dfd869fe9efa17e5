#!/usr/bin/env bash
# Prepared in session 23 for session 24's first device call, from the repo root with carry [".whl", ".dev"]
# (build first on the CPU: python benchmarks/kernel_dev/hopper_build.py .dev/hopper cur_causal_bf16_d128_128x128s2
# cur_causal_bf16_d64_192x128s2 R2_causal_bf16_d128_128x128s2 R2_causal_bf16_d64_192x128s2 cur_window256_bf16_d128
# R2_window256_bf16_d128 cur_plain_bf16_d64_192x128s2 cur_plain_bf16_d64_128x128s2 PP_plain_bf16_d64_128x128s2;
# R2 = production's bit_masks switch, off by default: kernel.schedule; and bash benchmarks/kernel_dev/fold_kernels.sh).
# SHORT=1 runs what one short call holds (session 24: eight starts failed first): the fold A/B in one order, the
# GPU tests, the twin without and with settling (BUDGET=330 fits it).
# Session 23 read R2 against cur at causal 4k three times: the kernel listed first in `flashgen bench` read 1-5 %
# faster each time, though time_in_rounds reverses the order every other round. Here one kernel against its twin
# (the same source, renamed; compiled on the device), both orders:
#   1. without settling (the listed order only, for time): predicted the first-listed 2-5 % faster at causal 4k (d64
#      and d128), level at N = 512;
#   2. with --settle 0.3 (the first kernel untimed for 0.3 s before each shape's rounds): predicted within 1 %.
# If 2 holds, R2 against cur with --settle, both orders (session 23: +1.5 % at 512, about -2 % at 4k averaged over
# the swap); and --settle becomes the CLI's default (with the suites' settings recording it).
# Then R2 on window 256 (bf16 d128; the variants suite's kernel, 0.89 of plain by its roofline share in session
# 23): two of a row block's three key tiles are masked there, each score tested against both limits (two ISETP);
# R2 takes the key-tile loop 787 -> 722 instructions (128 ISETP -> 8 R2P and ~16 others). Predicted +5..8 %.
# Session 24 added, first: softcap's score fold on the sm80 / sm75 skeleton (plan.FactoredScore: tanh(acc * scale /
# C) stored, C * log2 e the multiplier), .dev/sm80/{old,new}_{d64,d128,t4_d128}: `flashgen generate --gpu a100 (t4)
# --dtype bf16 --softcap 30` before and after (main / branch s24-score-fold-skeleton: built by
# benchmarks/kernel_dev/fold_kernels.sh), renamed fg_old_* / fg_new_*, compiled for the GPU present. The
# skeleton's key-tile loop 1790 -> 1415 instructions at d128 (three FMUL a score fewer), 1517 -> 1151 at d64.
# Predicted on the H100: +3..8 % at 4k, +2..5 % at 512 (the sm80 path there is bound by mma.sync and issue).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s24 "${BUDGET:-560}"
trap 'tar -czf "$OUT/call1.tgz" -C "$W" .' EXIT
SHORT=${SHORT:-}
BENCH_RESERVE=20 PYTEST_RESERVE=150
[ -n "$SHORT" ] && BENCH_RESERVE=5 PYTEST_RESERVE=70
full() { [ -z "$SHORT" ]; }  # a step of the whole call only
SM80=".dev/sm80"
FOLD="B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128;B=4,H=32,N=4096,M=4096,D=64;B=32,H=32,N=512,M=512,D=64"
for k in causal_bf16_d128_128x128s2 causal_bf16_d64_192x128s2; do
  rm -rf "$W/twin_$k"; mkdir -p "$W/twin_$k"
  sed "s/fg_cur_$k/fg_twin_$k/g" ".dev/hopper/cur_$k/kernel.cu" > "$W/twin_$k/kernel.cu"
  sed "s/fg_cur_$k/fg_twin_$k/g" ".dev/hopper/cur_$k/manifest.json" > "$W/twin_$k/manifest.json"
done
SHAPES="B=4,H=32,N=4096,M=4096,D=64;B=32,H=32,N=512,M=512,D=64;B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128"
bench() {  # NAME SETTLE KERNEL_DIR...
  local name=$1 settle=$2; shift 2
  timeout -k 10 "$(cap 90 "$BENCH_RESERVE")" python3 -m flashgen.cli bench "$@" --shapes "$SHAPES" --no-flex --min-time 0.2 \
    --rounds 4 --settle "$settle" --out "$W/$name.json" > "$W/$name.log" 2>&1
  echo "[$SECONDS s] $name: exit $?"; grep "fg_" "$W/$name.log" | grep -v "  -  "
}
SHAPES=$FOLD bench fold-new-second-s03 0.3 $SM80/old_d128 $SM80/old_d64 $SM80/old_t4_d128 $SM80/new_d128 $SM80/new_d64 $SM80/new_t4_d128
full && SHAPES=$FOLD bench fold-new-first-s03 0.3 $SM80/new_d128 $SM80/new_d64 $SM80/new_t4_d128 $SM80/old_d128 $SM80/old_d64 $SM80/old_t4_d128
# The GPU tests of the sm80 / sm75 softcap kernels the fold changed (kernel hashes: 16 in test_kernel_gpu, 15 in
# test_turing_gpu; 29 head dims in test_fa2_grid_gpu, those in a later call) and of the bit_masks switch (seven
# kernels under it, never run yet), in one pytest.
timeout -k 10 "$(cap 200 "$PYTEST_RESERVE")" python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 \
  tests/test_bit_masks_gpu.py tests/test_kernel_gpu.py tests/test_turing_gpu.py \
  -k "test_bit_masks_gpu or (softcap and not alibi and (a100 or fp32 or turing))" > "$W/pytest-fold-bit-masks.log" 2>&1
echo "[$SECONDS s] pytest fold and bit_masks: exit $?"; tail -3 "$W/pytest-fold-bit-masks.log"
CUR=".dev/hopper/cur_causal_bf16_d128_128x128s2 .dev/hopper/cur_causal_bf16_d64_192x128s2"
TWIN="$W/twin_causal_bf16_d128_128x128s2 $W/twin_causal_bf16_d64_192x128s2"
bench twin-first-s0 0 $CUR $TWIN
bench twin-first-s03 0.3 $CUR $TWIN
W256="B=4,H=16,N=4096,M=4096,D=128;B=1,H=16,N=16384,M=16384,D=128"
full && SHAPES=$W256 bench window-r2-second-s03 0.3 .dev/hopper/cur_window256_bf16_d128 .dev/hopper/R2_window256_bf16_d128
full && SHAPES=$W256 bench window-r2-first-s03 0.3 .dev/hopper/R2_window256_bf16_d128 .dev/hopper/cur_window256_bf16_d128
# Plain d64 at short rows on 128-row blocks (the 192-row block computes 576 rows for 512, 1152 for 1k), with and
# without ping-pong (causal d64 takes both at N <= 1k): predicted PP +3..6 % at 512, +1..3 % at 1k; cur 128x128
# level to +3 %. Session 4 (H200, before ping-pong and the TMA epilogue) read 128x128 -8..-12 %.
full && SHAPES="B=32,H=32,N=512,M=512,D=64;B=16,H=32,N=1024,M=1024,D=64" bench d64-short-s03 0.3 \
  .dev/hopper/cur_plain_bf16_d64_192x128s2 .dev/hopper/cur_plain_bf16_d64_128x128s2 .dev/hopper/PP_plain_bf16_d64_128x128s2
full && bench twin-second-s03 0.3 $TWIN $CUR
R2=".dev/hopper/R2_causal_bf16_d128_128x128s2 .dev/hopper/R2_causal_bf16_d64_192x128s2"
full && bench r2-second-s03 0.3 $CUR $R2
full && bench r2-first-s03 0.3 $R2 $CUR
true  # the last step is full-only: the call ends well either way
