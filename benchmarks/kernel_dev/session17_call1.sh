#!/usr/bin/env bash
# Session 17, device call 1, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $K   (the names below)
# 1. EW (idle_warpgroups: a consumer warpgroup without rows passes the barriers on) against production, interleaved,
#    bf16: plain and causal d64 at 192x128 (N = 512 / 1k leave one / two of the last block's three warpgroups
#    empty), plain d128 (no idle warpgroup at these N: what the branch costs), ALiBi d64 (the idle turns of
#    pingpong); EW's d64 kernels and ALiBi through the harness's whole verification (N = 1, 67, 197, 253, 256: one
#    or two idle warpgroups);
# 2. PP (pingpong) for causal d64 at 128x128 (the N <= 1k tile) and for cos(k_idx) with session 14's cheaper cos;
# 3. racecheck and synccheck of EW ALiBi d64; ncu of production causal d64 128x128 at N = 512 beside cuDNN (the
#    grid's slowest shape: HBM bytes, stalls).
set -u
K="cur_plain_bf16_d64_192x128s2 EW_plain_bf16_d64_192x128s2 cur_causal_bf16_d64_192x128s2
EW_causal_bf16_d64_192x128s2 cur_plain_bf16_d128_128x128s2 EW_plain_bf16_d128_128x128s2 cur_alibi_bf16_d64
EW_alibi_bf16_d64 cur_causal_bf16_d64_128x128s2 PP_causal_bf16_d64_128x128s2 cur_score_cos_bf16_d128
PP_score_cos_bf16_d128 cur_plain_bf16_d64_192x128s2 EW_plain_bf16_d64_192x128s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 \
  FULL="EW_plain_bf16_d64_192x128s2 EW_causal_bf16_d64_192x128s2 EW_alibi_bf16_d64 PP_score_cos_bf16_d128" \
  timeout 330 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ew.txt" 2>&1
echo "[$SECONDS s] EW, PP: exit $?"; grep -E "TIMEOUT|FAIL|Error|verify" "$OUT/ew.txt" | head -20
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-ew.json" 2>/dev/null
KERNELS=none BENCH=0 SANITIZE="EW_alibi_bf16_d64" timeout 120 bash benchmarks/kernel_dev/hopper_session.sh \
  > "$OUT/sanitize.txt" 2>&1
echo "[$SECONDS s] sanitize: exit $?"; grep -E "racecheck|synccheck" "$OUT/sanitize.txt" | head
KERNELS=none BENCH=0 NCU="cur_causal_bf16_d64_128x128s2" NCU_N=512 \
  timeout 110 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ncu.txt" 2>&1
echo "[$SECONDS s] ncu: exit $?"; rm -f "$OUT"/*.ncu-rep "$OUT/hopper-dev.json"
gzip -f "$OUT"/ncu-*-details.txt "$OUT"/ncu-*-source.csv 2>/dev/null
for f in "$OUT"/ncu-*-details.txt.gz; do
  [ -e "$f" ] && zcat "$f" | grep -E "^  [a-z_]|^    Duration  |DRAM Throughput   |L2 Hit Rate   |Memory Throughput  .*byte"
done
# the table: TF/s at N = 512 / 1k / 2k / 4k / 16k per kernel, in run order
bash benchmarks/kernel_dev/dev_table.sh "$OUT/ew.txt"
