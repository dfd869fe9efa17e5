"""What our kernels are timed beside: torch SDPA with each backend pinned, and FlexAttention.

Each baseline is built for one (variant, shape, tensors) and either gives a zero-argument callable
or a reason it is skipped (unsupported variant, dtype or shape; not installed; it raised on a trial
call). All of them follow flashgen.variant's conventions (bottom-right causal alignment for N != M).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from flashgen.variant import Norm, Variant, alibi_slope

FlexMode = Literal["static", "dynamic", "off"]

BASELINE_NAMES = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def sdpa_unsupported(variant: Variant) -> str | None:
    if variant.norm is not Norm.softmax:
        return f"SDPA computes softmax attention only, not {variant.norm.value}"
    if variant.window is not None:
        return "SDPA has no sliding window"
    if variant.two_sided:
        return "SDPA has no two-sided window"
    if variant.alibi:
        return "SDPA's fused backends take no ALiBi bias"
    if variant.softcap is not None:
        return "SDPA has no softcap"
    return None


def make_baselines(variant: Variant, q, k, v, scale: float, flex: FlexMode = "static", alibi_slopes=None
                   ) -> list[tuple[str, Callable[[], Any] | None, str | None]]:
    """[(name, callable or None, skip reason or None)] for torch tensors q (B,H,N,D), k, v (B,KVH,M,D).
    `flex`: FlexAttention compiled per shape ("static"), once per (dtype, D, mask) ("dynamic"), or "off".
    `alibi_slopes`: an ALiBi variant's slopes, a torch fp32 (H) or (B, H) tensor, as our kernel is timed with (None:
    the standard ones)."""
    try:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as exc:
        return [(name, None, f"torch not available ({_first_line(exc)})") for name in BASELINE_NAMES]
    n, m = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    out: list[tuple[str, Callable[[], Any] | None, str | None]] = []
    reason = sdpa_unsupported(variant)
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    for name, backend in backends.items():
        if reason:
            out.append((name, None, reason))
            continue
        kwargs: dict[str, Any] = {"scale": scale}
        if gqa:
            kwargs["enable_gqa"] = True
        if variant.causal and n == m:
            kwargs["is_causal"] = True
        elif variant.causal:
            try:
                from torch.nn.attention.bias import causal_lower_right

                kwargs["attn_mask"] = causal_lower_right(n, m)
            except Exception as exc:
                out.append((name, None, f"no bottom-right causal mask in this torch ({_first_line(exc)})"))
                continue

        def call(backend=backend, kwargs=kwargs):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        out.append(_trial(name, call))
    out.append(_flex(variant, q, k, v, scale, gqa, flex, alibi_slopes))
    return out


def _trial(name: str, call: Callable[[], Any]) -> tuple[str, Callable[[], Any] | None, str | None]:
    try:
        call()
        import torch

        torch.cuda.synchronize()
        return name, call, None
    except Exception as exc:
        return name, None, f"unsupported here: {_first_line(exc)}"


_compiled_flex: dict[bool, Any] = {}


def compiled_flex(dynamic: bool):
    """flex_attention under torch.compile, one compiled function per process and mode."""
    if dynamic not in _compiled_flex:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        # Every shape (static) or every (dtype, D, mask) (dynamic) adds a graph of the same function; past
        # dynamo's recompile limit (8 by default) flex silently runs eagerly, far slower than FlexAttention is.
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(int(getattr(cfg, name)), 512))
        _compiled_flex[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return _compiled_flex[dynamic]


def _flex(variant: Variant, q, k, v, scale: float, gqa: bool, mode: FlexMode = "static", alibi_slopes=None):
    if mode == "off":
        return "flex", None, "FlexAttention off for this run (--no-flex)"
    if variant.norm is not Norm.softmax:
        return "flex", None, f"FlexAttention normalizes with softmax; {variant.norm.value} is not expressible"
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask

        flex_fn = compiled_flex(dynamic=(mode == "dynamic"))
    except Exception as exc:
        return "flex", None, f"FlexAttention not available ({_first_line(exc)})"
    b, h, n, _ = q.shape
    m = k.shape[2]
    offset = m - n
    block_mask = None
    if variant.causal:
        window = variant.window

        def mask_mod(b_, h_, q_idx, kv_idx):
            visible = kv_idx <= q_idx + offset
            if window is not None:
                visible = visible & (q_idx + offset - kv_idx < window)
            return visible

        try:
            block_mask = create_block_mask(mask_mod, None, None, n, m, device=q.device)
        except Exception as exc:
            return "flex", None, f"create_block_mask failed: {_first_line(exc)}"
    elif variant.two_sided:  # FlashAttention's window size (left, right): its keys i + M - N - left .. + right
        left, right = variant.window_left, variant.window_right

        def mask_mod(b_, h_, q_idx, kv_idx):
            visible = kv_idx >= 0
            if left is not None:
                visible = visible & (q_idx + offset - kv_idx <= left)
            if right is not None:
                visible = visible & (kv_idx <= q_idx + offset + right)
            return visible

        try:
            block_mask = create_block_mask(mask_mod, None, None, n, m, device=q.device)
        except Exception as exc:
            return "flex", None, f"create_block_mask failed: {_first_line(exc)}"
    score_mod = None
    if variant.softcap is not None or variant.alibi:
        cap = variant.softcap
        if alibi_slopes is None:  # the standard slopes, per (batch, head) as a caller's (B, H) would be
            slopes = torch.tensor([alibi_slope(i, h) for i in range(h)], device=q.device, dtype=torch.float32)
        else:
            slopes = alibi_slopes.to(device=q.device, dtype=torch.float32)
        slopes = (slopes if slopes.dim() == 2 else slopes[None]).expand(b, h)

        def score_mod(score, b_, h_, q_idx, kv_idx):
            if cap is not None:
                score = cap * torch.tanh(score / cap)
            if variant.alibi:
                score = score - slopes[b_, h_] * torch.abs(q_idx + offset - kv_idx)
            return score

    def call():
        return flex_fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                              return_lse=variant.return_lse)

    return _trial("flex", call)
