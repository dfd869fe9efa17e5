"""Launch prebuilt development kernels (hopper_build.py dirs) once each on one shape, for Nsight Compute:

    ncu --set full -k regex:fg_ -o OUT python benchmarks/kernel_dev/ncu_dev.py DIR [DIR ...] [--n 4096] [--cudnn]

Each DIR holds kernel.cubin and manifest.json. B = 16384 / N, H = 2048 / D (the Hopper grid's shapes); --cudnn
also runs SDPA's cuDNN backend once on the same tensors (profile it with -k regex:'fg_|cudnn|sdpa')."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--cudnn", action="store_true")
    args = ap.parse_args()

    import torch

    from flashgen.abi import KernelManifest
    from flashgen.harness.device import prepare_launch

    for name in args.dirs:
        kdir = Path(name)
        manifest = KernelManifest.model_validate_json((kdir / "manifest.json").read_text())
        d = manifest.head_dim
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[manifest.dtype.value]
        b, h = max(1, 16384 // args.n), 2048 // d
        q, k, v = (torch.randn(b, h, args.n, d, device="cuda", dtype=dt) for _ in range(3))
        o = torch.empty_like(q)
        prepare_launch(manifest, str(kdir / "kernel.cubin"), q, k, v, o, scale=1.0 / math.sqrt(d))()
        torch.cuda.synchronize()
        print(f"{kdir.name}: launched, max |o| {o.float().abs().max().item():.3f}", flush=True)
        if args.cudnn:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=manifest.variant.causal)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
