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
# mask functions, as `flashgen generate --mask-mod` builds them: their key tiles tested by the producer alone, which
# hands each work tile and key tile to the consumers through shared memory (the sm90 tiles_from_producer switch);
# lengths of 0..M give rows without a key tile (the notes of a work tile without Q)
MASKS = {"lengths_mask": {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}}
KEYS = [("h200", name, DType.bf16, 64) for name in (*FAMILIES, *MASKS)]


def gpu_kernels(items, arch):
    from flashgen.harness.suite import build_expert_kernel, build_mask_kernel
    from tests.gpu_kernels import Build

    return {key: Build(build_mask_kernel, (key[0], key[2].value, Variant(), key[3], MASKS[key[1]])) if key[1] in MASKS
            else Build(build_expert_kernel, (key[0], key[2].value, FAMILIES[key[1]], key[3])) for key in KEYS}


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
    assert set(report.written) == {key[1] for key in KEYS}, report.log_tail
    assert all(w == total for w, total in report.written.values()), report.written
    assert report.ok, report.log_tail

