"""KernelPlan -> CUDA source + KernelManifest.

The plan's backend (flashgen.translators.backends, named by plan.backend) picks the template: the shared kernel
skeleton templates/attention_fwd.cu.j2 or its own extension of it (backends/<name>/*.cu.j2), and provides its
variables (arch header, warp GEMMs, packed P) and facts (shared memory, stages, notes); the limits come from
plan.target. The emitted source is self-contained: our headers (shared ones in include/flashgen/, the backend's in
backends/<name>/include/flashgen/) are inlined, each behind an include guard, so several kernels of one arch can
share a translation unit; only the ABI header `flashgen_abi.cuh` stays an #include, found with
`-I flashgen/include` (flashgen.abi.ABI_HEADER).
"""

from __future__ import annotations

from functools import cache

import jinja2

from flashgen.abi import KernelManifest, Launch
from flashgen.errors import UsageError
from flashgen.targets import Target, resolve_target
from flashgen.translators.backends import Backend, backend_for, get_backend
from flashgen.translators.backends.base import BACKENDS_DIR, SHARED_INCLUDE, SHARED_TEMPLATES, score_units, tiles_bytes
from flashgen.translators.backends.headers import inline_headers
from flashgen.translators.plan import KernelPlan, check_expressions
from flashgen.variant import DType

TEMPLATES = SHARED_TEMPLATES
INCLUDE_DIR = SHARED_INCLUDE
COMBINE_ROWS_PER_BLOCK = 4

__all__ = ["COMBINE_ROWS_PER_BLOCK", "INCLUDE_DIR", "TEMPLATES", "inline_headers", "max_stages", "num_splits_expr",
           "render", "smem_bytes", "smem_itemsize", "smem_limit", "tiles_bytes", "validate_plan"]


def smem_limit(target: Target | str) -> int:
    """Dynamic shared memory one block may use on `target` (a Target, GPU name or arch): the target's opt-in
    maximum."""
    target = resolve_target(target)
    return backend_for(target).smem_limit(target)


def smem_itemsize(target: Target | str, dtype: DType) -> int:
    """Bytes per shared-memory element on the target's backend (2 for bf16/fp32 on Turing: scaled fp16 tiles)."""
    target = resolve_target(target)
    return backend_for(target).smem_itemsize(target, dtype)


def max_stages(target: Target | str) -> int:
    """The deepest K/V buffering the target's backend implements: Turing's register-staged loads have one;
    cp.async two."""
    return backend_for(resolve_target(target)).max_stages


def _backend(plan: KernelPlan) -> Backend:
    return get_backend(plan.backend)


def smem_bytes(plan: KernelPlan) -> int:
    return _backend(plan).smem_bytes(plan)


@cache
def _environment() -> jinja2.Environment:
    # the shared skeleton by its name; a backend's templates as <backend>/<file>
    loader = jinja2.FileSystemLoader([str(TEMPLATES), str(BACKENDS_DIR)])
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def validate_plan(plan: KernelPlan) -> None:
    """Raise UsageError where the plan's backend cannot render it on plan.target (stages, shared memory) or an
    expression names something undefined."""
    check_expressions(plan)
    backend = _backend(plan)
    backend.validate(plan)
    if plan.stages > backend.max_stages:
        raise UsageError(f"{plan.name}: stages={plan.stages}: the {plan.arch} translator implements "
                         f"STAGES in 1..{backend.max_stages}")
    limit = backend.smem_limit(plan.target)
    need = backend.smem_bytes(plan)
    if need > limit:
        raise UsageError(f"{plan.name}: tiles need {need} bytes of shared memory, over {plan.arch}'s per-block "
                         f"{limit}; lower block_m/block_n")


_validate = validate_plan  # the name flashgen.translators.search imports


def num_splits_expr(plan: KernelPlan) -> str:
    """Split count: enough (b, h, m-tile, split) blocks for ~2 waves, at least 256 keys per split, at most 32."""
    sms = _backend(plan).split_sm_count(plan.target)
    return f"max(1, min(32, min(cdiv(M, 256), cdiv({2 * sms}, B*H*cdiv(N, {plan.block_m})))))"


def render(plan: KernelPlan, *, inline: bool = True) -> tuple[str, KernelManifest]:
    """CUDA source (self-contained but for flashgen_abi.cuh when `inline`; else its `#include "flashgen/..."` lines
    need flashgen.harness.compile.include_dirs()) and the manifest to launch it."""
    validate_plan(plan)
    backend = _backend(plan)
    if backend.own_renderer:
        return backend.render(plan)
    split = plan.variant.split_kv
    context = dict(
        plan=plan, ns=f"{plan.name}_cfg", split=split, reverse_m=plan.variant.causal,
        **score_units(plan), **backend.context(plan),
    )
    source = _environment().get_template(backend.template(plan)).render(**context)
    if inline:
        source = inline_headers(source, (backend.include_dir, INCLUDE_DIR))
    smem = backend.smem_bytes(plan)
    m_tiles = f"cdiv(N, {plan.block_m})"
    launches = [Launch(kernel=plan.name, grid=(f"{m_tiles}*SPLITS" if split else m_tiles, "H", "B"),
                       threads=plan.threads, smem_bytes=smem)]
    if split:
        launches.append(Launch(kernel=f"{plan.name}_combine", grid=(f"cdiv(N, {COMBINE_ROWS_PER_BLOCK})", "H", "B"),
                               threads=32 * COMBINE_ROWS_PER_BLOCK))
    manifest = KernelManifest(
        name=plan.name, arch=backend.compile_arch(plan.target), dtype=plan.dtype, head_dim=plan.head_dim, variant=plan.variant,
        head_dim_v=plan.head_dim_v, launches=launches,
        # the partials are O's columns (Dv, a constant of the kernel where V has a head dim of its own) and the LSE
        workspace_floats=(f"B*H*SPLITS*N*({plan.head_dim_v}+1)" if plan.head_dim_v else "B*H*SPLITS*N*(D+1)") if split
        else "0",
        num_splits=num_splits_expr(plan) if split else "1",
        params={"BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n, "WARPS": plan.warps, "STAGES": plan.stages,
                "Q_IN_REGS": int(plan.q_in_regs), "GROUP_HEADS": plan.group_heads},
        notes=backend.notes(plan),
    )
    return source, manifest
