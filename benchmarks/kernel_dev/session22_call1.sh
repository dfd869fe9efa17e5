#!/usr/bin/env bash
# Ran in session 22 (results/session22-call1-*; NOTES.md). DA has been production since e601a4f and its dev schedule
# is gone (OT is OTDA now); the command below names it as it ran.
# Prepared in session 21 (whose device time ran out before it could run) for session 22's first device call, from
# the repo root with carry [".whl", ".dev/hopper"] under one deadline (BUDGET, default 420 s). Build first on the CPU:
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper {cur,DA,OTDA}_{plain,causal}_bf16_d128_128x128s2 \
#     {cur,SC,SCEX,EX}_softcap30_bf16_d128
# The SASS counts behind the predictions (benchmarks/kernel_dev/sass_loops.py, key-tile loop instructions):
#   DA   each k-step's wgmma descriptor as the first one's plus an add: plain d128 740 -> 698, causal 757 -> 715.
#        Predicted 0..3 % (the loop is not issue-bound by the count: ~1480 issue cycles a key-tile pair against
#        ~2050 of tensor time).
#   OTDA overlap_tiles with DA: 784 -> 721 (below production's 740). Predicted level with cur to +5 % at N = 512.
#   SC   softcap's constants folded (tanh(s * scale / 30) stored, 30 log2 e in the softmax's multiplier): 1373 ->
#        997. Predicted +10..25 % for softcap 30 (0.74x of plain in s21's variants suite; issue-, SFU- and
#        tensor-bound together).
#   (session 22, added) d64: plain and causal with EX and DA. A 192x128 key tile takes ~1536 cycles on the tensor
#        cores, ~1584 on the SFU (3 warps a scheduler x 66 MUFU x 8) and ~1545 of issue (3 x ~515 instructions run:
#        the loop's 675 less its masked and huge-max branches): all three bind. EX adds issue (964 in the loop) and
#        session 7's E4 measured 1-10 % slower on plain d64: predicted level to -8 %. DA takes 30 uniform ops
#        (675 -> 645): predicted +0..4 %.
#   EX   half the softmax's exp2 on the FMA pipe (degree-3 polynomial): SFU ops a score 2 -> 1.5 for softcap, +289
#        instructions a key tile. Predicted level or worse alone (issue); SCEX = SC + EX (1286): SC's gain +0..5 %.
# 1. `flashgen bench` on the dev kernels: each verified (the quick cases, persistent_walk among them) against the
#    fp64 reference of its manifest's variant, then timed in rounds beside SDPA's backends (softcap: none).
# 2. Alternating blocks (clock_watch) cur / DA / OTDA, plain d128 at N = 512 and 2k.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s22 "${BUDGET:-520}"
trap 'tar -czf "$OUT/call1.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 120 200)" python3 -m flashgen.cli bench .dev/hopper/{cur,SC,SCEX,EX}_softcap30_bf16_d128 \
  --shapes "B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128" --no-flex --min-time 0.1 --rounds 2 \
  --out "$W/softcap.json" > "$W/softcap.log" 2>&1
echo "[$SECONDS s] softcap bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/softcap.log" | tail -14
timeout -k 10 "$(cap 140 60)" python3 -m flashgen.cli bench .dev/hopper/{cur,DA,OTDA}_plain_bf16_d128_128x128s2 \
  .dev/hopper/{cur,DA,OTDA}_causal_bf16_d128_128x128s2 --shapes "B=32,H=16,N=512,M=512,D=128;B=4,H=16,N=4096,M=4096,D=128" \
  --no-flex --min-time 0.05 --rounds 2 --out "$W/da.json" > "$W/da.log" 2>&1
echo "[$SECONDS s] DA bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/da.log" | tail -16
timeout -k 10 "$(cap 100 60)" python3 -m flashgen.cli bench .dev/hopper/{cur,EX,DA}_plain_bf16_d64_192x128s2 \
  .dev/hopper/{cur,EX}_causal_bf16_d64_192x128s2 --shapes "B=32,H=32,N=512,M=512,D=64;B=1,H=32,N=16384,M=16384,D=64" \
  --no-flex --min-time 0.05 --rounds 2 --out "$W/d64.json" > "$W/d64.log" 2>&1
echo "[$SECONDS s] d64 EX/DA bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/d64.log" | tail -16
for n in 512 2048; do
  timeout -k 10 "$(cap 30 0)" python3 benchmarks/kernel_dev/clock_watch.py .dev/hopper/{cur,DA,OTDA}_plain_bf16_d128_128x128s2 \
    --n "$n" --blocks 2 --seconds 0.5 --out "$W/ab-$n.json" > "$W/ab-$n.log" 2>&1
  echo "[$SECONDS s] A/B N=$n: exit $?"; grep ours "$W/ab-$n.log"
done
