"""CPU tests of the Turing (sm_75) bf16/fp32 path: renders, compiles spill-free within 64 KB of shared memory,
and leaves every sm_80 source exactly as it renders without the sm75 backend's templates and headers."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import jinja2
import pytest

from flashgen.abi import ENTRY_SIGNATURE
from flashgen.translators import render as render_mod
from flashgen.translators.params import choose_params
from flashgen.translators.render import render, smem_bytes, smem_limit
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Norm, Variant

VARIANTS = {
    "plain": Variant(), "causal": Variant(causal=True), "window": Variant(causal=True, window=100),
    "alibi": Variant(alibi=True), "softcap": Variant(softcap=30.0), "gqa": Variant(kv_group=4),
    "relu": Variant(norm=Norm.relu), "sigmoid": Variant(norm=Norm.sigmoid), "lse": Variant(return_lse=True),
    "splitkv": Variant(split_kv=True, return_lse=True),
}
SCALED = (DType.bf16, DType.fp32)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _turing_plans(dtype: DType):
    plans = [plan_for_variant(v, "sm_75", dtype, 64, name=f"t_{n}_{dtype.value}") for n, v in VARIANTS.items()]
    plans += [plan_for_variant(Variant(), "sm_75", dtype, d, name=f"t_plain_{dtype.value}_d{d}") for d in (96, 128, 256)]
    return plans


@pytest.mark.parametrize("dtype", SCALED, ids=lambda d: d.value)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_turing_scaled_dtypes_render_with_fp16_tiles(name, dtype):
    plan = plan_for_variant(VARIANTS[name], "sm_75", dtype, 64)
    source, manifest = render(plan)
    assert ENTRY_SIGNATURE.findall(source) == [launch.kernel for launch in manifest.launches]
    assert "v_loader.amax_slots = " in source and "using TS = fg::f16;" in source
    assert "attn_mma16<fg::f16," in source and "#define FG_ARCH 75" in source
    # fp16 tiles in shared memory whatever the input type; the note says how the dtype is handled
    assert manifest.launches[0].smem_bytes == smem_bytes(plan) == (64 * 64 + 2 * 64 * 64) * 2 + 3 * 4 * plan.warps
    assert "sm_75" in manifest.notes and dtype.value in manifest.notes


@pytest.mark.parametrize("dtype", SCALED, ids=lambda d: d.value)
def test_turing_tile_choices_fit_64kb_for_every_head_dim(dtype):
    for d in (64, 96, 128, 256):
        params = choose_params(Variant(causal=True), "sm_75", dtype, d)
        plan = plan_for_variant(Variant(causal=True), "sm_75", dtype, d)
        assert plan.block_m == params["BLOCK_M"]
        assert smem_bytes(plan) <= smem_limit("sm_75") == 64 << 10, (dtype, d)


def test_turing_fp16_keeps_the_unscaled_path():
    source, _ = render(plan_for_variant(Variant(), "sm_75", DType.fp16, 64))
    assert "fg::block::tile_loader<BLOCK_N, D, D_PAD, T, THREADS> k_loader;" in source
    assert "scaled_tile_loader<" not in source.split("namespace fg_")[-1]  # defined by the header, never used


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sm80_sources_do_not_depend_on_the_sm75_backend(arch, monkeypatch, tmp_path):
    """The sm80 path renders the same without the sm75 folder (its templates and header) on the search paths."""
    from flashgen.translators.backends.base import BACKENDS_DIR

    plans = [plan_for_variant(v, arch, dt, d, backend="sm80") for v in VARIANTS.values() for dt in DType
             for d in (64, 256)]
    assert {p.backend for p in plans} == {"sm80"}
    with_sm75 = [render(p)[0] for p in plans]
    visible = tmp_path / "backends"
    visible.mkdir()
    for child in BACKENDS_DIR.iterdir():
        if child.name != "sm75" and child.is_dir():
            (visible / child.name).symlink_to(child)
    bare = jinja2.Environment(loader=jinja2.FileSystemLoader([str(render_mod.TEMPLATES), str(visible)]),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)
    monkeypatch.setattr(render_mod, "_environment", lambda: bare)
    without = [render(p)[0] for p in plans]
    assert "sm75" not in "".join(t for t in bare.list_templates())
    for plan, a, b in zip(plans, with_sm75, without):
        assert a == b, plan.name
        assert "FG_ARCH 75" not in a and "flashgen/sm75.cuh" not in a, plan.name


@needs_nvcc
def test_turing_scaled_kernels_compile_for_sm75_without_spills_within_64kb():
    from flashgen.harness.compile import compile_cuda

    batches = {dt: _turing_plans(dt) for dt in SCALED}

    def build(dtype):
        return compile_cuda("\n".join(render(p)[0] for p in batches[dtype]), "sm_75", filename=f"turing_{dtype.value}.cu")

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(SCALED, pool.map(build, SCALED)))
    for dtype, result in results.items():
        assert result.ok, result.feedback_text()
        plans = batches[dtype]
        expected = {launch.kernel for p in plans for launch in render(p)[1].launches}
        assert expected <= set(result.kernels)
        spilled = {n: (u.spill_store_bytes, u.spill_load_bytes) for n, u in result.kernels.items() if u.spills}
        assert not spilled, f"{dtype.value}: spills {spilled}"
        for plan in plans:
            usage = result.kernels[plan.name]
            # no static shared memory: with it, a 48 KB dynamic tile set would need an opt-in the launcher skips
            assert usage.shared_static_bytes == 0 and smem_bytes(plan) <= 64 << 10, plan.name
