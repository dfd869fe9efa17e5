"""Lowering full TL to a KernelPlan: library programs, custom masks/score mods, rejected constructs, nvcc."""

import re
import shutil

import pytest

from flashgen.errors import FlashgenError
from flashgen.harness.static_check import static_check
from flashgen.targets import get_target
from flashgen.tl_spec import library
from flashgen.tl_spec.parser import parse
from flashgen.translators import UnsupportedConstruct, lower, manifest_for, translate
from flashgen.translators.plan import alibi_slope_c

SCALE_LINE = "Compute S_r = S_r * (scale * log2e)"
TAIL_MASK = "Compute S_r = where(k_idx < M, S_r, -inf)"


def _edit(name: str, replace: dict[str, str]) -> str:
    text = library.load(name)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("gpu", ["a100", "t4"])
@pytest.mark.parametrize("name", list(library.PROGRAMS))
def test_every_library_program_translates(name, gpu):
    target = get_target(gpu)
    tr = translate(parse(library.load(name)), target)
    variant = library.PROGRAMS[name]
    assert tr.plan.arch == target.arch and tr.manifest.arch == target.arch
    assert tr.plan.variant == variant and tr.manifest.variant == variant
    assert tr.plan.norm.kind.value == variant.norm.value
    assert tr.plan.write_lse == variant.return_lse
    assert static_check(tr.source, tr.manifest) == []
    assert tr.manifest.launches[0].kernel == tr.plan.name
    assert len(tr.manifest.launches) == (2 if variant.split_kv else 1)
    assert "void __launch_bounds__" in tr.source and tr.plan.name in tr.source


def _plan(name: str):
    return lower(parse(library.load(name)), "sm_80")[0]


def test_library_plans_hold_the_expected_pieces():
    plain = _plan("plain")
    assert (plain.score_mods, plain.visible, plain.mask_tile, plain.kv_tile_begin) == ([], None, "false", "0")
    causal = _plan("causal")
    assert causal.visible == "kpos <= qpos + diag"
    assert causal.mask_tile == "n_block * BLOCK_N + BLOCK_N - m_block * BLOCK_M - diag > 1"
    assert causal.kv_tile_end.startswith("min((seqlen_k + BLOCK_N - 1) / BLOCK_N, ")
    window = _plan("window")
    assert window.visible == "kpos <= qpos + diag && qpos + diag - kpos < 100"
    assert window.kv_tile_begin.startswith("max(0, ") and "||" in window.mask_tile
    alibi = _plan("alibi")
    (mod,) = alibi.score_mods
    assert mod.uses_positions and mod.expr == "s - (float)abs(qpos + diag - kpos) * tl_c0"
    # the caller's slope (FlashgenAttnParams.alibi_slopes) or, for a null pointer, the standard one: plan.alibi_slope_c
    assert alibi.prologue[0].expr == alibi_slope_c("b", "head") and "p.alibi_slopes[b * p.alibi_stride_b + head]" in \
        alibi.prologue[0].expr and "exp2f(-8.0f * (float)(head + 1) / (float)heads)" in alibi.prologue[0].expr
    softcap = _plan("softcap")
    assert [m.expr for m in softcap.score_mods] == ["30.0f * fg::tanh_fast(0.033333335f * s)"]
    assert not softcap.score_mods[0].uses_positions
    relu = _plan("relu")
    assert relu.norm.p_expr == "(s > 0.0f ? s : 0.0f) * tl_c0" and relu.prologue[0].expr == "1.0f / (float)seqlen_k"
    sigmoid = _plan("sigmoid")
    assert sigmoid.norm.p_expr == "1.0f / (1.0f + expf(-(s - tl_c0)))"
    # both are 0 at a masked score's -inf: the sm90 path applies them after the mask (Normalization.zero_at_masked);
    # a p that is not keeps p = 0 for invisible keys inside the mask's loop
    assert relu.norm.zero_at_masked and sigmoid.norm.zero_at_masked
    shifted = lower(parse(_edit("relu", {"relu(S_r) / M, 0)": "(relu(S_r) + 1) / M, 0)"})), "sm_80")[0]
    assert shifted.norm.p_expr == "(s > 0.0f ? s : 0.0f) * tl_c0 + tl_c0" and not shifted.norm.zero_at_masked
    assert sigmoid.prologue[0].expr == "logf((float)seqlen_k)"
    split = _plan("decode_splitkv")
    assert split.variant.split_kv and split.block_m == 16 and split.warps == 1


def test_explicit_softmax_steps_lower_like_the_composite():
    for name in ("causal", "softcap"):
        variant = library.PROGRAMS[name]
        composite = lower(parse(library.render(variant)), "sm_80")[0]
        plan, notes = lower(parse(library.render(variant, explicit_softmax=True)), "sm_80")
        assert ([m.expr for m in plan.score_mods], plan.visible, plan.mask_tile, plan.norm, plan.prologue) == \
            ([m.expr for m in composite.score_mods], composite.visible, composite.mask_tile, composite.norm,
             composite.prologue)
        assert any("explicit softmax" in n for n in notes)


def test_explicit_softmax_with_natural_exp_is_recognised():
    text = library.render(library.PROGRAMS["plain"], explicit_softmax=True)
    text = text.replace(SCALE_LINE, "Compute S_r = S_r * scale").replace("exp2(", "exp(")
    text = text.replace("(m_i + log2(l_i)) * ln2", "m_i + log(l_i)")
    plan, notes = lower(parse(text), "sm_80")
    assert plan.score_mods == [] and any("(exp)" in n for n in notes)


def test_custom_mask_and_score_mod_translate_from_the_tl():
    text = _edit("plain", {TAIL_MASK: "Compute S_r = where(k_idx < 40 or k_idx <= q_idx + M - N, S_r, -inf)\n"
                                      "Compute S_r = S_r + log2e * where(q_idx + M - N - k_idx < 8, 0.5, -0.5)"})
    plan, _ = lower(parse(text), "sm_80")
    assert plan.visible == "kpos < 40 || kpos <= qpos + diag"
    # a disjunction fails only where both parts may fail
    assert plan.mask_tile == ("(n_block * BLOCK_N + BLOCK_N > 40) && "
                              "(n_block * BLOCK_N + BLOCK_N - m_block * BLOCK_M - diag > 1)")
    (mod,) = plan.score_mods
    assert mod.expr == "s + (qpos + diag - kpos < 8 ? 0.5f : -0.5f)" and mod.uses_positions
    assert "TL line" in mod.name


def test_softmax_in_other_units_is_kept_faithfully():
    # scores scaled but never put in log2 units: the TL's exp2-softmax is a softmax of s * ln2... exactly
    plan, notes = lower(parse(_edit("plain", {SCALE_LINE: "Compute S_r = S_r * scale"})), "sm_80")
    assert len(plan.score_mods) == 1 and plan.score_mods[0].expr.startswith("s * 0.6931")
    assert any("score mod" in n for n in notes)


def test_params_and_names():
    text = library.load("causal").replace("STAGES = 2", "STAGES = 1")
    plan, notes = lower(parse(text), "a100", name="my_kernel")
    assert plan.name == "my_kernel" and plan.stages == 1 and not any("STAGES" in n for n in notes)
    m = manifest_for(parse(text), "a100", name="my_kernel")
    assert [x.kernel for x in m.launches] == ["my_kernel"] and m.params["BLOCK_M"] == 64


UNSUPPORTED = [
    ("atan", {TAIL_MASK: "Compute S_r = atan(S_r)"}, "atan(S_r)",
     r"^line \d+: Compute with 'atan' is not supported by the sm_80 translator \(supported: where, "),
    ("before scale", {SCALE_LINE: "Compute S_r = tanh(S_r)\n          " + SCALE_LINE}, "tanh(S_r)",
     "before it is multiplied by scale"),
    ("no scale", {SCALE_LINE: "Compute S_r = S_r * log2e"}, "S_r * log2e", "multiplied by scale 0 times"),
    ("row vector in a score step", {TAIL_MASK: "Compute S_r = S_r - m_i * 0"}, "m_i * 0", "next to OnlineSoftmax"),
    ("get instead of accumulate", {"Compute GEMM P_r, V_s and accumulate O_r": "Compute GEMM P_r, V_s and get O_r"},
     "and get O_r", "and accumulate"),
    ("unguarded division", {"Compute O_r = where(l_i > 0, O_r / l_i, 0)": "Compute O_r = O_r / l_i"},
     "Copy O_r", "is not O / l"),
    ("head dim", {"head_dim 64": "head_dim 84"}, "head_dim 84", "head dim 84 is not supported: head dims are multiples"),
    ("float floor division", {TAIL_MASK: "Compute S_r = S_r // 2"}, "S_r // 2", "integer"),
]


@pytest.mark.parametrize("label,replace,line_needle,message", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_constructs_are_named(label, replace, line_needle, message):
    text = _edit("plain", replace)
    with pytest.raises(UnsupportedConstruct) as info:
        translate(parse(text), "a100")
    msg = str(info.value)
    assert isinstance(info.value, FlashgenError) and "\n" not in msg
    assert re.search(message, msg), msg
    if line_needle is not None:
        assert msg.startswith(f"line {_line_of(text, line_needle)}: "), msg


def test_sketch_is_rejected():
    with pytest.raises(UnsupportedConstruct, match="sketch"):
        translate(parse(library.load("causal", "sketch")), "a100")


def test_unknown_target_is_a_usage_error():
    with pytest.raises(FlashgenError, match="unknown GPU"):
        translate(parse(library.load("plain")), "not-a-gpu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_custom_translation_compiles_for_sm80_without_spills(tmp_path):
    from flashgen.harness.compile import compile_cuda

    text = _edit("window", {"Compute S_r = where(k_idx <= q_idx + M - N and q_idx + M - N - k_idx < window, S_r, -inf)":
                            "Compute S_r = where(k_idx < 40 or k_idx <= q_idx + M - N, S_r, -inf)\n"
                            "Compute S_r = S_r - log2e * 0.125 * abs(q_idx + M - N - k_idx)"})
    tr = translate(parse(text), "a100")
    result = compile_cuda(tr.source, "sm_80", cache_dir=tmp_path)
    assert result.ok, result.feedback_text()
    (usage,) = [u for name, u in result.kernels.items() if name == tr.plan.name]
    assert not usage.spills and usage.stack_frame_bytes == 0, result.feedback_text()


def test_missing_key_bound_is_noted():
    _, notes = lower(parse(_edit("plain", {TAIL_MASK + "\n": ""})), "sm_80")
    assert any("padded keys past M" in n for n in notes)
    _, notes = lower(parse(library.load("plain")), "sm_80")
    assert not any("padded keys" in n for n in notes)
