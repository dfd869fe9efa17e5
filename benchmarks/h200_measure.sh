#!/usr/bin/env bash
# The session's measurements on a lent H200, in one call from the repo root (carry [".whl"]):
#   run(command="FLASHGEN_GIT_COMMIT=<sha> bash benchmarks/h200_measure.sh", carry=[".whl"], timeout_s=600)
# 1. the Hopper grid (`flashgen bench --suite hopper`: 72 shapes, every kernel verified first, beside cuDNN, FLASH,
#    EFFICIENT and Flex in the same process)                                      -> hopper.json, hopper.log
# 2. the variants suite (bf16 d128 4k: window 256, ALiBi, softcap 30, GQA 8:1 beside plain and causal)
#                                                                                  -> variants.json, variants.log
# 3. the head-dim suite (non-native head dims beside the native ones they pad to) -> headdims.json, headdims.log
# 4. the mods benchmark (benchmarks/mods_bench.py: score and mask functions beside plain, sm90 and sm80 paths) -> mods.json
# 5. nvcc throughput against the 16 cores (benchmarks/library_scaling.py --nvcc: K = 64 real compiles one at a time,
#    then on 16 spawned processes, as the library job's build pool runs them, and on 16 threads of one process)
#                                                                                  -> scaling.json, scaling.log
# Each step runs under a timeout cut from one deadline (MEASURE_BUDGET_S, default 580 s), a failing step does not
# stop the next, and everything lands in $OUT/measure.tgz (the device returns at most 8 files). STEPS (default
# "hopper variants headdims mods scaling") picks the steps, e.g. STEPS="hopper variants mods" MODS_GPUS=h200 for the
# Hopper path's figures alone (session 21's call 2). ROUNDS (default: the CLI's, 4) sets the grid's and the variants'
# --rounds: session 26 read a 16k ratio move +-10 % between runs of 4 rounds (NOTES.md); SETTLE_EACH=1 gives both
# --settle-each (NOTES.md, session 27: that spread is the order inside a round; the grid takes ~36 s more).
set -u
cd "$(dirname "$0")/.." || exit 1
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/measure 580
FG="python3 -m flashgen.cli"
TIMING_ARGS="${ROUNDS:+--rounds $ROUNDS}${SETTLE_EACH:+ --settle-each}"
STEPS=" ${STEPS:-hopper variants headdims mods scaling} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
# A step's timeout keeps back what the wanted steps after it need at least (their floors) and 10 s for the tar, so
# that a short budget or STEPS="hopper variants" gives the grid what the steps left out would have kept.
ORDER="hopper variants headdims mods scaling"
declare -A FLOOR=([hopper]=200 [variants]=90 [headdims]=60 [mods]=60 [scaling]=50)
reserve() {  # STEP
  local total=10 after="" step
  for step in $ORDER; do
    [ -n "$after" ] && want "$step" && total=$((total + FLOOR[$step]))
    [ "$step" = "$1" ] && after=1
  done
  echo "$total"
}
if want hopper; then
  timeout -k 10 "$(cap 300 "$(reserve hopper)")" $FG bench --suite hopper --gpu h200 --min-time 0.1 $TIMING_ARGS --out "$W/hopper.json" > "$W/hopper.log" 2>&1
  echo "[$SECONDS s] hopper grid: exit $?"; tail -5 "$W/hopper.log"
fi
if want variants; then
  timeout -k 10 "$(cap 100 "$(reserve variants)")" $FG bench --suite variants --gpu h200 --min-time 0.1 $TIMING_ARGS --out "$W/variants.json" > "$W/variants.log" 2>&1
  echo "[$SECONDS s] variants: exit $?"; tail -12 "$W/variants.log"
fi
if want headdims; then
  timeout -k 10 "$(cap 90 "$(reserve headdims)")" $FG bench --suite headdims --gpu h200 --min-time 0.1 --out "$W/headdims.json" > "$W/headdims.log" 2>&1
  echo "[$SECONDS s] head dims: exit $?"; tail -16 "$W/headdims.log"
fi
if want mods; then
  timeout -k 10 "$(cap 60 "$(reserve mods)")" python3 benchmarks/mods_bench.py --gpu ${MODS_GPUS:-h200 a100} --out "$W/mods.json" > "$W/mods.log" 2>&1
  echo "[$SECONDS s] mods: exit $?"; grep -v -i warn "$W/mods.log" | tail -6
fi
if want scaling; then
  timeout -k 10 "$(cap 200 "$(reserve scaling)")" python3 benchmarks/library_scaling.py --skip-library --nvcc --nvcc-workers process,thread \
    --out "$W/scaling.json" > "$W/scaling.log" 2>&1
  echo "[$SECONDS s] nvcc scaling: exit $?"; grep "^nvcc" "$W/scaling.log"
fi
tar czf "$OUT/measure.tgz" -C "$W" .
