"""Issue 15 item 3, second half, on the CPU: V's head dim separate from Q's and K's (Dv; DeepSeek-style prefill has
D = 192 and Dv = 128): q (B, H, N, D), k (B, KVH, M, D), v (B, KVH, M, Dv), o (B, H, N, Dv). The contract (manifest,
plan, shape, task, the TL's `head_dim_v`), the TL's interpretation against an fp64 numpy reference of its own, the
translation on every code path compiled with nvcc, and the kernels of one head dim byte for byte as committed. The GPU
half (the harness's whole verification on each path) is tests/test_head_dim_v_gpu.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from flashgen.errors import UsageError
from flashgen.variant import DType, Shape, Variant, check_head_dim_v, head_dims_tag

ROOT = Path(__file__).resolve().parents[1]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

#: (D, Dv): DeepSeek's prefill, V wider than Q and K, V narrower, and both padded (40 -> 48, 24 -> 32 columns)
PAIRS = ((192, 128), (64, 128), (128, 64), (40, 24))
RULE = ("head dims are multiples of 8 from 8 to 256 (rows move in 16-byte chunks, 8 elements of 16 bits; pad the "
        "tensors' last axis to the next multiple yourself)")
#: the code paths and the target whose kernels take each (as tests/test_head_dims_gpu.py)
PATHS = {"sm90": "h200", "sm80": "a100", "sm75": "t4"}
VARIANTS = {"plain": Variant(), "causal": Variant(causal=True)}
PAIR_IDS = [f"d{d}v{dv}" for d, dv in PAIRS]


# ------------------------------------------------------------------------------------------------ the contract

def test_head_dim_v_takes_the_rule_of_d_and_one_equal_to_d_is_none():
    assert check_head_dim_v(None, 64) is None
    assert check_head_dim_v(64, 64) is None  # the kernel of one head dim
    assert check_head_dim_v(128, 192) == 128 and check_head_dim_v(np.int64(24), 40) == 24
    for bad in (12, 0, 264, 7, -8):
        with pytest.raises(UsageError) as caught:
            check_head_dim_v(bad, 64)
        assert str(caught.value) == f"V head dim {bad} is not supported: {RULE}"
        with pytest.raises(UsageError) as caught:
            check_head_dim_v(bad, 64, "--head-dim-v")
        assert str(caught.value) == f"--head-dim-v {bad}: {RULE}"
    with pytest.raises(UsageError, match=r"^head_dim_v '128': expected an integer head dim$"):
        check_head_dim_v("128", 64)
    assert head_dims_tag(192, 128) == "d192v128" and head_dims_tag(64, None) == head_dims_tag(64, 64) == "d64"


def test_manifest_shape_task_and_plan_carry_dv_and_dump_as_before_without_it():
    from pydantic import ValidationError

    from flashgen.abi import KernelManifest, Launch, validation_error_lines
    from flashgen.agent.messages import Task
    from flashgen.translators.plan import KernelPlan
    from flashgen.translators.rules import plan_for_variant

    fields = dict(name="k", arch="sm_80", dtype=DType.bf16, head_dim=192, variant=Variant(),
                  launches=[Launch(kernel="k", grid=("1", "1", "1"), threads=128)])
    own = KernelManifest(**fields, head_dim_v=128)
    assert own.dv == 128 and json.loads(own.model_dump_json())["head_dim_v"] == 128
    assert KernelManifest.model_validate_json(own.model_dump_json()) == own
    one = KernelManifest(**fields)
    assert one.dv == 192 and "head_dim_v" not in json.loads(one.model_dump_json())
    with pytest.raises(ValidationError) as caught:
        KernelManifest(**fields, head_dim_v=12)
    [line] = validation_error_lines(caught.value)
    assert line.startswith("`head_dim_v`: ") and f"V head dim 12 is not supported: {RULE}" in line

    shape = Shape(B=2, H=4, N=100, M=300, D=192, DV=128)
    assert shape.dv == 128 and shape.flops() == 2.0 * 2 * 4 * 100 * 300 * (192 + 128)
    assert shape.flops(causal=True) == shape.flops() / 2
    assert Shape.parse("B=2,H=4,N=100,M=300,D=192,DV=128") == shape
    plain = Shape(B=2, H=4, N=100, M=300, D=64)
    assert plain.dv == 64 and "DV" not in plain.model_dump() and "DV" not in repr(plain)
    assert plain.flops() == 4.0 * 2 * 4 * 100 * 300 * 64

    task = Task(variant=Variant(), target="a100", arch="sm_80", dtype=DType.bf16, head_dim=192)
    assert task.dims == {} and "head_dim_v" not in task.model_dump()
    task = task.model_copy(update={"head_dim_v": 128})
    assert task.dims == {"head_dim_v": 128} and task.model_dump()["head_dim_v"] == 128

    plan = plan_for_variant(Variant(), "a100", DType.bf16, 192, head_dim_v=128)
    assert (plan.head_dim, plan.head_dim_v, plan.dv) == (192, 128, 128) and plan.name == "fg_plain_bf16_d192v128_sm_80"
    assert plan_for_variant(Variant(), "a100", DType.bf16, 64, head_dim_v=64).head_dim_v is None
    for bad, why in ((192, "head_dim_v 192 is head_dim: give None"), (12, "V head dim 12 is not supported")):
        with pytest.raises(ValueError, match=re.escape(why)):
            KernelPlan(**{**plan.model_dump(), "target": plan.target, "head_dim_v": bad})
    with pytest.raises(UsageError, match=re.escape(f"V head dim 264 is not supported: {RULE}")):
        plan_for_variant(Variant(), "a100", DType.bf16, 192, head_dim_v=264)


# ------------------------------------------------------------------------------------------------ the TL

def _program_text(variant=Variant(causal=True), arch="sm_80", dtype=DType.bf16, d=192, dv=128, **kw) -> str:
    from flashgen.tl_spec import library

    return library.render(variant, dtype=dtype, arch=arch, head_dim=d, head_dim_v=dv, **kw)


def test_the_target_line_takes_head_dim_v_and_v_and_o_are_declared_over_dv():
    from flashgen.tl_spec import check, library, parse
    from flashgen.tl_spec.diagnostics import TLSyntaxError
    from flashgen.tl_spec.printer import format_program

    text = _program_text()
    assert "Target sm_80 dtype bf16 accum fp32 head_dim 192 head_dim_v 128\n" in text
    for line in ("Allocate Q in global shape [B, H, N, D]", "Allocate K in global shape [B, KVH, M, D]",
                 "Allocate V in global shape [B, KVH, M, DV]", "Allocate O in global shape [B, H, N, DV]",
                 "Allocate K_s in shared shape [BLOCK_N, D]", "Allocate V_s in shared shape [BLOCK_N, DV]",
                 "Allocate O_r in register shape [BLOCK_M, DV]", "Copy V[b, h, k0 : k0 + BLOCK_N, 0 : DV]",
                 "Copy K[b, h, k0 : k0 + BLOCK_N, 0 : D]", "global O[b, h, q0 : q0 + BLOCK_M, 0 : DV]"):
        assert line in text, line
    program = parse(text)
    assert (program.target.head_dim, program.target.head_dim_v, program.target.dv) == (192, 128, 128)
    assert format_program(program) == text and parse(format_program(program)) == program
    assert check(program, "a100") == []
    hopper = _program_text(arch="sm_90")  # the Hopper dataflow: V's ring over DV
    assert "Allocate V_s in shared shape [BLOCK_N, DV] dtype bf16 stages STAGES" in hopper
    assert check(parse(hopper), "h200") == []
    split = _program_text(Variant(split_kv=True, return_lse=True))
    assert "Allocate O_part in global shape [B, H, SPLITS, N, DV]" in split and check(parse(split), "a100") == []
    # no head_dim_v, or one equal to head_dim: the program of one head dim, byte for byte
    for variant in (Variant(), Variant(causal=True, return_lse=True), Variant(split_kv=True, return_lse=True)):
        same = library.render(variant, dtype=DType.bf16, arch="sm_80", head_dim=64)
        assert _program_text(variant, d=64, dv=64) == _program_text(variant, d=64, dv=None) == same
        assert "head_dim_v" not in same and "DV" not in same and parse(same).target.head_dim_v is None
    with pytest.raises(TLSyntaxError, match=re.escape("head_dim_v = 0: expected a positive integer")):
        parse("Target sm_80 dtype fp16 head_dim 64 head_dim_v 0\n")


def test_the_checker_wants_v_and_o_over_dv_and_a_dv_by_the_rule_of_d():
    from flashgen.tl_spec import check, parse

    text = _program_text()

    def errors(program_text: str) -> list[str]:
        return [d.message for d in check(parse(program_text), "a100") if d.severity == "error"]

    assert errors(text.replace("Allocate V in global shape [B, KVH, M, DV]", "Allocate V in global shape [B, KVH, M, D]")) \
        == ["global 'V' has shape [B, KVH, M, D], expected [B, KVH, M, DV]"]
    assert errors(text.replace("Allocate O in global shape [B, H, N, DV]", "Allocate O in global shape [B, H, N, D]")) \
        == ["global 'O' has shape [B, H, N, D], expected [B, H, N, DV]"]
    # without head_dim_v V and O are over D, as always
    one = _program_text(d=64, dv=None)
    assert errors(one.replace("Allocate V in global shape [B, KVH, M, D]", "Allocate V in global shape [B, KVH, M, DV]")) \
        == ["global 'V' has shape [B, KVH, M, DV], expected [B, KVH, M, D]"]
    assert f"V head dim 12 is not supported: {RULE}" in errors(text.replace("head_dim_v 128", "head_dim_v 12"))


def test_the_translator_loads_v_over_dv_and_refuses_v_over_d():
    from flashgen.tl_spec import parse
    from flashgen.translators import UnsupportedConstruct, translate

    text = _program_text(params={"BLOCK_M": 128, "BLOCK_N": 32, "WARPS": 8, "STAGES": 1})
    translation = translate(parse(text), "a100")
    assert translation.manifest.head_dim_v == 128 and translation.plan.head_dim_v == 128
    wrong = text.replace("Copy V[b, h, k0 : k0 + BLOCK_N, 0 : DV]", "Copy V[b, h, k0 : k0 + BLOCK_N, 0 : D]")
    with pytest.raises(UnsupportedConstruct, match=re.escape("loads tiles like V[b, h, k0 : k0 + BLOCK_N, 0 : DV]")):
        translate(parse(wrong), "a100")
    with pytest.raises(UnsupportedConstruct, match=re.escape(f"V head dim 264 is not supported: {RULE}")):
        translate(parse(text.replace("head_dim_v 128", "head_dim_v 264")), "a100")


# ------------------------------------------------------------------------------------------------ fp64 meaning

def _numpy_attention(q, k, v, causal: bool, scale: float):
    """An fp64 reference of its own (not flashgen.reference): softmax(scale * q k^T, masked) @ v per head, GQA by
    h // (H // KVH), bottom-right causal alignment, O = 0 and LSE = -inf for a row that sees no key."""
    b, h, n, _ = q.shape
    kvh, m, dv = k.shape[1], k.shape[2], v.shape[3]
    o, lse = np.zeros((b, h, n, dv)), np.full((b, h, n), -np.inf)
    visible = np.ones((n, m), dtype=bool)
    if causal:
        visible = np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // kvh)
            s = scale * np.einsum("nd,md->nm", q[bi, hi], k[bi, kv])
            for i in range(n):
                keys = np.nonzero(visible[i])[0]
                if keys.size == 0:
                    continue
                row = s[i, keys]
                top = row.max()
                w = np.exp(row - top)
                o[bi, hi, i] = w @ v[bi, kv, keys] / w.sum()
                lse[bi, hi, i] = top + math.log(w.sum())
    return o, lse


@pytest.mark.parametrize("d,dv", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("arch,dtype", [("sm_80", DType.bf16), ("sm_90", DType.bf16), ("sm_75", DType.bf16),
                                        ("sm_80", DType.fp32)], ids=["sm80", "sm90-roles", "sm75-scaled", "sm80-fp32"])
def test_the_interpreter_computes_o_over_dv_as_an_fp64_numpy_reference(arch, dtype, d, dv):
    from flashgen.reference import attention
    from flashgen.tl_spec import interpret, parse

    for variant, shape in ((Variant(return_lse=True), Shape(B=2, H=3, N=45, M=70, D=d, DV=dv)),
                           (Variant(causal=True, return_lse=True), Shape(B=1, H=2, N=70, M=45, D=d, DV=dv)),
                           (Variant(kv_group=2, causal=True, return_lse=True), Shape(B=1, H=4, KVH=2, N=33, M=61, D=d,
                                                                                      DV=dv))):
        program = parse(_program_text(variant, arch=arch, dtype=dtype, d=d, dv=dv))
        result = interpret(program, shape, seed=d + dv)
        q, k, v = (result.inputs[name] for name in ("Q", "K", "V"))
        assert q.shape[-1] == k.shape[-1] == d and v.shape == (shape.B, shape.kv_heads, shape.M, dv)
        want_o, want_lse = _numpy_attention(q, k, v, variant.causal, 1 / math.sqrt(d))
        assert result.outputs["O"].shape == (shape.B, shape.H, shape.N, dv)
        np.testing.assert_allclose(result.outputs["O"], want_o, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(result.outputs["LSE"], want_lse, rtol=1e-10, atol=1e-12)
        ref_o, ref_lse = attention(q, k, v, variant)  # the harness's reference agrees
        np.testing.assert_allclose(ref_o, want_o, rtol=1e-10, atol=1e-12)
        if variant.causal and shape.N > shape.M:
            assert (result.outputs["O"][:, :, : shape.N - shape.M] == 0).all()  # rows that see no key


@pytest.mark.parametrize("d,dv", [(192, 128), (40, 24)], ids=["d192v128", "d40v24"])
def test_split_kv_partials_and_their_combine_run_over_dv(d, dv):
    from flashgen.tl_spec import compare, parse

    program = parse(_program_text(Variant(split_kv=True, return_lse=True), d=d, dv=dv))
    result = compare(program, Shape(B=2, H=2, N=3, M=300, D=d, DV=dv), seed=5)
    assert result.rel_err < 1e-12, result


def test_the_interpreter_says_in_one_line_when_the_shape_has_another_dv():
    from flashgen.tl_spec import interpret, parse

    program = parse(_program_text())
    with pytest.raises(UsageError, match=r"^<tl>: the program is written for V head dim 128, the shape has D=192$"):
        interpret(program, Shape(B=1, H=1, N=4, M=4, D=192))
    one = parse(_program_text(d=64, dv=None))
    with pytest.raises(UsageError, match=r"^<tl>: the program is written for V head dim 64 \(its head_dim: no "
                                         r"head_dim_v\), the shape has DV=128$"):
        interpret(one, Shape(B=1, H=1, N=4, M=4, D=64, DV=128))


# ------------------------------------------------------------------------------------------------ the harness

def test_v_and_o_of_another_head_dim_are_one_line_array_errors():
    from flashgen.abi import KernelManifest, Launch
    from flashgen.api import Kernel
    from flashgen.harness.device import ArrayError, TensorView, build_params
    from tests.test_arrays import FakeCupy

    manifest = KernelManifest(name="k", arch="sm_80", dtype=DType.fp16, head_dim=192, head_dim_v=128,
                              variant=Variant(), launches=[Launch(kernel="k", grid=("cdiv(N, 64)", "H", "B"),
                                                                  threads=128)])
    kernel = Kernel(tl="", sketch="", source="// not compiled on the CPU", manifest=manifest, report="", meta={})
    q, k = FakeCupy((2, 4, 33, 192), "<f2"), FakeCupy((2, 4, 40, 192), "<f2")
    with pytest.raises(ArrayError) as caught:  # before anything is compiled
        kernel(q, k, FakeCupy((2, 4, 40, 192), "<f2"))
    assert str(caught.value) == ("v has head dim 192 (shape (2, 4, 40, 192)) but the kernel was built for Dv=128 "
                                 "(v (B, KVH, M, 128), o (B, H, N, 128))")

    def view(shape):  # C-contiguous
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return TensorView(ptr=1 << 20, shape=shape, strides=strides, dtype="fp16", kind="cupy.ndarray")

    qv, kv, vv, ov = view((2, 4, 33, 192)), view((2, 4, 40, 192)), view((2, 4, 40, 128)), view((2, 4, 33, 128))
    params = build_params(manifest, qv, kv, vv, ov, None, 0, 0.1, 1)
    assert (params.v_stride_m, params.o_stride_n) == (128, 128)
    for args, name, got in (((qv, kv, view((2, 4, 40, 192)), ov), "v", "(2, 4, 40, 192)"),
                            ((qv, kv, vv, view((2, 4, 33, 192))), "o", "(2, 4, 33, 192)")):
        with pytest.raises(ArrayError) as caught:
            build_params(manifest, *args, None, 0, 0.1, 1)
        assert str(caught.value) == (f"{name} has head dim 192 (shape {got}) but the kernel was built for Dv=128 "
                                     "(v (B, KVH, M, 128), o (B, H, N, 128))")
    one = manifest.model_copy(update={"head_dim": 64, "head_dim_v": None})
    with pytest.raises(ArrayError) as caught:
        build_params(one, view((2, 4, 33, 64)), view((2, 4, 40, 64)), view((2, 4, 40, 128)), view((2, 4, 33, 64)),
                     None, 0, 0.1, 1)
    assert str(caught.value) == ("v has head dim 128 (shape (2, 4, 40, 128)) but the kernel was built for D=64, for q, "
                                 "k, v and o alike")


def test_verification_cases_bench_flops_and_the_o_the_kernel_returns_are_over_dv():
    from flashgen.harness.bench import attention_counts, shape_text, tflops
    from flashgen.harness.verify import default_cases
    from flashgen.translators.render import render
    from flashgen.translators.rules import plan_for_variant

    _, manifest = render(plan_for_variant(Variant(causal=True), "a100", DType.bf16, 192, head_dim_v=128))
    cases = default_cases(manifest)
    assert cases and all(c.shape.D == 192 and c.shape.DV == 128 for c in cases)
    assert "D=192,DV=128" in cases[0].label
    _, one = render(plan_for_variant(Variant(causal=True), "a100", DType.bf16, 64))
    assert all(c.shape.DV is None and "DV" not in c.label for c in default_cases(one))
    shape = Shape(B=1, H=2, N=512, M=512, D=192, DV=128)
    # FlashAttention's count per visible (query, key) pair: 2 FLOPs a multiply-add over D (Q K^T) and over Dv (P V)
    assert tflops(shape, Variant(), 1.0) == pytest.approx(2 * 1 * 2 * 512 * 512 * (192 + 128) / 1e-3 / 1e12)
    assert tflops(Shape(B=1, H=2, N=512, M=512, D=64), Variant(), 1.0) == pytest.approx(4 * 2 * 512 * 512 * 64 / 1e9)
    counts = attention_counts(shape, Variant(), DType.bf16)
    assert counts.bytes["global_write"] == 1 * 2 * 512 * 128 * 2  # O is (B, H, N, Dv)
    assert counts.bytes["global_read"] == (2 * 512 * 192 + 2 * 512 * (192 + 128)) * 2
    assert shape_text(shape) == "B=1,H=2,N=512,M=512,D=192,DV=128"


# ------------------------------------------------------------------------------------------------ tiles and params

def test_each_tile_counts_at_its_own_width_and_the_choice_reads_the_larger_head_dim():
    from flashgen.translators.backends.base import tile_bytes, tiles_bytes
    from flashgen.translators.backends.sm90 import kernel as hopper
    from flashgen.translators.params import choose_params, choose_params_with_source, estimate_registers
    from flashgen.translators.render import smem_bytes
    from flashgen.translators.rules import plan_for_variant

    # Q's region holds Q's tile or O's staging tile, the larger; K at D's padding, V at Dv's (40 -> 48, 24 -> 32)
    assert tiles_bytes(128, 64, 64, 2, 2, 128) == tile_bytes(128, 128, 2) + 2 * (tile_bytes(64, 64, 2)
                                                                                 + tile_bytes(64, 128, 2))
    assert tiles_bytes(128, 64, 40, 2, 1, 24) == tile_bytes(128, 48, 2) + tile_bytes(64, 48, 2) + tile_bytes(64, 32, 2)
    assert tiles_bytes(64, 32, 64, 2, 1, 128, o_staged=False) == tile_bytes(64, 64, 2) + tile_bytes(32, 64, 2) \
        + tile_bytes(32, 128, 2)
    assert tiles_bytes(128, 64, 64, 2, 2, None) == tiles_bytes(128, 64, 64, 2, 2)
    plan = plan_for_variant(Variant(), "a100", DType.bf16, 64, head_dim_v=128)
    assert smem_bytes(plan) == tiles_bytes(plan.block_m, plan.block_n, 64, 2, plan.stages, 128)
    turing = plan_for_variant(Variant(), "t4", DType.bf16, 64, head_dim_v=128)  # scaled tiles: O from registers
    assert smem_bytes(turing) == tiles_bytes(turing.block_m, turing.block_n, 64, 2, 1, 128, o_staged=False) \
        + 3 * 4 * turing.warps
    h = plan_for_variant(Variant(causal=True), "h200", DType.bf16, 192, head_dim_v=128)
    staged = hopper.schedule(h)["o_stage_chunks"]
    assert staged == 2  # both of O's 64-column chunks (Dv = 128), not D's three
    assert hopper.smem_bytes(h) == ((h.block_m + h.stages * h.block_n) * 3 + h.stages * h.block_n * 2) * 128 \
        + h.block_m * staged * 128 + 8 * (2 + 4 * h.stages) + 1024
    # the tile tables are read at the larger of D and Dv (its native entry), fitting each tile at its own width
    for target, dtype in (("a100", DType.bf16), ("h200", DType.bf16), ("t4", DType.fp16), ("a100", DType.fp32)):
        for d, dv in PAIRS:
            wide = max(d, dv)
            choice = choose_params_with_source(Variant(), target, dtype, d, head_dim_v=dv, tuned=False)
            assert choice.params == choose_params(Variant(), target, dtype, wide, tuned=False), (target, d, dv)
            assert f"(d{d}v{dv} takes the entry of d" in choice.detail, choice.detail
    assert choose_params_with_source(Variant(), "a100", DType.bf16, 64, head_dim_v=128, tuned=False).detail.endswith(
        "(d64v128 takes the entry of d128, the larger of its head dims)")
    assert choose_params_with_source(Variant(), "a100", DType.bf16, 192, head_dim_v=128, tuned=False).detail.endswith(
        "(d192v128 takes the entry of d256, the nearest native head dim at or above the larger of its head dims)")
    # O's accumulator is Dv's, Q's fragments D's
    assert estimate_registers(128, 64, 8, 64, True, 2, 128) - estimate_registers(128, 64, 8, 64, True, 2) == 16 * 64 // 32


@pytest.mark.parametrize("target", ["t4", "a100", "h200"])
def test_the_sources_run_pv_over_dv_and_qk_over_d(target):
    from flashgen.translators.render import render
    from flashgen.translators.rules import plan_for_variant

    source, manifest = render(plan_for_variant(Variant(causal=True), target, DType.bf16, 40, head_dim_v=24))
    assert manifest.head_dim == 40 and manifest.head_dim_v == 24 and "d40v24" in manifest.name
    assert "constexpr int D = 40;" in source and "constexpr int D_PAD = 48;" in source
    assert "constexpr int DV = 24;" in source
    if target == "h200":
        assert "rs_m64n24k16_bf16(acc, a, b)" in source and "ss_m64n" in source  # P V's N = Dv
        assert "constexpr int V_CHUNKS = 1;" in source and "float acc_o[DV / 2];" in source
        assert "for (int c = 0; c < V_CHUNKS; ++c)" in source and "arrive_expect_tx(&v_full[s], V_TILE_BYTES)" in source
        assert [m.tensor for m in manifest.tensor_maps] == ["q", "k", "v", "o"]
        return
    assert "constexpr int DV_PAD = 32;" in source and "float acc_o[MT][DV / 8][4];" in source
    loader = "scaled_tile_loader" if target == "t4" else "tile_loader"
    assert f"{loader}<BLOCK_N, DV, DV_PAD, T, THREADS" in source and f"{loader}<BLOCK_N, D, D_PAD, T, THREADS" in source
    assert "VMma::pv(acc_o, " in source and "mma.qk(acc_s, sQ, sK, warp_row0, lane);" in source
    if target == "a100":
        assert "constexpr int O_CHUNKS = DV / OLayout::CHUNK_ELEMS;" in source
        assert "T* sK = sQ + Q_REGION_ELEMS;" in source
    split, split_manifest = render(plan_for_variant(Variant(split_kv=True, return_lse=True), "a100", DType.bf16, 192,
                                                    head_dim_v=128))
    assert split_manifest.workspace_floats == "B*H*SPLITS*N*(128+1)"
    assert "float* ws_o = p.workspace + part * DV;" in split and "float acc[(DV + 31) / 32];" in split


# ------------------------------------------------------------------------------------------------ compiled

COMPILE_ARCHS = {"t4": "sm_75", "a100": "sm_80", "h200": "sm_90a"}


def _compile_group(arch: str, sources: list[str]) -> dict:
    from flashgen.harness.compile import compile_cuda

    result = compile_cuda("\n".join(sources), arch, filename=f"head_dim_v_{arch}.cu")
    assert result.ok, result.feedback_text(3000)
    return result.kernels


@needs_nvcc
@pytest.mark.slow  # about a minute on 2 cores: 48 kernels
def test_every_path_compiles_dv_kernels_without_spills():
    """sm_75, sm_80 and sm_90a; fp16 and bf16; plain and causal; every pair, built as the GPU tests build them (the
    library's program through the checker and the translator). None spills; were one to, it may keep no more in local
    memory than the kernel of one head dim whose tile entry it takes (the larger of D and Dv)."""
    from flashgen.harness.suite import build_expert_kernel

    jobs = [(target, dtype, name, d, dv) for target in COMPILE_ARCHS for dtype in (DType.fp16, DType.bf16)
            for name in VARIANTS for d, dv in PAIRS]
    built = {job: build_expert_kernel(job[0], job[1].value, VARIANTS[job[2]], job[3], head_dim_v=job[4])[:2]
             for job in jobs}
    assert all(m.head_dim_v == job[4] and m.dv == job[4] for job, (_, m) in built.items())
    groups = []
    for target, arch in COMPILE_ARCHS.items():
        mine = [built[job][0] for job in jobs if job[0] == target]
        size = 1 if arch == "sm_90a" else 8  # Hopper kernels each define their own wgmma wrappers
        groups += [(arch, mine[i:i + size]) for i in range(0, len(mine), size)]
    usage = {}
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        for kernels in pool.map(lambda group: _compile_group(*group), groups):
            usage.update(kernels)
    for job, (_, manifest) in built.items():
        spilled = usage[manifest.name].spill_store_bytes + usage[manifest.name].spill_load_bytes
        if spilled:
            target, dtype, name, d, dv = job
            source, one = build_expert_kernel(target, dtype.value, VARIANTS[name], max(d, dv))[:2]
            own = _compile_group(COMPILE_ARCHS[target], [source])[one.name]
            assert spilled <= own.spill_store_bytes + own.spill_load_bytes, (job, spilled)
    assert len(usage) >= len(jobs)


# ------------------------------------------------------------------------------------------------ byte for byte

def test_the_committed_kernels_are_byte_identical_when_dv_is_d():
    """Every kernel committed under generated/ (5 GPUs, fp16 and bf16, plain and causal, d64 and d128), built by the
    expert with head_dim_v equal to head_dim, is its kernel.tl, kernel.cu and manifest.json byte for byte; and the
    ALiBi kernels of tests/test_fa2_grid_gpu.py hash as tests/kernel_hashes.json records them."""
    from flashgen.harness.suite import build_expert_kernel

    folders = sorted(ROOT.glob("generated/*/*/*_d*/kernel.cu"))
    assert len(folders) >= 40
    for cu in folders:
        folder = cu.parent
        meta = json.loads((folder / "meta.json").read_text())
        gpu, dtype = folder.parts[-3], folder.parts[-2]
        source, manifest, tl = build_expert_kernel(gpu, dtype, Variant(**meta["variant_fields"]), meta["head_dim"],
                                                   head_dim_v=meta["head_dim"])
        assert source == cu.read_text(), folder
        assert manifest.model_dump_json(indent=2) + "\n" == (folder / "manifest.json").read_text(), folder
        assert tl == (folder / "kernel.tl").read_text(), folder
        assert "head_dim_v" not in tl and "DV" not in source
    hashes = json.loads((ROOT / "tests" / "kernel_hashes.json").read_text())
    checked = 0
    for path, target in PATHS.items():
        for d in (64, 128):
            key = f"gpu/fa2_grid_gpu/{path}-bf16-alibi-{d}"
            source, manifest = build_expert_kernel(target, "bf16", Variant(alibi=True), d, head_dim_v=d)[:2]
            assert hashlib.sha256(source.encode()).hexdigest() == hashes[key], key
            assert hashlib.sha256(manifest.model_dump_json().encode()).hexdigest() == hashes[f"{key}#manifest"], key
            checked += 1
    assert checked == 6


# ------------------------------------------------------------------------------------------------ generate

def test_generate_and_the_cli_take_head_dim_v_and_refuse_a_bad_one_in_one_line(tmp_path, monkeypatch):
    import subprocess
    import sys

    from flashgen.api import default_out_dir, generate

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))

    assert default_out_dir("h200", DType.bf16, Variant(causal=True), 192, head_dim_v=128) == \
        Path("generated/h200/bf16/causal_d192v128")
    assert default_out_dir("h200", DType.bf16, Variant(), 64, head_dim_v=64) == Path("generated/h200/bf16/plain_d64")
    with pytest.raises(UsageError, match=re.escape(f"head_dim_v 12: {RULE}")):
        generate(gpu="a100", head_dim=64, head_dim_v=12, out=tmp_path / "never")
    with pytest.raises(UsageError, match="head_dim_v: a resume keeps the run's own head dims"):
        generate(resume="1", head_dim_v=128, out=tmp_path / "never")
    assert not (tmp_path / "never").exists()
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "flashgen", "generate", "--gpu", "a100", "--head-dim", "192",
                           "--head-dim-v", "12"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"error: --head-dim-v 12: {RULE}"]


def test_generate_writes_a_dv_kernel_end_to_end(tmp_path, monkeypatch):
    """The expert through the whole loop (sketch, full TL checked and interpreted against the fp64 reference over Dv,
    translation, compile where nvcc is): the files say Dv everywhere it matters."""
    from flashgen.api import generate

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))

    kernel = generate(gpu="a100", dtype="bf16", head_dim=192, head_dim_v=128, causal=True, out=tmp_path / "out")
    assert kernel.manifest.head_dim == 192 and kernel.manifest.head_dim_v == 128 and kernel.manifest.dv == 128
    assert "head_dim 192 head_dim_v 128" in kernel.tl and "constexpr int DV = 128;" in kernel.source
    assert kernel.meta["head_dim"] == 192 and kernel.meta["head_dim_v"] == 128
    assert "head dim 192, V head dim 128" in kernel.report.splitlines()[0]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["head_dim_v"] == 128 and "d192v128" in manifest["name"]
    assert "d=192, dv=128" in repr(kernel)
    if shutil.which("nvcc"):
        resources = kernel.meta["resources"]
        assert resources and all(u["spill_store_bytes"] == 0 for u in resources.values())


def test_the_prompts_tell_a_dv_task_its_shapes_and_leave_the_others_as_they_were():
    from flashgen.agent.loop import Loop, LoopConfig
    from flashgen.agent.messages import Task
    from flashgen.harness.environment import Environment
    from tests.test_agent_manifest import ScriptedProvider

    env = Environment()
    one = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.bf16, head_dim=192)
    own = one.model_copy(update={"head_dim_v": 128})
    plain, told = (Loop(LoopConfig(task=t), ScriptedProvider([]), env, trace=None)._opening_prompt("sketch")
                   for t in (one, own))
    task_part = plain[plain.index("## The task"):plain.index("## ", plain.index("## The task") + 3)]
    assert "head dim **192**, variant **causal**:" in task_part
    assert "V head dim" not in task_part and "head_dim_v" not in task_part and "Dv" not in task_part
    assert "V's own head dim Dv" not in plain
    assert "head dim **192**, V head dim **128**, variant **causal**:" in told
    assert "V is (B, KVH, M, 128) and O (B, H, N, 128)" in told and "`head_dim_v 128`" in told
    assert "- V's own head dim Dv (DeepSeek-style prefill" in told  # the semantics' line, for this task only
    loop = Loop(LoopConfig(task=own), ScriptedProvider([]), env, trace=None)
    loop.state.tl = env.library_tl(own.variant, env.target("a100"), own.dtype, 192, form="full", head_dim_v=128,
                                   params=env.choose_params(own.variant, env.target("a100"), own.dtype, 192,
                                                            head_dim_v=128)[0])
    translate = loop._opening_prompt("translate")
    assert "head_dim 192 head_dim_v 128" in translate and "constexpr int DV = 128;" in translate  # the worked example


def test_tl_run_takes_the_programs_dv_or_the_shapes_and_says_a_wrong_one_in_one_line(tmp_path, monkeypatch, capsys):
    from tests.test_tl_cli import run_cli

    path = tmp_path / "dv.full.tl"
    path.write_text(_program_text(Variant(causal=True, return_lse=True), d=64, dv=128))
    for shape in ("B=1,H=2,N=40,M=70,D=64", "B=1,H=2,N=40,M=70,D=64,DV=128"):
        code, out, err = run_cli(monkeypatch, capsys, "run", str(path), "--shape", shape, "--json")
        assert code == 0, err
        record = json.loads(out)
        assert record["passed"] and record["rel_err"] < 1e-12 and record["shape"]["DV"] == 128
    code, out, err = run_cli(monkeypatch, capsys, "run", str(path), "--shape", "B=1,H=2,N=40,M=70,D=64,DV=64")
    assert code != 0
    assert [line for line in err.splitlines() if line.strip()] == [
        f"error: {path}: the program is written for V head dim 128, the shape has DV=64"]
