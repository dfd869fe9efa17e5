"""Issue 15 items 2 and 4: what a caller passes at call time besides Q, K and V.

- ALiBi slopes given by the caller (FlashAttention's `alibi_slopes`, fp32 (H) or (B, H)): the ABI's
  `alibi_slopes`/`alibi_stride_b` (null: the standard slopes), the TL's builtin `alibi_slopes[b, h]`, one prologue
  constant on every path, the fp64 reference, the CPU check and the verification cases with caller slopes.
- Call-time tensors of score and mask functions (`--tensor LEN=int32[B]:0..M`, a TL `Tensor` line, `LEN[b]` in an
  expression): parsed, checked, interpreted (against numpy, written here), lowered to reads of the ABI's
  `mod_tensors` slots with clamped indices, compiled by nvcc for sm_80 and sm_90a, filled alike by the interpreter
  and the harness, and refused in one line where they are wrong (the TL checker, `make_mods`, `Kernel.__call__`).
The GPU half is tests/test_call_time_gpu.py.
"""

from __future__ import annotations

import ctypes
import json
import re

import numpy as np
import pytest

from flashgen.abi import ABI_HEADER, MAX_MOD_RANK, MAX_MOD_TENSORS, FlashgenAttnParams, KernelManifest, ModTensor
from flashgen.errors import UsageError
from flashgen.harness.environment import Environment
from flashgen.mods import make_mods
from flashgen.reference import alibi_table, attend, attention, random_alibi_slopes, random_inputs, visible_mask
from flashgen.tl_spec import check, compare, format_program, interpret, library, parse
from flashgen.tl_spec.diagnostics import TLSyntaxError, errors_only
from flashgen.tl_spec.tensors import fill, fill_all, sizes_of
from flashgen.translators import translate
from flashgen.translators.plan import alibi_slope_c
from flashgen.variant import DType, Shape, Variant, alibi_slope, default_scale
from tests.cli_cases import assert_one_line_exit_2

LEN_MODS = make_mods(mask_mod="k_idx < LEN[b]", tensors={"LEN": "int32[B]:0..M"})
DOC_MODS = make_mods(score_mod="s + 0.25 * cos(k_idx)", mask_mod="DOC[q_idx] == DOC[k_idx]",
                     tensors={"DOC": "int32[M]:0..3:sorted"})
GPUS = [("a100", "fp16"), ("h200", "bf16"), ("t4", "bf16")]  # the sm80 path, the Hopper dataflow, Turing scaled


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))


def _program(mods, variant: Variant, gpu: str, dtype: str):
    env = Environment()
    text = env.library_tl(variant, env.target(gpu), DType(dtype), 64, form="full", mods=mods)
    program = parse(text)
    assert not errors_only(check(program, gpu)), [str(d) for d in check(program, gpu)]
    return text, program


def _numpy(q, k, v, variant: Variant, visible_fn, score_fn=None):
    """Attention written here without flashgen's interpreter: dense scores per (b, h), the score function, the
    variant's mask and the mask function `visible_fn(b, h) -> (N, M) bool`, then softmax over the visible keys."""
    batch, heads, n, d = q.shape
    m = k.shape[2]
    o, lse = np.zeros(q.shape), np.full((batch, heads, n), -np.inf)
    for b in range(batch):
        for h in range(heads):
            s = default_scale(d) * q[b, h] @ k[b, h].T
            if score_fn is not None:
                s = score_fn(s, np.arange(n)[:, None], np.arange(m)[None, :])
            o[b, h], lse[b, h] = attend(s, visible_mask(n, m, variant) & visible_fn(b, h), v[b, h], variant.norm)
    return o, lse


def _close(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = ~np.isneginf(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------ the TL

def test_tensor_lines_and_reads_parse_and_print_back():
    text = ("Tensor LEN shape [B] dtype int32 fill 0 to M\n"
            "Tensor DOC shape [M] dtype int32 fill -1 to M - 1 sorted\n"
            "Tensor W shape [H, 8] dtype fp32\n"
            "Compute S = where(k_idx < LEN[b + 1] and DOC[q_idx] == DOC[k_idx], S, -inf) - W[h, q_idx % 8] * 2\n")
    program = parse(text)
    printed = format_program(program)
    assert parse(printed) == program
    assert "Tensor W shape [H, 8] dtype fp32 fill 0 to 1\n" in printed  # the default fill, written out
    decl = program.tensor_decls[1]
    assert (decl.name, decl.dtype, decl.sorted) == ("DOC", "int32", True)
    with pytest.raises(TLSyntaxError, match=r"unknown tensor dtype 'int8' \(hint: a call-time tensor is int32 or fp32"):
        parse("Tensor X shape [B] dtype int8\n")


def _edited(edit: dict[str, str]) -> str:
    text, _ = _program(LEN_MODS, Variant(return_lse=True), "a100", "fp16")
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


REFUSED = [
    ({"LEN[b]": "LEN[b, h]"}, "'LEN' has 1 dims; the index gives 2"),
    ({"LEN[b]": "LENX[b]"}, "undefined tensor 'LENX' (hint: declare it at program level: Tensor LENX shape [B]"),
    ({"LEN[b]": "LEN"}, "'LEN' is a call-time tensor: read an element, LEN[i]"),
    ({"LEN[b]": "LEN[-1]"}, "index -1 of 'LEN' is out of range whatever the sizes"),
    ({"LEN[b]": "LEN[b // 2 + 0.5]"}, ""),  # a float index: the checker's probes say nothing, the lowering does
    ({"Tensor LEN shape [B]": "Tensor LEN shape [4]", "LEN[b]": "LEN[4]"},
     "index 4 of 'LEN' is out of range whatever the sizes (the dim has 4 elements)"),
    ({"LEN[b]": "LEN[S_r]"}, "an index of 'LEN' reads the tile 'S_r'"),
    ({"Let q0 = m_blk * BLOCK_M": "Let q0 = m_blk * BLOCK_M + LEN[b]"}, "a call-time tensor is read only in a Compute"),
    ({"Tensor LEN shape [B]": "Tensor LEN shape [X]"}, "dim 'X' of tensor 'LEN': a size (B, H, KVH, N, M, D)"),
    ({"fill 0 to M": "fill M to 0"}, "tensor 'LEN': fill M to 0 is empty at B=3"),
    ({"fill 0 to M": "fill 0 to M / 2"}, "tensor 'LEN' is int32: its fill bounds are integers"),
    ({"Tensor LEN": "Tensor alibi_slopes", "LEN[b]": "alibi_slopes[b]"}, "'alibi_slopes' is the builtin ALiBi slopes"),
    ({"LEN[b]": "alibi_slopes[b, h]"}, "undefined tensor 'alibi_slopes' (hint: alibi_slopes exists in an ALiBi program"),
    ({"Tensor LEN shape [B] dtype int32 fill 0 to M\n": "".join(f"Tensor T{i} shape [B] dtype int32\n" for i in range(4))
      + "Tensor LEN shape [B] dtype int32 fill 0 to M\n"}, f"more than {MAX_MOD_TENSORS} Tensor lines"),
    ({"Tensor LEN shape [B]": "Tensor LEN shape [B, H, N, M, D]"}, f"has 5 dims; a call-time tensor has 1 to {MAX_MOD_RANK}"),
    ({"Tensor LEN shape [B] dtype int32 fill 0 to M\n": "",
      "Let q0 = m_blk * BLOCK_M": "Let q0 = m_blk * BLOCK_M\n        Tensor LEN shape [B] dtype int32 fill 0 to M"},
     "a Tensor line inside a Kernel"),
]


@pytest.mark.parametrize("edit,message", REFUSED, ids=[m[:40] or "float index" for _, m in REFUSED])
def test_the_checker_refuses_wrong_tensors_in_one_line_each(edit, message):
    diagnostics = [str(d) for d in errors_only(check(parse(_edited(edit)), "a100"))]
    if not message:  # a float index: the translator names it (the checker cannot prove an index's type)
        with pytest.raises(Exception, match="an index of 'LEN' is a float: indices are integers"):
            translate(parse(_edited(edit)), "a100")
        return
    assert any(message in d for d in diagnostics), diagnostics
    assert all("\n" not in d for d in diagnostics)


@pytest.mark.parametrize("gpu,dtype", GPUS)
@pytest.mark.parametrize("causal", [False, True])
def test_the_interpreter_computes_the_length_mask_as_numpy(gpu, dtype, causal):
    variant = Variant(causal=causal, return_lse=True)
    _, program = _program(LEN_MODS, variant, gpu, dtype)
    shape = Shape(B=3, H=2, N=45, M=90, D=64)
    lengths = np.array([0, 17, 90])  # a batch whose rows see no key: O = 0, LSE = -inf
    q, k, v = random_inputs(shape, 3)
    result = interpret(program, shape, inputs={"Q": q, "K": k, "V": v, "LEN": lengths})
    o, lse = _numpy(q, k, v, variant, lambda b, h: np.arange(90)[None, :] < lengths[b])
    _close(result.outputs["O"], o)
    _close(result.outputs["LSE"], lse)
    assert np.all(result.outputs["O"][0] == 0) and np.all(np.isneginf(result.outputs["LSE"][0]))
    # without the tensor the run fills it by its rule from the seed, exactly as the harness does for a case
    filled = interpret(program, shape, seed=11).inputs["LEN"]
    assert np.array_equal(filled, fill_all(LEN_MODS.tensors, sizes_of(shape), 11)["LEN"])


@pytest.mark.parametrize("gpu,dtype", GPUS)
def test_the_interpreter_computes_the_document_mask_and_score_as_numpy(gpu, dtype):
    variant = Variant(causal=True, return_lse=True)
    _, program = _program(DOC_MODS, variant, gpu, dtype)
    shape = Shape(B=2, H=2, N=150, M=150, D=64)  # packed sequences: N == M
    doc = np.repeat([0, 0, 1, 2, 2, 2], 25)
    q, k, v = random_inputs(shape, 4)
    result = interpret(program, shape, inputs={"Q": q, "K": k, "V": v, "DOC": doc})
    o, lse = _numpy(q, k, v, variant, lambda b, h: doc[:, None] == doc[None, :],
                    lambda s, qi, kj: s + 0.25 * np.cos(kj))
    _close(result.outputs["O"], o)
    _close(result.outputs["LSE"], lse)


def test_indices_are_clamped_into_their_dims_in_the_interpreter_and_the_c():
    mods = make_mods(score_mod="s + W[q_idx + 5] - W[k_idx - 3]", tensors={"W": "fp32[N]:-1..1"})
    variant = Variant(return_lse=True)
    text, program = _program(mods, variant, "a100", "fp16")
    shape = Shape(B=1, H=2, N=37, M=41, D=64)
    w = np.linspace(-1.0, 1.0, 37)
    q, k, v = random_inputs(shape, 1)
    result = interpret(program, shape, inputs={"Q": q, "K": k, "V": v, "W": w})
    clip = lambda i: w[np.clip(i, 0, 36)]  # noqa: E731
    o, lse = _numpy(q, k, v, variant, lambda b, h: np.ones((37, 41), bool), lambda s, qi, kj: s + clip(qi + 5)
                    - clip(kj - 3))
    _close(result.outputs["O"], o)
    _close(result.outputs["LSE"], lse)
    plan = translate(program, "a100").plan
    (mod,) = [m for m in plan.score_mods if "mod_tensors" in m.expr]
    assert "min(qpos + 5, seqlen_q - 1)" in mod.expr and "min(max(kpos - 3, 0), seqlen_q - 1)" in mod.expr


def test_fill_rules_are_the_declared_ones_and_seeded():
    sizes = {"B": 4, "H": 2, "KVH": 2, "N": 64, "M": 50, "D": 64, "KV_GROUP": 1}
    rng = np.random.default_rng(0)
    lengths = fill(ModTensor.parse("LEN=int32[B]:0..3"), {**sizes, "B": 4000}, rng)
    assert lengths.dtype == np.int32 and set(np.unique(lengths)) == {0, 1, 2, 3}  # both ends included
    doc = fill(ModTensor.parse("DOC=int32[M]:0..3:sorted"), sizes, rng)
    assert doc.shape == (50,) and np.all(np.diff(doc) >= 0)
    bias = fill(ModTensor.parse("X=fp32[H, N]:-0.5..0.5"), sizes, rng)
    assert bias.dtype == np.float32 and bias.shape == (2, 64) and bias.min() >= -0.5 and bias.max() < 0.5
    default = fill(ModTensor.parse("L=int32[B]"), sizes, rng)
    assert default.min() >= 0 and default.max() <= 50  # 0..M
    specs = [ModTensor.parse("A=int32[B]:1..N - 1"), ModTensor.parse("C=fp32[M]")]
    one, two = fill_all(specs, sizes, 7), fill_all(specs, sizes, 7)
    assert all(np.array_equal(one[n], two[n]) for n in one) and one["A"].max() <= 63
    with pytest.raises(ValueError, match=r"^E: fill M to 0 is empty at B=4, H=2, N=64, M=50"):
        fill(ModTensor.parse("E=int32[B]:M..0"), sizes, rng)


# ------------------------------------------------------------------------------------------ the ABI

def test_the_header_and_the_ctypes_mirror_agree_on_the_call_time_fields():
    header = ABI_HEADER.read_text()
    assert re.search(rf"#define FLASHGEN_MAX_MOD_TENSORS {MAX_MOD_TENSORS}\b", header)
    assert re.search(rf"#define FLASHGEN_MAX_MOD_RANK {MAX_MOD_RANK}\b", header)
    body = header[header.index("struct FlashgenAttnParams {"):header.index("};")]
    ends = re.findall(r"^\s+(?:const )?[\w ]+?\*?\s*(\w+)(?:\[[^\]]*\])*;", body, re.M)[-4:]
    assert ends == ["alibi_slopes", "alibi_stride_b", "mod_tensors", "mod_strides"]  # added at the end
    names = [name for name, _ in FlashgenAttnParams._fields_]
    assert names[-4:] == ends
    p = FlashgenAttnParams()
    assert len(p.mod_tensors) == MAX_MOD_TENSORS and len(p.mod_strides[0]) == MAX_MOD_RANK
    assert FlashgenAttnParams.mod_strides.offset + ctypes.sizeof(ctypes.c_longlong) * MAX_MOD_TENSORS * MAX_MOD_RANK \
        == ctypes.sizeof(FlashgenAttnParams)  # (the g++ comparison of every offset: test_compile)


def test_manifests_carry_the_tensors_as_text_and_older_ones_read_unchanged():
    man = KernelManifest.model_validate({"name": "k", "arch": "sm_80", "dtype": "fp16", "head_dim": 64,
                                         "variant": {}, "launches": [], "mod_tensors": ["DOC = int32[M]:0 .. 3:sorted"]})
    assert man.mod_tensors == ["DOC=int32[M]:0..3:sorted"] and man.call_tensors[0].sorted
    plain = man.model_copy(update={"mod_tensors": []})
    assert "mod_tensors" not in json.loads(plain.model_dump_json())  # manifests without tensors keep their bytes
    with pytest.raises(ValueError, match="expected NAME=DTYPE"):
        KernelManifest.model_validate({**json.loads(plain.model_dump_json()), "mod_tensors": ["LEN int32"]})


# ------------------------------------------------------------------------------------------ translation and nvcc

def _nvcc():
    from flashgen.harness.compile import find_nvcc

    try:
        return find_nvcc()
    except Exception:
        return None


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("gpu,dtype,arch,mods", [("a100", "fp16", "sm_80", LEN_MODS), ("h200", "bf16", "sm_90", DOC_MODS),
                                                 ("h200", "bf16", "sm_90", LEN_MODS)])
def test_programs_with_tensors_translate_and_compile(gpu, dtype, arch, mods):
    from flashgen.harness.compile import compile_cuda

    _, program = _program(mods, Variant(causal=True, return_lse=True), gpu, dtype)
    tr = translate(program, gpu)
    assert tr.manifest.mod_tensors == [t.text for t in mods.tensors] and tr.manifest.reference_tl is not None
    assert "p.mod_tensors[0]" in tr.source and tr.plan.backend == ("sm90" if arch == "sm_90" else "sm80")
    if mods is LEN_MODS:  # read once per block, and the tile test reads the same constant
        (const,) = [p for p in tr.plan.prologue if "mod_tensors" in p.expr]
        assert const.expr == "static_cast<const int*>(p.mod_tensors[0])[b * p.mod_strides[0][0]]"
        assert f"kpos < {const.name}" in tr.plan.visible and const.name in tr.plan.mask_tile
    built = compile_cuda(tr.source, arch)
    assert built.ok, built.feedback_text()


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("gpu,dtype,arch,split", [("a100", "fp16", "sm_80", False), ("h200", "bf16", "sm_90", False),
                                                  ("h200", "fp16", "sm_90", True)])
def test_alibi_programs_read_the_callers_slopes_on_every_path(gpu, dtype, arch, split):
    from flashgen.harness.compile import compile_cuda

    variant = Variant(alibi=True, return_lse=True, split_kv=split)
    env = Environment()
    text = env.library_tl(variant, env.target(gpu), DType(dtype), 64, form="full")
    assert "alibi_slopes[b, h]" in text
    tr = translate(parse(text), gpu)
    assert [p.expr for p in tr.plan.prologue] == [alibi_slope_c("b", "head")]
    assert tr.manifest.reference_tl is None and not tr.manifest.mod_tensors  # it computes its Variant line
    built = compile_cuda(tr.source, arch)
    assert built.ok, built.feedback_text()


# ------------------------------------------------------------------------------------------ ALiBi's reference

def test_the_reference_takes_the_callers_slopes_in_both_shapes():
    shape = Shape(B=2, H=3, N=20, M=31, D=64)
    q, k, v = random_inputs(shape, 0)
    variant = Variant(alibi=True, return_lse=True)
    standard = attention(q, k, v, variant)
    assert all(np.allclose(a, b) for a, b in zip(standard, attention(q, k, v, variant, alibi_slopes=alibi_table(2, 3))))
    heads = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    assert all(np.allclose(a, b) for a, b in zip(attention(q, k, v, variant, alibi_slopes=heads),
                                                 attention(q, k, v, variant, alibi_slopes=np.tile(heads, (2, 1)))))
    per_batch = random_alibi_slopes(2, 3, 5, per_batch=True)
    o, lse = attention(q, k, v, variant, alibi_slopes=per_batch)
    dist = np.abs(np.arange(20)[:, None] + 11 - np.arange(31)[None, :])
    for b in range(2):
        for h in range(3):
            s = default_scale(64) * q[b, h] @ k[b, h].T - float(per_batch[b, h]) * dist
            want_o, want_lse = attend(s, np.ones((20, 31), bool), v[b, h], variant.norm)
            assert np.allclose(o[b, h], want_o) and np.allclose(lse[b, h], want_lse)
    assert not np.allclose(o, standard[0])
    assert alibi_table(1, 4)[0, 1] == alibi_slope(1, 4)
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(2,\), expected \(3,\) or \(2, 3\)"):
        alibi_table(2, 3, np.ones(2))


def test_the_library_alibi_program_follows_the_callers_slopes_and_a_fixed_formula_does_not():
    text = library.render(Variant(alibi=True, return_lse=True), dtype="fp16", arch="sm_80", head_dim=64)
    shape = Shape(B=2, H=4, N=37, M=53, D=64)
    for slopes in (None, random_alibi_slopes(2, 4, 1, True), random_alibi_slopes(2, 4, 1, False)):
        assert compare(parse(text), shape, alibi_slopes=slopes).rel_err < 1e-12
    fixed = text.replace("alibi_slopes[b, h]", "exp2(-8.0 * (h + 1) / H)")
    assert compare(parse(fixed), shape).rel_err < 1e-12  # the standard slopes alone cannot tell them apart
    assert compare(parse(fixed), shape, alibi_slopes=random_alibi_slopes(2, 4, 1, True)).rel_err > 1e-3
    env = Environment()
    variant, target = Variant(alibi=True, return_lse=True), env.target("a100")
    assert env.check_tl(text, variant, target, DType.fp16, 64, full=True).ok
    refused = env.check_tl(fixed, variant, target, DType.fp16, 64, full=True)
    assert not refused.ok and "read the slope of batch b, head h as alibi_slopes[b, h]" in refused.summary


def test_verification_runs_alibi_kernels_with_the_standard_and_the_callers_slopes():
    from flashgen.harness.verify import CheckCase, default_cases, reference_outputs

    tr = translate(parse(library.render(Variant(alibi=True, return_lse=True), head_dim=64)), "a100")
    cases = default_cases(tr.manifest)
    given = {c.name: c.alibi_slopes for c in cases if c.alibi_slopes != "standard"}
    assert given == {"alibi_slopes_h": "H", "alibi_slopes_bh": "BH"} and len(cases) > len(given)
    assert "caller ALiBi slopes (B, H)" in next(c for c in cases if c.alibi_slopes == "BH").label
    assert "alibi_slopes" not in CheckCase(name="x", shape=Shape(B=1, H=1, N=1, M=1, D=64)).model_dump()
    assert default_cases(translate(parse(library.render(Variant(), head_dim=64)), "a100").manifest)[-1].alibi_slopes \
        == "standard"
    shape = Shape(B=2, H=4, N=30, M=40, D=64)
    q, k, v = random_inputs(shape, 2)
    slopes = random_alibi_slopes(2, 4, 9, per_batch=True)
    o, lse = reference_outputs(tr.manifest, q, k, v, call_time={"alibi_slopes": slopes})
    want = attention(q, k, v, tr.manifest.variant, alibi_slopes=slopes)
    assert np.allclose(o, want[0]) and np.allclose(lse, want[1])
    # a kernel with call-time tensors: its TL interpreted on the case's tensors
    _, program = _program(LEN_MODS, Variant(return_lse=True), "a100", "fp16")
    man = translate(program, "a100").manifest
    lengths = np.array([3, 40], dtype=np.int32)
    o, lse = reference_outputs(man, q, k, v, call_time={"LEN": lengths})
    want_o, want_lse = _numpy(q, k, v, Variant(return_lse=True), lambda b, h: np.arange(40)[None, :] < lengths[b])
    _close(o, want_o)
    _close(lse, want_lse)


# ------------------------------------------------------------------------------------------ the call's checks

def _kernel(manifest: KernelManifest):
    from flashgen.api import Kernel

    return Kernel(tl="", sketch="", source="// not compiled on the CPU", manifest=manifest, report="", meta={})


def _arrays():
    from tests.test_arrays import FakeCupy

    return FakeCupy, (FakeCupy((2, 4, 33, 64), "<f2"), FakeCupy((2, 4, 40, 64), "<f2"), FakeCupy((2, 4, 40, 64), "<f2"))


def test_kernel_call_refuses_bad_slopes_and_tensors_in_one_line_before_the_gpu():
    from flashgen.harness.device import ArrayError, NoGpuError
    from tests.test_arrays import FakePycuda

    cupy, qkv = _arrays()
    base = {"name": "fg_k", "arch": "sm_80", "dtype": "fp16", "head_dim": 64,
            "launches": [{"kernel": "k", "grid": ["cdiv(N, 64)", "H", "B"], "threads": 128}]}
    alibi = _kernel(KernelManifest.model_validate({**base, "variant": {"alibi": True}}))
    mods = _kernel(KernelManifest.model_validate({**base, "variant": {}, "reference_tl": "x",
                                                  "mod_tensors": ["LEN=int32[B]:0..M", "DOC=int32[M]:0..3:sorted"]}))
    good = {"LEN": cupy((2,), "<i4"), "DOC": cupy((40,), "<i4")}
    refusals = [
        (lambda: alibi(*qkv, alibi_slopes=cupy((4,), "<f2")), "alibi_slopes has dtype float16, the kernel takes float32"),
        (lambda: alibi(*qkv, alibi_slopes=cupy((3,), "<f4")),
         "alibi_slopes has shape (3,), expected (4,) or (2, 4): FlashAttention's (nheads) or (batch, nheads)"),
        (lambda: alibi(*qkv, alibi_slopes=cupy((2, 4), "<f4", (16, 8))), "the head axis must be contiguous"),
        (lambda: alibi(*qkv, alibi_slopes=FakePycuda((4,), "<f4")), "is a pycuda.GPUArray"),
        (lambda: mods(*qkv, alibi_slopes=cupy((4,), "<f4"), tensors=good), "alibi_slopes: fg_k has no ALiBi bias"),
        (lambda: mods(*qkv), "tensors: LEN is missing: fg_k reads LEN, int32 [B] ((2,) here); pass tensors={'LEN': ...}"),
        (lambda: mods(*qkv, tensors={"LEN": good["LEN"]}), "tensors: DOC is missing"),
        (lambda: mods(*qkv, tensors={**good, "X": good["LEN"]}),
         "tensors: X: fg_k has no call-time tensor of that name (it reads LEN, DOC)"),
        (lambda: mods(*qkv, tensors={**good, "LEN": cupy((2,), "<f4")}),
         "tensors['LEN'] has dtype float32, the kernel takes int32"),
        (lambda: mods(*qkv, tensors={**good, "DOC": cupy((33,), "<i4")}),
         "tensors['DOC'] has shape (33,), expected (40,) (int32 [M] at M=40)"),
        (lambda: mods(*qkv, tensors=[good["LEN"]]), "tensors: expected a dict of name -> CUDA array, got list"),
        (lambda: mods(*qkv, tensors={"LEN": [1, 2], "DOC": good["DOC"]}), "tensors['LEN'] (builtins.list) is not a CUDA"),
    ]
    for call, message in refusals:
        with pytest.raises(ArrayError) as info:
            call()
        assert message in str(info.value) and "\n" not in str(info.value), (message, str(info.value))
    for call in (lambda: alibi(*qkv), lambda: alibi(*qkv, alibi_slopes=cupy((2, 4), "<f4")),
                 lambda: alibi(*qkv, alibi_slopes=cupy((4,), "<f4")), lambda: mods(*qkv, tensors=good)):
        with pytest.raises(NoGpuError):  # past every check, the first thing is asking for the GPU
            call()


def test_build_params_fills_the_call_time_fields():
    from flashgen.harness.device import build_params, tensor_view

    cupy, (q, k, v) = _arrays()
    base = {"name": "k", "arch": "sm_80", "dtype": "fp16", "head_dim": 64, "launches": []}
    man = KernelManifest.model_validate({**base, "variant": {"alibi": True}, "reference_tl": "x",
                                         "mod_tensors": ["LEN=int32[B]", "W=fp32[H, N]"]})
    views = [tensor_view(x) for x in (q, k, v, cupy((2, 4, 33, 64), "<f2"))]
    tensors = {"LEN": tensor_view(cupy((2,), "<i4", ptr=4096)),
               "W": tensor_view(cupy((4, 33), "<f4", (4, 33 * 4), ptr=8192))}  # strided: any strides
    p = build_params(man, *views, None, 0, 0.125, 1, alibi_slopes=tensor_view(cupy((2, 4), "<f4", ptr=64)),
                     tensors=tensors)
    assert (p.alibi_slopes, p.alibi_stride_b) == (64, 4)
    assert (p.mod_tensors[0], p.mod_tensors[1], p.mod_tensors[2]) == (4096, 8192, None)
    assert list(p.mod_strides[0]) == [1, 0, 0, 0] and list(p.mod_strides[1]) == [1, 33, 0, 0]
    p = build_params(man, *views, None, 0, 0.125, 1, alibi_slopes=tensor_view(cupy((4,), "<f4", ptr=64)),
                     tensors=tensors)
    assert (p.alibi_slopes, p.alibi_stride_b) == (64, 0)
    p = build_params(man, *views, None, 0, 0.125, 1, tensors=tensors)
    assert p.alibi_slopes is None  # null: the standard slopes


# ------------------------------------------------------------------------------------------ the options

BAD = [
    (["--mask-mod", "k_idx < LEN[b]"], "error: --mask-mod 'k_idx < LEN[b]': 'LEN' is an unknown tensor"),
    (["--mask-mod", "k_idx < LEN", "--tensor", "LEN=int32[B]"], "error: --mask-mod 'k_idx < LEN': 'LEN' is a tensor: "
                                                              "read an element, LEN[i]"),
    (["--mask-mod", "k_idx < LEN[b, h]", "--tensor", "LEN=int32[B]"], "error: --mask-mod 'k_idx < LEN[b, h]': LEN[...] "
                                                                     "takes 1 index"),
    (["--mask-mod", "k_idx < 3", "--tensor", "LEN=int32[B]"], "error: --tensor LEN=int32[B]:0..M: not used by --mask-mod"),
    (["--mask-mod", "k_idx < LEN[b]", "--tensor", "LEN=int8[B]"], "error: --tensor LEN=int8[B]: dtype 'int8': a "
                                                                 "call-time tensor is int32 or fp32"),
    (["--mask-mod", "k_idx < LEN[b]", "--tensor", "LEN=int32[X]"], "error: --tensor LEN=int32[X]: dim 'X': a size"),
    (["--mask-mod", "k_idx < LEN[b]", "--tensor", "LEN=int32[B]:M..0"], "error: --tensor LEN=int32[B]:M..0: fill M to 0 "
                                                                       "is empty"),
    (["--mask-mod", "k_idx < LEN[b]", "--tensor", "LEN"], "error: --tensor 'LEN': expected NAME=DTYPE[DIMS]"),
    (["--mask-mod", "k_idx < h[b]", "--tensor", "h=int32[B]"], "error: --tensor h: a name the expressions already have"),
    (["--mask-mod", "k_idx < LEN[0.5]", "--tensor", "LEN=int32[B]"], "error: --mask-mod 'k_idx < LEN[0.5]': an index of "
                                                                    "'LEN' is a float"),
    (["--tensor", "LEN=int32[B]"], "error: --tensor LEN: tensors need --score-mod or --mask-mod"),
    (["--mask-mod", "k_idx < LEN[b]", "--tensor", "LEN=int32[B]", "--tensor", "LEN=int32[B]"],
     "error: --tensor LEN: given twice"),
]


def test_bad_tensor_options_exit_2_with_one_line_before_any_model_call(tmp_path):
    assert_one_line_exit_2(BAD, tmp_path)


def test_the_api_writes_the_tensors_into_the_tl_manifest_and_meta(tmp_path):
    import flashgen

    with pytest.raises(UsageError, match=r"^tensors LEN=int32\[B\]:0\.\.M: not used by mask_mod"):
        flashgen.generate(gpu="a100", mask_mod="k_idx < 3", tensors={"LEN": "int32[B]"})
    with pytest.raises(UsageError, match="a resume keeps the run's own functions"):
        flashgen.generate(resume="1", out=tmp_path / "o", tensors={"LEN": "int32[B]"})
    kernel = flashgen.generate(gpu="a100", dtype="fp16", head_dim=64, mask_mod="k_idx < LEN[b]",
                               tensors={"LEN": "int32[B]:1..M"}, out=tmp_path / "out")
    assert "Tensor LEN shape [B] dtype int32 fill 1 to M" in kernel.tl and "Tensor LEN" in kernel.sketch
    assert kernel.manifest.mod_tensors == ["LEN=int32[B]:1..M"] and kernel.manifest.reference_tl is not None
    assert kernel.meta["mods"]["tensors"] == [{"name": "LEN", "dtype": "int32", "shape": ["B"], "low": "1", "high": "M",
                                               "sorted": False}]
    assert "tensor LEN=int32[B]:1..M (given at each call: tensors={'LEN': ...})" in kernel.report
    assert kernel.meta["mods"]["tiles"] is None  # the tiles depend on the call's values
    assert make_mods("s").tag == make_mods("s", tensors=None).tag  # functions without tensors keep their folders
    assert LEN_MODS.tag != make_mods(mask_mod="k_idx < LEN[b]", tensors={"LEN": "int32[B]:1..M"}).tag
