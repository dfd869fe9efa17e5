import numpy as np

from flashgen.abi import KernelManifest, Launch
from flashgen.harness.verify import (
    POISON_BITS,
    QUICK_CASES,
    TOLERANCES,
    compare_outputs,
    default_cases,
    from_dtype_bits,
    quick_cases,
    to_dtype_bits,
)
from flashgen.reference import attention, random_inputs
from flashgen.targets import TARGETS
from flashgen.variant import DType, Shape, Variant


def _ref(shape, variant, seed=0):
    q, k, v = random_inputs(shape, seed)
    return attention(q, k, v, variant)


def test_exact_output_passes_and_fp16_rounding_is_within_tolerance():
    shape = Shape(B=2, H=2, N=40, M=70, D=16)
    variant = Variant(causal=True, return_lse=True)
    o, lse = _ref(shape, variant)
    assert compare_outputs(o, o, DType.fp16, variant, shape.M, lse=lse, lse_ref=lse).ok
    rounded = from_dtype_bits(to_dtype_bits(o, DType.fp16), DType.fp16)
    check = compare_outputs(rounded, o, DType.fp16, variant, shape.M, lse=lse, lse_ref=lse)
    assert check.ok and 0 < check.rel_err < TOLERANCES[DType.fp16].rel


def test_a_wrong_tile_is_located():
    shape = Shape(B=1, H=3, N=100, M=100, D=32)
    variant = Variant()
    o, _ = _ref(shape, variant)
    bad = o.copy()
    bad[0, 2, 32:48, 8:16] += 1.0  # row tile 2 of BLOCK_M=16, head (0, 2)
    check = compare_outputs(bad, o, DType.bf16, variant, shape.M, block_m=16)
    assert not check.ok and check.bad_elements == 16 * 8
    assert "heads (b,h) (0,2) of 3" in check.detail
    assert "rows 32-47" in check.detail and "columns 8-15" in check.detail
    assert "row tile 2 (BLOCK_M=16" in check.detail
    assert check.max_err_at[:2] == [0, 2] and 32 <= check.max_err_at[2] < 48


def test_unwritten_and_computed_nan_are_told_apart():
    shape = Shape(B=1, H=1, N=50, M=50, D=8)
    variant = Variant()
    o, _ = _ref(shape, variant)
    got = o.copy()
    unwritten = np.zeros(o.shape, bool)
    unwritten[0, 0, 48:, :] = True  # the tail rows were never written
    got[unwritten] = np.nan
    got[0, 0, 3, 0] = np.nan  # one NaN the kernel computed
    check = compare_outputs(got, o, DType.fp16, variant, shape.M, o_unwritten=unwritten, block_m=16)
    assert not check.ok and check.unwritten_o == 16 and check.nonfinite_o == 1
    assert "O never written: 16 elements" in check.detail and "rows 48-49" in check.detail


def test_empty_row_convention_is_enforced():
    shape = Shape(B=1, H=1, N=6, M=3, D=4)  # rows 0..2 see no key under causal
    variant = Variant(causal=True, return_lse=True)
    o, lse = _ref(shape, variant)
    assert compare_outputs(o, o, DType.fp32, variant, shape.M, lse=lse, lse_ref=lse).ok
    lse_bad = lse.copy()
    lse_bad[0, 0, 1] = 0.0  # an empty row must give -inf
    check = compare_outputs(o, o, DType.fp32, variant, shape.M, lse=lse_bad, lse_ref=lse)
    assert not check.ok and check.empty_rows_wrong == 1 and check.bad_lse == 1


def test_inputs_modified_fail_even_with_right_output():
    shape = Shape(B=1, H=1, N=8, M=8, D=8)
    o, _ = _ref(shape, Variant())
    check = compare_outputs(o, o, DType.fp16, Variant(), shape.M, inputs_modified={"q": 5, "k": 0})
    assert not check.ok and "q (5 elements)" in check.detail and "k (" not in check.detail


def test_bf16_round_trip_and_poison_patterns():
    x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0])
    bits = to_dtype_bits(x, DType.bf16)
    assert bits.dtype == np.uint16
    back = from_dtype_bits(bits, DType.bf16)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2 ** -8)
    for dtype, poison in POISON_BITS.items():  # the poison is a NaN, and not the canonical one
        value = from_dtype_bits(np.array([poison]), dtype) if dtype is DType.bf16 else \
            np.array([poison]).view(np.float16 if dtype is DType.fp16 else np.float32)
        assert np.isnan(value).all()
        assert int(poison) not in (0x7E00, 0x7FC0, 0x7FC00000)


def test_default_cases_cover_tails_layouts_gqa_and_magnitude():
    man = KernelManifest(name="x", arch="sm_80", dtype=DType.fp16, head_dim=64,
                         variant=Variant(causal=True, kv_group=4, window=64),
                         launches=[Launch(kernel="k", grid=("1", "1", "1"), threads=128)])
    cases = default_cases(man)
    shapes = [c.shape for c in cases]
    assert any(s.N > s.M for s in shapes) and any(s.N < s.M for s in shapes)
    assert any(s.N % 64 and s.M % 64 for s in shapes)
    assert all(s.H // s.kv_heads == 4 for s in shapes) and any(s.B > 1 for s in shapes)
    assert {c.layout for c in cases} == {"bhnd", "bnhd"}
    assert any(c.magnitude > 1 for c in cases) and any(c.name == "window_edges" for c in cases)


def test_a_persistent_grid_is_verified_over_more_work_tiles_than_ctas():
    """A grid sized by the GPU's SMs (the sm90 path's) gets persistent_walk: at every row block the sm90 path takes
    (64 rows: two CTAs an SM; 128, 192: one), more work tiles than the largest known target runs CTAs, and causal
    rows without keys amid them; a grid of one CTA per tile does not need it."""
    for kv_group in (1, 8):
        variant = Variant(causal=True, kv_group=kv_group)
        launch = Launch(kernel="k", grid=("min(cdiv(N, 128) * H * B, SMS)", "1", "1"), threads=384)
        man = KernelManifest(name="x", arch="sm_90a", dtype=DType.bf16, head_dim=128, variant=variant,
                             launches=[launch])
        assert launch.persistent()
        (walk,) = [c.shape for c in default_cases(man) if c.name == "persistent_walk"]
        sms = max(target.sm_count for target in TARGETS.values())
        assert sms >= 132  # the H100's and H200's
        for block_m, ctas in ((64, 2 * sms), (128, sms), (192, sms)):
            assert walk.B * walk.H * -(-walk.N // block_m) > ctas, (kv_group, block_m)
        assert walk.N - walk.M >= 192 and walk.H % kv_group == 0  # whole causal blocks without a key
        # a benchmark and the tuner verify it too before timing (their shapes all walk several tiles)
        assert [c.name for c in quick_cases(man)] == list(QUICK_CASES)
        one_per_tile = man.model_copy(update=dict(launches=[Launch(kernel="k", grid=("cdiv(N, 128)", "H", "B"),
                                                                   threads=128)]))
        assert not one_per_tile.launches[0].persistent()
        assert "persistent_walk" not in {c.name for c in default_cases(one_per_tile)}


def test_large_magnitude_scores_reach_the_hundreds():
    shape = Shape(B=1, H=1, N=64, M=64, D=64)
    q, k, _ = random_inputs(shape, 1, scale_mag=8.0)
    scores = q[0, 0] @ k[0, 0].T / 8.0
    assert np.abs(scores).max() > 100
