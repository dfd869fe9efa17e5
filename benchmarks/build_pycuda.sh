#!/usr/bin/env bash
# Build a pycuda wheel for the offline GPU machine (CPython 3.12, x86-64 Linux) on a machine with nvcc and no GPU,
# plus the pure-Python wheels it needs, into DEST (default .dev/pycuda, ignored by git):
#   bash benchmarks/build_pycuda.sh [DEST]
# then on the GPU machine (tests/test_arrays_gpu.py::test_pycuda_gpuarrays_in_gpuarrays_out):
#   run(command="python3 -m pip install -q --no-index --no-deps --target /tmp/site .dev/pycuda/*.whl && ...",
#       carry=[".whl", ".dev/pycuda"])
# pycuda links against the driver library, libcuda.so.1, which only a GPU machine has (a CUDA toolkit installed from
# the pip packages ships no lib/stubs/libcuda.so): the build links against a stub of that name that defines the
# cu* symbols pycuda uses, so the extension records libcuda.so.1 as NEEDED and binds to the real driver when it is
# imported there. CURAND is left out (not in that toolkit). Needs python3.12 (PYTHON=...), gcc/g++, nvcc (CUDA_ROOT).
set -euo pipefail
dest=$(realpath -m "${1:-.dev/pycuda}")
python=${PYTHON:-python3.12}
if ! "$python" -V >/dev/null 2>&1; then  # a pyenv shim of a version that is installed but not selected
  python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python 2>/dev/null | tail -1)
fi
[ -n "$python" ] && "$python" -V >/dev/null 2>&1 || { echo "no CPython 3.12: set PYTHON=/path/to/python3.12"; exit 1; }
# the toolkit nvcc belongs to (nvcc may be a wrapper script: its dry run names the real folder)
cuda_root=${CUDA_ROOT:-$(realpath "$(cd /tmp && nvcc -dryrun -cubin -arch=sm_80 x.cu 2>&1 | sed -n 's/^#\$ TOP=//p')")}
version=${PYCUDA_VERSION:-2026.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q numpy setuptools wheel
cd "$work"
"$work/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation "pycuda==$version"
tar xzf "pycuda-$version.tar.gz"
cd "pycuda-$version"
# first build: find which cu* symbols the extension needs (an empty stub satisfies the linker)
mkdir -p "$work/stubs"
echo 'void flashgen_libcuda_stub(void) {}' > "$work/stubs/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stubs/libcuda.so" "$work/stubs/stub.c"
"$work/venv/bin/python" configure.py --cuda-root="$cuda_root" --cudadrv-lib-dir="$work/stubs" --no-cuda-enable-curand
"$work/venv/bin/python" setup.py -q build_ext
so=$(find build -name '_driver*.so' | head -1)
nm -D --undefined-only "$so" | awk '{print $2}' | sed 's/@.*//' | grep -E '^cu' | sort -u \
  | awk '{print "int " $1 "(void) { return 999; }"}' > "$work/stubs/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stubs/libcuda.so" "$work/stubs/stub.c"
rm -f "$so"
"$work/venv/bin/python" setup.py -q bdist_wheel -d "$dest"
"$work/venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$dest" \
  pytools platformdirs mako markupsafe siphash24 typing-extensions
ls "$dest"
