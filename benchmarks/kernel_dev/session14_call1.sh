#!/usr/bin/env bash
# Session 14, device call 1, from the repo root with carry [".whl", ".dev/hopper"] (hopper_build.py .dev/hopper
#   $(names below)):
# 1. cos without cosf's range reduction (CW, CWH) against production (cur, run twice, interleaved) and the plain
#    kernel, bf16 d128, N = 512 ... 16k; CW and CWH through the harness's whole verification;
# 2. the variants suite and the mods benchmark at this tree's production kernels (the session's record).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
K="cur_plain_bf16_d128_128x128s2 cur_score_cos_bf16_d128 CW_score_cos_bf16_d128 CWH_score_cos_bf16_d128
cur_score_cos_bf16_d128 CW_score_cos_bf16_d128"
KERNELS="$K" BASELINES=none KTIMEOUT=60 FULL="CW_score_cos_bf16_d128 CWH_score_cos_bf16_d128" \
  timeout 200 bash benchmarks/kernel_dev/hopper_session.sh > "$OUT/ab.txt" 2>&1
echo "[$SECONDS s] A/B done: exit $?"; grep -E "TIMEOUT|FAIL|Error" "$OUT/ab.txt" | head
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
FG="python3 -m flashgen.cli"
timeout -k 10 150 $FG bench --suite variants --gpu h200 --min-time 0.1 --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -12 "$OUT/variants.log"
timeout -k 10 120 python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -8
cd "$OUT" && tar czf session14-call1.tgz ab.txt hopper-dev.json hopper-dev.log variants.json variants.log mods.json mods.log
