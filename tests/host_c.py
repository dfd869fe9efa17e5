"""Host C++ stand-ins for the device helpers that translated expressions call, so that tests can compile a plan's
expressions with the host compiler and compare them with numpy (test_lower_cexpr, test_lower_semantics).

Each mirrors its device definition in flashgen/translators/include/flashgen/common.cuh, with the host's exact
functions in place of the approximate SFU instructions (fg::tanh_fast is tanh.approx.f32 there, tanhf here; the
device's range reduction of fg::cos_approx and fg::sin_approx, reduce_2pi, is the header's own code)."""

from __future__ import annotations

import re
import shutil

from flashgen.abi import ABI_HEADER
from flashgen.translators.backends.base import SHARED_INCLUDE

CXX = shutil.which("g++")
COMMON_CUH = SHARED_INCLUDE / "flashgen" / "common.cuh"


def device_function(name: str, header=COMMON_CUH) -> str:
    """A device function of `header` (common.cuh by default; `__device__ __forceinline__ T name(...) { ... }`, ending
    at the first line that is `}`) as host C++."""
    match = re.search(r"^__device__ __forceinline__ \w+ " + name + r"\(.*?^}$", header.read_text(), re.M | re.S)
    assert match, f"{name} is not in {header}"
    return match.group(0).replace("__device__ __forceinline__", "static inline")


COMPILE = ["g++", "-O1", "-std=c++17", "-w"]
PRELUDE = """#include <math.h>
#include <stdio.h>
#include <stdlib.h>
namespace fg {
static inline float tanh_fast(float x) { return tanhf(x); }  // the device's tanh.approx.f32, exactly
""" + device_function("reduce_2pi") + """
static inline float cos_approx(float x) { return cosf(reduce_2pi(x)); }  // the device's cos.approx of the same
static inline float sin_approx(float x) { return sinf(reduce_2pi(x)); }
}  // namespace fg
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
""" + f'#include "{ABI_HEADER}"' + """
// the kernel's parameters as far as expressions read them: no caller ALiBi slopes (the standard ones), no tensors
static const FlashgenAttnParams p = {};"""
# The tile tests' interval functions (flashgen/interval.cuh, flashgen.translators.tiles) on the host: the header is
# plain C++ but for its device qualifiers. Compile with INCLUDE (its folder).
INTERVALS = """#define __host__
#define __device__
#define __forceinline__ inline
#include "flashgen/interval.cuh"
"""
INCLUDE = ["-I", str(SHARED_INCLUDE)]
