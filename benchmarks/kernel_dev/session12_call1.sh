#!/usr/bin/env bash
# Session 12, device call 1, from the repo root with carry [".whl", ".dev/hopper"] (kernels prebuilt by
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper $(cat the names below)):
# ping-pong (PP) and V's wait before the fence (VW) beside production (cur), bf16, N = 512 ... 16k, interleaved per
# kernel; the harness's whole verification on the PP kernels whose turns differ (a ring of three, causal, ALiBi,
# window with skipped tiles); the SASS's warpgroup arrives of cur / VW / PP.
set -u
K="cur_plain_bf16_d128_128x128s2 VW_plain_bf16_d128_128x128s2 PP_plain_bf16_d128_128x128s2
cur_alibi_bf16_d128 VW_alibi_bf16_d128 PP_alibi_bf16_d128 cur_softcap30_bf16_d128 VW_softcap30_bf16_d128 PP_softcap30_bf16_d128
cur_score_cos_bf16_d128 VW_score_cos_bf16_d128 PP_score_cos_bf16_d128 cur_document512_bf16_d128 PP_document512_bf16_d128
cur_causal_bf16_d128_128x128s2 PP_causal_bf16_d128_128x128s2 cur_plain_bf16_d64_192x128s2 PP_plain_bf16_d64_192x128s2
cur_plain_bf16_d256_128x64s2 PP_plain_bf16_d256_128x64s2 cur_causal_bf16_d256_128x64s2 PP_causal_bf16_d256_128x64s2
cur_window256_bf16_d128 PP_window256_bf16_d128"
for k in cur_alibi_bf16_d128 VW_alibi_bf16_d128 PP_alibi_bf16_d128; do
  cuobjdump -sass .dev/hopper/$k/kernel.cubin > "$OUT/$k.sass" 2>&1
  echo "$k: $(grep -c 'WARPGROUP.ARRIVE' "$OUT/$k.sass") WARPGROUP.ARRIVE, $(grep -c 'WARPGROUP.DEPBAR' "$OUT/$k.sass") DEPBAR, $(grep -c 'HGMMA' "$OUT/$k.sass") HGMMA"
done
KERNELS="$K" BASELINES=cur_plain KTIMEOUT=60 \
  FULL="PP_plain_bf16_d64_192x128s2 PP_causal_bf16_d128_128x128s2 PP_alibi_bf16_d128 PP_window256_bf16_d128" \
  timeout 500 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -v "quick ok" "$OUT/ab.txt" | grep -E "^[a-zA-Z]|N=|verify|TIMEOUT" | head -150
cd "$OUT" && tar czf session12-call1.tgz *.sass ab.txt hopper-dev.json hopper-dev.log && rm -f *.sass
