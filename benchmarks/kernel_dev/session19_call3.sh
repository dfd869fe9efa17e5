#!/usr/bin/env bash
# Session 19, device call 3, from the repo root with carry [".whl"]: the whole GPU suite (`pytest -m gpu`, every
# module and every code path compiled for the GPU present), last run whole in session 13 (H200, e63b555); the sm80
# and sm75 kernels have changed since, and sessions 14-18 ran only the nine sm90 modules. Under one deadline
# (BUDGET, default 575 s): pytest is interrupted (SIGINT, so that it still prints its summary) before the call's.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch "$OUT" "${BUDGET:-575}"
timeout -s INT -k 10 "$(cap 560 0)" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=10 \
  > "$OUT/tests.log" 2>&1
echo "[$SECONDS s] whole GPU suite: exit $?"
grep -E "passed|failed|error|FAILED|ERROR|pre-compile" "$OUT/tests.log" | tail -40
