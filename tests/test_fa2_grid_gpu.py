"""FlashAttention-2's forward test grid (its tests/test_flash_attn.py, test_flash_attn_output), ported as GPU tests
on every backend, with FlashAttention's own tolerance rule:

    max |out - ref| <= 2 * max |out_pt - ref| + 1e-5

`ref` the attention in fp64 (FlashAttention upcasts to fp32), `out_pt` the same attention computed in the kernel's
dtype by PyTorch (matmuls and softmax in fp16 / bf16, as FlashAttention's reference without upcast). Both are written
here from FlashAttention's definitions (window_size, softcap, ALiBi slopes), not from flashgen's reference.

The grid: FlashAttention's head dims that are multiples of 8 (32 ... 256; its 59 and 111 are rejected by flashgen
with one line, tests/test_head_dims.py: FlashAttention pads those by copying), its (seqlen_q, seqlen_k) pairs, batch
4 and 9 query heads (MQA: 1 kv head, GQA: 3), causal, local windows both ways (non-causal (left, right) and causal
(left, 0)), softcap 50, ALiBi with the caller's own (B, H) slopes (FlashAttention's torch.rand(B, H) * 0.3),
fp16 and bf16, on the three code paths an H200 runs: sm90 (the h200 target), sm80 (a100), sm75 (t4). Dropout, the
KV-packed and deterministic flags are FlashAttention's own interface and have no counterpart here. Each kernel runs
on three of the seqlen pairs, taken in turn over the grid so that every pair runs on every backend; inputs are
fresh random each run and the output is poisoned (NaN) before the launch."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from flashgen.variant import DType, Variant, make_variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

BACKENDS = {"sm90": "h200", "sm80": "a100", "sm75": "t4"}  # the code path -> the target whose kernels take it
HEAD_DIMS = (32, 40, 64, 80, 96, 128, 160, 192, 224, 256)
SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024),
           (1024, 1023), (2048, 2048)]
BATCH, HEADS = 4, 9
SOFTCAP = 50.0
LOCAL = (64, 32)  # window_size=(left, right), not causal
CAUSAL_LOCAL = (63, 0)  # causal with a window: FlashAttention's (W - 1, 0)
VARIANTS: dict[str, tuple[Variant, int]] = {  # name -> (variant, kv heads)
    "mha": (Variant(), HEADS),
    "causal": (Variant(causal=True), HEADS),
    "local": (make_variant(window_size=LOCAL), HEADS),
    "causal_local": (make_variant(causal=True, window_size=CAUSAL_LOCAL), HEADS),
    "softcap": (Variant(softcap=SOFTCAP), HEADS),
    "alibi": (Variant(alibi=True), HEADS),
    "mqa": (Variant(kv_group=HEADS), 1),
    "gqa_causal": (Variant(kv_group=3, causal=True), 3),
}
# fp16 runs plain and causal at every head dim and the rest at four of them (bf16: everything everywhere)
FP16_DIMS = (40, 80, 160, 256)
MATRIX = [(path, dtype, name, d) for path in BACKENDS for dtype in (DType.bf16, DType.fp16) for name in VARIANTS
          for d in HEAD_DIMS if dtype is DType.bf16 or name in ("mha", "causal") or d in FP16_DIMS]


def gpu_kernels(items, arch):
    """The selected tests' kernels, built the way `flashgen generate` builds them (tests/gpu_kernels.py: built and
    compiled once, before the tests run)."""
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    keys = {tuple(item.callspec.params[k] for k in ("path", "dtype", "name", "head_dim")) for item in items}
    return {key: Build(build_expert_kernel, (BACKENDS[key[0]], key[1].value, VARIANTS[key[2]][0], key[3]))
            for key in keys}


def seqlen_pairs(index: int) -> list[tuple[int, int]]:
    """Three of FlashAttention's pairs for the kernel at `index` of the grid, in turn."""
    return [SEQLENS[(3 * index + i) % len(SEQLENS)] for i in range(3)]


def visible(n: int, m: int, variant: Variant, device):
    """FlashAttention's masks, from its words: query i stands at key position i + M - N; causal hides keys after
    it; window_size=(left, right) shows keys [pos - left, pos + right] (-1: unbounded)."""
    import torch

    pos = torch.arange(n, device=device)[:, None] + (m - n)
    j = torch.arange(m, device=device)[None, :]
    left, right = variant.window_size if (variant.window is not None or variant.two_sided) else (-1, -1)
    if variant.causal:
        right = 0
    keep = torch.ones(n, m, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= pos - left
    if right >= 0:
        keep &= j <= pos + right
    return keep


def attention(q, k, v, variant: Variant, slopes, scale: float):
    """FlashAttention's reference forward in q's own dtype (fp64 in: the reference; fp16/bf16 in: out_pt): scores,
    softcap (s / cap, tanh, * cap), the ALiBi bias -slope * |i + M - N - j|, the masks, softmax, P V; rows that see
    no key are 0. q (B, H, N, D), k and v (B, KVH, M, D)."""
    import torch

    b, h, n, _ = q.shape
    m, group = k.shape[2], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("bhnd,bhmd->bhnm", q * scale, k)
    if variant.softcap is not None:
        s = torch.tanh(s / variant.softcap) * variant.softcap
    if variant.alibi:
        pos = torch.arange(n, device=q.device)[:, None] + (m - n)
        dist = (pos - torch.arange(m, device=q.device)[None, :]).abs().to(s.dtype)
        s = s - slopes.to(s.dtype)[:, :, None, None] * dist
    keep = visible(n, m, variant, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    return torch.einsum("bhnm,bhmd->bhnd", p.to(v.dtype), v)


@pytest.mark.parametrize("path, dtype, name, head_dim", MATRIX,
                         ids=[f"{p}-{t.value}-{n}-d{d}" for p, t, n, d in MATRIX])
def test_fa2_forward_grid(prebuilt_kernels, path, dtype, name, head_dim):
    import torch

    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.device import device_arch, launch

    source, manifest = prebuilt_kernels[(path, dtype, name, head_dim)]  # fails with the build or compiler error
    assert manifest.head_dim == head_dim and manifest.variant == VARIANTS[name][0]
    built = compile_cuda(source, device_arch())
    assert built.ok, built.feedback_text(800)
    variant, kv_heads = VARIANTS[name]
    dt = {DType.fp16: torch.float16, DType.bf16: torch.bfloat16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(time.time_ns() % (1 << 31))
    scale = 1.0 / math.sqrt(head_dim)
    failures = []
    for n, m in seqlen_pairs(MATRIX.index((path, dtype, name, head_dim))):
        q = torch.randn(BATCH, HEADS, n, head_dim, device="cuda", dtype=dt, generator=gen)
        k, v = (torch.randn(BATCH, kv_heads, m, head_dim, device="cuda", dtype=dt, generator=gen) for _ in range(2))
        slopes = torch.rand(BATCH, HEADS, device="cuda", generator=gen) * 0.3 if variant.alibi else None
        o = torch.full_like(q, float("nan"))
        launch(manifest, built.cubin_path, q, k, v, o, scale=scale, alibi_slopes=slopes)
        torch.cuda.synchronize()
        ref = attention(q.double(), k.double(), v.double(), variant, None if slopes is None else slopes.double(),
                        scale)
        out_pt = attention(q, k, v, variant, slopes, scale)
        err = (o.double() - ref).abs().max().item()  # NaN (an unwritten element) fails the comparison below
        bar = 2 * (out_pt.double() - ref).abs().max().item() + 1e-5
        if not err <= bar:
            failures.append(f"N={n} M={m}: max|out - ref| {err:.3g} > 2 max|out_pt - ref| + 1e-5 = {bar:.3g}")
    assert not failures, f"{manifest.name}: " + "; ".join(failures)
