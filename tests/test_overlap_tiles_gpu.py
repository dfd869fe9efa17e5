"""The GPU half of tests/test_overlap_tiles.py: kernels built under the sm90 overlap_tiles switch (a work tile's last
P V and the next work tile's first S back to back, the epilogue under both; off by default: slower) through
the harness's whole verification, and racecheck / synccheck. The switch acts only between the work tiles of one
CTA, so every case that matters walks more tiles than the GPU runs CTAs: the default cases' persistent_walk (one
key tile a row; causal rows without keys amid the walk) and walk_long_rows here (four key tiles a row); a mask
that empties every other 128-row block puts tiles without keys amid the walk of a kernel whose producer hands the
tiles to the consumers (the drain's S of the dummy tile, then the notes of a tile without Q)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Shape, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

from tests.test_overlap_tiles import ALTERNATE_BLOCKS, LENGTHS  # noqa: E402

DOCUMENTS = {"mask_mod": "DOC[q_idx] == DOC[k_idx]", "tensors": {"DOC": "int32[M]:0..3:sorted"}}
# key -> (dtype, variant, head dim, mods keywords or None, tiles (BLOCK_M, BLOCK_N) or None: the production table's)
KERNELS = {
    ("plain", "bf16", 64): ("bf16", Variant(), 64, None, None),  # three consumer warpgroups
    ("plain", "fp16", 128): ("fp16", Variant(), 128, None, None),
    ("causal", "bf16", 64): ("bf16", Variant(causal=True), 64, None, None),
    ("causal", "bf16", 128): ("bf16", Variant(causal=True), 128, None, None),
    ("causal_lse", "fp16", 128): ("fp16", Variant(causal=True, return_lse=True), 128, None, None),
    ("causal_128x80", "bf16", 256): ("bf16", Variant(causal=True), 256, None, (128, 80)),  # O from registers
    ("window256", "bf16", 128): ("bf16", Variant(causal=True, window=256), 128, None, None),
    ("alibi", "bf16", 128): ("bf16", Variant(alibi=True), 128, None, None),  # ping-pong
    ("gqa4", "bf16", 128): ("bf16", Variant(kv_group=4), 128, None, None),
    ("lengths", "bf16", 128): ("bf16", Variant(return_lse=True), 128, LENGTHS, None),
    ("documents_causal", "bf16", 128): ("bf16", Variant(causal=True), 128, DOCUMENTS, None),
    ("alternate_blocks", "bf16", 128): ("bf16", Variant(), 128, ALTERNATE_BLOCKS, None),
}
SANITIZED = [("causal", "bf16", 64), ("alibi", "bf16", 128), ("alternate_blocks", "bf16", 128)]


def build(dtype: str, variant: Variant, head_dim: int, mods: dict | None, tiles: tuple[int, int] | None):
    """(source, manifest) built for the H200 target under the switch, checked to have taken effect."""
    from flashgen.harness.suite import build_expert_kernel, build_mask_kernel
    from flashgen.translators.backends.sm90 import kernel
    from flashgen.translators.render import render
    from flashgen.translators.rules import plan_for_variant

    with kernel.schedule_overrides(overlap_tiles=True):
        if mods is not None:
            source, manifest = build_mask_kernel("h200", dtype, variant, head_dim, mods)
        elif tiles is not None:
            plan = plan_for_variant(variant, "h200", DType(dtype), head_dim, backend="sm90")
            plan = plan.model_copy(update=dict(block_m=tiles[0], block_n=tiles[1], warps=tiles[0] // 16,
                                               name=f"{plan.name}_{tiles[0]}x{tiles[1]}"))
            source, manifest = render(plan)
        else:
            source, manifest, _ = build_expert_kernel("h200", dtype, variant, head_dim)
    assert "dummy_tile" in source, "overlap_tiles did not take effect"
    return source, manifest


def walk_long_rows(manifest) -> list:
    """Four key tiles a row (of 128) over 210 .. 490 work tiles: the drain between tiles that each ran the loop."""
    from flashgen.harness.verify import CheckCase

    g = manifest.variant.kv_group
    heads = g * -(-35 // g)
    shape = Shape(B=2, H=heads, N=384, M=416, D=manifest.head_dim, KVH=heads // g if g > 1 else None,
                  DV=manifest.head_dim_v)
    return [CheckCase(name="walk_long_rows", shape=shape)]


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build

    return {key: Build(build, KERNELS[key]) for key in KERNELS}


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    from flashgen.harness.worker import KernelInput
    from tests.gpu_kernels import verify_many

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items()}, extra_cases=walk_long_rows)


@pytest.mark.parametrize("key", list(KERNELS), ids=["-".join(map(str, k)) for k in KERNELS])
def test_kernels_under_the_switch_pass_the_whole_verification_over_a_persistent_walk(prebuilt_kernels, reports, key):
    prebuilt_kernels[key]  # fails here with the build or compiler error, if any
    report = reports[key]
    assert report.ok, report.summary
    names = {case.case.name for case in report.cases}
    assert {"persistent_walk", "walk_long_rows"} <= names, names


@pytest.fixture(scope="module")
def sanitized(prebuilt_kernels):
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.device import runnable_arch
    from flashgen.harness.sanitize import sanitize, sanitizer_path

    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer is not on PATH")
    kernels = {}
    for key in SANITIZED:
        source, manifest = prebuilt_kernels[key]
        compiled = compile_cuda(source, runnable_arch(manifest))
        assert compiled.ok, compiled.log
        kernels["-".join(map(str, key))] = (manifest, compiled.cubin_path)
    return sanitize(kernels)


@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_no_hazards_under_the_switch(sanitized, tool):
    report = sanitized[tool]
    assert report.errors == 0, report.log_tail
    if tool == "racecheck":
        assert report.hazards == 0, report.log_tail
    assert len(report.written) == len(SANITIZED), report.log_tail
    assert all(w == total for w, total in report.written.values()), report.written
    assert report.ok, report.log_tail
