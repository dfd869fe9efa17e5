"""Host C++ stand-ins for the device helpers that translated expressions call, so that tests can compile a plan's
expressions with the host compiler and compare them with numpy (test_lower_cexpr, test_lower_semantics).

Each mirrors its device definition in flashgen/translators/include/flashgen/common.cuh, with the host's exact
functions in place of the approximate SFU instructions (fg::tanh_fast is tanh.approx.f32 there, tanhf here)."""

from __future__ import annotations

import shutil

from flashgen.abi import ABI_HEADER
from flashgen.translators.backends.base import SHARED_INCLUDE

CXX = shutil.which("g++")
COMPILE = ["g++", "-O1", "-std=c++17", "-w"]
PRELUDE = """#include <math.h>
#include <stdio.h>
#include <stdlib.h>
namespace fg {
static inline float tanh_fast(float x) { return tanhf(x); }  // the device's tanh.approx.f32, exactly
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
