"""Why a kernel's time swings between runs: each call timed alone (CUDA events, L2 flushed before it, as the
harness times), in blocks that alternate our kernel and SDPA's cuDNN backend at the same shape, while nvidia-smi
samples the SM clock, power and the clock-event reasons every 50 ms; per block, the calls' times beside the clock
and power the samples saw. Session 19: plain bf16 d128 / d256 at 16k read min 3.10 / 2.91 ms against medians of
3.74 / 3.75 on the s18 grid (cuDNN 3.18 / 3.02 min, 3.36 / 3.14 median): the clock (a power cap), or the kernel?

    python benchmarks/kernel_dev/clock_watch.py DIR [DIR ...] [--n 16384] [--blocks 4] [--seconds 1.5] --out F.json

Each DIR is a development kernel (benchmarks/kernel_dev/hopper_build.py: kernel.cu, manifest.json, kernel.cubin),
plain or causal, timed at B = 16k / N, H = 2048 / D."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FIELDS = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


def start_sampler(path: Path) -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                             "-lms", "50"], stdout=path.open("w"), stderr=subprocess.STDOUT)


def read_samples(path: Path) -> list[dict]:
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append(dict(t=stamp, sm_mhz=float(parts[1]), power_w=float(parts[2]), temp_c=float(parts[3]),
                                reasons=parts[4]))
        except ValueError:
            continue
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--blocks", type=int, default=4, help="blocks of each kernel, alternating")
    ap.add_argument("--seconds", type=float, default=1.5, help="per block")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashgen.abi import KernelManifest
    from flashgen.harness.device import prepare_launch

    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # past the L2 of every card we use
    smi_file = Path(tempfile.mkstemp(suffix=".csv")[1])
    sampler = start_sampler(smi_file)
    blocks = []
    try:
        for name in args.dirs:
            kdir = Path(name)
            manifest = KernelManifest.model_validate_json((kdir / "manifest.json").read_text())
            d, causal = manifest.head_dim, manifest.variant.causal
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[manifest.dtype.value]
            b, h, n = max(1, 16384 // args.n), 2048 // d, args.n
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
            o = torch.empty_like(q)
            ours = prepare_launch(manifest, str(kdir / "kernel.cubin"), q, k, v, o, scale=1.0 / math.sqrt(d))

            def cudnn(q=q, k=k, v=v, causal=causal):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            for fn in (ours, cudnn):
                fn()
            torch.cuda.synchronize()
            for _ in range(args.blocks):
                for label, fn in (("ours", ours), ("cudnn", cudnn)):
                    times, t0 = [], time.time()
                    while time.time() - t0 < args.seconds:
                        flush.zero_()
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        fn()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end))
                    blocks.append(dict(kernel=kdir.name, who=label, d=d, n=n, causal=causal, t0=t0, t1=time.time(),
                                       times_ms=times, flops=flops))
    finally:
        time.sleep(0.2)
        sampler.terminate()
        sampler.wait(timeout=5)
    samples = read_samples(smi_file)
    for block in blocks:
        seen = [s for s in samples if block["t0"] <= s["t"] <= block["t1"]]
        times = block["times_ms"]
        block.update(calls=len(times), median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times),
                     tflops_median=block["flops"] / statistics.median(times) / 1e9, samples=len(seen),
                     sm_mhz_mean=statistics.fmean(s["sm_mhz"] for s in seen) if seen else None,
                     sm_mhz_min=min((s["sm_mhz"] for s in seen), default=None),
                     power_w_mean=statistics.fmean(s["power_w"] for s in seen) if seen else None,
                     power_w_max=max((s["power_w"] for s in seen), default=None),
                     temp_c_max=max((s["temp_c"] for s in seen), default=None),
                     reasons=sorted({s["reasons"] for s in seen}))
        print(f"{block['kernel']:32s} {block['who']:5s} {block['calls']:4d} calls  median {block['median_ms']:.3f} ms "
              f"({block['tflops_median']:.0f} TF/s)  min {block['min_ms']:.3f}  max {block['max_ms']:.3f}  "
              f"SM {block['sm_mhz_mean'] or 0:.0f} MHz (min {block['sm_mhz_min'] or 0:.0f})  "
              f"{block['power_w_mean'] or 0:.0f} W (max {block['power_w_max'] or 0:.0f})  "
              f"{block['temp_c_max'] or 0:.0f} C  reasons {' '.join(block['reasons'])}", flush=True)
    Path(args.out).write_text(json.dumps(dict(blocks=blocks, samples=samples), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
