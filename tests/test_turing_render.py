"""CPU tests of the Turing (sm_75) bf16/fp32 path: renders, compiles spill-free within 64 KB of shared memory,
and leaves every sm_80 source exactly as the template renders it without the Turing blocks."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import jinja2
import pytest

from flashgen.abi import ENTRY_SIGNATURE
from flashgen.translators import render as render_mod
from flashgen.translators.params import choose_params
from flashgen.translators.plan import plan_for_variant
from flashgen.translators.render import render, smem_bytes, smem_limit
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
    assert "fg::block::tile_loader<BLOCK_N, D, T, THREADS> k_loader;" in source
    assert "scaled_tile_loader<" not in source.split("namespace fg_")[-1]  # defined by the header, never used


def _template_without_turing_blocks() -> str:
    text = (render_mod.TEMPLATES / "attention_fwd.cu.j2").read_text()
    no_tag = r"(?:(?!\{%).)*?"  # a block body with no nested tag
    stripped = re.sub(r"\{% elif turing_scaled %\}.*?\n(\{% else %\})", r"\1", text, flags=re.S)
    stripped = re.sub(r"\{% if turing_scaled %\}\n" + no_tag + r"\{% else %\}\n(" + no_tag + r")\{% endif %\}\n",
                      r"\1", stripped, flags=re.S)
    stripped = re.sub(r"\{% if turing_scaled %\}\n" + no_tag + r"\{% endif %\}\n", "", stripped, flags=re.S)
    assert "turing" not in stripped
    return stripped


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sm80_sources_are_what_the_template_gives_without_the_turing_blocks(arch, monkeypatch):
    env = render_mod._environment()
    bare = jinja2.Environment(loader=jinja2.DictLoader({"attention_fwd.cu.j2": _template_without_turing_blocks()}),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)
    plans = [plan_for_variant(v, arch, dt, d) for v in VARIANTS.values() for dt in DType for d in (64, 256)]
    with_turing = [render(p)[0] for p in plans]
    monkeypatch.setattr(render_mod, "_environment", lambda: bare)
    without = [render(p)[0] for p in plans]
    assert env is not bare
    for plan, a, b in zip(plans, with_turing, without):
        assert a == b, plan.name


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
