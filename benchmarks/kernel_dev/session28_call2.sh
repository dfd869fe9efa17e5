#!/usr/bin/env bash
# Written in session 27 (no machine lent): what one 16k ratio to cuDNN is worth, and whether --settle-each fixes it.
# From the repo root with carry [".whl", ".cubin-cache.tar.xz"] (NO_WHEELS=1 after session28_call1.sh in the same lease).
# Session 26's four settle runs (H100, plain bf16 d128 16k, 4 rounds of 25 ms blocks) read ours / cuDNN at
# 1.03-1.17x; split by the order inside each round, the rounds where ours ran right after its own previous block
# (or the settle) read 0.91-1.01x, those where it ran after FLASH 1.13-1.29x, and cuDNN's own blocks split the same
# way (3.19-3.63 ms after EFFICIENT, 3.56-4.13 right after its own). bench.BENCH_SETTLE_EACH says why and what
# --settle-each does. Three ways, each twice, interleaved (a b c a b c), plain bf16 d128 and d256 16k beside cuDNN:
#   a. the grid's (--min-time 0.1, 4 rounds, settle 0.3);
#   b. the same with --settle-each;
#   c. 16 rounds at --min-time 0.4 (session 26's plan: more, equally short, blocks).
# Predicted: a's two runs differ by 5-15 % and its rounds split by order as above; b's rounds split by under 5 %,
# its two runs agree within 3 %, its times are the slower, self-heated ones (ours ~3.6 ms at d128, ~1.05x cuDNN);
# c's runs agree within 5 % but its rounds still split. If b holds, BENCH_SETTLE_EACH goes on (the grid costs
# ~36 s more) and the grid is run again with it.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s28c2 "${BUDGET:-400}"
trap 'tar -czf "$OUT/call2.tgz" -C "$W" .' EXIT
for i in 1 2; do
  for cfg in "a --rounds 4 --min-time 0.1" "b --rounds 4 --min-time 0.1 --settle-each" "c --rounds 16 --min-time 0.4"; do
    set -- $cfg
    name=$1; shift
    for d in 128 256; do
      timeout -k 5 "$(cap 45 0)" python3 -m flashgen.cli bench generated/h200/bf16/plain_d$d --no-flex "$@" \
        --shapes "B=1,H=$((2048 / d)),N=16384,M=16384,D=$d" --out "$W/$name-d$d-$i.json" > "$W/$name-d$d-$i.log" 2>&1
      echo "[$SECONDS s] $name d$d run $i: exit $?"
    done
  done
done
python3 - "$W" <<'EOF' | tee "$W/summary.txt"
import json, pathlib, statistics, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    entries = {e["name"] if e["kind"] == "baseline" else "ours": e["stats"]
               for e in json.loads(path.read_text())["entries"] if e["ok"] and e["stats"]}
    if "ours" not in entries or "sdpa_cudnn" not in entries:
        print(f"{path.stem}: not timed")
        continue
    ours, cudnn = entries["ours"], entries["sdpa_cudnn"]
    paired = [c / o for o, c in zip(ours["round_medians_ms"], cudnn["round_medians_ms"])]
    print(f"{path.stem}: {ours['median_ms']:.3f} / {cudnn['median_ms']:.3f} ms -> {cudnn['median_ms'] / ours['median_ms']:.3f}x"
          f"; rounds ours first {statistics.fmean(paired[0::2]):.3f}x, last {statistics.fmean(paired[1::2]):.3f}x")
EOF
