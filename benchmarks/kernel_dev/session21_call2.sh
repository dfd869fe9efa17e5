#!/usr/bin/env bash
# Session 21, device call 2, from the repo root with carry [".whl"], under one deadline (BUDGET, default 560 s): the
# Hopper grid (each kernel and its baselines in rounds), the variants suite and the mods benchmark, with the
# production kernels of this commit, packed into $OUT/call2.tgz (the logs and JSON).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s21 "${BUDGET:-560}"
trap 'tar -czf "$OUT/call2.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 300 170)" python3 -m flashgen.cli bench --suite hopper --gpu h200 \
  --min-time 0.1 --out "$W/hopper.json" > "$W/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$W/hopper.log"
timeout -k 10 "$(cap 90 80)" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$W/variants.json" > "$W/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -10 "$W/variants.log"
timeout -k 10 "$(cap 75 0)" python3 benchmarks/mods_bench.py --gpu h200 --min-time 0.1 --out "$W/mods.json" \
  > "$W/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$W/mods.log" | tail -8
