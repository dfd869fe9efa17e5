"""Tile-parameter search, the CPU half: which (BLOCK_M, BLOCK_N, WARPS, STAGES, Q_IN_REGS, GROUP_HEADS) are
worth trying for one variant, dtype and head dim on one GPU.

    records = screen_candidates(variant, "h200", DType.bf16, 128)   # every point of the space, why dropped
    candidate_params(variant, "h200", DType.bf16, 128)              # the survivors' params, likeliest first
    build_sources(records, "h200")                                   # CUDA source and manifest of the live ones

A candidate must pass the TL checker's budgets for the target (shared memory, registers, warp shapes) and
the translator's limits (render raises UsageError); survivors are ordered by the occupancy model of
flashgen.translators.params (`model_score`). Compiling them (dropping spills), verifying and timing them on
the GPU and recording the winner is the harness's half: flashgen.harness.tune.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from itertools import product
from typing import Any

from pydantic import BaseModel, Field

from flashgen.abi import KernelManifest
from flashgen.errors import FlashgenError, UsageError
from flashgen.translators.params import ModelScore, model_score
from flashgen.variant import DType, Variant, head_dims_tag

# The space screened is the target's backend's (flashgen.translators.backends.base.SearchSpace): BLOCK_M, BLOCK_N,
# WARPS, STAGES, Q_IN_REGS and the launch orders (GROUP_HEADS, the variant's default first).


_COMPACT = re.compile(r"^(\d+)x(\d+)w(\d+)q([01])s(\d+)(?:g(\d+))?$")


def parse_compact_params(text: str) -> dict[str, int]:
    """'128x64w4q0s2g4' -> BLOCK_M=128, BLOCK_N=64, WARPS=4, Q_IN_REGS=0, STAGES=2, GROUP_HEADS=4 (the
    benchmarks' notation; gG is optional)."""
    found = _COMPACT.match(text.strip())
    if not found:
        raise UsageError(f"tile parameters {text!r} are not BMxBNwWqQsS[gG] (e.g. 128x64w4q0s2)")
    bm, bn, w, q, s, g = found.groups()
    params = {"BLOCK_M": int(bm), "BLOCK_N": int(bn), "WARPS": int(w), "STAGES": int(s), "Q_IN_REGS": int(q)}
    if g is not None:
        params["GROUP_HEADS"] = int(g)
    return params


def params_label(params: dict[str, int]) -> str:
    return (f"{params['BLOCK_M']}x{params['BLOCK_N']} w{params['WARPS']} s{params.get('STAGES', 1)} "
            f"q{params.get('Q_IN_REGS', 1)}" + (f" g{params['GROUP_HEADS']}" if "GROUP_HEADS" in params else ""))


class CandidateRecord(BaseModel):
    """One point of the parameter space and how far it got (resources, verify_summary and the times are filled
    by the GPU half, flashgen.harness.tune)."""

    params: dict[str, int]
    label: str
    model: ModelScore | None = None
    dropped: str | None = Field(default=None, description="'<stage>: <reason>' where it left the search; stages: "
                                "check, render, compile, verify, time, budget")
    kernel_name: str | None = None
    resources: dict[str, Any] = Field(default_factory=dict, description="per entry: registers, smem, spills")
    verify_summary: str | None = None
    times_ms: dict[str, float] = Field(default_factory=dict, description="shape text -> median ms")
    geomean_ms: float | None = None
    tl: str | None = Field(default=None, exclude=True)
    source: str | None = Field(default=None, exclude=True)
    manifest: KernelManifest | None = Field(default=None, exclude=True)

    @property
    def alive(self) -> bool:
        return self.dropped is None


# ---------------------------------------------------------------------------------------------
# The CPU filters
# ---------------------------------------------------------------------------------------------

def resolve_target(target):
    """A Target from a Target, a GPU name (h200) or an arch (sm_80: the first known GPU of that arch):
    flashgen.targets.resolve_target."""
    from flashgen.targets import resolve_target as resolve

    return resolve(target)


def kernel_name(variant: Variant, dtype: DType, head_dim: int, arch: str, params: dict[str, int],
                head_dim_v: int | None = None) -> str:
    """One name per candidate: the bench report tells kernels apart by manifest name."""
    return (f"fg_{variant.name}_{dtype.value}_{head_dims_tag(head_dim, head_dim_v)}_{arch}_m{params['BLOCK_M']}"
            f"n{params['BLOCK_N']}"
            f"w{params['WARPS']}s{params.get('STAGES', 1)}q{params.get('Q_IN_REGS', 1)}"
            + (f"g{params['GROUP_HEADS']}" if "GROUP_HEADS" in params else ""))


def screen_candidates(variant: Variant, target, dtype: DType, head_dim: int,
                      head_dim_v: int | None = None) -> list[CandidateRecord]:
    """Every point of the space: the survivors of the checker and the translator first, ordered by the
    occupancy model (likeliest fast first), then the dropped ones with their reason. `head_dim_v`: V's and O's own
    head dim (None: head_dim)."""
    from flashgen.tl_spec import library, parse
    from flashgen.tl_spec.checker import check
    from flashgen.tl_spec.diagnostics import errors_only
    from flashgen.translators.backends import backend_for
    from flashgen.translators.lower import check_translates
    from flashgen.translators.params import default_group_heads

    target = resolve_target(target)
    dtype = DType(getattr(dtype, "value", dtype))
    space = backend_for(target).search_space
    alive, dropped = [], []
    first = default_group_heads(variant)
    orders = (first,) if variant.split_kv else (first, *(g for g in space.group_heads if g != first))
    for block_m, block_n, warps, stages, q_in_regs, group_heads in product(space.block_m, space.block_n, space.warps,
                                                                             space.stages, space.q_in_regs, orders):
        params = {"BLOCK_M": block_m, "BLOCK_N": block_n, "WARPS": warps, "STAGES": stages, "Q_IN_REGS": q_in_regs,
                  "GROUP_HEADS": group_heads}
        record = CandidateRecord(params=params, label=params_label(params),
                                 model=model_score(target, dtype, head_dim, params, head_dim_v))
        try:
            tl = library.render(variant, dtype=dtype, arch=target.arch, params=params, head_dim=head_dim,
                                head_dim_v=head_dim_v)
            errors = errors_only(check(parse(tl, "kernel.tl"), target))
        except FlashgenError as exc:
            record.dropped = f"check: {exc}"
            dropped.append(record)
            continue
        if errors:
            record.dropped = f"check: {errors[0].message}" + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")
            dropped.append(record)
            continue
        name = kernel_name(variant, dtype, head_dim, target.arch, params, head_dim_v)
        try:
            # the translator's plan and render's limits (stages, shared memory), without writing the CUDA yet
            check_translates(parse(tl, "kernel.tl"), target, name=name)
        except FlashgenError as exc:
            record.dropped = f"render: {exc}"
            dropped.append(record)
            continue
        record.tl, record.kernel_name = tl, name
        alive.append(record)
    # stable: ties (the launch orders of one tile) keep the space's order, the variant's default order first
    alive.sort(key=lambda r: (not r.model.fits, -r.model.score))
    return alive + dropped


@lru_cache(maxsize=64)
def _candidate_params(variant: Variant, target_name: str, dtype: DType, head_dim: int,
                      head_dim_v: int | None = None) -> tuple[tuple, ...]:
    return tuple(tuple(r.params.items()) for r in screen_candidates(variant, target_name, dtype, head_dim, head_dim_v)
                 if r.alive)


def candidate_params(variant: Variant, target, dtype: DType, head_dim: int,
                     head_dim_v: int | None = None) -> list[dict[str, int]]:
    """The parameters worth trying on `target` (a Target, GPU name or arch), likeliest first. CPU only;
    cached per (variant, target, dtype, head dims)."""
    target = resolve_target(target)
    dtype = DType(getattr(dtype, "value", dtype))
    return [dict(items) for items in _candidate_params(variant, target.name, dtype, head_dim, head_dim_v)]


def translate_with_params(variant: Variant, target, dtype: DType, head_dim: int, params: dict[str, int],
                          backend: str | None = None):
    """The reference translator's kernel for exactly these parameters (the library's full TL carrying them), named by
    kernel_name: a bench tells kernels apart by name. `backend` pins a code path (sm80 on an H200). Returns
    flashgen.translators' Translation."""
    from flashgen.tl_spec import library, parse
    from flashgen.translators import translate
    from flashgen.translators.backends import get_backend

    target = resolve_target(target)
    dtype = DType(getattr(dtype, "value", dtype))
    # a pinned path gets the program in its own dataflow (the Hopper form with Role blocks for sm90, else the plain one)
    roles = None if backend is None else get_backend(backend).role_dataflow
    tl = library.render(variant, dtype=dtype, arch=target.arch, params=params, head_dim=head_dim, form="full",
                        roles=roles)
    return translate(parse(tl, "kernel.tl"), target, name=kernel_name(variant, dtype, head_dim, target.arch, params),
                     backend=backend)


def build_sources(records: Sequence[CandidateRecord], target) -> None:
    """CUDA source and manifest of each live record (the reference translator), where not built yet."""
    from flashgen.tl_spec import parse
    from flashgen.translators import translate

    target = resolve_target(target)
    for record in records:
        if record.alive and record.source is None:
            try:
                translation = translate(parse(record.tl, "kernel.tl"), target, name=record.kernel_name)
            except FlashgenError as exc:
                record.dropped = f"render: {exc}"
                continue
            record.source, record.manifest = translation.source, translation.manifest
