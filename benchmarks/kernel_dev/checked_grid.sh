#!/usr/bin/env bash
# A kept change's closing device call, from the repo root with carry [".whl"], under one deadline (BUDGET, default
# 570 s): the GPU tests of the kernels the change touched (TESTS: the test files, e.g. the modules of the kernel-hash
# test's list; TESTS_K: pytest's -k expression over them, e.g. "h200 or sm90 or size_params"), then, only if they
# pass, the Hopper grid (beside cuDNN, FLASH and Flex) and the variants suite, and with MODS=1 the mods benchmark on
# the sm90 path. Each step's limit comes from the one deadline (device_prelude.sh's cap), leaving the later steps
# their reserves.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-570}"
mods_reserve=$([ "${MODS:-0}" = 1 ] && echo 120 || echo 0)
# shellcheck disable=SC2086  # TESTS is a list of files
timeout -s INT -k 15 "$(cap 300 $((260 + mods_reserve)))" python3 -m pytest -m gpu -q -p no:cacheprovider \
  --durations=5 ${TESTS_K:+-k "$TESTS_K"} $TESTS > "$OUT/tests.log" 2>&1
rc=$?
echo "[$SECONDS s] GPU tests: exit $rc"; grep -E "passed|failed|error|FAILED|pre-compile" "$OUT/tests.log" | head -30
[ "$rc" = 0 ] || exit 1
timeout -k 10 "$(cap 200 $((60 + mods_reserve)))" python3 -m flashgen.cli bench --suite hopper --gpu h200 \
  --min-time 0.1 --out "$OUT/hopper.json" > "$OUT/hopper.log" 2>&1
echo "[$SECONDS s] Hopper grid: exit $?"; tail -8 "$OUT/hopper.log"
timeout -k 10 "$(cap 60 "$mods_reserve")" python3 -m flashgen.cli bench --suite variants --gpu h200 --min-time 0.1 \
  --out "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[$SECONDS s] variants: exit $?"; tail -10 "$OUT/variants.log"
if [ "${MODS:-0}" = 1 ]; then
  timeout -k 10 "$(cap 120 0)" python3 benchmarks/mods_bench.py --gpu h200 --out "$OUT/mods.json" > "$OUT/mods.log" 2>&1
  echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$OUT/mods.log" | tail -8
fi
