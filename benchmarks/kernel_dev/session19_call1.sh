#!/usr/bin/env bash
# Session 19, device call 1, from the repo root with carry [".whl"], under one deadline (BUDGET, default 420 s):
# tiles_from_producer (the producer alone tests a mask function's key tiles and hands each work tile and key tile to
# the consumers in shared memory) through the GPU tests of every kernel it changes (the tile-skipping and call-time
# modules, the sanitizer module with a length mask added), then the mods benchmark with the switch on (the new
# default) and off, each kernel's ratio to the plain kernel of its own rounds.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-420}"
timeout -s INT -k 15 "$(cap 200 200)" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 \
  -k "h200 or sm90 or racecheck or synccheck" tests/test_tile_skipping_gpu.py tests/test_call_time_gpu.py \
  tests/test_sanitizer_gpu.py > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
for sw in on off; do
  timeout -k 10 "$(cap 100 10)" python3 benchmarks/mods_bench.py --gpu h200 --switch "tiles_from_producer=$sw" \
    --out "$OUT/mods-$sw.json" > "$OUT/mods-$sw.log" 2>&1
  echo "[$SECONDS s] mods bench, tiles_from_producer=$sw: exit $?"; grep -v -i warn "$OUT/mods-$sw.log" | tail -4
done
