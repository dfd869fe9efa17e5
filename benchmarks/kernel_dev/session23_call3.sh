#!/usr/bin/env bash
# Session 23's last device call (about 300 s of device time left), from the repo root with carry [".whl",
# ".dev/hopper"]: R2 against cur, causal bf16 d64 (192x128) and d128 (128x128), in shared rounds; `flashgen bench`
# verifies each against fp64 first (tails, n_gt_m, large_magnitude, persistent_walk). R2 (hopper_build.py): the
# diagonal tile's mask as a prefix bit mask of each row's visible columns, tested bit by bit in order after the
# scores, which ptxas turns into R2P (eight a key tile) where it was an ISETP a score: the key-tile loop 662 -> 636
# instructions at d64, 715 -> 688 at d128. Predicted: +1..3 % at N = 512 (40 % of the tiles there are diagonal
# ones), level at 4k.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s23c "${BUDGET:-200}"
trap 'tar -czf "$OUT/call3.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 180 5)" python3 -m flashgen.cli bench .dev/hopper/{cur,R2}_causal_bf16_d64_192x128s2 \
  .dev/hopper/{cur,R2}_causal_bf16_d128_128x128s2 \
  --shapes "B=32,H=32,N=512,M=512,D=64;B=4,H=32,N=4096,M=4096,D=64;B=32,H=16,N=512,M=512,D=128;B=4,H=16,N=4096,M=4096,D=128" \
  --no-flex --min-time 0.2 --rounds 4 --out "$W/r2.json" > "$W/r2.log" 2>&1
echo "[$SECONDS s] R2 bench: exit $?"; grep "fg_\|bf16\|rror" "$W/r2.log"
