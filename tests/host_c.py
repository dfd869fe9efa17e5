"""Host C++ stand-ins for the device helpers that translated expressions call, so that tests can compile a plan's
expressions with the host compiler and compare them with numpy (test_lower_cexpr, test_lower_semantics).

Each mirrors its device definition in flashgen/translators/include/flashgen/common.cuh formula for formula, with
the host's exact exp2f and division in place of the approximate EX2 and RCP instructions."""

from __future__ import annotations

import shutil

CXX = shutil.which("g++")
COMPILE = ["g++", "-O1", "-std=c++17", "-w"]
PRELUDE = """#include <math.h>
#include <stdio.h>
#include <stdlib.h>
namespace fg {
static inline float tanh_fast(float x) { return 1.0f - 2.0f / (exp2f(2.8853900817779268f * x) + 1.0f); }
}  // namespace fg
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }"""
