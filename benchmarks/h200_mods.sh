#!/usr/bin/env bash
# Score and mask functions on a lent H200, in one call from the repo root (carry [".whl"]):
#   run(command="FLASHGEN_GIT_COMMIT=<sha> bash benchmarks/h200_mods.sh", carry=[".whl"], timeout_s=600)
# 0. the GPU tests of the kernels that skip key tiles and take call-time tensors (tests/test_tile_skipping_gpu.py,
#    tests/test_call_time_gpu.py), so a change to those kernels is verified in the call that times it, and of the
#    sm90 path's two CTAs per SM (tests/test_sm90_two_ctas_gpu.py)                 -> pytest.log
# 1. the mods benchmark (benchmarks/mods_bench.py: a document mask of 512 keys, the per-batch length mask
#    `k_idx < LEN[b]` and the score function `s + 0.25 * cos(k_idx)`, each verified, then timed beside the plain
#    kernel, bf16 d128 4k, on the sm90 and sm80 paths)                                 -> mods.json, mods.log
# 2. the same functions given from the command line, as a user gives them: `flashgen generate` (verified on the GPU,
#    timed beside the libraries and beside flashgen's kernel without the functions, the goal it is held to) -> gen_*.log
# 3. Nsight Compute (a few sections, the tensor pipe's use) and SASS of the kernels NCU_SPECS names (default: the
#    document-mask and score-function kernels, and the plain one at N = 512, as the document mask's row blocks see
#    512 keys each), cuDNN's beside where a spec says so                               -> ncu_*.txt, sass_*.txt
# Each step runs under a timeout cut from one deadline (MEASURE_BUDGET_S, default 550 s; the reserves fit 430 s
# too); everything lands in
# $OUT/mods.tgz (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/.." || exit 1
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/mods 550
timeout -s INT -k 20 "$(cap 150 300)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_tile_skipping_gpu.py \
  tests/test_call_time_gpu.py tests/test_sm90_two_ctas_gpu.py > "$W/pytest.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; grep -v "^\.*\s*\[" "$W/pytest.log" | tail -6
timeout -k 10 "$(cap 120 190)" python3 benchmarks/mods_bench.py --out "$W/mods.json" > "$W/mods.log" 2>&1
echo "[$SECONDS s] mods bench: exit $?"; grep -v -i warn "$W/mods.log" | tail -8
FG="python3 -m flashgen.cli"
timeout -k 10 "$(cap 200 90)" $FG generate --gpu h200 --dtype bf16 --head-dim 128 --score-mod 's + 0.25 * cos(k_idx)' \
  --out "$W/gen_score" > "$W/gen_score.log" 2>&1
echo "[$SECONDS s] generate --score-mod: exit $?"; tail -14 "$W/gen_score.log"
timeout -k 10 "$(cap 60 60)" $FG generate --gpu h200 --dtype bf16 --head-dim 128 --mask-mod 'k_idx < LEN[b]' \
  --tensor 'LEN=int32[B]:0..M' --out "$W/gen_mask" > "$W/gen_mask.log" 2>&1
echo "[$SECONDS s] generate --mask-mod: exit $?"; tail -14 "$W/gen_mask.log"
# NCU_SPECS: "KERNEL N[ cudnn], ..." (hopper_build.py names; cudnn: SDPA's cuDNN kernel on the same tensors too)
NCU_SPECS=${NCU_SPECS:-"cur_document512_bf16_d128 4096, cur_plain_bf16_d128_128x128s2 512, cur_score_cos_bf16_d128 4096"}
timeout -k 10 "$(cap 30 30)" python3 benchmarks/kernel_dev/hopper_build.py "$W/k" \
  $(echo "$NCU_SPECS" | tr ',' '\n' | awk 'NF {print $1}' | sort -u) > "$W/build.log" 2>&1
echo "[$SECONDS s] ncu kernels built: exit $?"; cat "$W/build.log"
NCU="ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats
  --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
echo "$NCU_SPECS" | tr ',' '\n' | while read -r kernel n cudnn; do
  [ -n "$kernel" ] || continue
  pick="regex:fg_" extra=""
  [ "${cudnn:-}" = cudnn ] && pick="regex:fg_|cudnn|sdpa|fmha" extra="--cudnn"
  timeout -k 10 "$(cap 30 5)" $NCU -k "$pick" python3 benchmarks/kernel_dev/ncu_dev.py "$W/k/$kernel" --n "$n" $extra \
    > "$W/ncu_${kernel}_$n.txt" 2>&1
  echo "[$SECONDS s] ncu $kernel N=$n: exit $?"
  grep -E "^  [a-z_]|Duration|Executed Ipc A|Issue Slots Busy|No Eligible|gmma|Block Limit|Achieved Active Warps" \
    "$W/ncu_${kernel}_$n.txt" | head -24
done
for k in "$W"/k/*/; do cuobjdump -sass "$k/kernel.cubin" > "$W/sass_$(basename "$k").txt" 2>&1; done
tar czf "$OUT/mods.tgz" -C "$W" --exclude='*.cubin' .
