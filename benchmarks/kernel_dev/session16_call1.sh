#!/usr/bin/env bash
# Session 16, device call 1, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $QP $TILES $KW   (the names below)
# 1. QP (the next work tile's Q prefetched into L2) against production, interleaved, bf16, at the production tiles
#    of plain and causal d64 / d128 / d256 (causal d64 at its N <= 1k tile, 128x128); QP causal d256 through the
#    harness's whole verification;
# 2. d64 tiles at short N: plain 128x128 (2 and 3 stages) beside 192x128, causal 128x128 with 3 stages;
# 3. session 15's KW (the key-term warp) against production for cos(k_idx) and the two-term function, KW's cos
#    kernel through the whole verification, racecheck and synccheck;
# 4. ncu of production causal d256 at N = 1k (the grid's slowest shape against cuDNN) beside cuDNN.
set -u
QP="cur_causal_bf16_d256_128x64s2 QP_causal_bf16_d256_128x64s2 cur_causal_bf16_d64_128x128s2
QP_causal_bf16_d64_128x128s2 cur_causal_bf16_d128_128x128s2 QP_causal_bf16_d128_128x128s2
cur_plain_bf16_d256_128x64s2 QP_plain_bf16_d256_128x64s2 cur_plain_bf16_d64_192x128s2 QP_plain_bf16_d64_192x128s2
cur_plain_bf16_d128_128x128s2 QP_plain_bf16_d128_128x128s2 cur_causal_bf16_d256_128x64s2 QP_causal_bf16_d256_128x64s2"
TILES="cur_plain_bf16_d64_128x128s2 cur_plain_bf16_d64_128x128s3 cur_causal_bf16_d64_128x128s3"
KW="cur_score_cos_bf16_d128 KW_score_cos_bf16_d128 cur_two_terms_bf16_d128 KW_two_terms_bf16_d128"
KERNELS="$QP $TILES" BASELINES=none KTIMEOUT=40 FULL="QP_causal_bf16_d256_128x64s2" \
  timeout 330 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/qp.txt" 2>&1
echo "[$SECONDS s] QP and tiles: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/qp.txt" | head
KERNELS="$KW" BASELINES=none KTIMEOUT=40 FULL="KW_score_cos_bf16_d128" SANITIZE="KW_score_cos_bf16_d128" \
  timeout 150 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/kw.txt" 2>&1
echo "[$SECONDS s] KW: exit $?"; grep -E "TIMEOUT|FAIL|Error|racecheck|synccheck" "$OUT/kw.txt" | head
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-all.json" 2>/dev/null
KERNELS=none BENCH=0 NCU="cur_causal_bf16_d256_128x64s2" NCU_N=1024 \
  timeout 100 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ncu.txt" 2>&1
echo "[$SECONDS s] ncu: exit $?"; rm -f "$OUT"/*.ncu-rep "$OUT/hopper-dev.json"
gzip -f "$OUT"/ncu-*-details.txt "$OUT"/ncu-*-source.csv 2>/dev/null
ls -la "$OUT"
# the table: TF/s at N = 512 / 1k / 2k / 4k / 16k per kernel, in run order
bash benchmarks/kernel_dev/dev_table.sh "$OUT/qp.txt" "$OUT/kw.txt"
