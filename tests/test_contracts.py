import numpy as np
import pytest

from flashgen.abi import eval_size
from flashgen.reference import attention, random_inputs
from flashgen.variant import Shape, Variant


def test_shape_parse_and_errors():
    s = Shape.parse("B=2,H=4,N=200,M=333,D=64,KVH=2")
    assert (s.B, s.H, s.N, s.M, s.D, s.kv_heads) == (2, 4, 200, 333, 64, 2)
    for bad in ("B=2,H=x", "B=2,Q=3,H=1,N=1,M=1,D=1", "B=1,H=3,KVH=2,N=1,M=1,D=1"):
        with pytest.raises(ValueError):
            Shape.parse(bad)


def test_eval_size():
    assert eval_size("cdiv(N, 128)", {"N": 257}) == 3
    assert eval_size("B * H * (M - 1) % 5", {"B": 2, "H": 3, "M": 4}) == 3
    for bad in ("__import__('os')", "N ** 2", "X + 1"):
        with pytest.raises(ValueError):
            eval_size(bad, {"N": 1})


def test_reference_softmax_matches_direct_formula():
    shape = Shape(B=1, H=2, N=5, M=7, D=4)
    q, k, v = random_inputs(shape, seed=3)
    o, lse = attention(q, k, v, Variant(causal=True))
    s = q[0, 1] @ k[0, 1].T / 2.0
    row = 4  # sits at key position 6: sees keys 0..6
    p = np.exp(s[row] - s[row].max())
    assert np.allclose(o[0, 1, row], p @ v[0, 1] / p.sum())
    assert np.isclose(lse[0, 1, row], np.log(np.exp(s[row]).sum()))
    # row 0 sits at position 2 and must not see keys 3..6
    p0 = np.exp(s[0, :3] - s[0, :3].max())
    assert np.allclose(o[0, 1, 0], p0 @ v[0, 1, :3] / p0.sum())


def test_reference_empty_rows_are_zero_with_minus_inf_lse():
    shape = Shape(B=1, H=1, N=6, M=3, D=4)
    q, k, v = random_inputs(shape, seed=4)
    o, lse = attention(q, k, v, Variant(causal=True))
    # rows 0..2 sit at positions -3..-1: no key is visible
    assert np.all(o[0, 0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
    assert np.all(np.isfinite(lse[0, 0, 3:]))
