"""Render and compile the Hopper development kernels on a CPU machine (nvcc compiles sm_90a anywhere), so a GPU
call only loads cubins: python benchmarks/kernel_dev/hopper_build.py OUTDIR [NAME ...]."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flashgen.abi import ABI_HEADER  # noqa: E402
from flashgen.targets import get_target  # noqa: E402
from flashgen.translators.render import render  # noqa: E402
from flashgen.translators.rules import plan_for_variant  # noqa: E402
from flashgen.variant import DType, Variant  # noqa: E402

def configs():
    """(name, variant, dtype, head dim, (BLOCK_M, BLOCK_N, STAGES)): the session-3 tile sweep."""
    for causal in (False, True):
        kind = "causal" if causal else "plain"
        for d, tiles in ((64, ((128, 128, 2), (192, 128, 2))), (128, ((128, 128, 2), (128, 176, 2), (128, 128, 3))),
                         (256, ((128, 64, 2), (128, 80, 2)))):
            for bm, bn, st in tiles:
                if causal and (bm, bn, st) in ((128, 128, 3), (128, 64, 2)):
                    continue
                yield f"{kind}_bf16_d{d}_{bm}x{bn}s{st}", Variant(causal=causal), DType.bf16, d, (bm, bn, st)


def build(out: Path, name, variant, dtype, d, tiles) -> str:
    target = get_target("h200")
    bm, bn, stages = tiles
    plan = plan_for_variant(variant, target, dtype, d).model_copy(update=dict(
        block_m=bm, block_n=bn, warps=bm // 16, stages=stages, backend="sm90", name=f"fg_{name}_sm90"))
    source, manifest = render(plan)
    kdir = out / name
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "kernel.cu").write_text(source)
    (kdir / "manifest.json").write_text(manifest.model_dump_json(indent=1))
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v",
           "-I", str(ABI_HEADER.parent), "kernel.cu", "-o", "kernel.cubin"]
    run = subprocess.run(cmd, cwd=kdir, capture_output=True, text=True)
    (kdir / "ptxas.txt").write_text(run.stdout + run.stderr)
    tail = [line for line in (run.stdout + run.stderr).splitlines() if "registers" in line or "spill" in line
            or "warning" in line.lower() or "error" in line.lower()]
    return f"{name}: rc={run.returncode} " + " | ".join(t.strip() for t in tail)[:400]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    wanted = set(sys.argv[2:])
    todo = [c for c in configs() if not wanted or c[0] in wanted]
    with ThreadPoolExecutor(4) as ex:
        for line in ex.map(lambda c: build(out, *c), todo):
            print(line, flush=True)
