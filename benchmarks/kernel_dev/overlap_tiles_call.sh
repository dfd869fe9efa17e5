#!/usr/bin/env bash
# Session 20's changes on a GPU (written on a CPU, no device lent: rendered, compiled, ptxas' reports read, never
# run), in two device calls from the repo root with carry [".whl", ".dev/hopper"], the kernels built first on the
# CPU with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper {cur,OT}_{plain,causal}_bf16_d64_192x128s2 \
#     {cur,OT}_{plain,causal}_bf16_d128_128x128s2
# PART=tests (about 300 s): the GPU tests of every kernel session 20 changed (tests/kernel_hashes.json's diff):
#   the overlap_tiles switch's twelve kernels through the harness's whole verification (persistent_walk and
#   walk_long_rows: more work tiles than CTAs, tiles without keys amid the walk), racecheck and synccheck on three;
#   relu on every path and sigmoid on sm90 (p after the mask; relu as a select), with the H200 half of
#   test_kernel_gpu.py, whose sm90 kernels now also run the harness's persistent_walk case; the sanitizer module.
# PART=bench (about 300 s): production (cur) against the switch (OT) in alternating blocks beside cuDNN, the clock
#   sampled (clock_watch.py), at N = 512 and 2k, plain and causal d128, causal d64; then the mods benchmark with the
#   switch on and off (the document mask's rows are 4 key tiles).
# Predicted (NOTES.md, session 20): OT +3..8 % at N = 512, +1..4 % at 1k-2k; the document mask +3..6 %.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-560}"
case "${PART:-tests}" in
tests)
  timeout -s INT -k 15 "$(cap 540 0)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 \
    -k "h200 or under_the_switch or relu or sigmoid or racecheck or synccheck" tests/test_overlap_tiles_gpu.py \
    tests/test_kernel_gpu.py tests/test_turing_gpu.py tests/test_sanitizer_gpu.py > "$OUT/tests.log" 2>&1
  echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED|pre-compile|hazard" "$OUT/tests.log" | head -40
  ;;
bench)
  for spec in plain_bf16_d128_128x128s2 causal_bf16_d128_128x128s2 causal_bf16_d64_192x128s2; do
    for n in 512 2048; do
      timeout -k 10 "$(cap 45 130)" python3 benchmarks/kernel_dev/clock_watch.py .dev/hopper/cur_$spec \
        .dev/hopper/OT_$spec --n $n --blocks 3 --seconds 0.6 --out "$OUT/ab-$spec-$n.json" > "$OUT/ab-$spec-$n.log" 2>&1
      echo "[$SECONDS s] A/B $spec N=$n: exit $?"; tail -6 "$OUT/ab-$spec-$n.log"
    done
  done
  for sw in on off; do
    timeout -k 10 "$(cap 100 10)" python3 benchmarks/mods_bench.py --gpu h200 --switch "overlap_tiles=$sw" \
      --out "$OUT/mods-$sw.json" > "$OUT/mods-$sw.log" 2>&1
    echo "[$SECONDS s] mods bench, overlap_tiles=$sw: exit $?"; grep -v -i warn "$OUT/mods-$sw.log" | tail -4
  done
  ;;
*) echo "PART=${PART}: tests or bench"; exit 2 ;;
esac
