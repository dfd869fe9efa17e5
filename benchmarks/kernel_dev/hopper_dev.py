"""Hopper (sm90 backend) kernel development on the GPU: verify, then time beside torch SDPA, in one call.

    python benchmarks/kernel_dev/hopper_dev.py DIR [DIR ...] [--bench] [--out FILE]

Each DIR holds kernel.cu, manifest.json and (optionally) kernel.cubin built ahead on a CPU machine
(benchmarks/kernel_dev/hopper_build.py). For each kernel: a quick check on fresh random inputs against an fp64
reference on the GPU (NaN-poisoned output, N != M tails, both layouts), then the harness's whole verification
(flashgen.harness.verify.verify_kernel), then, with --bench, TFLOP/s on the Hopper grid beside SDPA's cuDNN and
FLASH backends in the same process. Prints a table; --out writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def reference(q, k, v, causal: bool, scale: float):
    import torch

    qd, kd, vd = (x.double() for x in (q, k, v))
    if kd.shape[1] != qd.shape[1]:
        rep = qd.shape[1] // kd.shape[1]
        kd, vd = kd.repeat_interleave(rep, 1), vd.repeat_interleave(rep, 1)
    s = torch.einsum("bhnd,bhmd->bhnm", qd, kd) * scale
    n, m = s.shape[-2:]
    if causal:
        i = torch.arange(n, device=s.device)[:, None]
        j = torch.arange(m, device=s.device)[None, :]
        s = s.masked_fill(j > i + (m - n), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhnm,bhmd->bhnd", p, vd)


def quick_check(kdir: Path, manifest, cubin: str) -> dict:
    import torch

    from flashgen.harness.device import launch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[manifest.dtype.value]
    d = manifest.head_dim
    causal = manifest.variant.causal
    results = []
    for (b, h, n, m, layout) in ((1, 2, 128, 128, "bhnd"), (2, 3, 200, 333, "bnhd"), (1, 2, 1000, 777, "bhnd"),
                                 (2, 2, 64, 1024, "bnhd"), (1, 1, 4096, 4096, "bhnd"),
                                 # more work tiles than SMs: a persistent CTA walks several, ragged and not
                                 (4, 16, 1024, 1024, "bhnd"), (3, 8, 1500, 1701, "bnhd"),
                                 # more (batch, head) pairs than SMs: the grid's groups of pairs (grid_groups)
                                 (2, 70, 200, 333, "bnhd"), (1, 140, 640, 640, "bhnd")):
        if causal and m < n:
            m = n + 17
        gen = torch.Generator(device="cuda").manual_seed(int(time.time_ns()) % (1 << 31))

        def make(rows, layout=layout, b=b, h=h, gen=gen):
            if layout == "bhnd":
                return torch.randn(b, h, rows, d, device="cuda", dtype=dt, generator=gen)
            return torch.randn(b, rows, h, d, device="cuda", dtype=dt, generator=gen).transpose(1, 2)

        q, k, v = make(n), make(m), make(m)
        o = torch.full((b, h, n, d), float("nan"), device="cuda", dtype=dt)
        scale = 1.0 / math.sqrt(d)
        launch(manifest, cubin, q, k, v, o, scale=scale)
        torch.cuda.synchronize()
        ref = reference(q, k, v, causal, scale)
        err = (o.double() - ref).abs()
        unwritten = int(torch.isnan(o).sum())
        max_err = float(err.nan_to_num(1e9).max())
        # the same-dtype torch reference's own error sets the bar (FlashAttention's rule)
        pt = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=False,
                                                              attn_mask=None if not causal else
                                                              torch.ones(n, m, dtype=torch.bool, device="cuda").tril(m - n),
                                                              scale=scale).to(dt)
        pt_err = float((pt.double() - ref).abs().nan_to_num(0).max())
        ok = unwritten == 0 and max_err <= 2 * pt_err + 1e-5 + 2e-3
        results.append(dict(shape=[b, h, n, m], layout=layout, max_err=max_err, pt_err=pt_err, unwritten=unwritten,
                            ok=ok))
    return dict(ok=all(r["ok"] for r in results), cases=results)


def full_verify(manifest, source: str, cubin: str) -> dict:
    from flashgen.harness.device import KernelInput
    from flashgen.harness.verify import verify_kernel

    report = verify_kernel(KernelInput(manifest=manifest, source=source, cubin_path=cubin))
    return dict(ok=report.ok, summary=report.summary[:1500])


def bench(manifest, cubin: str, baselines: bool = True) -> list[dict]:
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashgen.harness.device import prepare_launch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[manifest.dtype.value]
    d = manifest.head_dim
    causal = manifest.variant.causal
    h = 2048 // d
    rows = []
    for n in (512, 1024, 2048, 4096, 16384):
        b = max(1, 16384 // n)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dt) for _ in range(3))
        o = torch.empty_like(q)
        run = prepare_launch(manifest, cubin, q, k, v, o, scale=1.0 / math.sqrt(d))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        row = dict(n=n, b=b, h=h, d=d, causal=causal, dtype=manifest.dtype.value)
        row["ours_ms"] = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
        for name, backend in ((("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
                              if baselines else ()):
            try:
                with sdpa_kernel([backend]):
                    fn = lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fn()
                    row[f"{name}_ms"] = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
            except Exception as exc:  # a backend that does not take this shape is reported, not fatal
                row[f"{name}_error"] = str(exc).splitlines()[0][:200]
        for key in ("ours", "cudnn", "flash"):
            if f"{key}_ms" in row:
                row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--full", action="store_true", help="also the harness's whole verification")
    ap.add_argument("--no-baselines", action="store_true", help="time ours only")
    ap.add_argument("--out")
    args = ap.parse_args()
    from flashgen.abi import KernelManifest

    out = {}
    for name in args.dirs:
        kdir = Path(name)
        entry: dict = {}
        out[kdir.name] = entry
        try:
            manifest = KernelManifest.model_validate_json((kdir / "manifest.json").read_text())
            source = (kdir / "kernel.cu").read_text()
            cubin = str(kdir / "kernel.cubin")
            full = args.full
            if manifest.variant.name in ("plain", "causal") and manifest.reference_tl is None:
                entry["quick"] = quick_check(kdir, manifest, cubin)
                print(f"{kdir.name}: quick {'ok' if entry['quick']['ok'] else 'FAIL'} "
                      + " ".join(f"{c['max_err']:.2e}/{c['pt_err']:.1e}{'' if c['ok'] else '!'}"
                                 for c in entry["quick"]["cases"]), flush=True)
            else:  # the quick check's reference is plain or causal attention, not this kernel's (a variant, or score
                # and mask functions: manifest.reference_tl): the harness's verification decides
                entry["quick"] = dict(ok=True, cases=[], note=f"{manifest.variant.name}: verified by --full only")
                full = True
                print(f"{kdir.name}: {manifest.variant.name}{' with functions' if manifest.reference_tl else ''}, "
                      "no quick check", flush=True)
            if entry["quick"]["ok"] and full:
                entry["verify"] = full_verify(manifest, source, cubin)
                print(f"  verify {'ok' if entry['verify']['ok'] else 'FAIL: ' + entry['verify']['summary'][:600]}",
                      flush=True)
            if entry["quick"]["ok"] and entry.get("verify", {}).get("ok", True) and args.bench:
                entry["bench"] = bench(manifest, cubin, baselines=not args.no_baselines)
                for r in entry["bench"]:
                    ours, cudnn = r.get("ours_tflops", 0), r.get("cudnn_tflops", 0)
                    ratio = f"{ours / cudnn:.3f}" if cudnn else "-"  # no cuDNN reading (BASELINES=none)
                    print(f"  N={r['n']:6d} ours {ours:6.1f}  cudnn {cudnn:6.1f}  "
                          f"flash {r.get('flash_tflops', 0):6.1f}  ratio/cudnn {ratio}", flush=True)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(f"{kdir.name}: ERROR {entry['error'][:500]}", flush=True)
            if "illegal" in str(exc).lower() or "launch failed" in str(exc).lower():
                break  # a sticky CUDA error poisons the context: stop here, report what ran
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
