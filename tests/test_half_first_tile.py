"""CPU tests of the sm90 half_first_tile switch (flashgen.translators.backends.sm90.kernel.schedule): a consumer
warpgroup whose rows see no key in the second half of its work tile's first key tile (the diagonal's) issues that
tile's S at N = BLOCK_N / 2 (into an accumulator of its own) and its P V in half the k-steps. It needs plan.key_range.hi to rise with the row (the warpgroup's last row then has
the largest limit), which the rules and the lowering both say; these check where the switch applies, what it
renders, and that ptxas keeps the kernels' wgmma asynchronous. The GPU half: tests/test_half_first_tile_gpu.py."""

from __future__ import annotations

import shutil

import pytest

from flashgen.translators.backends.sm90 import kernel
from flashgen.translators.render import render
from flashgen.variant import Variant
from tests.gpu_kernels import assert_compiles_asynchronous, build_under_switch, sm90_plan

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _plan(variant: Variant, head_dim: int = 128, **tiles):
    return sm90_plan(variant, head_dim, f"hp_{head_dim}", **tiles)


@pytest.mark.parametrize("variant, head_dim, tiles, applies", [
    (Variant(causal=True), 64, {}, True),  # 192 x 128, three consumer warpgroups
    (Variant(causal=True), 64, {"block_m": 128}, True),  # the N <= 1k tile, ping-pong
    (Variant(causal=True), 256, {}, True),  # 64-key tiles: two k-steps of four
    (Variant(causal=True, window=256), 128, {}, True),  # the window's upper limit is causal's
    (Variant(window_left=64, window_right=32), 128, {}, True),  # two-sided: hi = qpos + diag + 33
    (Variant(window_left=64), 128, {}, False),  # a lower limit only: every key tile's second half may be seen
    (Variant(), 128, {}, False),  # no key limits
    (Variant(causal=True), 128, {"block_n": 80}, False),  # 40 keys: not whole k-steps of 16
])
def test_where_the_switch_applies(variant, head_dim, tiles, applies):
    plan = _plan(variant, head_dim, **tiles)
    with kernel.schedule_overrides(half_first_tile=True):
        source = render(plan)[0]
        assert kernel.schedule(plan)["half_first_tile"] is applies
    assert ("issue_pv(s_prev, pv_half);" in source) is applies
    if applies:  # the limit of the warpgroup's last row against the middle of the first key tile
        assert "(q_row0 + cw * 64 + 63) + diag + " in source and "(n_end - 1) * BLOCK_N + BLOCK_N / 2" in source
        assert "for (int kk = 0; kk < BLOCK_N / 32; ++kk)" in source  # the P V's half
        assert f"fg::wgmma::ss_m64n{plan.block_n // 2}k16_bf16(acc, a, b, accumulate);" in source  # the S's
        assert "if constexpr (HALF) ss_qk_half(acc_h, a_desc, b_desc, kk > 0);" in source


def test_off_by_default_and_production_renders_without_it():
    for variant in (Variant(causal=True), Variant(causal=True, window=256)):
        plan = _plan(variant)
        assert kernel.schedule(plan)["half_first_tile"] is False
        assert "pv_half" not in render(plan)[0]


@needs_nvcc
def test_kernels_under_the_switch_compile_with_asynchronous_wgmma():
    """Both halves are chosen behind branches: ptxas keeps every wgmma asynchronous only where the branch is
    warp-uniform to it (the limit broadcast from lane 0: C7520 before) and the half S has an accumulator of its own
    (C7515 / C7511 when it wrote half of acc_s)."""
    assert_compiles_asynchronous("half_first_tile", [_plan(Variant(causal=True), 64, block_m=128),
                                                     _plan(Variant(causal=True, window=256), 128),
                                                     _plan(Variant(causal=True), 256)])


@needs_nvcc
def test_a_limit_that_reads_a_call_time_length_compiles():
    """Causal rows with a length (k_idx < LEN[b], a call-time tensor): the warpgroup's limit, min(LEN[b], q + 1),
    reads a prologue constant, so the half_first test comes after the prologue (before it: "identifier tl_c0 is
    undefined", found when the switch was turned on for every test kernel); ptxas keeps the wgmma asynchronous."""
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.ptxas import serialized_wgmma

    source, _ = build_under_switch("half_first_tile", "issue_pv(s_prev, pv_half);", "bf16", Variant(causal=True), 128,
                                   {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}})
    constant = source.index("const int tl_c0 = ")
    assert "min(tl_c0, " in source and constant < source.index("const bool half_first = ")
    result = compile_cuda(source, "sm_90a")
    assert result.ok, result.log
    assert not serialized_wgmma(result.log)
