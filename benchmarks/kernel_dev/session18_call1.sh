#!/usr/bin/env bash
# Session 18, device call 1, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $K   (the names below)
# 1. WS (key_terms_scratch: the shared key-only terms through the warp's own slot of shared memory, no shuffles)
#    against production for cos(k_idx) (pingpong on, and WSN with it off) and for two key terms (WS, WSP = pingpong
#    forced); the plain d128 kernel for the ratio;
# 2. RK (row_key_limits: a masked tile against per-row key limits) against production, causal d64
#    at both its tiles, causal d128 and window 256 d128.
# WS cos, WSP two terms and the RK kernels through the harness's whole verification; racecheck / synccheck of WS cos.
set -u
K="cur_plain_bf16_d128_128x128s2 cur_score_cos_bf16_d128 WS_score_cos_bf16_d128 WSN_score_cos_bf16_d128
cur_two_terms_bf16_d128 WS_two_terms_bf16_d128 WSP_two_terms_bf16_d128
cur_causal_bf16_d64_128x128s2 RK_causal_bf16_d64_128x128s2 cur_causal_bf16_d64_192x128s2 RK_causal_bf16_d64_192x128s2
cur_causal_bf16_d128_128x128s2 RK_causal_bf16_d128_128x128s2 cur_window256_bf16_d128 RK_window256_bf16_d128
cur_score_cos_bf16_d128 WS_score_cos_bf16_d128 cur_causal_bf16_d64_128x128s2 RK_causal_bf16_d64_128x128s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 FULL="WS_score_cos_bf16_d128 WSP_two_terms_bf16_d128
RK_causal_bf16_d64_128x128s2 RK_causal_bf16_d64_192x128s2 RK_causal_bf16_d128_128x128s2 RK_window256_bf16_d128" \
  timeout 400 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ws-rk.txt" 2>&1
echo "[$SECONDS s] WS, RK: exit $?"; grep -E "TIMEOUT|FAIL|Error|verify" "$OUT/ws-rk.txt" | head -20
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-ws-rk.json" 2>/dev/null
KERNELS=none BENCH=0 SANITIZE="WS_score_cos_bf16_d128" timeout 80 \
  bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/sanitize.txt" 2>&1
echo "[$SECONDS s] sanitize: exit $?"; grep -E "racecheck|synccheck" "$OUT/sanitize.txt" | head
rm -f "$OUT/hopper-dev.json"
bash benchmarks/kernel_dev/dev_table.sh "$OUT/ws-rk.txt"
