"""Tile parameters (BLOCK_M, BLOCK_N, WARPS, STAGES, Q_IN_REGS) and the launch order (GROUP_HEADS) per target,
dtype, head dim and variant.

Sources, in order: a tuned file (the user's, `flashgen.paths.config_dir()/tuned/<gpu>.json`, written by `flashgen tune
--write` after a timed search on that GPU, then the packaged flashgen/translators/tuned/<gpu>.json; keyed by dtype,
variant and head dim); the target's backend's `measured` table
(values from manual sweeps on a GPU, keyed by arch, dtype, head dim and launch order); its `defaults`
(spill-checked starting points, keyed by dtype and head dim), both at the native head dims (plan.NATIVE_HEAD_DIMS)
and a few others whose budget the native entry exceeds: any other head dim takes the entry of the nearest native one
at or above it; GROUP_HEADS (the launch order) follows
`default_group_heads` where a source is silent; otherwise a small model: candidates that fit the target's per-block
shared memory and an estimated 255-register budget, scored by tensor-core work per shared-memory byte read (the
mma.sync path is bound by ldmatrix traffic), by resident blocks per SM (the target's shared memory per SM), and by
tail waste of the key tile. The tables live in the backends (flashgen/translators/backends/<name>/__init__.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from flashgen.errors import UsageError
from flashgen.targets import Target, resolve_target
from flashgen.tl_spec.ast import TILE_PARAMS, SizeParams
from flashgen.translators.backends import Backend, backend_for, get_backend
from flashgen.translators.backends.base import tiles_bytes
from flashgen.translators.plan import (
    choice_head_dim,
    default_group_heads,
    launch_order,
    native_head_dim,
    padded_head_dim,
)
from flashgen.variant import DType, Variant, head_dims_tag

TUNED_DIR = Path(__file__).parent / "tuned"
# GROUP_HEADS (the launch order; default_group_heads(variant) when absent) is a schedule parameter, not a tile one,
# but it travels with them
TILE_KEYS = TILE_PARAMS  # the TL's: the params a `Params when` line may set per range of sizes

_REG_BUDGET = 255
_REG_OVERHEAD = 48  # addresses, loop state, softmax statistics, ldmatrix operands


def _with_schedule(params: dict[str, int], variant: Variant) -> dict[str, int]:
    return {**params, "GROUP_HEADS": params.get("GROUP_HEADS", default_group_heads(variant))}


def estimate_registers(block_m: int, block_n: int, warps: int, head_dim: int, q_in_regs: bool, itemsize: int,
                       head_dim_v: int | None = None) -> int:
    """Registers a thread holds: O's accumulator (over Dv), S's, Q's fragments (over D) where kept, and the rest."""
    rows = block_m // warps
    acc_o = rows * (head_dim if head_dim_v is None else head_dim_v) // 32
    acc_s = rows * block_n // 32
    q_frag = rows * padded_head_dim(head_dim, itemsize) * (4 if itemsize == 4 else 2) // 4 // 32 if q_in_regs else 0
    return acc_o + acc_s + q_frag + _REG_OVERHEAD


def _smem(block_m: int, block_n: int, head_dim: int, itemsize: int, stages: int = 1,
          head_dim_v: int | None = None) -> int:
    return tiles_bytes(block_m, block_n, head_dim, itemsize, stages, head_dim_v)


class ModelScore(BaseModel):
    """What the occupancy model thinks of one set of tile parameters."""

    registers: int = Field(description="estimated registers per thread")
    smem_bytes: int
    blocks_per_sm: int = Field(description="resident blocks per SM by shared memory and registers")
    fits: bool = Field(description="within the register budget, the per-block shared memory and >= 1 block per SM")
    score: float = Field(description="higher is likelier fast: mma work per shared-memory byte, tile overhead, "
                         "occupancy")


def model_score(target: Target | str, dtype: DType, head_dim: int, params: dict[str, int],
                head_dim_v: int | None = None) -> ModelScore:
    """The occupancy model's view of `params` on `target` (a Target, GPU name or arch); `head_dim_v`: V's and O's
    own head dim (P V's work and V's tile at Dv, Q K^T's and K's at D)."""
    target = resolve_target(target)
    backend = backend_for(target)
    itemsize = backend.smem_itemsize(target, dtype)
    block_m, block_n, warps = int(params["BLOCK_M"]), int(params["BLOCK_N"]), int(params["WARPS"])
    q_in_regs = bool(params.get("Q_IN_REGS", 1))
    smem_per_sm = backend.model_smem_per_sm(target)
    regs = estimate_registers(block_m, block_n, warps, head_dim, q_in_regs, itemsize, head_dim_v)
    smem = _smem(block_m, block_n, head_dim, itemsize, int(params.get("STAGES", 1)), head_dim_v)
    blocks = min(smem_per_sm // smem, 65536 // (max(regs, 64) * 32 * warps))
    rows_per_warp = block_m // warps
    # flops per smem byte read by one warp per key tile: QK^T + PV over (K, V [, Q])
    if head_dim_v is None:
        flops = 4 * rows_per_warp * block_n * head_dim
        bytes_read = (2 * block_n * head_dim + (0 if q_in_regs else rows_per_warp * head_dim)) * itemsize
    else:
        flops = 2 * rows_per_warp * block_n * (head_dim + head_dim_v)
        bytes_read = (block_n * (head_dim + head_dim_v) + (0 if q_in_regs else rows_per_warp * head_dim)) * itemsize
    # fixed per-key-tile costs (two barriers, quad reductions, O rescale) amortize over block_n
    score = flops / bytes_read * block_n / (block_n + 48) * min(max(blocks, 0) * warps, 8) ** 0.25
    fits = regs <= _REG_BUDGET and smem <= backend.smem_limit(target) and blocks >= 1
    return ModelScore(registers=regs, smem_bytes=smem, blocks_per_sm=max(blocks, 0), fits=fits, score=score)


def model_params(target: Target | str, dtype: DType, head_dim: int, head_dim_v: int | None = None) -> dict[str, int]:
    target = resolve_target(target)
    best: tuple[float, dict[str, int]] | None = None
    for warps in (4, 8):
        for rows_per_warp in (16, 32):
            block_m = warps * rows_per_warp
            for block_n in (16, 32, 64, 128):
                for q_in_regs in (True, False):
                    params = {"BLOCK_M": block_m, "BLOCK_N": block_n, "WARPS": warps, "STAGES": 1,
                              "Q_IN_REGS": int(q_in_regs)}
                    scored = model_score(target, dtype, head_dim, params, head_dim_v)
                    if scored.fits and (best is None or scored.score > best[0]):
                        best = (scored.score, params)
    if best is None:
        raise UsageError(f"no tile configuration fits {target.arch} for {dtype.value} "
                         f"{head_dims_tag(head_dim, head_dim_v)}")
    return best[1]


# ---------------------------------------------------------------------------------------------
# The tuned files: one per GPU, written by `flashgen tune --write` (flashgen.translators.search)
# ---------------------------------------------------------------------------------------------

class TunedEntry(BaseModel):
    """The winner of one timed search, with what it was measured on."""

    params: dict[str, int]
    arch: str = Field(description="the code path the kernel was translated for (the target's arch)")
    geomean_ms: float
    times_ms: dict[str, float] = Field(description="shape text -> median ms of the winner")
    candidates_timed: int
    date: str
    gpu: str | None = Field(description="the device's own name, as the GPU worker read it")
    versions: dict[str, Any] = Field(default_factory=dict, description="driver, CUDA runtime, torch, nvcc")
    timer: str = Field(description="what timed it: 'gpu-worker' for a real run")
    by_size: list[SizeParams] = Field(default_factory=list, description="tiles that beat `params` at the shortest or "
                                      "longest lengths timed (`Params when` lines; flashgen.harness.tune.pick_by_size)")


class TunedFile(BaseModel):
    gpu: str = Field(description="flashgen target name, e.g. h200")
    entries: dict[str, TunedEntry] = Field(default_factory=dict, description="tuned_key(...) -> entry")


def tuned_key(dtype: DType, variant: Variant, head_dim: int, head_dim_v: int | None = None) -> str:
    return f"{dtype.value}/{variant.name}/{head_dims_tag(head_dim, head_dim_v)}"


def user_tuned_dir() -> Path:
    """Where `flashgen tune --write` stores winners: the user's config folder (FLASHGEN_HOME wins), never the
    installed package."""
    from flashgen.paths import config_dir

    return config_dir() / "tuned"


def tuned_dirs(directory: Path | None = None) -> list[Path]:
    """The tuned folders read, first match wins: `directory` alone when given, else the user's then the package's."""
    return [directory] if directory is not None else [user_tuned_dir(), TUNED_DIR]


def tuned_path(gpu: str, directory: Path | None = None) -> Path:
    """The tuned file of `gpu` in `directory` (default: the user's folder, where --write stores it)."""
    return (directory or user_tuned_dir()) / f"{gpu}.json"


def load_tuned(gpu: str, directory: Path | None = None) -> TunedFile:
    """The tuned file of `gpu` in `directory` (default: the user's; empty when there is none); a damaged file is a
    one-line UsageError naming it."""
    path = tuned_path(gpu, directory)
    if not path.is_file():
        return TunedFile(gpu=gpu)
    try:
        return TunedFile.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise UsageError(f"{path} is not a tuned-parameters file: {' '.join(str(exc).split())[:300]}") from None


def save_tuned(tuned: TunedFile, directory: Path | None = None) -> Path:
    """Write the tuned file (default: the user's folder) atomically; never into the installed package."""
    import os
    import tempfile

    path = tuned_path(tuned.gpu, directory)
    package = Path(__file__).resolve().parents[1]
    if path.resolve().is_relative_to(package):
        raise UsageError(f"{path}: tuned files are not written into the installed package; the user's folder is "
                         f"{user_tuned_dir()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = tuned.model_copy(update={"entries": dict(sorted(tuned.entries.items()))})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(ordered.model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------

ParamsSource = Literal["tuned", "measured", "defaults", "model"]


class ParamsChoice(BaseModel):
    params: dict[str, int]
    source: ParamsSource
    detail: str = Field(description="where exactly, in words")
    by_size: list[SizeParams] = Field(default_factory=list, description="tiles for ranges of sizes, over `params` "
                                      "(the TL's `Params when` lines; the backend's measured_by_size)")


def _table_detail(backend: Backend, table: str, key: tuple) -> str:
    # The label generated/*/meta.json and report.md record, kept as it was when the tables lived in this file (the
    # DEFAULTS key then began with the backend's name): a truthful one, backend.source_label, changes every
    # committed meta.json and report.md, which is a regeneration of its own.
    legacy_key = (backend.name, *key) if table == "DEFAULTS" else key
    return f"flashgen/translators/params.py {table}[{', '.join(map(str, legacy_key))}]"


def choose_params_with_source(variant: Variant, target: Target | str, dtype: DType, head_dim: int, *,
                               tuned_dir: Path | None = None, tuned: bool | None = None,
                               backend: str | None = None, head_dim_v: int | None = None) -> ParamsChoice:
    """Tile parameters and where they came from. `target` is a Target or a GPU name (h200: its tuned file is read
    first), or an arch (sm_80: the first known GPU of it, no tuned file). `tuned=False` skips the tuned file.
    `head_dim_v`: V's and O's own head dim: the tables are read at the larger of D and Dv (plan.choice_head_dim),
    and an entry must fit the shared memory with each tile at its own width."""
    if tuned is None:
        tuned = not (isinstance(target, str) and target.startswith("sm_"))
    target = resolve_target(target)
    backend = get_backend(backend) if backend else backend_for(target, variant, dtype)
    gpu, arch = (target.name if tuned else None), target.arch
    dtype = DType(dtype)
    itemsize = backend.smem_itemsize(target, dtype)
    limit = backend.smem_limit(target)

    def fits(found: dict[str, int]) -> bool:
        return _smem(found["BLOCK_M"], found["BLOCK_N"], head_dim, itemsize, found.get("STAGES", 1),
                     head_dim_v) <= limit

    key_text = tuned_key(dtype, variant, head_dim, head_dim_v)
    for directory in tuned_dirs(tuned_dir) if gpu is not None else []:  # the user's file over the package's
        entry = load_tuned(gpu, directory).entries.get(key_text)
        if entry is not None and entry.arch == arch and fits(entry.params):
            path = tuned_path(gpu, directory)
            where = f"flashgen/translators/tuned/{path.name}" if path.parent == TUNED_DIR else str(path)
            return ParamsChoice(params=_with_schedule(entry.params, variant), source="tuned",
                                detail=f"{where} [{key_text}]: {entry.geomean_ms:.4g} ms "
                                       f"geomean on {entry.gpu or gpu}, {entry.date}",
                                by_size=[line for line in entry.by_size if fits({**entry.params, **line.params})])
    order = launch_order(variant)
    # The tables hold the native head dims, and a few others where the native entry does not fit their budget
    # (checked with ptxas); any other head dim takes the entry of the nearest native one at or above it.
    wide = choice_head_dim(head_dim, head_dim_v)  # D, or the larger of D and Dv
    native = native_head_dim(wide)
    for d in dict.fromkeys((wide, native)):
        if head_dim_v is None:
            borrowed = "" if d == head_dim else f" (d{head_dim} takes the nearest native head dim at or above it)"
        else:
            borrowed = (f" ({head_dims_tag(head_dim, head_dim_v)} takes the entry of d{d}, "
                        + ("the larger of its head dims)" if d == wide else
                           "the nearest native head dim at or above the larger of its head dims)"))
        for source, table, key in (("measured", backend.measured, (arch, dtype.value, d, order)),
                                   ("defaults", backend.defaults, (dtype.value, d))):
            found = table.get(key)
            if found is not None and fits(found):
                by_size = [SizeParams.over(size, op, bound, tiles, found)
                           for size, op, bound, tiles in backend.measured_by_size.get(key, ()) if fits(tiles)] \
                    if source == "measured" else []
                return ParamsChoice(params=_with_schedule(found, variant), source=source,  # type: ignore[arg-type]
                                    detail=_table_detail(backend, source.upper(), key)
                                    + "".join(f"; at {line.condition}: measured_by_size" for line in by_size)
                                    + borrowed,
                                    by_size=by_size)
    return ParamsChoice(params=_with_schedule(model_params(target, dtype, head_dim, head_dim_v), variant),
                        source="model", detail=f"flashgen.translators.params.model_params({arch}, {dtype.value}, "
                                               f"{head_dims_tag(head_dim, head_dim_v)})")


def choose_size_params(variant: Variant, target: Target | str, dtype: DType, head_dim: int, *,
                       tuned: bool | None = None, backend: str | None = None,
                       head_dim_v: int | None = None) -> list[SizeParams]:
    """The tiles for ranges of sizes that go with choose_params' choice (its `Params when` lines; none where the
    choice is a tuned file's or a table's without them)."""
    return choose_params_with_source(variant, target, dtype, head_dim, tuned=tuned, backend=backend,
                                     head_dim_v=head_dim_v).by_size


def choose_params(variant: Variant, target: Target | str, dtype: DType, head_dim: int, *,
                  tuned: bool | None = None, backend: str | None = None,
                  head_dim_v: int | None = None) -> dict[str, int]:
    """Tile parameters for a variant on a target: a Target or GPU name (h200: its tuned file first) or an arch
    (sm_80). `tuned=False` skips the tuned file; `backend` names another code path than the target's choice;
    `head_dim_v`: V's and O's own head dim (choose_params_with_source)."""
    return choose_params_with_source(variant, target, dtype, head_dim, tuned=tuned, backend=backend,
                                     head_dim_v=head_dim_v).params


__all__ = ["TILE_KEYS", "ModelScore", "ParamsChoice", "TunedEntry", "TunedFile", "choose_params", "choose_size_params",
           "choose_params_with_source", "default_group_heads", "estimate_registers", "launch_order", "load_tuned",
           "model_params", "model_score", "save_tuned", "tuned_dirs", "tuned_key", "tuned_path", "user_tuned_dir"]
