"""The mods suite's sm90 kernels (flashgen.harness.suite.MOD_SUITE, as `flashgen generate` builds them) and the plain
kernel, written as development kernel folders for ncu_dev.py (kernel.cu, manifest.json, kernel.cubin, ptxas.txt):

    python benchmarks/kernel_dev/mods_build.py OUTDIR [NAME ...]     # names of MOD_SUITE; none: all, and plain

Only masks of positions and score functions run under ncu_dev.py (it passes no call-time tensors)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hopper_build import compile_one  # noqa: E402


def main() -> None:
    from flashgen.harness.suite import (
        MOD_SUITE,
        MOD_SUITE_DTYPE,
        MOD_SUITE_SHAPE,
        build_expert_kernel,
        build_mask_kernel,
    )
    from flashgen.variant import Variant

    out = Path(sys.argv[1])
    names = sys.argv[2:] or ["plain", *MOD_SUITE]
    for name in names:
        if name == "plain":
            source, manifest, _ = build_expert_kernel("h200", MOD_SUITE_DTYPE, Variant(), MOD_SUITE_SHAPE.D)
        else:
            source, manifest = build_mask_kernel("h200", MOD_SUITE_DTYPE, Variant(), MOD_SUITE_SHAPE.D, MOD_SUITE[name])
        kdir = out / name
        kdir.mkdir(parents=True, exist_ok=True)
        (kdir / "kernel.cu").write_text(source)
        (kdir / "manifest.json").write_text(manifest.model_dump_json(indent=1))
        print(compile_one(kdir), flush=True)


if __name__ == "__main__":
    main()
