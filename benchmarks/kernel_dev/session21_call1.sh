#!/usr/bin/env bash
# Session 21, device call 1 (ran at commit 1f51e7b, whose q_stages switch the OT2 kernels and the mods run with
# two Q buffers need; removed since, NOTES.md), from the repo root with carry [".whl", ".dev/hopper"] under one
# deadline (BUDGET, default 570 s): the two parts of session 20's overlap_tiles_call.sh (removed: this superseded
# it) in one call (the machine goes back 30 s after each call, and a
# fresh start costs about 100 s of the session's 30 minutes). The kernels are built first on the CPU with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper {cur,OT,OT2}_{plain,causal}_bf16_d64_192x128s2 \
#     {cur,OT,OT2}_{plain,causal}_bf16_d128_128x128s2
# 1. The GPU tests of every kernel session 20 changed (overlap_tiles' twelve kernels and seven with two Q buffers,
#    relu on every path, sigmoid on sm90, the sm90 kernels under the new persistent_walk case, the sanitizer module).
# 2. Production (cur) against the switch (OT) and the switch with two Q buffers (OT2) in alternating blocks, the clock
#    sampled: N = 512 for plain and causal d128 and causal d64, N = 2k for plain d128 (predicted, NOTES.md: OT +3..8 %
#    at 512, +1..4 % at 2k, or level if the next tile's Q arrives late; OT2 at least OT's).
# 3. The mods benchmark with OT2, then production, as far as the deadline allows (predicted: document mask +3..6 %).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
# $OUT brings back at most 8 files: everything is gathered in $W and packed into $OUT/call1.tgz at the end.
scratch /tmp/s21 "${BUDGET:-570}"
trap 'tar -czf "$OUT/call1.tgz" -C "$W" .' EXIT
timeout -s INT -k 15 "$(cap 320 230)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 \
  -k "h200 or under_the_switch or relu or sigmoid or racecheck or synccheck" tests/test_overlap_tiles_gpu.py \
  tests/test_kernel_gpu.py tests/test_turing_gpu.py tests/test_sanitizer_gpu.py > "$W/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED|pre-compile|hazard" "$W/tests.log" | head -40
for run in plain_bf16_d128_128x128s2:512 causal_bf16_d128_128x128s2:512 causal_bf16_d64_192x128s2:512 \
           plain_bf16_d128_128x128s2:2048; do
  spec=${run%:*} n=${run#*:}
  timeout -k 10 "$(cap 45 110)" python3 benchmarks/kernel_dev/clock_watch.py .dev/hopper/cur_$spec \
    .dev/hopper/OT_$spec .dev/hopper/OT2_$spec --n "$n" --blocks 3 --seconds 0.6 --out "$W/ab-$spec-$n.json" > "$W/ab.log" 2>&1
  echo "[$SECONDS s] A/B $spec N=$n: exit $?"; tail -8 "$W/ab.log"
done
for sw in on off; do
  switches=(--switch "overlap_tiles=$sw"); [ $sw = on ] && switches+=(--switch q_stages=2)
  timeout -k 10 "$(cap 75 0)" python3 benchmarks/mods_bench.py --gpu h200 --min-time 0.1 "${switches[@]}" \
    --out "$W/mods-$sw.json" > "$W/mods-$sw.log" 2>&1
  echo "[$SECONDS s] mods bench, ${switches[*]}: exit $?"; grep -v -i warn "$W/mods-$sw.log" | tail -4
done
