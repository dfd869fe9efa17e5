#!/usr/bin/env bash
# Session 19, device call 4, from the repo root with carry [".whl"], under one deadline (BUDGET, default 400 s): the
# GPU test call 3 failed (its planted bug was stale), then the Hopper grid and the variants suite, each kernel and its baselines now timed in rounds (bench.BENCH_ROUNDS: ours
# first, then last, samples pooled), then the mods benchmark. The kernels are those call 2's GPU tests passed
# (da8a92a: 404 passed) and call 3's whole suite ran.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-400}"
# the one test call 3's whole suite failed, its planted bug rewritten for the kernels' per-row key limits
timeout -s INT -k 10 "$(cap 60 300)" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_agent_real.py::test_gpu_wrong_mask_in_cuda_repaired_after_the_verifier > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] planted-mask test: exit $?"; tail -3 "$OUT/tests.log"
timeout -k 10 "$(cap 240 120)" python3 -m flashgen.cli bench --suite hopper --gpu h200 \
  --min-time 0.1 --out "$OUT/hopper.json" > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$OUT/hopper.log"
timeout -k 10 "$(cap 70 50)" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -10 "$OUT/variants.log"
timeout -k 10 "$(cap 60 0)" python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -8
