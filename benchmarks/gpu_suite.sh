#!/usr/bin/env bash
# The whole GPU suite (`pytest -m gpu`, nothing left out) in one call, on a lent GPU machine, from the repo root:
#   run(command="bash benchmarks/gpu_suite.sh", carry=[".whl"], timeout_s=600)
# .whl/ holds the wheels that machine's image lacks (CPython 3.12), built here with
#   ../shared/gpu/wheelhouse.sh .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 typing-extensions==4.16.0 lark==1.3.1 typer==0.29.2 shellingham==1.5.4 \
#     annotated-doc==0.0.7 openai==3.57.0 anthropic==2.14.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
#     jiter==0.19.0 sniffio==1.3.1 docstring-parser==0.18.0 opentelemetry-api==1.45.2
# (the SDKs are for the CPU tests that use them; the GPU tests need the first nine). NO_WHEELS=1 skips the install.
# $OUT (default /tmp/flashgen-out) receives gpu-suite.log (with the pre-compile pass's line and the 30 slowest
# tests) and gpu-junit.xml; copy the log to benchmarks/results/<date>-h200-pytest-gpu-<commit>.log.
# Extra arguments go to pytest (e.g. -k turing). GPU_SUITE_LIMIT_S (default 570) cuts pytest with SIGINT first,
# so a run that overruns still writes its log and junit XML. FLASHGEN_GIT_COMMIT=<sha> is printed in the log.
# PART=1 / PART=2: the suite in two calls (since session 6 it is more than one 10-minute call holds): PART=2 is the
# grids (every head dim, FlashAttention-2's forward grid, V's own head dim), PART=1 everything else.
cd "$(dirname "$0")/.." || exit 1
GRIDS="tests/test_head_dims_gpu.py tests/test_fa2_grid_gpu.py tests/test_head_dim_v_gpu.py"
case "${PART:-all}" in
  1) for f in $GRIDS; do set -- "--ignore=$f" "$@"; done ;;
  2) set -- $(for f in $GRIDS; do [ -e "$f" ] && echo "$f"; done) "$@" ;;
  all) ;;
  *) echo "PART=${PART}: 1, 2 or all"; exit 2 ;;
esac
. benchmarks/device_prelude.sh || exit 1
set -o pipefail
{
  echo "# gpu suite (part ${PART:-all}): $(date -u +%FT%TZ)  commit: ${FLASHGEN_GIT_COMMIT:-unknown}  cpus: $(nproc)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1 || echo "no nvidia-smi"
  nvcc --version 2>&1 | tail -1
} | tee "$OUT/gpu-suite.log"
timeout -s INT -k 20 "${GPU_SUITE_LIMIT_S:-570}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=30 \
  --junitxml="$OUT/gpu-junit.xml" "$@" 2>&1 | tee -a "$OUT/gpu-suite.log"
rc=$?
echo "# pytest exit $rc (124: cut at ${GPU_SUITE_LIMIT_S:-570} s)" | tee -a "$OUT/gpu-suite.log"
exit $rc
