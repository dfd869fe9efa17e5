#!/usr/bin/env bash
# The library job on a lent H200 (issue 16's H200 figures), in one call, from the repo root:
#   run(command="bash benchmarks/library_h200.sh", carry=[".whl"], timeout_s=600)
# 1. `flashgen targets detect` on the GPU present -> $OUT/h200-detected.toml
# 2. the h200 library (fp16, bf16 x plain, causal x d64, d128, d256: 12 entries), CPU stages over the cores, GPU
#    stages (full verification, timing beside the baselines) on the GPU -> $OUT/h200-library.json (the index),
#    $OUT/h200-library.md, $OUT/h200-library-summary.json (wall times, per-entry seconds)
# 3. the parameter search as a stage (tuned = "search"): 4 of those entries (bf16 x plain, causal x d64, d128), each
#    searched on the GPU (the 6 likeliest candidates and the packaged choice), built with the winner, verified and
#    timed (beside step 2's packaged kernels at the same shape) -> $OUT/h200-search-library.json,
#    $OUT/h200-search-library.md, $OUT/h200-search-summary.json; then the rerun (every entry kept, nothing searched)
# 4. the library's GPU tests (tests/test_library_gpu.py)
# 5. nvcc throughput against cores (K = 4 x 16 = 64 real compiles: the 24 distinct committed kernel sources for their
#    own arch, then again with a define of their own each; one at a time, then on 16 threads) and the 4-entry CPU-only
#    job (benchmarks/library_scaling.py) -> $OUT/h200-scaling.json
cd "$(dirname "$0")/.." || exit 1
. benchmarks/device_prelude.sh || exit 1
echo "# library on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cpus, $(nvcc --version | tail -1)"
python3 -m flashgen targets detect --out "$OUT/h200-detected.toml"; cat "$OUT/h200-detected.toml"
cat > /tmp/h200-library.toml <<'SPEC'
gpus = ["h200"]
dtypes = ["fp16", "bf16"]
variants = ["plain", "causal"]
head_dims = [64, 128, 256]
tuned = "packaged"
SPEC
start=$(date +%s.%N)
python3 -m flashgen library build /tmp/h200-library.toml --out /tmp/h200-library --json > "$OUT/h200-library-summary.json"
echo "# h200 library: exit $?, $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall"
cp /tmp/h200-library/library.json "$OUT/h200-library.json"; cp /tmp/h200-library/library.md "$OUT/h200-library.md"
cat /tmp/h200-library/library.md
python3 -m flashgen library build /tmp/h200-library.toml --out /tmp/h200-library --json | python3 -c "import json,sys; s=json.load(sys.stdin); print('# rerun:', s['kept'], 'kept,', s['built'], 'built in', s['wall_s'], 's')"
cat > /tmp/h200-search.toml <<'SPEC'
gpus = ["h200"]
dtypes = ["bf16"]
variants = ["plain", "causal"]
head_dims = [64, 128]
tuned = "search"

[search]
max_candidates = 6
budget_s = 120
min_time_s = 0.05
SPEC
start=$(date +%s.%N)
timeout 200 python3 -m flashgen library build /tmp/h200-search.toml --out /tmp/h200-search --json > "$OUT/h200-search-summary.json"
echo "# h200 search library: exit $?, $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall"
cp /tmp/h200-search/library.json "$OUT/h200-search-library.json"; cp /tmp/h200-search/library.md "$OUT/h200-search-library.md"
cat /tmp/h200-search/library.md
python3 -m flashgen library build /tmp/h200-search.toml --out /tmp/h200-search --json | python3 -c "import json,sys; s=json.load(sys.stdin); print('# search rerun:', s['kept'], 'kept,', s['built'], 'built,', s['searched'], 'searched in', s['wall_s'], 's')"
timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_library_gpu.py 2>&1 | tail -5
# the scaling step last, inside what is left of the call (LIBRARY_CALL_S, default 590 s)
left=$(( ${LIBRARY_CALL_S:-590} - SECONDS ))
echo "# nvcc scaling: $left s left"
timeout "$left" python3 benchmarks/library_scaling.py --skip-sequential --only h200/fp16 --nvcc --out "$OUT/h200-scaling.json"
