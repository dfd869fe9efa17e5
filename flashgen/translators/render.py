"""KernelPlan -> CUDA source + KernelManifest.

One shared kernel skeleton (templates/attention_fwd.cu.j2) over per-arch primitive headers
(include/flashgen/*.cuh). The emitted source is self-contained: our headers are inlined (each behind an
include guard, so several kernels of one arch can share a translation unit); only the ABI header
`flashgen_abi.cuh` stays an #include, found with `-I flashgen/include` (flashgen.abi.ABI_HEADER).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import jinja2

from flashgen.abi import KernelManifest, Launch
from flashgen.errors import UsageError
from flashgen.targets import tensor_cores_take
from flashgen.translators.plan import KernelPlan, NormKind, check_expressions
from flashgen.variant import DType

TEMPLATES = Path(__file__).parent / "templates"
INCLUDE_DIR = Path(__file__).parent / "include"
_INCLUDE = re.compile(r'^\s*#include\s+"(flashgen/[\w./]+)"\s*$', re.MULTILINE)

# Per-block shared memory limit per arch when flashgen.targets has no entry (opt-in maximum) [CUDA guide].
_SMEM_FALLBACK = {"sm_75": 64 << 10, "sm_80": 163 << 10, "sm_86": 99 << 10, "sm_89": 99 << 10, "sm_90": 227 << 10}
_CTYPE = {DType.fp16: "fg::f16", DType.bf16: "fg::bf16", DType.fp32: "fg::f32"}
COMBINE_ROWS_PER_BLOCK = 4
_TURING_NOTE = ("{dtype} inputs on sm_75 run on fp16 tensor cores: each Q/K/V tile is stored as fp16 x * 2^-e "
                "(e from the tile's max |x|), scales folded back exactly in fp32 (docs/turing-dtypes.md)")


def smem_limit(arch: str) -> int:
    """The smallest opt-in per-block shared memory among known targets of this arch."""
    try:
        from flashgen.targets import TARGETS

        limits = [t.smem_per_block_bytes for t in TARGETS.values() if t.arch == arch]
    except Exception:  # the targets table is optional for rendering
        limits = []
    return min(limits) if limits else _SMEM_FALLBACK[arch]


def _tile_bytes(rows: int, cols: int, itemsize: int) -> int:
    """st_layout<rows, cols, itemsize>::BYTES (common.cuh): XOR swizzle, or one chunk of padding per row."""
    chunk_elems = 16 // itemsize
    chunks = cols // chunk_elems
    row_elems = cols if chunks % 8 == 0 else cols + chunk_elems
    return rows * row_elems * itemsize


def smem_itemsize(arch: str, dtype: DType) -> int:
    """Bytes per shared-memory element: where the tensor cores do not take the dtype (bf16/fp32 on Turing) tiles
    are staged as scaled fp16 (docs/turing-dtypes.md)."""
    return DType.fp16.itemsize if not tensor_cores_take(arch, dtype) else dtype.itemsize


def turing_scaled(plan: KernelPlan) -> bool:
    """bf16/fp32 on sm_75: per-tile power-of-two scaled fp16 tiles on the fp16-only tensor cores."""
    return not tensor_cores_take(plan.arch, plan.dtype)


def turing_early_words(plan: KernelPlan) -> int:
    """16-byte words per thread a Turing bf16/fp32 tile loader keeps in flight across the GEMMs (the rest of the
    tile is read inside land()). Chosen spill-free with ptxas for sm_75: d256's O accumulator leaves no room."""
    return 0 if plan.head_dim >= 256 else 4


def max_stages(arch: str) -> int:
    """The deepest K/V buffering the template implements: Turing's register-staged loads have one; cp.async two."""
    return 1 if arch == "sm_75" else 2


def tiles_bytes(block_m: int, block_n: int, head_dim: int, itemsize: int, stages: int = 1) -> int:
    """Q's tile plus `stages` K and V tiles each."""
    return _tile_bytes(block_m, head_dim, itemsize) + 2 * stages * _tile_bytes(block_n, head_dim, itemsize)


def smem_bytes(plan: KernelPlan) -> int:
    item = smem_itemsize(plan.arch, plan.dtype)
    tiles = tiles_bytes(plan.block_m, plan.block_n, plan.head_dim, item, plan.stages)
    # Turing bf16/fp32: one fp32 block-max slot per warp for each of the Q, K and V loaders
    return tiles + (3 * 4 * plan.warps if turing_scaled(plan) else 0)


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def inline_headers(source: str) -> str:
    """Replace each `#include "flashgen/x.cuh"` with the header's text behind an include guard."""
    def expand(text: str, seen: set[str]) -> str:
        def repl(match: re.Match) -> str:
            rel = match.group(1)
            guard = "FG_INLINED_" + re.sub(r"\W", "_", rel).upper()
            if rel in seen:
                return ""
            seen.add(rel)
            body = (INCLUDE_DIR / rel).read_text().replace("#pragma once\n", "")
            return f"#ifndef {guard}\n#define {guard}\n// ---- {rel} ----\n{expand(body, seen)}\n#endif  // {guard}"
        return _INCLUDE.sub(repl, text)
    return expand(source, set())


def _arch_code_path(plan: KernelPlan) -> str:
    return "sm75.cuh" if plan.arch == "sm_75" else "sm80.cuh"


def _validate(plan: KernelPlan) -> None:
    check_expressions(plan)
    if plan.stages > max_stages(plan.arch):
        raise UsageError(f"{plan.name}: stages={plan.stages}: the {plan.arch} translator implements "
                         f"STAGES in 1..{max_stages(plan.arch)}")
    limit = smem_limit(plan.arch)
    need = smem_bytes(plan)
    if need > limit:
        raise UsageError(f"{plan.name}: tiles need {need} bytes of shared memory, over {plan.arch}'s per-block "
                         f"{limit}; lower block_m/block_n")


def num_splits_expr(plan: KernelPlan) -> str:
    """Split count: enough (b, h, m-tile, split) blocks for ~2 waves, at least 256 keys per split, at most 32."""
    sms = 132
    try:
        from flashgen.targets import TARGETS

        counts = [t.sm_count for t in TARGETS.values() if t.arch == plan.arch]
        sms = max(counts) if counts else sms
    except Exception:
        pass
    return f"max(1, min(32, min(cdiv(M, 256), cdiv({2 * sms}, B*H*cdiv(N, {plan.block_m})))))"


def render(plan: KernelPlan, *, inline: bool = True) -> tuple[str, KernelManifest]:
    """CUDA source (self-contained but for flashgen_abi.cuh when `inline`) and the manifest to launch it."""
    _validate(plan)
    split = plan.variant.split_kv
    if turing_scaled(plan):
        warp_mma = f"fg::warp::attn_mma16<fg::f16, MT, D, BLOCK_N, {str(plan.q_in_regs).lower()}, BLOCK_M>"
    elif plan.dtype is DType.fp32:
        warp_mma = (f"fg::warp::attn_mma_tf32<MT, D, BLOCK_N, {str(plan.q_in_regs).lower()}, BLOCK_M>")
    else:
        warp_mma = f"fg::warp::attn_mma16<T, MT, D, BLOCK_N, {str(plan.q_in_regs).lower()}, BLOCK_M>"
    context = dict(
        plan=plan, ns=f"{plan.name}_cfg", ctype=_CTYPE[plan.dtype], arch_header=_arch_code_path(plan),
        warp_mma=warp_mma, split=split, reverse_m=plan.variant.causal,
        softmax=plan.norm.kind is NormKind.softmax,
        raw_scores=plan.norm.kind is NormKind.softmax and not plan.score_mods,
        turing_scaled=turing_scaled(plan), turing_early_words=turing_early_words(plan),
        # P packed to 16 bits straight after the exponentials; fp32 (tf32) and Turing's rescaled tiles keep fp32 P
        packed_p=plan.norm.kind is NormKind.softmax and plan.dtype is not DType.fp32 and not turing_scaled(plan),
    )
    source = _environment().get_template("attention_fwd.cu.j2").render(**context)
    if inline:
        source = inline_headers(source)
    smem = smem_bytes(plan)
    m_tiles = f"cdiv(N, {plan.block_m})"
    launches = [Launch(kernel=plan.name, grid=(f"{m_tiles}*SPLITS" if split else m_tiles, "H", "B"),
                       threads=plan.threads, smem_bytes=smem)]
    if split:
        launches.append(Launch(kernel=f"{plan.name}_combine", grid=(f"cdiv(N, {COMBINE_ROWS_PER_BLOCK})", "H", "B"),
                               threads=32 * COMBINE_ROWS_PER_BLOCK))
    manifest = KernelManifest(
        name=plan.name, arch=plan.arch, dtype=plan.dtype, head_dim=plan.head_dim, variant=plan.variant,
        launches=launches,
        workspace_floats="B*H*SPLITS*N*(D+1)" if split else "0",
        num_splits=num_splits_expr(plan) if split else "1",
        params={"BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n, "WARPS": plan.warps, "STAGES": plan.stages,
                "Q_IN_REGS": int(plan.q_in_regs), "GROUP_HEADS": plan.group_heads},
        notes=(_TURING_NOTE.format(dtype=plan.dtype.value) if turing_scaled(plan)
               else "fp32 inputs run on tf32 tensor cores (10-bit mantissa products, fp32 accumulation)"
               if plan.dtype is DType.fp32 else ""),
    )
    return source, manifest
