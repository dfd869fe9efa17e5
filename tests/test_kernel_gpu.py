"""Every variant x dtype x head dim of the reference translator, built the way `flashgen generate` builds
it (library TL -> check -> translate) and verified by the harness's whole verification suite on the GPU
present: the H200 target (sm90 path for fp16/bf16, sm80 for fp32 and split-KV) and the A100 target (sm80 path),
both compiled for that GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Norm, Variant

# The spawned worker imports by module path: it needs the repo root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

# h200: the target's own paths (sm90 for fp16/bf16, sm80 for fp32 and split-KV); a100: the sm80 path everywhere.
# The harness compiles each for the GPU present, so an H200 runs both.
GPUS = ("h200", "a100")
VARIANTS = {
    "plain": Variant(),
    "causal": Variant(causal=True),
    "window": Variant(causal=True, window=48),
    "alibi": Variant(alibi=True),
    "softcap": Variant(softcap=5.0),
    "gqa": Variant(kv_group=2),
    "mqa": Variant(kv_group=4),
    "relu": Variant(norm=Norm.relu),
    "sigmoid": Variant(norm=Norm.sigmoid),
    "lse": Variant(return_lse=True),
    "causal_alibi_softcap_lse": Variant(causal=True, alibi=True, softcap=30.0, return_lse=True),
    "decode_splitkv": Variant(split_kv=True, return_lse=True),
}
HEAD_DIMS = (64, 96, 128, 256)
MATRIX = [(gpu, name, dtype, d) for gpu in GPUS for name in VARIANTS for dtype in DType for d in HEAD_DIMS]


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    keys = [(p["gpu"], p["name"], p["dtype"], p["head_dim"]) for p in (item.callspec.params for item in items)]
    return {key: Build(build_expert_kernel, (key[0], key[2].value, VARIANTS[key[1]], key[3])) for key in keys}


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.value)
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("gpu", GPUS)
def test_translated_kernel_passes_verification(prebuilt_kernels, reports, gpu, name, dtype, head_dim):
    prebuilt_kernels[(gpu, name, dtype, head_dim)]  # fails here with the build or compiler error, if any
    report = reports[(gpu, name, dtype, head_dim)]
    assert report.ok, report.summary
