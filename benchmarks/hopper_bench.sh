#!/usr/bin/env bash
# The Hopper grid on a lent H200, one call from the repo root (carry [".whl"]):
#   run(command="FLASHGEN_GIT_COMMIT=<sha> bash benchmarks/hopper_bench.sh", carry=[".whl"], timeout_s=600)
# `flashgen bench --suite hopper --gpu h200` (our kernels, each verified first, beside torch SDPA's FLASH, CUDNN and
# EFFICIENT backends and FlexAttention in the same process). $OUT gets the results JSON and the log; the JSON is
# rewritten after every kernel, so a run cut by its limit (HOPPER_BENCH_LIMIT_S, default 420) still reports.
cd "$(dirname "$0")/.." || exit 1
. benchmarks/device_prelude.sh || exit 1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1; } | tee "$OUT/hopper-bench.log"
timeout -k 10 "${HOPPER_BENCH_LIMIT_S:-420}" python3 -m flashgen.cli bench --suite hopper --gpu h200 --min-time 0.1 \
  --out "$OUT/hopper.json" "$@" 2>&1 | tee -a "$OUT/hopper-bench.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/hopper-bench.log"
