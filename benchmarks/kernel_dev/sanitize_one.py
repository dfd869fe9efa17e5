"""One launch of a prebuilt kernel on a small ragged shape, for compute-sanitizer (racecheck, synccheck):
    compute-sanitizer --tool racecheck python3 benchmarks/kernel_dev/sanitize_one.py DIR [B H N M]
The default shape (B=2, H=70, N=200, M=333) has more work tiles than an H200 has SMs, so a persistent CTA
walks several.
DIR holds kernel.cubin and manifest.json (hopper_build.py). Inputs are cupy arrays (no torch: a short start
under the sanitizer); prints the max |O| so a run that wrote nothing shows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy as cp  # noqa: E402

from flashgen.abi import KernelManifest  # noqa: E402
from flashgen.harness.device import launch  # noqa: E402

kdir = Path(sys.argv[1])
manifest = KernelManifest.model_validate_json((kdir / "manifest.json").read_text())
b, h, n, m = (int(x) for x in sys.argv[2:6]) if len(sys.argv) > 5 else (2, 70, 200, 333)
d = manifest.head_dim
rng = cp.random.default_rng(1)
half = cp.float16 if manifest.dtype.value == "fp16" else cp.uint16


def rand(rows):
    x = rng.standard_normal((b, h, rows, d), dtype=cp.float32)
    if half is cp.float16:
        return x.astype(cp.float16)
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


q, k, v = rand(n), rand(m), rand(m)
o = cp.zeros((b, h, n, d), dtype=half)
launch(manifest, str(kdir / "kernel.cubin"), q, k, v, o)
cp.cuda.runtime.deviceSynchronize()
print(kdir.name, "launched; nonzero outputs:", int(cp.count_nonzero(o)), "of", o.size)
