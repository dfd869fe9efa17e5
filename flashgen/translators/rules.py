"""The rule-based plan of a `Variant`: what the expert's TL program lowers to, built without TL.

    plan = plan_for_variant(Variant(causal=True), target, DType.bf16, 128)   # target: a Target, GPU name or arch
"""

from __future__ import annotations

from flashgen.errors import UsageError
from flashgen.targets import Target, resolve_target
from flashgen.translators.backends import backend_for, get_backend
from flashgen.translators.params import choose_params
from flashgen.translators.plan import (
    KernelPlan,
    normalization_for,
    score_mods_for,
    tile_fields,
    visibility_for,
)
from flashgen.variant import DType, Variant, check_head_dim_v, head_dims_tag


def plan_for_variant(variant: Variant, target: Target | str, dtype: DType, head_dim: int, *, name: str | None = None,
                     params: dict[str, int] | None = None, backend: str | None = None,
                     head_dim_v: int | None = None) -> KernelPlan:
    """The plan the rule-based expert would write for `target` (a Target, a GPU name, or an arch such as sm_80: the
    first known GPU of it). `params` (BLOCK_M, BLOCK_N, WARPS, STAGES, optional Q_IN_REGS and GROUP_HEADS) default
    to flashgen.translators.params.choose_params without a tuned file (the tables and the model). `backend` names
    a code path other than the target's own choice (sm80 on an H200, to compare the two). `head_dim_v`: V's and O's
    own head dim (None, or `head_dim` itself: one head dim)."""
    target = resolve_target(target)
    dtype = DType(dtype)
    path = get_backend(backend) if backend else backend_for(target, variant, dtype)
    if not path.supports(target) or not path.accepts(variant, dtype):
        raise UsageError(f"the {path.name} path does not translate {variant.name} {dtype.value} for {target.name}")
    backend = path
    if (problem := backend.head_dim_problem(head_dim)) is not None:
        raise UsageError(problem)
    head_dim_v = check_head_dim_v(head_dim_v, head_dim)
    if params is None:
        params = choose_params(variant, target, dtype, head_dim, tuned=False, backend=backend.name,
                               head_dim_v=head_dim_v)
    mods, prologue = score_mods_for(variant)
    norm, norm_prologue = normalization_for(variant)
    visible, begin, end, mask_tile, key_range = visibility_for(variant)
    kernel_name = name or f"fg_{variant.name}_{dtype.value}_{head_dims_tag(head_dim, head_dim_v)}_{target.arch}"
    try:
        return KernelPlan(
            name=kernel_name, arch=target.arch, target=target, backend=backend.name, dtype=dtype, head_dim=head_dim,
            head_dim_v=head_dim_v,
            **tile_fields(params, variant),
            variant=variant, score_mods=mods, prologue=prologue + norm_prologue, visible=visible, norm=norm,
            write_lse=variant.return_lse, kv_tile_begin=begin, kv_tile_end=end, mask_tile=mask_tile,
            key_range=key_range,
        )
    except ValueError as exc:
        raise UsageError(f"cannot plan {kernel_name}: {exc}") from None
