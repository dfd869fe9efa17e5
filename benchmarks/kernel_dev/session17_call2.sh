#!/usr/bin/env bash
# Session 17, device call 2, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $K   (the names below)
# 1. EW again, its branch now on a shuffled (warp-uniform) cw: call 1's EW had every wgmma serialized by ptxas
#    (32 WARPGROUP.ARRIVE against 4), which made it 16-22 % slower everywhere; now 4, as production;
# 2. SW (every mbarrier wait with a suspend-time hint: NANOSLEEP.SYNCS in place of the retry loop) and SWP (the
#    producer's waits only) against production: ncu, causal d64 N = 512: 5 M of 65 M instructions are the
#    producer's try_wait retries;
# 3. PP causal d64 128x128 again (call 1: +1 / +3 / +4 / +4 / +4 %).
# EW's and SW's d64 kernels through the harness's whole verification; racecheck and synccheck of EW plain d64.
set -u
K="cur_plain_bf16_d64_192x128s2 EW_plain_bf16_d64_192x128s2 SWP_plain_bf16_d64_192x128s2
cur_causal_bf16_d64_192x128s2 EW_causal_bf16_d64_192x128s2
cur_causal_bf16_d64_128x128s2 SW_causal_bf16_d64_128x128s2 SWP_causal_bf16_d64_128x128s2 PP_causal_bf16_d64_128x128s2
cur_plain_bf16_d128_128x128s2 EW_plain_bf16_d128_128x128s2 SW_plain_bf16_d128_128x128s2 SWP_plain_bf16_d128_128x128s2
cur_causal_bf16_d128_128x128s2 SWP_causal_bf16_d128_128x128s2 cur_score_cos_bf16_d128 SWP_score_cos_bf16_d128
cur_plain_bf16_d64_192x128s2 EW_plain_bf16_d64_192x128s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 \
  FULL="EW_plain_bf16_d64_192x128s2 EW_causal_bf16_d64_192x128s2 SW_causal_bf16_d64_128x128s2 SWP_causal_bf16_d64_128x128s2" \
  timeout 440 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ew-sw.txt" 2>&1
echo "[$SECONDS s] EW, SW, SWP: exit $?"; grep -E "TIMEOUT|FAIL|Error|verify" "$OUT/ew-sw.txt" | head -20
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-ew-sw.json" 2>/dev/null
KERNELS=none BENCH=0 SANITIZE="EW_plain_bf16_d64_192x128s2" timeout 100 bash benchmarks/kernel_dev/hopper_session.sh \
  > "$OUT/sanitize.txt" 2>&1
echo "[$SECONDS s] sanitize: exit $?"; grep -E "racecheck|synccheck" "$OUT/sanitize.txt" | head
rm -f "$OUT/hopper-dev.json"
bash benchmarks/kernel_dev/dev_table.sh "$OUT/ew-sw.txt"
