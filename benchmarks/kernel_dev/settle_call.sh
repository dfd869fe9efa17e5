#!/usr/bin/env bash
# Session 25: does --settle 0.3 put ours in the clock dip after idle (the grid read ours 3.4 % slower than session
# 23 against cuDNN 1 %)? The production bf16 plain d128 at 16k and causal d64 at 512 beside cuDNN, settle 0 / 0.3
# / 1 / 2. Predicted: if 0.3 s lands ours in the dip, 1 and 2 read ours 2-5 % faster against cuDNN
# than 0.3; if not, 0.3 / 1 / 2 level within ~2 % and 0 the fastest (the boost). carry [".whl"]. Not run in
# session 25 (no device time left to start a machine): the first call of the next.
set -u
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/settle 150
for s in 0 0.3 1 2; do
  for k in "plain_d128 B=1,H=16,N=16384,M=16384,D=128" "causal_d64 B=32,H=32,N=512,M=512,D=64"; do
    set -- $k
    timeout -k 5 "$(cap 40 8)" python3 -m flashgen.cli bench generated/h200/bf16/$1 --shapes "$2" --no-flex --min-time 0.1 \
      --rounds 4 --settle $s --out "$W/$1-s$s.json" > "$W/$1-s$s.log" 2>&1
    echo "[$SECONDS s] $1 settle $s: exit $? $(grep -E 'fg_|cudnn' "$W/$1-s$s.log" | grep -v '  -  ' | tr -s ' ' | tr '\n' '|')"
  done
done
# each run's round medians (ms, round order) for ours and cuDNN: a slow first round on ours alone is the dip
python3 - "$W" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for e in json.loads(f.read_text())["entries"]:
        if e.get("stats") and (e["kind"] == "kernel" or e["name"] == "sdpa_cudnn"):
            print(f.stem, e["name"], [round(x, 4) for x in e["stats"]["round_medians_ms"]])
PY
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv
tar czf "$OUT/settle.tgz" -C "$W" .
