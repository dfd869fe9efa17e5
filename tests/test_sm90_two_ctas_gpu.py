"""The sm90 path with one consumer warpgroup (BLOCK_M = 64): two CTAs share an SM, each walking its own work tiles
(kernel.ctas_per_sm). No tile table picks it yet (benchmarks/kernel_dev measures it first); these are its
correctness tests, each kernel through the harness's whole verification on the GPU present: the variants whose
code differs by tile (causal's diagonal, a window's both edges, ALiBi + softcap + LSE, GQA), at d64 with 128-key
tiles and d128 with 64-key tiles (what fits twice in an SM's shared memory), fp16 and bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_tile_params_gpu import GPU, VARIANTS as TILE_VARIANTS  # noqa: E402, I001

pytestmark = pytest.mark.gpu

# the tile tests' variants (each differs by tile) the sm90 path takes (split-KV runs on the sm80 path), and GQA
VARIANTS = {name: v for name, v in TILE_VARIANTS.items() if not v.split_kv} | {"gqa4": Variant(kv_group=4)}
TILES = {64: 128, 128: 64}  # head dim -> BLOCK_N at BLOCK_M = 64, STAGES = 2
MATRIX = [(v, dt, d) for v in VARIANTS for dt in (DType.bf16, DType.fp16) for d in TILES]


def _build(name: str, dtype: DType, head_dim: int):
    from flashgen.harness.suite import translation_target
    from flashgen.translators.backends.sm90 import kernel
    from flashgen.translators.search import translate_with_params

    params = {"BLOCK_M": 64, "BLOCK_N": TILES[head_dim], "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0}
    translation = translate_with_params(VARIANTS[name], translation_target(GPU), dtype, head_dim, params,
                                        backend="sm90")
    assert translation.plan.backend == "sm90" and kernel.ctas_per_sm(translation.plan) == 2, translation.plan
    return translation.source, translation.manifest


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from tests.gpu_kernels import Build

    params = (item.callspec.params for item in items)
    return {key: Build(_build, key) for key in ((p["name"], p["dtype"], p["head_dim"]) for p in params)}


@pytest.mark.parametrize("name,dtype,head_dim", MATRIX, ids=[f"{v}-{dt.value}-d{d}" for v, dt, d in MATRIX])
def test_two_ctas_per_sm_pass_verification(prebuilt_kernels, reports, name, dtype, head_dim):
    prebuilt_kernels[(name, dtype, head_dim)]  # fails here with the build or compiler error, if any
    report = reports[(name, dtype, head_dim)]
    assert report.ok, report.summary
