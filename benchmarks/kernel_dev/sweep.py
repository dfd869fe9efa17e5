"""Tile-parameter sweep beside FlashAttention-2 (torch SDPA FLASH), for kernel development on a GPU.

    python benchmarks/kernel_dev/sweep.py --d 128 --configs 128x128w8q1s1,128x64w4q0s2 --n 512,2048,8192 \
        --masks plain,causal --dtypes bf16 --out sweep.json

Each config is BMxBNwWqQsS (BLOCK_M x BLOCK_N, WARPS, Q_IN_REGS, STAGES). Every kernel is built by the
reference translator from the library's full TL with those parameters, compiled (ptxas resources kept),
verified on the harness's tails / n_gt_m / large_magnitude cases in the isolated GPU worker, and only then
timed (L2 flushed before each run) at B*N = 16k tokens, H*D = 2048. FLASH, EFFICIENT and CUDNN are timed once
per shape in the same process. `flashgen tune` is the user-facing search; this script answers "is it faster
than FA2" for template changes that the parameter space does not describe.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from flashgen.variant import DType, Shape, Variant


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--n", default="512,2048,8192")
    ap.add_argument("--masks", default="plain,causal")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from flashgen.harness.bench import bench_kernels, shape_text
    from flashgen.harness.compile import compile_many
    from flashgen.harness.suite import translation_target
    from flashgen.harness.verify import quick_cases
    from flashgen.harness.worker import GpuWorker, KernelInput
    from flashgen.translators.search import parse_compact_params, translate_with_params

    target = translation_target("h200")
    shapes = [Shape(B=16384 // n, H=2048 // args.d, N=n, M=n, D=args.d) for n in map(int, args.n.split(","))]
    built = []
    for dt in map(DType, args.dtypes.split(",")):
        for mask in args.masks.split(","):
            variant = Variant(causal=mask == "causal")
            for label in args.configs.split(","):
                translation = translate_with_params(variant, target, dt, args.d, parse_compact_params(label))
                built.append({"label": label, "dtype": dt.value, "mask": mask, "name": translation.manifest.name,
                              "source": translation.source, "manifest": translation.manifest})
    t0 = time.time()
    compiled = compile_many([b["source"] for b in built], "sm_90", jobs=16)
    print(f"compiled {len(built)} kernels in {time.time() - t0:.1f} s", flush=True)
    rows = []
    with GpuWorker(job_timeout_s=120) as worker:
        for b, c in zip(built, compiled, strict=True):
            res = {k: (u.registers, u.spill_store_bytes) for k, u in c.kernels.items()} if c.ok else None
            b["resources"] = res
            if not c.ok:
                b["verified"] = f"compile failed: {c.feedback_text(300)}"
                continue
            cases = quick_cases(b["manifest"])
            report = worker.verify(KernelInput(manifest=b["manifest"], cubin_path=c.cubin_path), cases=cases)
            b["verified"] = "ok" if report.ok else (report.summary or report.error or "failed")[:300]
            print(f"{b['dtype']} {b['mask']} {b['label']}: {res} verify {b['verified'][:120]}", flush=True)
    good = [b for b, c in zip(built, compiled, strict=True) if b["verified"] == "ok"]
    t0 = time.time()
    report = bench_kernels([KernelInput(manifest=b["manifest"], cubin_path=c.cubin_path)
                            for b, c in zip(built, compiled, strict=True) if b["verified"] == "ok"],
                           shapes, baselines=True, min_time_s=args.min_time, flex="off")
    print(f"timed in {time.time() - t0:.1f} s", flush=True)
    base: dict[tuple[str, str, str, str], float] = {}
    ours: dict[tuple[str, str], float] = {}
    for e in report.entries:
        if e.ok and e.stats is not None:
            if e.kind == "baseline":
                base[(e.name, e.dtype, e.variant, shape_text(e.shape))] = e.stats.median_ms
            else:
                ours[(e.name, shape_text(e.shape))] = e.stats.median_ms
    summary = []
    for b in good:
        ratios = []
        for s in shapes:
            ms = ours.get((b["name"], shape_text(s)))
            fa = base.get(("sdpa_flash", b["dtype"], b["manifest"].variant.name, shape_text(s)))
            cudnn = base.get(("sdpa_cudnn", b["dtype"], b["manifest"].variant.name, shape_text(s)))
            if ms and fa:
                ratios.append(fa / ms)
            rows.append({"label": b["label"], "dtype": b["dtype"], "mask": b["mask"], "shape": shape_text(s),
                         "ms": ms, "flash_ms": fa, "cudnn_ms": cudnn, "x_flash": fa / ms if ms and fa else None})
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        summary.append({"label": b["label"], "dtype": b["dtype"], "mask": b["mask"], "resources": b["resources"],
                        "geomean_x_flash": gm, "min_x_flash": min(ratios) if ratios else None,
                        "per_shape": [round(r, 3) for r in ratios]})
        print(f"{b['dtype']} {b['mask']:6s} d{args.d} {b['label']:14s} geomean x FLASH "
              f"{gm if gm is None else round(gm, 3)}  per N {[round(r, 3) for r in ratios]}  {b['resources']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": report.env, "summary": summary, "rows": rows,
                                    "unverified": [{k: b[k] for k in ("label", "dtype", "mask", "verified")}
                                                   for b in built if b["verified"] != "ok"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
