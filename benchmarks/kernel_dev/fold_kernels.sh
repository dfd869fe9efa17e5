#!/usr/bin/env bash
# The sm80 / sm75 softcap kernels before and after softcap's fold on the shared skeleton (session 24), for
# session24_call1.sh's A/B: `old` from the commit before the fold, `new` from the fold's (merged in session 25),
# each written by `flashgen generate` (a100 bf16 d64 and d128, t4 bf16 d128, softcap 30) and renamed fg_old_* /
# fg_new_* so that one `flashgen bench` loads both. From the repo root, with flashgen installed (editable) and a clean tree:
#   bash benchmarks/kernel_dev/fold_kernels.sh [.dev/sm80]
set -eu
DEST=${1:-.dev/sm80}
declare -A AT=([old]=c2751c3 [new]=c6b2122)  # before the fold; the fold and its review (score_units.cu.j2)
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash first: this checks out ${AT[*]}"; exit 2; }
HERE=$(git rev-parse --abbrev-ref HEAD)
TMP=$(mktemp -d)
trap 'git checkout -q "$HERE"; rm -rf "$TMP"' EXIT
rm -rf "$DEST" && mkdir -p "$DEST"
for version in old new; do
  git checkout -q "${AT[$version]}"
  for spec in "a100 64 d64" "a100 128 d128" "t4 128 t4_d128"; do
    set -- $spec
    flashgen generate --gpu "$1" --dtype bf16 --head-dim "$2" --softcap 30 --out "$TMP/${version}_$3" > /dev/null
    name=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['name'])" "$TMP/${version}_$3/manifest.json")
    mkdir -p "$DEST/${version}_$3"
    for f in kernel.cu manifest.json; do
      sed "s/$name/${name/fg_attn_fwd_/fg_${version}_}/g" "$TMP/${version}_$3/$f" > "$DEST/${version}_$3/$f"
    done
    echo "$DEST/${version}_$3: ${name/fg_attn_fwd_/fg_${version}_}"
  done
done
