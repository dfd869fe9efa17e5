#!/usr/bin/env bash
# Session 19, device call 2, from the repo root with carry [".whl", ".dev/hopper"] (built first with
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper cur_plain_bf16_d128_128x128s2 G0_plain_bf16_d128_128x128s2 \
#     cur_plain_bf16_d256_128x64s2 G0_plain_bf16_d256_128x64s2), under one deadline (BUDGET, default 420 s):
# 1. the nine sm90 GPU test modules (sm90.cuh gained fg::mbar::read_in_lane0, so every sm90 kernel's source changed;
#    the mask-function kernels read the producer's notes through it: racecheck again);
# 2. the mods benchmark once more (tiles_from_producer on, with the lane-0 reads);
# 3. G0 (grid groups of the pairs that fit half the L2 however few rounds) against production, plain d128 / d256
#    at N = 512 .. 16k, each kernel in its own process;
# 4. clock_watch: cur and G0 at 16k beside cuDNN, per call, with the SM clock and power sampled.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-420}"
timeout -s INT -k 15 "$(cap 200 160)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  -k "h200 or sm90 or size_params or racecheck or synccheck" tests/test_fa2_grid_gpu.py tests/test_head_dims_gpu.py \
  tests/test_kernel_gpu.py tests/test_sm90_two_ctas_gpu.py tests/test_call_time_gpu.py tests/test_head_dim_v_gpu.py \
  tests/test_tile_skipping_gpu.py tests/test_size_params_gpu.py tests/test_sanitizer_gpu.py > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -E "passed|failed|error|FAILED|pre-compile|Race|hazard" "$OUT/tests.log" | head -30
timeout -k 10 "$(cap 60 130)" python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -4
K="cur_plain_bf16_d128_128x128s2 G0_plain_bf16_d128_128x128s2 cur_plain_bf16_d256_128x64s2 G0_plain_bf16_d256_128x64s2"
KERNELS="$K" BASELINES=none KTIMEOUT=40 timeout "$(cap 90 50)" bash benchmarks/kernel_dev/hopper_session.sh \
  > "$OUT/g0.txt" 2>&1
echo "[$SECONDS s] G0: exit $?"; grep -E "N=|quick|TIMEOUT|ERROR" "$OUT/g0.txt" | head -30
timeout -k 10 "$(cap 60 0)" python3 benchmarks/kernel_dev/clock_watch.py $(for k in $K; do echo .dev/hopper/$k; done) \
  --blocks 3 --seconds 1.2 --out "$OUT/clock-watch.json" > "$OUT/clock-watch.log" 2>&1
echo "[$SECONDS s] clock watch: exit $?"; cat "$OUT/clock-watch.log" | tail -30
