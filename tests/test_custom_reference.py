"""A kernel translated from a TL program that a Variant cannot describe is verified against the TL."""

import numpy as np

from flashgen.harness.verify import reference_outputs
from flashgen.reference import attention, random_inputs
from flashgen.tl_spec import interpret, library, parse
from flashgen.translators import translate
from flashgen.variant import Shape

PREFIX_LM = "Compute S_r = where(k_idx < M and (k_idx < 40 or k_idx <= q_idx + M - N), S_r, -inf)"


def _prefix_lm_program():
    text = library.load("plain")
    tail_mask = "Compute S_r = where(k_idx < M, S_r, -inf)"
    assert tail_mask in text
    return parse(text.replace(tail_mask, PREFIX_LM, 1))


def test_library_programs_keep_the_variant_reference():
    translation = translate(parse(library.load("causal")), "a100")
    assert translation.manifest.reference_tl is None


def test_custom_mask_carries_its_tl_as_the_reference():
    program = _prefix_lm_program()
    manifest = translate(program, "a100").manifest
    assert manifest.reference_tl is not None and "k_idx < 40" in manifest.reference_tl

    shape = Shape(B=1, H=2, N=70, M=90, D=program.target.head_dim)
    q, k, v = random_inputs(shape, seed=11)
    o_ref, _ = reference_outputs(manifest, q, k, v)
    o_tl = interpret(program, shape, inputs={"Q": q, "K": k, "V": v}).outputs["O"]
    assert np.array_equal(o_ref, o_tl)
    # and it is not the declared (plain) variant's function: row 0 (position 20) must not see keys 40..89
    o_plain, _ = attention(q, k, v, manifest.variant)
    assert np.abs(o_ref - o_plain).max() > 1e-3
