"""The fp64 reference every check compares against: the interpreter's, the harness's, the agent's.

It implements the conventions in flashgen.variant literally, one dense (N, M) score matrix per head,
so it is slow but obviously right. Split-KV decode computes the same function as the plain variant.
"""

from __future__ import annotations

import numpy as np

from flashgen.variant import Norm, Variant, alibi_slope, default_scale


def visible_mask(n: int, m: int, variant: Variant) -> np.ndarray:
    """Boolean (N, M): which keys each query row may see."""
    qpos = np.arange(n)[:, None] + (m - n)
    kpos = np.arange(m)[None, :]
    visible = np.ones((n, m), dtype=bool)
    if variant.causal:
        visible &= kpos <= qpos
    if variant.window is not None:
        visible &= (qpos - kpos) < variant.window
    if variant.window_left is not None:  # FlashAttention's window_size=(left, right), not causal
        visible &= kpos >= qpos - variant.window_left
    if variant.window_right is not None:
        visible &= kpos <= qpos + variant.window_right
    return visible


def alibi_table(batch: int, heads: int, alibi_slopes: np.ndarray | None = None) -> np.ndarray:
    """The (B, H) float64 ALiBi slopes a call runs with: the caller's (FlashAttention's alibi_slopes, (H) or (B, H);
    fp32 values as given) or, for None, the standard 2^(-8 (h + 1) / H) of every batch."""
    if alibi_slopes is None:
        return np.tile(np.array([alibi_slope(h, heads) for h in range(heads)], dtype=np.float64), (batch, 1))
    slopes = np.asarray(alibi_slopes, dtype=np.float64)
    if slopes.shape not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes has shape {slopes.shape}, expected ({heads},) or ({batch}, {heads})")
    return np.broadcast_to(slopes, (batch, heads)).copy()


def scores(q: np.ndarray, k: np.ndarray, variant: Variant, head: int, heads: int, scale: float,
           slope: float | None = None) -> np.ndarray:
    """Scores of one head before masking: q (N, D), k (M, D) -> (N, M) float64. `slope`: this head's ALiBi slope
    (None: the standard one)."""
    s = scale * (q.astype(np.float64) @ k.astype(np.float64).T)
    if variant.softcap is not None:
        s = variant.softcap * np.tanh(s / variant.softcap)
    if variant.alibi:
        n, m = s.shape
        dist = np.abs(np.arange(n)[:, None] + (m - n) - np.arange(m)[None, :])
        s = s - (alibi_slope(head, heads) if slope is None else slope) * dist
    return s


def attend(s: np.ndarray, visible: np.ndarray, v: np.ndarray, norm: Norm) -> tuple[np.ndarray, np.ndarray | None]:
    """One head's normalisation over its visible keys: final scores s (N, M), visible (N, M), V (M, Dv) ->
    O (N, Dv) float64 and, for softmax, LSE (N) (natural log, -inf for a row that sees no key; O = 0 there)."""
    m = s.shape[1]
    vv = v.astype(np.float64)
    if norm is Norm.softmax:
        s = np.where(visible, s, -np.inf)
        row_max = s.max(axis=1, keepdims=True)
        safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
        p = np.exp(s - safe_max)
        row_sum = p.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(row_sum > 0, (p @ vv) / np.where(row_sum > 0, row_sum, 1.0), 0.0)
            lse = np.where(row_sum[:, 0] > 0, np.log(row_sum[:, 0]) + safe_max[:, 0], -np.inf)
        return out, lse
    if norm is Norm.relu:
        return np.where(visible, np.maximum(s, 0.0), 0.0) / m @ vv, None
    return np.where(visible, 1.0 / (1.0 + np.exp(-(s - np.log(m)))), 0.0) @ vv, None


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, variant: Variant, scale: float | None = None,
    alibi_slopes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """q (B, H, N, D), k (B, KVH, M, D) and v (B, KVH, M, Dv) -> (O (B, H, N, Dv) float64, LSE (B, H, N) or None);
    Dv is D but where V has a head dim of its own (DeepSeek-style: D = 192, Dv = 128).

    LSE is returned for softmax (natural log, -inf for rows that see no key), None otherwise. `alibi_slopes`: the
    caller's ALiBi slopes, (H) or (B, H) (None: the standard ones; ignored by a variant without ALiBi).
    """
    b, h, n, d = q.shape
    kvh, m = k.shape[1], k.shape[2]
    if h % kvh:
        raise ValueError(f"H={h} is not a multiple of KVH={kvh}")
    group = h // kvh
    scale = default_scale(d) if scale is None else scale
    visible = visible_mask(n, m, variant)
    out = np.zeros((b, h, n, v.shape[-1]), dtype=np.float64)
    lse = np.full((b, h, n), -np.inf) if variant.norm is Norm.softmax else None
    slopes = alibi_table(b, h, alibi_slopes) if variant.alibi else None
    for bi in range(b):
        for hi in range(h):
            s = scores(q[bi, hi], k[bi, hi // group], variant, hi, h, scale,
                       None if slopes is None else float(slopes[bi, hi]))
            out[bi, hi], head_lse = attend(s, visible, v[bi, hi // group], variant.norm)
            if lse is not None:
                lse[bi, hi] = head_lse
    return out, lse


def random_inputs(
    shape, seed: int, scale_mag: float = 1.0, dtype=np.float64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fresh normal inputs (never zeros): q (B, H, N, D), k (B, KVH, M, D), v (B, KVH, M, Dv). scale_mag > 1 makes
    large-magnitude scores."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((shape.B, shape.H, shape.N, shape.D)) * scale_mag
    k = rng.standard_normal((shape.B, shape.kv_heads, shape.M, shape.D)) * scale_mag
    v = rng.standard_normal((shape.B, shape.kv_heads, shape.M, getattr(shape, "dv", shape.D)))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def random_alibi_slopes(batch: int, heads: int, seed: int, per_batch: bool) -> np.ndarray:
    """Caller ALiBi slopes as FlashAttention's tests make them (`torch.rand(B, H) * 0.3`): fp32 (B, H), or (H) when
    not `per_batch`; drawn from their own stream of `seed` (random_inputs' Q, K, V of the same seed are another)."""
    rng = np.random.default_rng([int(seed) % (2 ** 32), 0xA11B1])
    return (rng.random((batch, heads) if per_batch else (heads,)) * 0.3).astype(np.float32)
