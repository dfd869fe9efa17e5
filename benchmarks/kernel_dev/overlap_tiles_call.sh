#!/usr/bin/env bash
# The overlap_tiles switch on a GPU (written in session 20 on a CPU, no device lent: rendered, compiled, its ptxas
# reports read, never run). One device call from the repo root with carry [".whl", ".dev/hopper"], the kernels built
# first on the CPU with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper {cur,OT}_{plain,causal}_bf16_d64_192x128s2 \
#     {cur,OT}_{plain,causal}_bf16_d128_128x128s2
# under one deadline (BUDGET, default 540 s):
# 1. its GPU tests: twelve kernels under the switch through the harness's whole verification (the default cases'
#    persistent_walk and walk_long_rows: more work tiles than CTAs, tiles without keys amid the walk), racecheck and
#    synccheck on three; then the harness's persistent_walk case on production kernels (test_kernel_gpu.py's
#    H200 half);
# 2. the A/B, production (cur) against the switch (OT) in alternating blocks beside cuDNN, the clock sampled
#    (clock_watch.py), at N = 512, 1k and 2k, plain and causal, d64 and d128;
# 3. the mods benchmark with the switch on and off (the document mask's rows are 4 key tiles).
# Predicted (NOTES.md, session 20): +3..8 % at N = 512, +1..4 % at 1k, level from 4k; document mask +3..6 %.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-540}"
timeout -s INT -k 15 "$(cap 220 300)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  -k "h200 or under_the_switch" tests/test_overlap_tiles_gpu.py tests/test_kernel_gpu.py > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED|pre-compile|hazard" "$OUT/tests.log" | head -30
for d in d64_192x128s2 d128_128x128s2; do
  for kind in plain causal; do
    dirs=".dev/hopper/cur_${kind}_bf16_$d .dev/hopper/OT_${kind}_bf16_$d"
    for n in 512 1024 2048; do
      timeout -k 10 "$(cap 40 90)" python3 benchmarks/kernel_dev/clock_watch.py $dirs --n $n --blocks 3 --seconds 0.6 \
        --out "$OUT/ab-${kind}-$d-$n.json" > "$OUT/ab-${kind}-$d-$n.log" 2>&1
      echo "[$SECONDS s] A/B $kind $d N=$n: exit $?"; tail -6 "$OUT/ab-${kind}-$d-$n.log"
    done
  done
done
for sw in on off; do
  timeout -k 10 "$(cap 100 10)" python3 benchmarks/mods_bench.py --gpu h200 --switch "overlap_tiles=$sw" \
    --out "$OUT/mods-$sw.json" > "$OUT/mods-$sw.log" 2>&1
  echo "[$SECONDS s] mods bench, overlap_tiles=$sw: exit $?"; grep -v -i warn "$OUT/mods-$sw.log" | tail -4
done
