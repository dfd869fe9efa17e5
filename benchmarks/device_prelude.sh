# Sourced from the repo root by the one-call scripts for a lent GPU machine (benchmarks/*.sh):
#   . benchmarks/device_prelude.sh || exit 1
# It installs the carried wheels (.whl/: the packages that machine's image lacks, built with
# ../shared/gpu/wheelhouse.sh as gpu_suite.sh's header lists them; NO_WHEELS=1 skips the install), puts them and the
# checkout on PYTHONPATH, unpacks a carried compile cache (.cubin-cache.tar.xz, benchmarks/warm_cache.py), sets
# unbuffered Python, one BLAS thread and flashgen's home (FLASHGEN_HOME, default /tmp/flashgen-home), makes $OUT
# (default /tmp/flashgen-out), and defines
#   cap WANT RESERVE  a step's limit in seconds under one deadline, $BUDGET (set it first): WANT, but never more than
#                     what is left minus RESERVE (what the later steps need), and never below 5
#   device_header     the commit (FLASHGEN_GIT_COMMIT), the time and the CPUs; the GPU, its driver and clocks; nvcc
#   scratch DIR BUDGET_S  for a script that gathers its files in one folder under one deadline: W=DIR (made),
#                     BUDGET=$MEASURE_BUDGET_S or BUDGET_S, and the header shown and written to $W/env.txt
if [ -z "${NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install from .whl/ failed (carry .whl, or NO_WHEELS=1)"; return 1; }
fi
# A second script in the same call sets NO_WHEELS=1 and still finds the first one's install.
# A compile cache filled on the CPU machine (benchmarks/warm_cache.py; carry .cubin-cache.tar.xz): unpacked once a call
# into FLASHGEN_CACHE_DIR (default /tmp/flashgen-cubin; a foreign entry is a cache miss, never a wrong cubin), with
# Python's tarfile (lzma is in its standard library: no xz program needed there)
if [ -f .cubin-cache.tar.xz ]; then
  export FLASHGEN_CACHE_DIR=${FLASHGEN_CACHE_DIR:-/tmp/flashgen-cubin}
  if [ ! -d "$FLASHGEN_CACHE_DIR" ]; then
    mkdir -p "$FLASHGEN_CACHE_DIR" && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
      .cubin-cache.tar.xz "$FLASHGEN_CACHE_DIR" || echo "could not unpack .cubin-cache.tar.xz; compiling afresh"
  fi
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
export FLASHGEN_HOME=${FLASHGEN_HOME:-/tmp/flashgen-home}
OUT=${OUT:-/tmp/flashgen-out}
mkdir -p "$OUT"
cap() {
  local want=$1 reserve=$2 avail
  avail=$(( BUDGET - SECONDS - reserve ))
  (( avail < want )) && want=$avail
  (( want < 5 )) && want=5
  echo "$want"
}
device_header() {
  echo "# commit ${FLASHGEN_GIT_COMMIT:-unknown}, $(date -u +%FT%TZ), $(nproc) cpus"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 | head -1
  nvcc --version 2>&1 | tail -1
}
scratch() {
  W=$1
  mkdir -p "$W"
  BUDGET=${MEASURE_BUDGET_S:-$2}
  device_header | tee "$W/env.txt"
}
