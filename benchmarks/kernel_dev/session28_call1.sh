#!/usr/bin/env bash
# Written in session 27 for its one device call (three failed starts, then no machine lent: it never ran), and
# replacing session 26's session27_call1.sh: the first call of the next session with a device, from the repo root
# with carry [".whl", ".dev/s26", ".cubin-cache.tar.xz"] and HPON_SHA=<the commit that turns half_first_tile on:
# session 27 left it on the branch hpon, to rebase onto main>. First, on the CPU: python
# benchmarks/kernel_dev/hopper_build.py .dev/s26 {cur,HP}_causal_bf16_d64_128x128s2 {cur,HP}_causal_bf16_d128_128x128s2
# {cur,HP}_causal_bf16_d256_128x64s2; and python benchmarks/warm_cache.py --suite hopper --suite variants (the
# GPU tests' and the grid's nvcc done here; the pre-compile line then says how many came from the cache).
# The 16k timing question session27_call1.sh also asked is session28_call2.sh.
#   1. The half_first_tile switch's GPU tests (never run) and test_harness_gpu.py (its host-time check fixed in s26).
#   2. HP (half_first_tile) against cur, both orders, ours alone in 4 rounds (no baselines: it is our A/B): causal
#      bf16 d64 128x128 at 512 / 1k, d128 at 512 / 1k / 4k, d256 128x64 at 512 / 4k. Predicted (session 26):
#      +5..9 % at 512, +2..5 % at 1k, -1..+1 % at 4k.
#   3. The rule, written before the run: the switch goes on where the tests pass, every 512 shape reads >= +2 %
#      (the mean of the two orders) and no shape below -1.5 %. Then the checkout here is switched on (the same
#      edit as HPON_SHA; FLASHGEN_GIT_COMMIT=HPON_SHA for what follows) and the Hopper grid runs with the time left
#      (benchmarks/h200_measure.sh STEPS="hopper", and "variants" if 400 s are left; none under 230 s: a cut grid
#      is no grid). The tests and the A/B come first: they decide. Otherwise the GPU tests session 26's PART=1 left
#      unreached run instead.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s28c1 "${BUDGET:-580}"
trap 'tar -czf "$OUT/call.tgz" -C "$W" .' EXIT
if [ -n "${AB_ONLY:-}" ]; then  # a budget too short for both: the A/B's figures alone (the rule then reads off)
  TESTS_RC=99; echo "tests not run (AB_ONLY=1)" > "$W/pytest-hp.log"
else
  timeout -k 10 "$(cap 150 160)" python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --durations=10 \
    tests/test_half_first_tile_gpu.py tests/test_harness_gpu.py > "$W/pytest-hp.log" 2>&1
  TESTS_RC=$?
fi
echo "[$SECONDS s] pytest: exit $TESTS_RC"; grep -E "passed|failed|error" "$W/pytest-hp.log" | tail -5
D=.dev/s26
ab() {  # NAME SHAPES KERNEL_DIR...
  local name=$1 shapes=$2; shift 2
  timeout -k 5 "$(cap 40 15)" python3 -m flashgen.cli bench "$@" --shapes "$shapes" --no-baselines --min-time 0.1 \
    --rounds 4 --out "$W/$name.json" > "$W/$name.log" 2>&1
  echo "[$SECONDS s] $name: exit $?"
}
S64="B=32,H=32,N=512,M=512,D=64;B=16,H=32,N=1024,M=1024,D=64"
S128="B=32,H=16,N=512,M=512,D=128;B=16,H=16,N=1024,M=1024,D=128;B=4,H=16,N=4096,M=4096,D=128"
S256="B=32,H=8,N=512,M=512,D=256;B=4,H=8,N=4096,M=4096,D=256"
ab hp-d64-second "$S64" $D/cur_causal_bf16_d64_128x128s2 $D/HP_causal_bf16_d64_128x128s2
ab hp-d64-first "$S64" $D/HP_causal_bf16_d64_128x128s2 $D/cur_causal_bf16_d64_128x128s2
ab hp-d128-second "$S128" $D/cur_causal_bf16_d128_128x128s2 $D/HP_causal_bf16_d128_128x128s2
ab hp-d128-first "$S128" $D/HP_causal_bf16_d128_128x128s2 $D/cur_causal_bf16_d128_128x128s2
ab hp-d256-second "$S256" $D/cur_causal_bf16_d256_128x64s2 $D/HP_causal_bf16_d256_128x64s2
ab hp-d256-first "$S256" $D/HP_causal_bf16_d256_128x64s2 $D/cur_causal_bf16_d256_128x64s2
python3 - "$W" "$TESTS_RC" > "$W/decision.txt" <<'EOF'
import json, math, pathlib, sys
folder, tests_rc = pathlib.Path(sys.argv[1]), int(sys.argv[2])
ms = {}  # (head dim, N) -> {"HP": [median ms per order], "cur": [...]}
for path in sorted(folder.glob("hp-*.json")):
    for e in json.loads(path.read_text())["entries"]:
        if e["kind"] == "kernel" and e["ok"]:
            arm = e["name"].split("_")[1]
            ms.setdefault((e["shape"]["D"], e["shape"]["N"]), {}).setdefault(arm, []).append(e["stats"]["median_ms"])
gains = {}
for key, arms in sorted(ms.items()):
    if len(arms.get("HP", [])) == 2 and len(arms.get("cur", [])) == 2:
        per_order = [c / h - 1 for c, h in zip(arms["cur"], arms["HP"])]
        gains[key] = sum(per_order) / 2
        print(f"d{key[0]} N={key[1]}: HP {' / '.join(f'{g:+.1%}' for g in per_order)} (mean {gains[key]:+.1%})")
full = len(gains) == 7
on = (tests_rc == 0 and full and all(g >= 0.02 for (d, n), g in gains.items() if n == 512)
      and all(g >= -0.015 for g in gains.values()))
print(f"tests exit {tests_rc}, {len(gains)} of 7 shapes timed in both orders -> half_first_tile {'ON' if on else 'off'}")
EOF
cat "$W/decision.txt"
left=$(( BUDGET - SECONDS - 15 ))
if ! grep -q "half_first_tile ON" "$W/decision.txt"; then
  timeout -k 10 "$(cap 400 15)" python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --durations=10 \
    tests/test_call_time_gpu.py tests/test_bit_masks_gpu.py tests/test_arrays_gpu.py tests/test_sanitizer_gpu.py \
    tests/test_size_params_gpu.py tests/test_agent_real.py > "$W/pytest-part1-rest.log" 2>&1
  echo "[$SECONDS s] pytest (PART=1's rest): exit $?"; grep -E "passed|failed|error" "$W/pytest-part1-rest.log" | tail -5
elif (( left < 230 )); then
  echo "[$SECONDS s] half_first_tile ON, but $left s are too few for the grid (~230 s with the cache): it waits for a call"
else
  sed -i 's/^                   half_first_tile=False,/                   half_first_tile=True,/' \
    flashgen/translators/backends/sm90/kernel.py
  grep -q "^                   half_first_tile=True," flashgen/translators/backends/sm90/kernel.py || exit 1
  steps="hopper"; (( left >= 400 )) && steps="hopper variants"  # the grid alone takes ~300 s on a cold nvcc cache
  echo "[$SECONDS s] $steps with half_first_tile on ($left s)"
  FLASHGEN_GIT_COMMIT=${HPON_SHA:-unknown} NO_WHEELS=1 STEPS="$steps" MEASURE_BUDGET_S=$left OUT=$W/measure \
    bash benchmarks/h200_measure.sh
fi
