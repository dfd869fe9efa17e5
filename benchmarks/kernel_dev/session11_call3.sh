#!/usr/bin/env bash
# Session 11, device call 3, from the repo root with carry [".whl", ".dev/hopper"], under one deadline (560 s), on the
# tree whose whole GPU suite passed in call 2 (snake rounds and tiles by N):
# 1. the Hopper grid (`flashgen bench --suite hopper`, every kernel verified first, beside cuDNN, FLASH and Flex)
# 2. the variants suite (window 256, ALiBi, softcap 30, GQA 8:1 beside plain, bf16 d128 4k)
# 3. the mods benchmark (score and mask functions beside their plain twins, sm90 and sm80)
# 4. Nsight Compute of the production causal d128 kernel at N = 1024 beside cuDNN's (the grid's causal gap at N <= 2k)
# Results land in $OUT as one tgz (the device returns at most 8 files).
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT/r" 560
FG="python3 -m flashgen.cli"
timeout -k 10 "$(cap 290 270)" $FG bench --suite hopper --gpu h200 --min-time 0.1 --out "$W/hopper.json" \
  > "$W/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -22 "$W/hopper.log"
timeout -k 10 "$(cap 90 180)" $FG bench --suite variants --gpu h200 --min-time 0.1 --out "$W/variants.json" \
  > "$W/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -12 "$W/variants.log"
timeout -k 10 "$(cap 90 90)" python3 benchmarks/mods_bench.py --gpu h200 --out "$W/mods.json" > "$W/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$W/mods.log" | tail -8
name=cur_causal_bf16_d128_128x128s2
timeout -k 10 "$(cap 80 0)" ncu --set full --import-source yes -k regex:'fg_|cudnn|sdpa|fmha' -o "$W/ncu-$name" \
  python3 benchmarks/kernel_dev/ncu_dev.py ".dev/hopper/$name" --n 1024 --cudnn > "$W/ncu-$name.txt" 2>&1
echo "[$SECONDS s] ncu: exit $?"
ncu -i "$W/ncu-$name.ncu-rep" --page details --print-details all > "$W/ncu-$name-details.txt" 2>&1
ncu -i "$W/ncu-$name.ncu-rep" --page source --csv --print-source sass > "$W/ncu-$name-source.csv" 2>&1
tar czf "$OUT/call3.tgz" -C "$W" . && ls -la "$OUT"
