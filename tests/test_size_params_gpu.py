"""Kernels with tiles per range of sizes (`Params when` lines, one launch per range) through the harness's whole
verification suite on the GPU present, which runs each at its bounds and either side of them (verify.default_cases):
the sm90 path with another BLOCK_N below a bound (the K and V tensor maps of that launch's own box) and with the
expert's causal d64 choice (128x128 at N <= 1024), and the sm80 path with smaller tiles at short N."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

# (gpu, variant, dtype, head dim, the `Params when` line; None: the expert's own first choice)
CASES = {
    "sm90-plain-bf16-d128-bn64": ("h200", Variant(), DType.bf16, 128, "Params when N <= 300: BLOCK_N = 64"),
    "sm90-causal-fp16-d64-expert": ("h200", Variant(causal=True), DType.fp16, 64, None),
    "sm90-window-bf16-d64-two-lines": ("h200", Variant(causal=True, window=48), DType.bf16, 64,
                                       "Params when N < 200: BLOCK_M = 64, WARPS = 4\n"
                                       "Params when N <= 1024: BLOCK_M = 128, WARPS = 8"),
    "sm80-causal-fp16-d64-small": ("a100", Variant(causal=True), DType.fp16, 64,
                                   "Params when N <= 256: BLOCK_M = 64, BLOCK_N = 32, WARPS = 4"),
}


def _build(name: str):
    from flashgen.harness.environment import Environment
    from flashgen.harness.suite import translation_target

    gpu, variant, dtype, head_dim, lines = CASES[name]
    env = Environment()
    target = translation_target(gpu)
    if lines is None:
        source, manifest, _tl = env.expert_kernel(variant, target, dtype, head_dim)
    else:
        params = env.choose_params(variant, target, dtype, head_dim)[0]
        text = env.library_tl(variant, target, dtype, head_dim, form="full", params=params)
        head, sep, rest = text.partition("\nParams ")
        first, nl, body = rest.partition("\n")
        source, manifest = env.translate(head + sep + first + nl + lines + "\n" + body, target)
    assert len({launch.when for launch in manifest.launches}) >= 2, "the kernel has one launch per range"
    return source, manifest


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from tests.gpu_kernels import Build

    return {p["name"]: Build(_build, (p["name"],)) for p in (item.callspec.params for item in items)}


@pytest.mark.parametrize("name", list(CASES))
def test_every_range_passes_verification(prebuilt_kernels, reports, name):
    prebuilt_kernels[name]  # fails here with the build or compiler error, if any
    report = reports[name]
    assert report.ok, report.summary
    assert any(result.case.name.startswith("bound_") for result in report.cases), "verification ran the bounds"
