#!/usr/bin/env bash
# Prepared in session 26 (whose last device calls found no machine) for session 27's first device call, from the
# repo root with carry [".whl", ".dev/s26"] (build first on the CPU:
# python benchmarks/kernel_dev/hopper_build.py .dev/s26 {cur,HP}_causal_bf16_d64_128x128s2
# {cur,HP}_causal_bf16_d128_128x128s2 {cur,HP}_causal_bf16_d256_128x64s2).
#   1. The GPU tests session 26's PART=1 did not reach (cut at 540 s: call time, bit masks, arrays, sanitizer, size
#      params, the real agent), test_harness_gpu.py again (its bench test read a 1 ms kernel as undertimed beside
#      five other pytest workers: the host's time per call is now the fastest call's), and the new switch's
#      test_half_first_tile_gpu.py (never run yet). SHORT=1: only the last two files.
#   2. HP (the half_first_tile switch: a warpgroup that sees nothing in the second half of its first key tile
#      issues that tile's S at N = BLOCK_N / 2 and its P V in half the k-steps) against cur, both orders, with
#      settling: causal bf16 d64 128x128 (the N <= 1k tile) at 512 / 1k, d128 at 512 / 1k / 4k, d256 128x64 at
#      512 / 4k. It saves 10 % of the MMA at 512 and 5.6 % at 1k (4 of 10 and 8 of 36 tiles of a row-block pair
#      are diagonal; one warpgroup's S and P V of each halved); the key-tile loop takes 32 more instructions (747
#      against 715 at d128: both P V forms and the moves around them). Predicted +5..9 % at 512, +2..5 % at 1k,
#      -1..+1 % at 4k.
#   3. What the grid's 16k ratio is worth: plain bf16 d128 16k beside cuDNN, twice each of 4 rounds at --min-time 0.1
#      (the grid's setting: ~10 calls a round) and 16 rounds at 0.4, alternating. Session 26 read round medians
#      swinging +-12 % within a run. Predicted: the 4-round runs' ratios differ by 5-15 %, the 16-round runs' by
#      under 5 %.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s27c1 "${BUDGET:-560}"
trap 'tar -czf "$OUT/call1.tgz" -C "$W" .' EXIT
# SHORT=1 (a short lease): only the new switch's GPU tests and test_harness_gpu.py
TESTS="tests/test_call_time_gpu.py tests/test_bit_masks_gpu.py tests/test_half_first_tile_gpu.py tests/test_arrays_gpu.py
  tests/test_sanitizer_gpu.py tests/test_size_params_gpu.py tests/test_agent_real.py tests/test_harness_gpu.py"
[ -n "${SHORT:-}" ] && TESTS="tests/test_half_first_tile_gpu.py tests/test_harness_gpu.py"
timeout -k 10 "$(cap 300 "${PYTEST_RESERVE:-170}")" python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --durations=15 \
  $TESTS > "$W/pytest-part1-rest.log" 2>&1
echo "[$SECONDS s] pytest: exit $?"; grep -E "passed|failed|error" "$W/pytest-part1-rest.log" | tail -5
D=.dev/s26
bench() {  # NAME SHAPES KERNEL_DIR...
  local name=$1 shapes=$2; shift 2
  timeout -k 5 "$(cap 40 5)" python3 -m flashgen.cli bench "$@" --shapes "$shapes" --no-flex --min-time 0.1 \
    --rounds 4 --out "$W/$name.json" > "$W/$name.log" 2>&1
  echo "[$SECONDS s] $name: exit $?"; grep "fg_" "$W/$name.log" | grep -v "  -  "
}
S64="B=32,H=32,N=512,M=512,D=64;B=16,H=32,N=1024,M=1024,D=64"
S128="B=32,H=16,N=512,M=512,D=128;B=16,H=16,N=1024,M=1024,D=128;B=4,H=16,N=4096,M=4096,D=128"
S256="B=32,H=8,N=512,M=512,D=256;B=4,H=8,N=4096,M=4096,D=256"
bench hp-d64-second "$S64" $D/cur_causal_bf16_d64_128x128s2 $D/HP_causal_bf16_d64_128x128s2
bench hp-d64-first "$S64" $D/HP_causal_bf16_d64_128x128s2 $D/cur_causal_bf16_d64_128x128s2
bench hp-d128-second "$S128" $D/cur_causal_bf16_d128_128x128s2 $D/HP_causal_bf16_d128_128x128s2
bench hp-d128-first "$S128" $D/HP_causal_bf16_d128_128x128s2 $D/cur_causal_bf16_d128_128x128s2
bench hp-d256-second "$S256" $D/cur_causal_bf16_d256_128x64s2 $D/HP_causal_bf16_d256_128x64s2
bench hp-d256-first "$S256" $D/HP_causal_bf16_d256_128x64s2 $D/cur_causal_bf16_d256_128x64s2
cp "$W/pytest-part1-rest.log" "$OUT/"
K=generated/h200/bf16/plain_d128
for i in 1 2; do
  for cfg in "4 0.1" "16 0.4"; do
    set -- $cfg
    timeout -k 5 "$(cap 40 0)" python3 -m flashgen.cli bench $K --shapes "B=1,H=16,N=16384,M=16384,D=128" --no-flex \
      --min-time $2 --rounds $1 --out "$W/rounds$1-$i.json" > "$W/rounds$1-$i.log" 2>&1
    echo "[$SECONDS s] rounds $1 run $i: exit $? $(grep -E 'fg_|cudnn' "$W/rounds$1-$i.log" | grep -v '  -  ' | tr -s ' ' | tr '\n' '|')"
  done
done
