"""The TL library: committed files equal the rendering; every program checks and matches the fp64 reference."""

import pytest

from flashgen.tl_spec import check, compare, library, parse
from flashgen.tl_spec.diagnostics import errors_only
from flashgen.variant import Shape, Variant

# N and M are not multiples of the 64-row tiles; N < M and N > M; B, H > 1
MHA_SHAPES = [Shape(B=2, H=2, N=130, M=333, D=64), Shape(B=1, H=2, N=200, M=71, D=64)]
SHAPES = {
    "gqa": [Shape(B=2, H=4, KVH=2, N=130, M=333, D=64), Shape(B=1, H=4, KVH=2, N=100, M=40, D=64)],
    "mqa": [Shape(B=2, H=4, KVH=1, N=70, M=200, D=64)],
    "decode_splitkv": [Shape(B=2, H=2, N=1, M=333, D=64), Shape(B=1, H=2, N=3, M=130, D=64)],
}


@pytest.mark.parametrize("name", library.list_programs())
def test_committed_files_equal_the_rendering(name):
    for form in ("full", "sketch"):
        assert library.load(name, form) == library.render_named(name, form), \
            f"{name}.{form}.tl is stale: run `python -m flashgen.tl_spec.library`"


def _sm90_text(name):
    """The program as rendered for sm_90 bf16: the Hopper dataflow (Role blocks), split-KV in the plain form."""
    variant = library.PROGRAMS[name]
    params = library.default_params(variant) if variant.split_kv else {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8,
                                                                        "STAGES": 2}
    text = library.render(variant, dtype="bf16", arch="sm_90", params=params, name=name)
    assert ("Role producer" in text) == (not variant.split_kv)
    return text


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", library.list_programs())
def test_library_program_checks_and_matches_reference(name, arch):
    text = library.load(name, "full") if arch == "sm_80" else _sm90_text(name)
    program = parse(text, f"{name}.full.tl")
    assert errors_only(check(program)) == []
    assert program.variant == library.PROGRAMS[name]
    for shape in SHAPES.get(name, MHA_SHAPES):
        result = compare(program, shape, seed=7)
        assert result.rel_err < 1e-9, (name, shape, result.rel_err)
        assert result.counts.mma_flops > 0 and result.counts.bytes["global_read"] > 0


@pytest.mark.parametrize("name", library.list_programs())
def test_sketch_parses_and_has_no_header(name):
    program = parse(library.load(name, "sketch"), f"{name}.sketch.tl")
    assert not program.is_full and check(program) == []
    assert any(s.kind == "gemm" for s in program.statements())


def test_explicit_softmax_form_matches_reference():
    text = library.render(Variant(causal=True, return_lse=True), explicit_softmax=True)
    assert "OnlineSoftmax" not in text and "Compute O_r = O_r * alpha" in text
    program = parse(text)
    assert errors_only(check(program)) == []
    assert compare(program, Shape(B=1, H=2, N=100, M=150, D=64), seed=1).rel_err < 1e-9


def test_render_other_params_dtype_head_dim():
    text = library.render(Variant(causal=True, window=32, return_lse=True), dtype="bf16", arch="sm_90",
                          params={"BLOCK_M": 128, "BLOCK_N": 32, "WARPS": 8, "STAGES": 3}, head_dim=128)
    program = parse(text)
    assert program.target.dtype.value == "bf16" and program.params["BLOCK_N"] == 32
    assert errors_only(check(program, "h100")) == []
    assert compare(program, Shape(B=1, H=1, N=150, M=170, D=128), seed=2).rel_err < 1e-9


def test_render_rejects_missing_params():
    from flashgen.errors import UsageError

    with pytest.raises(UsageError, match="BLOCK_N"):
        library.render(Variant(), params={"BLOCK_M": 64})
    with pytest.raises(UsageError, match="no library program"):
        library.load("nonexistent")


def test_counts_skip_masked_tiles_in_causal():
    shape = Shape(B=1, H=1, N=256, M=256, D=64)
    plain = compare(parse(library.load("plain")), shape, 0).counts
    causal = compare(parse(library.load("causal")), shape, 0).counts
    # 4x4 tiles: causal runs 10 of 16 key tiles
    assert causal.mma_flops == pytest.approx(plain.mma_flops * 10 / 16)
    assert plain.mma_flops == 4 * 256 * 256 * 64
