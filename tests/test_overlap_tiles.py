"""CPU tests of the sm90 overlap_tiles switch (flashgen.translators.backends.sm90.kernel.schedule): a work tile's last
P V and the next work tile's first S issued back to back, this tile's epilogue under both. Off by default (measured
6-8 % slower on an H100, session 21: kernel.schedule says why); these check what the switch renders, where it applies, and that ptxas keeps the kernels'
wgmma asynchronous (a wgmma issued on one branch only serializes them all: the drain issues an S on every path,
of the dummy tile where there is no next key tile). The GPU half: tests/test_overlap_tiles_gpu.py."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from flashgen.harness.ptxas import serialized_wgmma
from flashgen.translators.backends.sm90 import kernel
from flashgen.translators.render import render
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Variant

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

LENGTHS = {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}
# a mask of positions only that empties every other 128-row block: work tiles without keys amid the walk, which the
# producer's notes announce (tiles_from_producer) and the drain answers with an S of the dummy tile
ALTERNATE_BLOCKS = {"mask_mod": "(q_idx // 128) % 2 == 1"}


def _plan(variant: Variant, head_dim: int, dtype: DType = DType.bf16, **tiles):
    plan = plan_for_variant(variant, "h200", dtype, head_dim, name=f"ot_{head_dim}", backend="sm90")
    if tiles:
        plan = plan.model_copy(update=dict(tiles, warps=tiles.get("block_m", plan.block_m) // 16))
    return plan


def test_off_by_default_and_production_renders_without_it():
    for variant in (Variant(), Variant(causal=True), Variant(alibi=True)):
        for d in (64, 128, 256):
            plan = _plan(variant, d)
            assert kernel.schedule(plan)["overlap_tiles"] is False
            assert "dummy_tile" not in render(plan)[0]


def test_the_switch_renders_the_drain_and_takes_a_dummy_tile_of_shared_memory():
    plan = _plan(Variant(causal=True), 128)
    off = kernel.smem_bytes(plan)
    with kernel.schedule_overrides(overlap_tiles=True):
        assert kernel.schedule(plan)["overlap_tiles"] is True
        source, manifest = render(plan)
        assert kernel.smem_bytes(plan) == off + 1024 == manifest.launches[0].smem_bytes
    # one S issued in the drain on every path (real or of the dummy tile), P V waited for alone under it, and the
    # last drain's S retired before the CTA exits
    assert source.count("issue_qk(s_next, real);") == 1
    assert source.count("fg::wgmma::wait<1>();  // P V landed; the next S may still run") == 1
    assert "if (!s_ahead) {" in source and "fg::wgmma::wait<0>();  // the last drain's S of the dummy tile" in source
    assert "dummy_tile[i] = 0u" in source


def test_not_with_64_key_tiles_nor_a_wider_v():
    """ptxas serializes every wgmma of a 64-key-tile kernel under the switch, and of one whose V is wider than Q and K
    (nvcc 13.0): such plans render without it; 80 keys and up, and a narrower V, with it."""
    with kernel.schedule_overrides(overlap_tiles=True):
        for d, block_n, on in ((128, 64, False), (256, 64, False), (256, 80, True), (128, 128, True)):
            plan = _plan(Variant(), d, block_m=128, block_n=block_n)
            assert kernel.schedule(plan)["overlap_tiles"] is on, (d, block_n)
            assert ("dummy_tile" in render(plan)[0]) is on
        for d, dv, on in ((64, 128, False), (128, 64, True)):
            plan = plan_for_variant(Variant(causal=True), "h200", DType.bf16, d, head_dim_v=dv, name="ot_dv",
                                    backend="sm90")
            assert plan.block_n > 64 and kernel.schedule(plan)["overlap_tiles"] is on, (d, dv)


def _builds():
    """(name, source) of the kernels the compile test takes, under the switch: production tiles (d64's three consumer
    warpgroups, d128, d256 causal at 128x80 where O leaves from registers), fp16, ping-pong (ALiBi), a window with
    GQA and the LSE, V's own head dim, mask functions (the producer's notes). Session 20 compiled more (every
    production tile of head dims 32 .. 128, both dtypes, the d64 / d128 variants: NOTES.md); these stand for them. Not the norms without softmax: ptxas serializes their
    wgmma without the switch too (relu d128, sigmoid d64: "insufficient register resources for the wgmma pipeline",
    sigmoid d64 with 740 bytes of spills; NOTES.md, session 20)."""
    from flashgen.harness.suite import build_mask_kernel

    plans = {
        "causal_d64": _plan(Variant(causal=True), 64), "plain_d128_fp16": _plan(Variant(), 128, DType.fp16),
        "causal_d256_128x80": _plan(Variant(causal=True), 256, block_m=128, block_n=80),
        "alibi_d128": _plan(Variant(alibi=True), 128), "window_gqa_lse_d128": _plan(
            Variant(causal=True, window=256, kv_group=4, return_lse=True), 128),
        # V's own head dim, narrower than Q's (DeepSeek's 192 / 128 takes 64-key tiles: without the switch)
        "dv_128_64": plan_for_variant(Variant(causal=True), "h200", DType.bf16, 128, head_dim_v=64, backend="sm90"),
    }
    builds = []
    with kernel.schedule_overrides(overlap_tiles=True):
        for name, plan in plans.items():
            builds.append((name, render(plan.model_copy(update=dict(name=f"ot_{name}")))[0]))
        for name, mods in (("lengths", LENGTHS), ("alternate_blocks", ALTERNATE_BLOCKS)):
            builds.append((name, build_mask_kernel("h200", DType.bf16, Variant(), 128, mods)[0]))
    return builds


@needs_nvcc
@pytest.mark.slow  # about a minute on 2 cores: 8 kernels
def test_kernels_under_the_switch_keep_their_wgmma_asynchronous_and_do_not_spill():
    from flashgen.harness.compile import compile_cuda

    builds = _builds()
    for name, source in builds:
        assert "dummy_tile" in source, name
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda b: compile_cuda(b[1], "sm_90a", filename=f"overlap_{b[0]}.cu"), builds))
    for (name, _), result in zip(builds, results, strict=True):
        assert result.ok, (name, result.feedback_text(2000))
        assert "serialized" not in result.log, (name, [line for line in result.log.splitlines() if "serialized" in line])
        assert not [w for w in result.warnings if w.tool == "ptxas" and serialized_wgmma(w.message)], name
        assert not any(info.spills for info in result.kernels.values()), (name, result.kernels)
