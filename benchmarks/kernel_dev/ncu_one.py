"""Launch one of our kernels (tile parameters given) and torch SDPA's FLASH backend on one shape, a few times
each, for Nsight Compute to profile side by side:

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:'fg_' --section WarpStateStats \
        python benchmarks/kernel_dev/ncu_one.py --config 128x64w4q0s2 --d 128 --n 4096 [--causal] [--flash]
"""

from __future__ import annotations

import argparse
import math


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--flash", action="store_true", help="also run SDPA FLASH on the same tensors")
    args = ap.parse_args()

    import torch

    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.suite import translation_target
    from flashgen.harness.worker import load_kernel, prepare_launch
    from flashgen.translators.search import parse_compact_params, translate_with_params
    from flashgen.variant import DType, Variant

    dtype = DType(args.dtype)
    translation = translate_with_params(Variant(causal=args.causal), translation_target("h200"), dtype, args.d,
                                        parse_compact_params(args.config))
    compiled = compile_cuda(translation.source, "sm_90")
    kernel = load_kernel(compiled.cubin_path, translation.manifest)
    b, h = 16384 // args.n, 2048 // args.d
    tdt = torch.bfloat16 if dtype is DType.bf16 else torch.float16
    q, k, v = (torch.randn(b, h, args.n, args.d, device="cuda", dtype=tdt) for _ in range(3))
    o = torch.empty_like(q)
    run = prepare_launch(translation.manifest, kernel, q, k, v, o, stream=None, step="ncu")
    for _ in range(4):
        run()
    torch.cuda.synchronize()
    if args.flash:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(4):
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal,
                                                                       scale=1 / math.sqrt(args.d))
        torch.cuda.synchronize()
        print("max |ours - flash|:", (o.float() - ref.float()).abs().max().item())


if __name__ == "__main__":
    main()
