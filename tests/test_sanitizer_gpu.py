"""compute-sanitizer's racecheck and synccheck on one kernel per variant family, as `flashgen generate` builds
them for the H200 target (the sm90 path for bf16; split-KV decode takes the sm80 path), compiled for the GPU
present, on a ragged shape with more work tiles than SMs (flashgen.harness.sanitize)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Norm, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

FAMILIES = {
    "plain": Variant(),
    "causal": Variant(causal=True),
    "window": Variant(causal=True, window=48),
    "alibi_softcap_lse": Variant(alibi=True, softcap=30.0, return_lse=True),
    "gqa": Variant(kv_group=2),
    "relu": Variant(norm=Norm.relu),
    "sigmoid": Variant(norm=Norm.sigmoid),
    "decode_splitkv": Variant(split_kv=True, return_lse=True),
}
KEYS = [("h200", name, DType.bf16, 64) for name in FAMILIES]


def gpu_kernels(items, arch):
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    return {key: Build(build_expert_kernel, (key[0], key[2].value, FAMILIES[key[1]], key[3])) for key in KEYS}


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.device import runnable_arch
    from flashgen.harness.sanitize import sanitize, sanitizer_path

    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer is not on PATH")
    kernels = {}
    for key, (source, manifest) in prebuilt_kernels.ready().items():
        compiled = compile_cuda(source, runnable_arch(manifest))
        assert compiled.ok, compiled.log
        kernels[key[1]] = (manifest, compiled.cubin_path)
    return sanitize(kernels)


@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_no_hazards_and_every_output_written(prebuilt_kernels, reports, tool):
    for key in KEYS:
        prebuilt_kernels[key]  # fails here with the build or compiler error, if any
    report = reports[tool]
    assert report.errors == 0, report.log_tail
    if tool == "racecheck":
        assert report.hazards == 0, report.log_tail
    assert set(report.written) == set(FAMILIES), report.log_tail
    assert all(w == total for w, total in report.written.values()), report.written
    assert report.ok, report.log_tail

