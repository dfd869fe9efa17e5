"""plan.key_range: a kernel's visibility as one interval of keys per query row, where it is one.

The lowering finds it from the TL's visibility conditions (every one linear in k_idx with coefficient +-1) and the
rule-based plan writes it beside its `visible`; both must mean exactly what `visible` means, which these tests check
by evaluating the C of both over every (query, key) pair of small problems; the sm90 path's row_key_limits switch
renders a masked tile against the per-row limits from it.
"""

from __future__ import annotations

import itertools
import re
import shutil

import pytest

from flashgen.harness.environment import Environment
from flashgen.mods import make_mods, reference_program
from flashgen.tl_spec import parse
from flashgen.translators import translate
from flashgen.translators.params import choose_params
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Variant

LIBRARY = [Variant(), Variant(causal=True), Variant(causal=True, window=256), Variant(causal=True, window=3),
           Variant(window_left=100, window_right=20), Variant(window_left=5), Variant(window_right=7),
           Variant(causal=True, alibi=True)]
# mask functions over positions (on a causal kernel): linear ones have a key range, the others none
LINEAR_MASKS = ["q_idx - k_idx < 300", "k_idx < LEN[b]", "k_idx >= q_idx - 7 and k_idx <= q_idx + 5",
                "not (k_idx > q_idx - 3)", "k_idx + 4 > q_idx"]
OTHER_MASKS = ["DOC[q_idx] == DOC[k_idx]", "k_idx % 2 == 0", "2 * k_idx < q_idx", "k_idx < 5 or k_idx > q_idx - 3"]
TENSORS = {"LEN": "int32[B]:0..M", "DOC": "int32[M]:0..3:sorted"}


@pytest.fixture(scope="module")
def env():
    return Environment()


def lowered_plan(env, variant: Variant, mask_mod: str | None = None):
    target = env.target("h200")
    if mask_mod is None:
        params = dict(choose_params(variant, target.name, DType.bf16, 128))
        tl = env.library_tl(variant, target, DType.bf16, 128, form="full", params=params)
    else:
        tensors = {name: spec for name, spec in TENSORS.items() if re.search(rf"\b{name}\[", mask_mod)}
        tl = reference_program(make_mods(mask_mod=mask_mod, tensors=tensors), variant, target, DType.bf16, 128, env)
    return translate(parse(tl), target).plan


def c_value(expr: str, names: dict) -> int | bool:
    """A plan's C (integer arithmetic, comparisons, &&, ||, !, min, max) evaluated in Python."""
    python = expr.replace("&&", " and ").replace("||", " or ")
    python = re.sub(r"!(?!=)", " not ", python)
    return eval(python, {"__builtins__": {}, "min": min, "max": max}, names)  # noqa: S307 - the plan's own C


def assert_range_means_visible(plan, diag: int, prologue: dict | None = None):
    names = {"diag": diag, **(prologue or {})}
    lo, hi = plan.key_range.lo, plan.key_range.hi
    for qpos, kpos in itertools.product(range(0, 40), range(0, 60)):
        row = {**names, "qpos": qpos, "kpos": kpos}
        visible = plan.visible is None or bool(c_value(plan.visible, row))
        in_range = (lo is None or kpos >= c_value(lo, row)) and (hi is None or kpos < c_value(hi, row))
        assert visible == in_range, (plan.visible, plan.key_range, qpos, kpos, diag)


@pytest.mark.parametrize("variant", LIBRARY, ids=lambda v: v.name)
def test_the_library_variants_key_range_means_their_visibility_in_both_plans(env, variant):
    lowered = lowered_plan(env, variant)
    ruled = plan_for_variant(variant, "h200", DType.bf16, 128)
    assert lowered.key_range == ruled.key_range
    if lowered.visible is None:
        assert lowered.key_range is None  # all keys visible: nothing to mask against
        return
    assert lowered.key_range is not None and (lowered.key_range.lo or lowered.key_range.hi)
    for diag in (0, 3, 17):
        assert_range_means_visible(lowered, diag)


@pytest.mark.parametrize("mask_mod", LINEAR_MASKS)
def test_a_linear_mask_function_gets_a_key_range_that_means_it(env, mask_mod):
    plan = lowered_plan(env, Variant(causal=True), mask_mod)
    assert plan.key_range is not None, plan.visible
    constants = {c.name: 23 for c in plan.prologue if c.ctype == "int"}  # LEN[b], hoisted as a per-block constant
    for diag in (0, 9):
        assert_range_means_visible(plan, diag, constants)


@pytest.mark.parametrize("mask_mod", OTHER_MASKS)
def test_a_mask_not_one_interval_of_keys_per_row_has_no_key_range(env, mask_mod):
    plan = lowered_plan(env, Variant(causal=True), mask_mod)
    assert plan.key_range is None and plan.visible


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not on PATH")
def test_row_key_limits_masks_against_the_rows_limits_and_compiles(env):
    """Under the sm90 switch (on by default) a causal kernel compares each score's column offset with its row's
    limit (a window's with two), no longer evaluating `visible` per score; a kernel without a key range renders as
    without the switch, and so does one with two shared key terms; the causal and window kernels compile for sm_90a
    without spills."""
    from flashgen.harness.compile import compile_cuda
    from flashgen.translators.backends.sm90 import kernel
    from flashgen.translators.render import render

    keywords = {"score_mod": "s * cos(k_idx + h) + exp(-k_idx / M)", "mask_mod": "k_idx < LEN[b]",
                "tensors": {"LEN": "int32[B]:0..M"}}
    causal, window, plain = (plan_for_variant(v, "h200", DType.bf16, 128)
                             for v in (Variant(causal=True), Variant(causal=True, window=256), Variant()))
    (causal_src, _), (window_src, _), (plain_src, _) = render(causal), render(window), render(plain)  # the default
    with kernel.schedule_overrides(row_key_limits=False):
        (causal_without, _), (plain_without, _) = render(causal), render(plain)
    assert plain_without == plain_src
    assert "(kpos <= qpos + diag)" in causal_without and "key_hi0" not in causal_without
    assert "visible = (i >> 2) * 8 + (i & 1) < ((i & 2) ? key_hi1 : key_hi0);" in causal_src
    assert "const int key_hi0 = min(seqlen_k, (q_row0 + row0) + diag + 1) - k_row0 - 2 * t;" in causal_src
    assert "const int key_hi1 = min(seqlen_k, (q_row0 + row0 + 8) + diag + 1) - k_row0 - 2 * t;" in causal_src
    assert "key_lo0" not in causal_src and "(kpos <= qpos + diag)" not in causal_src
    assert " && (i >> 2) * 8 + (i & 1) >= ((i & 2) ? key_lo1 : key_lo0);" in window_src
    assert "const int key_lo1 = ((q_row0 + row0 + 8) + diag - 255) - k_row0 - 2 * t;" in window_src
    # not beside two shared key terms, where ptxas spills more with the limits
    from flashgen.harness.suite import build_mask_kernel

    two_terms, _ = build_mask_kernel("h200", "bf16", Variant(causal=True), 128, keywords)
    assert "kt1" in two_terms and "key_hi0" not in two_terms and "kpos <= qpos + diag);" in two_terms
    for name, source in (("row_key_limits_causal.cu", causal_src), ("row_key_limits_window.cu", window_src)):
        built = compile_cuda(source, "sm_90a", filename=name)
        assert built.ok and built.kernels, built.feedback_text()
        assert all(u.spill_store_bytes == 0 and u.spill_load_bytes == 0 for u in built.kernels.values()), \
            built.feedback_text()


@pytest.mark.parametrize("mask_mod, rises", [(None, True), ("k_idx < LEN[b]", True),
                                             ("k_idx >= q_idx - 7 and k_idx <= q_idx + 5", True),
                                             ("q_idx - k_idx < 300", True),  # a lower bound; hi is causal's
                                             ("k_idx < 100 - q_idx", False), ("k_idx + q_idx < 90", False)])
def test_hi_rises_says_whether_a_later_row_never_has_a_lower_limit(env, mask_mod, rises):
    """key_range.hi_rises (what the sm90 half_first_tile switch relies on: a warpgroup's last row has its largest
    limit) where every upper bound grows with q_idx; checked against the limit's C over rows."""
    plan = lowered_plan(env, Variant(causal=True), mask_mod)
    assert plan.key_range is not None and plan.key_range.hi_rises is rises, plan.key_range
    constants = {c.name: 23 for c in plan.prologue if c.ctype == "int"}
    for diag in (0, 9):
        limits = [c_value(plan.key_range.hi, {"diag": diag, "qpos": q, **constants}) for q in range(0, 120)]
        assert (limits == sorted(limits)) is rises, limits


@pytest.mark.parametrize("variant", [v for v in LIBRARY if v.causal or v.window_right is not None], ids=lambda v: v.name)
def test_the_library_variants_with_an_upper_limit_rise(variant):
    assert plan_for_variant(variant, "h200", DType.bf16, 128).key_range.hi_rises
