"""The translator's other tile shapes: the parameters a search (`flashgen tune`) may choose instead of the
defaults must be as correct as the defaults. Double-buffered K/V (STAGES=2), Q re-read from shared memory,
one or two 16-row MMA tiles per warp, key tiles of 32..128 and the launch orders, each through the harness's whole
verification suite on the GPU present."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

GPU = "h200"
VARIANTS = {
    "plain": Variant(),
    "causal": Variant(causal=True),
    "window": Variant(causal=True, window=48),
    "decode_splitkv": Variant(split_kv=True, return_lse=True),
    "causal_alibi_softcap_lse": Variant(causal=True, alibi=True, softcap=30.0, return_lse=True),
}
# BMxBNwWqQsS[gG]: BLOCK_M x BLOCK_N, WARPS, Q_IN_REGS, STAGES, GROUP_HEADS (launch order; the variant's default
# when absent). g3 leaves a partial last group of (batch, head) pairs in the verification shapes.
CONFIGS = ("128x64w4q0s2", "128x64w4q1s2g3", "128x128w8q1s2g0", "64x32w4q1s2", "128x64w8q0s1g2")
MATRIX = ([(v, DType.bf16, d, c) for v in VARIANTS for d in (64, 128) for c in CONFIGS]
          + [(v, DType.fp16, d, c) for v in VARIANTS for d in (64, 128) for c in ("128x64w4q0s2", "128x128w8q1s2")]
          + [(v, DType.fp32, d, "64x32w4q0s2") for v in ("plain", "causal") for d in (64, 128)])


def _build(name: str, dtype: DType, head_dim: int, config: str):
    from flashgen.harness.suite import translation_target
    from flashgen.translators.search import parse_compact_params, translate_with_params

    params = parse_compact_params(config)
    translation = translate_with_params(VARIANTS[name], translation_target(GPU), dtype, head_dim, params,
                                        backend="sm80")  # this module tests the mma.sync path's tiles
    chosen = {key: translation.manifest.params[key] for key in params}
    assert chosen == params, f"the translator changed the requested parameters: {chosen} != {params}"
    return translation.source, translation.manifest


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from tests.gpu_kernels import Build

    params = (item.callspec.params for item in items)
    return {key: Build(_build, key) for key in ((p["name"], p["dtype"], p["head_dim"], p["config"]) for p in params)}


@pytest.mark.parametrize("name,dtype,head_dim,config", MATRIX,
                         ids=[f"{v}-{dt.value}-d{d}-{c}" for v, dt, d, c in MATRIX])
def test_tile_parameters_pass_verification(prebuilt_kernels, reports, name, dtype, head_dim, config):
    prebuilt_kernels[(name, dtype, head_dim, config)]  # fails here with the build or compiler error, if any
    report = reports[(name, dtype, head_dim, config)]
    assert report.ok, report.summary
