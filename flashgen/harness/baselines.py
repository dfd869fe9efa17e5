"""What our kernels are timed beside: torch SDPA with each backend pinned, and FlexAttention.

Each baseline is built for one (variant, shape, tensors) and either gives a zero-argument callable
or a reason it is skipped (unsupported variant, dtype or shape; not installed; it raised on a trial
call). All of them follow flashgen.variant's conventions (bottom-right causal alignment for N != M).
"""

from __future__ import annotations

from typing import Any, Callable

from flashgen.variant import Norm, Variant, alibi_slope

BASELINE_NAMES = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def sdpa_unsupported(variant: Variant) -> str | None:
    if variant.norm is not Norm.softmax:
        return f"SDPA computes softmax attention only, not {variant.norm.value}"
    if variant.window is not None:
        return "SDPA has no sliding window"
    if variant.alibi:
        return "SDPA's fused backends take no ALiBi bias"
    if variant.softcap is not None:
        return "SDPA has no softcap"
    return None


def make_baselines(variant: Variant, q, k, v, scale: float) -> list[tuple[str, Callable[[], Any] | None, str | None]]:
    """[(name, callable or None, skip reason or None)] for torch tensors q (B,H,N,D), k, v (B,KVH,M,D)."""
    try:
        import torch
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
    out.append(_flex(variant, q, k, v, scale, gqa))
    return out


def _trial(name: str, call: Callable[[], Any]) -> tuple[str, Callable[[], Any] | None, str | None]:
    try:
        call()
        import torch

        torch.cuda.synchronize()
        return name, call, None
    except Exception as exc:
        return name, None, f"unsupported here: {_first_line(exc)}"


_compiled_flex = None


def _flex(variant: Variant, q, k, v, scale: float, gqa: bool):
    if variant.norm is not Norm.softmax:
        return "flex", None, f"FlexAttention normalizes with softmax; {variant.norm.value} is not expressible"
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as exc:
        return "flex", None, f"FlexAttention not available ({_first_line(exc)})"
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
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
    score_mod = None
    if variant.softcap is not None or variant.alibi:
        cap = variant.softcap
        slopes = torch.tensor([alibi_slope(i, h) for i in range(h)], device=q.device, dtype=torch.float32)

        def score_mod(score, b_, h_, q_idx, kv_idx):
            if cap is not None:
                score = cap * torch.tanh(score / cap)
            if variant.alibi:
                score = score - slopes[h_] * torch.abs(q_idx + offset - kv_idx)
            return score

    def call():
        return _compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                              return_lse=variant.return_lse)

    return _trial("flex", call)
