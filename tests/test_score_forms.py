"""The two forms of a score function the templates treat specially (sessions 23-24), found by the lowering in the
score function's normal form, whatever the TL calls it: softcap's `C * g(s * K)` (plan.FactoredScore: g stored, C in
the softmax's multiplier, K in the scale; every path) and ALiBi's `rest + w * |q + offset - k|` (plan.DistanceTerm:
linear on the key tiles wholly on one side of the diagonal; the Hopper path). The GPU tests of every softcap and
ALiBi kernel check the numbers."""

import re

import pytest

from flashgen.harness.environment import Environment
from flashgen.mods import make_mods, reference_program
from flashgen.targets import get_target
from flashgen.tl_spec import library
from flashgen.tl_spec.parser import parse
from flashgen.translators import lower, translate
from flashgen.translators.plan import DistanceTerm, FactoredScore
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Variant


def _mods(score_mod: str, gpu: str = "h200"):
    env = Environment()
    tl = reference_program(make_mods(score_mod=score_mod), Variant(), env.target(gpu), DType.bf16, 128, env)
    return lower(parse(tl), gpu)[0].score_mods


def test_softcap_and_alibi_are_found_in_the_library_programs_as_the_rules_write_them():
    for variant in (Variant(softcap=30.0), Variant(alibi=True)):
        (lowered,) = lower(parse(library.render(variant, dtype="bf16", arch="sm_90")), "h200")[0].score_mods
        (ruled,) = plan_for_variant(variant, get_target("h200"), DType.bf16, 128).score_mods
        assert (lowered.factored is None) == (ruled.factored is None)
        assert (lowered.distance is None) == (ruled.distance is None)
    (softcap,) = lower(parse(library.render(Variant(softcap=50.0), dtype="bf16", arch="sm_90")), "h200")[0].score_mods
    assert (softcap.factored.expr, softcap.factored.out_factor) == ("fg::tanh_fast(s)", 50.0)
    assert softcap.factored.in_factor == pytest.approx(0.02)
    assert softcap.distance is None
    (alibi,) = lower(parse(library.render(Variant(alibi=True), dtype="bf16", arch="sm_90")), "h200")[0].score_mods
    assert alibi.factored is None and alibi.distance is not None
    assert (alibi.distance.rest, alibi.distance.offset) == ("s", "diag")
    assert re.fullmatch(r"-tl_c\d+", alibi.distance.weight)  # the slope, read once a block


@pytest.mark.parametrize("score_mod, distance", [
    ("s - 0.5 * abs(q_idx - k_idx)", DistanceTerm(rest="s", weight="-0.5f", offset="0")),
    ("s + 0.25 * abs(k_idx - q_idx - 3)", DistanceTerm(rest="s", weight="0.25f", offset="3")),
    ("2 * s - 0.5 * abs(q_idx - k_idx)", DistanceTerm(rest="2.0f * s", weight="-0.5f", offset="0")),
    ("s - 0.5 * abs(q_idx - k_idx + M - N)", DistanceTerm(rest="s", weight="-0.5f", offset="diag")),
    ("s - 0.5 * abs(q_idx - k_idx + 0.5)", None),  # not an integer: a tile's side is tested on integers
    ("s - 0.5 * abs(2 * q_idx - k_idx)", None),  # not a distance: q_idx twice
    ("s - 0.5 * abs(q_idx + k_idx)", None),
    ("s - s * abs(q_idx - k_idx)", None),  # its weight reads the score
    ("s - 0.5 * abs(q_idx - k_idx) - 0.25 * abs(q_idx - k_idx - 8)", None),  # two of them
    ("s + 0.25 * cos(k_idx)", None),
])
def test_a_users_distance_term_is_found_or_not(score_mod, distance):
    (mod,) = _mods(score_mod)
    assert mod.distance == distance


@pytest.mark.parametrize("score_mod, factored", [
    ("20 * tanh(s / 20)", FactoredScore(expr="fg::tanh_fast(s)", in_factor=0.05, out_factor=20.0)),
    ("3 * sin(2 * s)", FactoredScore(expr="fg::sin_approx(s)", in_factor=2.0, out_factor=3.0)),
    ("-20 * tanh(s / 20)", None),  # a negative factor does not commute with the max
    ("20 * tanh(s / 20) + 1", None),
    ("s * tanh(s)", None),
    ("20 * tanh(s * s)", None),
    ("20 * tanh(s / 20 + k_idx)", None),
])
def test_a_users_factored_score_is_found_or_not(score_mod, factored):
    (mod,) = _mods(score_mod)
    if factored is None:
        assert mod.factored is None
    else:
        assert mod.factored.expr.split("(")[0] == factored.expr.split("(")[0] and mod.factored.expr.endswith("(s)")
        assert mod.factored.in_factor == pytest.approx(factored.in_factor)
        assert mod.factored.out_factor == factored.out_factor


def _source(variant: Variant, gpu: str) -> str:
    return translate(parse(library.render(variant, dtype="bf16", arch=get_target(gpu).arch)), gpu).source


@pytest.mark.parametrize("gpu, stored", [("h200", "float s = acc_s[i] * score_in;"),
                                         ("a100", "float s = acc_s[mt][nt][c] * score_in;"),
                                         ("t4", "float s = acc_s[mt][nt][c] * score_in;")])
def test_every_path_stores_g_and_multiplies_by_c_in_the_exponent(gpu, stored):
    source = _source(Variant(softcap=30.0), gpu)
    assert stored in source and "const float score_in = p.scale * 3.333333333e-02f;" in source
    (mult,) = re.findall(r"const float mult = RAW_SCORES \? scale_log2 : ([-+.e\d]+)f;", source)
    assert float(mult) == pytest.approx(30.0 * 1.4426950408889634, rel=1e-9)
    assert "30.0f * fg::tanh_fast" not in source  # the factor is in the multiplier alone, not also in the score
    assert "s *= 1.4426950408889634f;" not in source  # nor log2 e: the multiplier holds it
    # the LSE reads the same multiplier: the running max is in g's units
    assert "row_max[" in source and "* mult" in source
    # with ALiBi after it, softcap's factor cannot leave the score: the whole form
    both = _source(Variant(softcap=30.0, alibi=True), gpu)
    assert "score_in" not in both and "30.0f * fg::tanh_fast" in both


def test_the_hopper_path_takes_the_distance_term_linear_on_one_sided_tiles():
    source = _source(Variant(alibi=True), "h200")
    assert "else if (dist_lo < 0 && dist_hi > 0) elementwise(std::false_type{}, std::false_type{});" in source
    assert "const float side_weight = dist_lo >= 0 ? (-tl_c0) : -(-tl_c0);" in source
    assert "(float)abs(" not in source  # no conversion a score on any path
    for variant in (Variant(alibi=True, softcap=30.0), Variant(causal=True, alibi=True)):
        assert "side_weight" in _source(variant, "h200")
    assert "side_weight" not in _source(Variant(alibi=True), "a100")
