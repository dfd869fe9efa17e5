#!/usr/bin/env bash
# Session 18, device call 1, from the repo root with carry [".whl", ".dev/hopper"], built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $K   (the names below)
# 1. WS (key_terms_scratch: the shared key-only terms through the warp's own slot of shared memory, no shuffles)
#    against production for cos(k_idx) (pingpong on, and WSN with it off) and for two key terms (WS, WSP = pingpong
#    forced); the plain d128 kernel for the ratio;
# 2. RL (the causal diagonal tile's mask as one compare against a per-row key limit) against production, causal d64
#    at both its tiles and causal d128.
# WS cos, WSP two terms and the RL kernels through the harness's whole verification; racecheck / synccheck of WS cos
# and WSP two terms.
set -u
K="cur_plain_bf16_d128_128x128s2 cur_score_cos_bf16_d128 WS_score_cos_bf16_d128 WSN_score_cos_bf16_d128
cur_two_terms_bf16_d128 WS_two_terms_bf16_d128 WSP_two_terms_bf16_d128
cur_score_cos_bf16_d128 WS_score_cos_bf16_d128 cur_plain_bf16_d128_128x128s2
cur_causal_bf16_d64_128x128s2 RL_causal_bf16_d64_128x128s2 cur_causal_bf16_d64_192x128s2 RL_causal_bf16_d64_192x128s2
cur_causal_bf16_d128_128x128s2 RL_causal_bf16_d128_128x128s2 cur_causal_bf16_d64_128x128s2 RL_causal_bf16_d64_128x128s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 FULL="WS_score_cos_bf16_d128 WSP_two_terms_bf16_d128
RL_causal_bf16_d64_128x128s2 RL_causal_bf16_d64_192x128s2 RL_causal_bf16_d128_128x128s2" \
  timeout 470 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ws-rl.txt" 2>&1
echo "[$SECONDS s] WS, RL: exit $?"; grep -E "TIMEOUT|FAIL|Error|verify" "$OUT/ws-rl.txt" | head -20
cp "$OUT/hopper-dev.json" "$OUT/hopper-dev-ws-rl.json" 2>/dev/null
KERNELS=none BENCH=0 SANITIZE="WS_score_cos_bf16_d128 WSP_two_terms_bf16_d128" timeout 100 \
  bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/sanitize.txt" 2>&1
echo "[$SECONDS s] sanitize: exit $?"; grep -E "racecheck|synccheck" "$OUT/sanitize.txt" | head
rm -f "$OUT/hopper-dev.json"
bash benchmarks/kernel_dev/dev_table.sh "$OUT/ws-rl.txt"
