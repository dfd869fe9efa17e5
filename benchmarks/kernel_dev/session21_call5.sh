#!/usr/bin/env bash
# Session 21, device call 5 (the session's last ~300 s of device time), from the repo root with carry
# [".whl", ".dev/hopper"], the kernels built first on the CPU with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper {cur,DA,OTDA}_{plain,causal}_bf16_d128_128x128s2
# DA: each k-step's wgmma descriptor as the first one's plus an add (key-tile loop 740 -> 698 instructions at plain
# d128); OTDA: overlap_tiles with DA (784 -> 721). Predicted: DA 0..3 % faster (the loop is not issue-bound by the
# count: ~1480 issue cycles against ~2050 of tensor time a key tile); OTDA level with cur to +5 % at N = 512.
# 1. `flashgen bench` on the dev kernels: each verified (the quick cases, persistent_walk among them), then timed
#    beside SDPA's backends at N = 512. 2. Alternating blocks (clock_watch) cur / DA / OTDA at N = 512 and 2k.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s21 "${BUDGET:-170}"
trap 'tar -czf "$OUT/call5.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 80 60)" python3 -m flashgen.cli bench .dev/hopper/{cur,DA,OTDA}_plain_bf16_d128_128x128s2 \
  .dev/hopper/{cur,DA,OTDA}_causal_bf16_d128_128x128s2 --shapes "B=32,H=16,N=512,M=512,D=128" --no-flex \
  --min-time 0.05 --rounds 2 --out "$W/bench.json" > "$W/bench.log" 2>&1
echo "[$SECONDS s] bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/bench.log" | tail -16
for n in 512 2048; do
  timeout -k 10 "$(cap 30 0)" python3 benchmarks/kernel_dev/clock_watch.py .dev/hopper/{cur,DA,OTDA}_plain_bf16_d128_128x128s2 \
    --n "$n" --blocks 2 --seconds 0.5 --out "$W/ab-$n.json" > "$W/ab-$n.log" 2>&1
  echo "[$SECONDS s] A/B N=$n: exit $?"; grep ours "$W/ab-$n.log"
done
