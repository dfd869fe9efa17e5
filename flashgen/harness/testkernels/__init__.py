"""Kernels the harness tests itself with: a plain correct attention kernel and planted cheats/faults.

`build(name, dtype, head_dim, variant)` returns self-contained CUDA source (configuration defines
prepended, the shared header inlined) and its KernelManifest; `write_kernel_dir` writes the pair as
a kernel directory (kernel.cu + manifest.json), the form `flashgen bench` and `flashgen verify` take.
"""

from __future__ import annotations

import json
from pathlib import Path

from flashgen.abi import KernelManifest, Launch
from flashgen.variant import DType, Norm, Variant

HERE = Path(__file__).parent
CATALOG: dict[str, dict] = {k: v for k, v in json.loads((HERE / "manifest.json").read_text()).items() if not k.startswith("_")}
BLOCK_M = 16  # FG_BLOCK_M in simple_attention.cuh

_DTYPE_CODE = {DType.fp32: 0, DType.fp16: 1, DType.bf16: 2}
_NORM_CODE = {Norm.softmax: 0, Norm.relu: 1, Norm.sigmoid: 2}


def _defines(dtype: DType, head_dim: int, variant: Variant) -> str:
    lines = {
        "FG_DTYPE": _DTYPE_CODE[dtype],
        "FG_HEAD_DIM": head_dim,
        "FG_CAUSAL": int(variant.causal),
        "FG_WINDOW": variant.window or 0,
        "FG_SOFTCAP_ON": int(variant.softcap is not None),
        "FG_SOFTCAP": f"{variant.softcap or 0.0!r}f",
        "FG_ALIBI": int(variant.alibi),
        "FG_NORM": _NORM_CODE[variant.norm],
    }
    return "".join(f"#define {key} {value}\n" for key, value in lines.items())


def build(name: str, dtype: DType | str = DType.fp16, head_dim: int = 64, variant: Variant | None = None,
          arch: str = "sm_80") -> tuple[str, KernelManifest]:
    """Self-contained source and manifest of test kernel `name` (a key of manifest.json)."""
    if name not in CATALOG:
        raise KeyError(f"unknown test kernel {name!r}; known: {', '.join(CATALOG)}")
    entry = CATALOG[name]
    dtype = DType(dtype)
    variant = variant or Variant()
    if variant.split_kv:
        raise ValueError("the simple test kernel has no split-KV form")
    header = (HERE / "simple_attention.cuh").read_text().replace("#pragma once\n", "")
    body = (HERE / entry["file"]).read_text()
    # Precision cheats define their hooks before the include: keep them first.
    hooks = "".join(line + "\n" for line in body.splitlines() if line.startswith("#define FG_"))
    body = "\n".join(line for line in body.splitlines() if not line.startswith("#define FG_"))
    source = (f"// flashgen test kernel {name} ({dtype.value}, D={head_dim}, {variant.name})\n"
              + _defines(dtype, head_dim, variant) + hooks
              + body.replace('#include "simple_attention.cuh"', header))
    manifest = KernelManifest(
        name=f"{name}_{dtype.value}_d{head_dim}_{variant.name}", arch=arch, dtype=dtype, head_dim=head_dim,
        variant=variant,
        launches=[Launch(kernel=entry["kernel"], grid=tuple(entry["grid"]), threads=entry["threads"])],
        params={"BLOCK_M": BLOCK_M, "BLOCK_N": 1}, notes=entry["expect"])
    return source, manifest


def needs_rdc(name: str) -> bool:
    return bool(CATALOG[name].get("rdc"))


def write_kernel_dir(directory: str | Path, name: str, **kwargs) -> Path:
    """Write kernel.cu + manifest.json for test kernel `name` into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source, manifest = build(name, **kwargs)
    (directory / "kernel.cu").write_text(source)
    (directory / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    return directory
