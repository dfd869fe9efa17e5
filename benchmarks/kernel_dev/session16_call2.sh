#!/usr/bin/env bash
# Session 16, device call 2, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $(the names below, each once)
# 1. CP (causal rows in complementary couples, fg::block::paired_tile) against production, interleaved, bf16: causal
#    d256 (twice), d128, d64 at both of its tiles (128x128 for N <= 1k, 192x128 beyond), window 256; CP causal d256
#    and d64 128x128 through the harness's whole verification;
# 2. ncu of CP causal d256 at N = 1k beside cuDNN: the HBM bytes (production read 2.5x the minimum in call 1).
set -u
K="cur_causal_bf16_d256_128x64s2 CP_causal_bf16_d256_128x64s2 cur_causal_bf16_d128_128x128s2
CP_causal_bf16_d128_128x128s2 cur_causal_bf16_d64_128x128s2 CP_causal_bf16_d64_128x128s2
cur_causal_bf16_d64_192x128s2 CP_causal_bf16_d64_192x128s2 cur_window256_bf16_d128 CP_window256_bf16_d128
cur_causal_bf16_d256_128x64s2 CP_causal_bf16_d256_128x64s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 FULL="CP_causal_bf16_d256_128x64s2 CP_causal_bf16_d64_128x128s2" \
  timeout 300 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/cp.txt" 2>&1
echo "[$SECONDS s] CP: exit $?"; grep -E "TIMEOUT|FAIL|Error|verify" "$OUT/cp.txt" | head
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-cp.json"
KERNELS=none BENCH=0 NCU="CP_causal_bf16_d256_128x64s2" NCU_N=1024 \
  timeout 100 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ncu.txt" 2>&1
echo "[$SECONDS s] ncu: exit $?"; rm -f "$OUT"/*.ncu-rep "$OUT/hopper-dev.json"
gzip -f "$OUT"/ncu-*-details.txt "$OUT"/ncu-*-source.csv 2>/dev/null
for f in "$OUT"/ncu-*-details.txt.gz; do
  zcat "$f" | grep -E "^  [a-z_]|^    Duration  |DRAM Throughput   |L2 Hit Rate   |Memory Throughput  .*byte"
done
bash benchmarks/kernel_dev/dev_table.sh "$OUT/cp.txt"
