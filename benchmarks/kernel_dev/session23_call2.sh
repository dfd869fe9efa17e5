#!/usr/bin/env bash
# Session 23's second device call, from the repo root with carry [".whl", ".dev/hopper"], under one deadline (BUDGET,
# default 560 s). The production forms of SC and AL3 (plan.FactoredScore, plan.DistanceTerm) are in the sm90 template;
# .dev/hopper/s23_{alibi,softcap30}_bf16_d128 are the production kernels renamed (the rules' plans, as hopper_build's
# cur renders them now), the cur_* there the kernels from before the change.
# 1. The GPU tests of every kernel the change touched (tests/kernel_hashes.json: the sm90 softcap and ALiBi kernels).
# 2. `flashgen bench --suite variants` (bf16 d128 4k beside the plain kernel). Predicted: softcap 0.73 -> ~0.79 of
#    plain, ALiBi 0.84 -> ~0.88 (call 1: SC +8.5 %, AL3 +4.6 % at 4k).
# 3. The production kernels against the ones before, in shared rounds: the same SASS as SC and AL3 (955 and 1099
#    instructions a key tile), so predicted as call 1 measured them.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s23b "${BUDGET:-560}"
trap 'tar -czf "$OUT/call2.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 300 250)" python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 -k "alibi or softcap" \
  tests/test_kernel_gpu.py tests/test_fa2_grid_gpu.py tests/test_call_time_gpu.py tests/test_overlap_tiles_gpu.py \
  tests/test_sanitizer_gpu.py tests/test_sm90_two_ctas_gpu.py > "$W/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -v -i "warn" "$W/tests.log" | tail -4
timeout -k 10 "$(cap 150 100)" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$W/variants.json" > "$W/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -14 "$W/variants.log"
timeout -k 10 "$(cap 100 5)" python3 -m flashgen.cli bench .dev/hopper/{cur,s23}_alibi_bf16_d128 \
  .dev/hopper/{cur,s23}_softcap30_bf16_d128 --shapes "B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128" \
  --no-flex --min-time 0.2 --rounds 4 --out "$W/ab.json" > "$W/ab.log" 2>&1
echo "[$SECONDS s] A/B: exit $?"; grep "fg_" "$W/ab.log"
