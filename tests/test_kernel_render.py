"""CPU tests of the CUDA translator back end: plans render, compile without spills, fit shared memory."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from flashgen.abi import ENTRY_SIGNATURE, eval_size
from flashgen.errors import UsageError
from flashgen.harness.ptxas import serialized_wgmma
from flashgen.translators.plan import KernelPlan, ScoreMod, check_expressions
from flashgen.translators.render import render, smem_bytes, smem_limit
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Norm, Variant

VARIANTS = {
    "plain": Variant(), "causal": Variant(causal=True), "window": Variant(causal=True, window=100),
    "alibi": Variant(alibi=True), "softcap": Variant(softcap=30.0), "gqa": Variant(kv_group=4),
    "relu": Variant(norm=Norm.relu), "sigmoid": Variant(norm=Norm.sigmoid), "lse": Variant(return_lse=True),
    "splitkv": Variant(split_kv=True, return_lse=True),
}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_unsupported_head_dim_is_a_usage_error():
    with pytest.raises(UsageError, match="head dim 84 is not supported: head dims are multiples of 8"):
        plan_for_variant(Variant(), "sm_80", DType.fp16, 84)


def test_unknown_name_in_an_expression_is_rejected():
    plan = plan_for_variant(Variant(), "sm_80", DType.fp16, 64)
    bad = plan.model_copy(update={"score_mods": [ScoreMod(name="x", expr="s + bias_table[kpos]", uses_positions=True)]})
    with pytest.raises(UsageError, match="bias_table"):
        check_expressions(bad)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_renders_with_an_abi_entry_and_consistent_manifest(name):
    variant = VARIANTS[name]
    plan = plan_for_variant(variant, "sm_80", DType.bf16, 128)
    source, manifest = render(plan)
    entries = ENTRY_SIGNATURE.findall(source)
    assert entries == [launch.kernel for launch in manifest.launches]
    assert "{{" not in source and "#include \"flashgen/" not in source
    sizes = dict(B=2, H=8, KVH=2, N=1, M=4096, D=128, SPLITS=1)
    sizes["SPLITS"] = eval_size(manifest.num_splits, sizes)
    if variant.split_kv:
        assert len(manifest.launches) == 2 and sizes["SPLITS"] > 1
        assert eval_size(manifest.workspace_floats, sizes) == 2 * 8 * sizes["SPLITS"] * 1 * 129
    else:
        assert len(manifest.launches) == 1 and manifest.workspace_floats == "0"
    assert manifest.launches[0].smem_bytes == smem_bytes(plan) <= smem_limit("sm_80")
    assert manifest.params["BLOCK_M"] == plan.block_m


def test_causal_and_window_skip_tiles_and_mask_only_boundaries():
    plan = plan_for_variant(Variant(causal=True, window=100), "sm_80", DType.fp16, 64)
    assert "m_block" in plan.kv_tile_end and "m_block" in plan.kv_tile_begin
    assert plan.mask_tile != "false"
    assert plan_for_variant(Variant(), "sm_80", DType.fp16, 64).mask_tile == "false"


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_75"])
def test_tiles_fit_each_targets_shared_memory(arch):
    dtypes = [DType.fp16] if arch == "sm_75" else list(DType)
    for dtype in dtypes:
        for d in (64, 96, 128, 256):
            plan = plan_for_variant(Variant(causal=True), arch, dtype, d)
            assert smem_bytes(plan) <= smem_limit(arch), (arch, dtype, d)


def _compile(arch: str, plans: list[KernelPlan]):
    from flashgen.harness.compile import compile_cuda

    source = "\n".join(render(p)[0] for p in plans)
    return compile_cuda(source, arch, filename=f"kernels_{arch}.cu")


@needs_nvcc
def test_one_kernel_per_variant_and_head_dim_compiles_without_spills():
    sm80 = [plan_for_variant(v, "sm_80", DType.bf16, 128, name=f"k_{n}") for n, v in VARIANTS.items()]
    sm80 += [plan_for_variant(Variant(causal=True, alibi=True, return_lse=True), "sm_80", dt, d, name=f"k_{dt.value}_{d}")
             for dt in DType for d in (64, 96, 256)]
    sm75 = [plan_for_variant(Variant(causal=True, return_lse=True), "sm_75", DType.fp16, d, name=f"t_{d}")
            for d in (64, 96, 128, 256)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: _compile(*job), [("sm_80", sm80), ("sm_75", sm75)]))
    for result, plans in zip(results, (sm80, sm75)):
        assert result.ok, result.feedback_text()
        expected = {launch.kernel for p in plans for launch in render(p)[1].launches}
        assert expected <= set(result.kernels)
        spilled = {name: u.spill_store_bytes for name, u in result.kernels.items() if u.spills}
        assert not spilled, f"{result.arch}: spills {spilled}"


def test_stages_two_double_buffers_k_and_v_and_turing_keeps_one():
    params = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0}
    two = plan_for_variant(Variant(causal=True), "sm_80", DType.bf16, 128, params=params)
    one = plan_for_variant(Variant(causal=True), "sm_80", DType.bf16, 128, params={**params, "STAGES": 1})
    tile = 64 * 128 * 2
    assert smem_bytes(two) - smem_bytes(one) == 2 * tile  # one more K and one more V tile
    source, manifest = render(two)
    assert manifest.params["STAGES"] == 2 and manifest.launches[0].smem_bytes == smem_bytes(two)
    assert "cp_async_wait<1>" in source and "cp_async_wait<2>" in source
    # Turing's loads go through registers: one buffer; a plan asking for two is refused, a TL asking for two is
    # translated with one and says so
    with pytest.raises(UsageError, match="STAGES in"):
        render(plan_for_variant(Variant(), "sm_75", DType.fp16, 64, params={**params, "Q_IN_REGS": 1}))
    from flashgen.tl_spec import library, parse
    from flashgen.translators import lower

    text = library.render(Variant(), dtype=DType.fp16, arch="sm_75", head_dim=64,
                          params={"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2})
    plan, notes = lower(parse(text), "t4")
    assert plan.stages == 1 and any("STAGES=2" in n and "STAGES=1" in n for n in notes)


def test_launch_order_reaches_the_kernel_and_follows_the_rows():
    from flashgen.translators.params import choose_params, default_group_heads

    assert default_group_heads(Variant(causal=True)) == 0 and default_group_heads(Variant(causal=True, window=8)) == 0
    assert default_group_heads(Variant()) == 1 and default_group_heads(Variant(split_kv=True, causal=True)) == 1
    for target in ("h200", "a100", "t4"):
        assert choose_params(Variant(causal=True), target, DType.bf16, 64)["GROUP_HEADS"] == 0
        assert choose_params(Variant(), target, DType.bf16, 64)["GROUP_HEADS"] >= 1
    params = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 1, "Q_IN_REGS": 1}
    for group in (0, 1, 3):
        source, manifest = render(plan_for_variant(Variant(causal=True), "sm_80", DType.fp16, 64,
                                                   params={**params, "GROUP_HEADS": group}))
        assert f"constexpr int GROUP_HEADS = {group};" in source and manifest.params["GROUP_HEADS"] == group
        # query blocks fastest in the grid: (m tiles, H, B)
        assert manifest.launches[0].grid == ("cdiv(N, 128)", "H", "B")


@needs_nvcc
def test_sm90_measured_tiles_keep_at_most_a_few_values_in_local_memory():
    """The H100/H200 choices (the sm80 backend's measured table) compiled for sm_90: a 255-register kernel may keep
    a few loop-invariant values in local memory (harness.tune.SPILL_TOLERANCE_BYTES), never its working set."""
    from flashgen.harness.tune import SPILL_TOLERANCE_BYTES
    from flashgen.translators.backends import get_backend

    plans = [plan_for_variant(Variant(causal=order == "causal"), "sm_90", DType(dt), d, params=params,
                              name=f"k_{dt}_{d}_{order}", backend="sm80")
             for (arch, dt, d, order), params in get_backend("sm80").measured.items() if arch == "sm_90"]
    result = _compile("sm_90", plans)
    assert result.ok, result.feedback_text()
    worst = {name: max(u.spill_store_bytes, u.spill_load_bytes) for name, u in result.kernels.items()}
    assert len(worst) == len(plans) and max(worst.values()) <= SPILL_TOLERANCE_BYTES, worst


@needs_nvcc
def test_sm90_one_consumer_warpgroup_puts_two_ctas_on_an_sm():
    """BLOCK_M = 64 on the sm90 path: one consumer warpgroup, so two CTAs share an SM (__launch_bounds__(256, 2), a
    persistent grid of 2 x SMS), each within half the SM's shared memory less the block's reserve, compiled without
    spills in the 128 registers a thread holds at launch; a tile that needs more is refused in one line. (No tile
    table picks it: benchmarks/kernel_dev measures it first, NOTES.md session 7.)"""
    from flashgen.translators.backends.sm90 import kernel

    plans = [plan_for_variant(Variant(causal=True), "h200", DType.bf16, d, name=f"k_c1_d{d}", backend="sm90",
                              params={"BLOCK_M": 64, "BLOCK_N": bn, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0})
             for d, bn in ((64, 128), (128, 64))]
    for plan in plans:
        source, manifest = render(plan)
        (launch,) = manifest.launches
        assert kernel.ctas_per_sm(plan) == 2 and launch.threads == 256 and launch.grid[0].endswith("2 * SMS)")
        assert eval_size(launch.grid[0], {"N": 4096, "H": 16, "B": 4, "SMS": 132}) == 264
        assert f"__launch_bounds__({plan.name}_cfg::THREADS, 2)" in source
        assert launch.smem_bytes <= (228 * 1024) // 2 - 1024 == kernel.cta_smem_limit(plan)
    result = _compile("sm_90a", plans)
    assert result.ok, result.feedback_text()
    assert all(u.registers <= 128 and not u.spills for u in result.kernels.values()), result.kernels
    too_big = plan_for_variant(Variant(), "h200", DType.bf16, 128, name="k_c1_big", backend="sm90",
                               params={"BLOCK_M": 64, "BLOCK_N": 128, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0})
    with pytest.raises(UsageError, match=r"over the 115712 each of the 2 CTAs that share an SM at BLOCK_M=64"):
        render(too_big)


def test_sm90_pingpong_where_measured_faster():
    """The consumer warpgroups take turns at the tensor cores (named barriers past the epilogue's) where D + Dv <=
    256 and a score function computes on positions for every score (ALiBi, a relative-position bias at d64 and
    d128; NOTES.md, session 12) or shares a key-only term (cos(k_idx)), or the rows are causal at d64 in two
    warpgroups (session 17); not for plain, softcap, d256, causal d128 nor causal d64 in three warpgroups."""
    from flashgen.translators.backends.sm90 import kernel

    def plan(variant, d, **update):
        return plan_for_variant(variant, "h200", DType.bf16, d, backend="sm90").model_copy(update=update)

    cos = ScoreMod(name="cos", expr="s + 0.25f * fg::cos_approx((float)kpos)", uses_positions=True,
                   key_terms=("fg::cos_approx((float)kpos)",))
    relative = ScoreMod(name="relative", expr="s - 0.125f * (float)(qpos + diag - kpos)", uses_positions=True)
    on = [plan(Variant(alibi=True), 128), plan(Variant(causal=True, alibi=True), 64),
          plan(Variant(), 128, score_mods=[relative]), plan(Variant(), 128, score_mods=[cos]),
          plan(Variant(causal=True), 64, block_m=128, warps=8)]  # causal d64's tile at N <= 1k
    off = [plan(Variant(), 128), plan(Variant(causal=True), 64), plan(Variant(softcap=30.0), 128),
           plan(Variant(alibi=True), 256), plan(Variant(causal=True), 128), plan(Variant(), 256, score_mods=[cos])]
    assert plan(Variant(causal=True), 64).block_m == 192  # three warpgroups: no turns measured there
    assert [kernel.schedule(p)["pingpong"] for p in on] == [True] * len(on)
    assert [kernel.schedule(p)["pingpong"] for p in off] == [False] * len(off)
    for p in on:
        source, _ = render(p)
        consumers = kernel.consumers(p)
        assert "constexpr int PINGPONG_BAR0 = 1 + CONSUMERS;" in source and 2 * consumers <= 15  # 16 named barriers
        # every warpgroup takes as many turns as it passes: one per key tile in the loop, one for the last P V,
        # one for a tile without keys
        assert source.count("my_turn();") == source.count("your_turn();") - 1 == 3
    for p in off:
        assert "PINGPONG_BAR0" not in render(p)[0]


@needs_nvcc
def test_sm90_production_kernels_keep_their_wgmma_asynchronous():
    """The Hopper path's own kernels at the tiles the tables give (plain and causal at d64, d128 and d256, a
    window of 256, ALiBi's ping-pong at d64 and d128), compiled for sm_90a: ptxas must not serialize their wgmma (its C75xx lines "wgmma.mma_async
    instructions are serialized"). That happens, silently but for an info line, when a wgmma or a write of its
    registers sits on a data-dependent branch, and it cost a session-9 build 20-30 % everywhere
    (benchmarks/kernel_dev/NOTES.md). No spills either."""
    variants = {"plain": Variant(), "causal": Variant(causal=True), "window": Variant(causal=True, window=256),
                "alibi": Variant(alibi=True),  # ALiBi's consumer warpgroups take turns (ping-pong)
                # p after the mask (Normalization.zero_at_masked): inside its loop every relu and sigmoid kernel's
                # wgmma were serialized, sigmoid d64's with 740 bytes of spills (session 20)
                "relu": Variant(norm=Norm.relu), "sigmoid": Variant(norm=Norm.sigmoid)}
    dims = {"plain": (64, 128, 256), "causal": (64, 128, 256), "window": (128,), "alibi": (64, 128), "relu": (128,),
            "sigmoid": (64,)}
    plans = [plan_for_variant(v, "h200", DType.bf16, d, name=f"h_{kind}_{d}", backend="sm90")
             for kind, v in variants.items() for d in dims[kind]]
    with ThreadPoolExecutor(2) as pool:  # one source each: every sm90 kernel carries its own wgmma wrappers
        results = list(pool.map(lambda plan: _compile("sm_90a", [plan]), plans))
    for plan, result in zip(plans, results):
        assert result.ok, result.feedback_text()
        assert plan.name in result.kernels
        assert "serialized" not in result.log, [line for line in result.log.splitlines() if "serialized" in line]
        # what the harness hands a model: the parsed diagnostics report a serialized wgmma as a ptxas warning
        assert not [w for w in result.warnings if w.tool == "ptxas" and serialized_wgmma(w.message)], result.warnings
        assert not result.kernels[plan.name].spills, (plan.name, result.kernels[plan.name])
