"""Tile parameters (BLOCK_M, BLOCK_N, WARPS, STAGES, Q_IN_REGS) and the launch order (GROUP_HEADS) per target,
dtype, head dim and variant.

Sources, in order: a tuned file (flashgen/translators/tuned/<gpu>.json, written by `flashgen tune --write`
after a timed search on that GPU, keyed by dtype, variant and head dim); MEASURED, a committed table of values
from manual sweeps on a GPU (keyed by arch, dtype, head dim and launch order); DEFAULTS, spill-checked starting
points per arch family; GROUP_HEADS (the launch order) follows `default_group_heads` where a source is silent;
otherwise a small model: candidates that fit the target's per-block shared memory
and an estimated 255-register budget, scored by tensor-core work per shared-memory byte read (the mma.sync
path is bound by ldmatrix traffic), by resident blocks per SM, and by tail waste of the key tile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from flashgen.errors import UsageError
from flashgen.variant import DType, Variant

TUNED_DIR = Path(__file__).parent / "tuned"
# GROUP_HEADS (the launch order; default_group_heads(variant) when absent) is a schedule parameter, not a tile one,
# but it travels with them
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "WARPS", "STAGES", "Q_IN_REGS", "GROUP_HEADS")

_P = lambda bm, bn, w, q, s=1: {"BLOCK_M": bm, "BLOCK_N": bn, "WARPS": w, "STAGES": s, "Q_IN_REGS": q}

# (arch, dtype, head_dim, order) -> params, measured on a GPU of that arch (benchmarks/kernel_dev/NOTES.md has the
# sweeps). order: "causal" (causal rows, window) or "full". Session 2 on the H200, bf16, N 512 / 2k / 8k, B*N = 16k,
# geomean FLASH time / ours: d64 full 128x64w4q1s2 1.004; d64 causal 128x64w4q1s2g0 1.091; d128 full 128x64w4q0s2g2
# 1.012 (128x128w8q1s1 0.916); d128 causal 128x64w4q0s1g0 1.099 (s2: 1.009 with g1). 128x64w4q0 holds 36 B of
# loop-invariant values in local memory on sm_90 (3-5 LDL per key tile, L1 hits), which the timings include.
MEASURED: dict[tuple[str, str, int, str], dict[str, int]] = {
    **{("sm_90", dt, 64, "full"): {**_P(128, 64, 4, 1, 2), "GROUP_HEADS": 1} for dt in ("fp16", "bf16")},
    **{("sm_90", dt, 64, "causal"): {**_P(128, 64, 4, 1, 2), "GROUP_HEADS": 0} for dt in ("fp16", "bf16")},
    **{("sm_90", dt, 128, "full"): {**_P(128, 64, 4, 0, 2), "GROUP_HEADS": 2} for dt in ("fp16", "bf16")},
    **{("sm_90", dt, 128, "causal"): {**_P(128, 64, 4, 0, 1), "GROUP_HEADS": 0} for dt in ("fp16", "bf16")},
}

# Starting points where nothing was measured on the arch (A100, Ada, Turing): tiles checked spill-free with
# `nvcc -Xptxas -v` for sm_80 (4 warps x 32 rows keep Q in registers at d64; 8 warps x 16 rows from d96 up keep
# O + S under 255 registers). Keyed by arch family: "sm80" (sm_80 .. sm_90, the mma.sync path) or "sm75".
DEFAULTS: dict[tuple[str, str, int], dict[str, int]] = {
    **{("sm80", dt, 64): _P(128, 64, 4, 1, 2) for dt in ("fp16", "bf16")},  # STAGES=2 as measured on sm_90
    **{("sm80", dt, 96): _P(128, 64, 8, 1) for dt in ("fp16", "bf16")},
    **{("sm80", dt, 128): _P(128, 128, 8, 1) for dt in ("fp16", "bf16")},
    **{("sm80", dt, 256): _P(128, 32, 8, 0) for dt in ("fp16", "bf16")},
    ("sm80", "fp32", 64): _P(64, 64, 4, 0),
    ("sm80", "fp32", 96): _P(64, 32, 4, 0),
    ("sm80", "fp32", 128): _P(64, 32, 4, 0),
    ("sm80", "fp32", 256): _P(64, 16, 4, 0),
    # Turing: 64 KB of shared memory and the register-staged loads (a K or V tile in flight per thread)
    **{("sm75", "fp16", d): _P(64, 64, 4, 1) for d in (64, 96)},
    ("sm75", "fp16", 128): _P(64, 32, 4, 1),
    ("sm75", "fp16", 256): _P(64, 16, 4, 0),
    # bf16/fp32 on Turing use fp16 tiles too (scaled on the way in); fp32 stages twice the registers per tile
    **{("sm75", dt, 64): _P(64, 64, 4, 1) for dt in ("bf16", "fp32")},
    **{("sm75", dt, d): _P(64, 32, 4, 1) for dt in ("bf16", "fp32") for d in (96, 128)},
    **{("sm75", dt, 256): _P(64, 16, 4, 0) for dt in ("bf16", "fp32")},
}

_REG_BUDGET = 255
_REG_OVERHEAD = 48  # addresses, loop state, softmax statistics, ldmatrix operands


def _family(arch: str) -> str:
    return "sm75" if arch == "sm_75" else "sm80"


def launch_order(variant: Variant) -> str:
    """"causal" where query blocks differ in work (causal rows, windows; split-KV decode has its own grid), else
    "full": the two want different launch orders (GROUP_HEADS)."""
    return "causal" if variant.causal and not variant.split_kv else "full"


def default_group_heads(variant: Variant) -> int:
    """GROUP_HEADS when a table or a tuned file does not say: 1 for full rows (one head's query blocks back to back,
    so K/V come from L2: +4% at d128 on the H200 against all heads interleaved), 0 for causal rows (every head's
    longest blocks first: +4-7% against one head at a time, whose last heads' long blocks end the launch late)."""
    return 0 if launch_order(variant) == "causal" else 1


def _with_schedule(params: dict[str, int], variant: Variant) -> dict[str, int]:
    return {**params, "GROUP_HEADS": params.get("GROUP_HEADS", default_group_heads(variant))}


def estimate_registers(block_m: int, block_n: int, warps: int, head_dim: int, q_in_regs: bool, itemsize: int) -> int:
    rows = block_m // warps
    acc_o = rows * head_dim // 32
    acc_s = rows * block_n // 32
    q_frag = rows * head_dim * (4 if itemsize == 4 else 2) // 4 // 32 if q_in_regs else 0
    return acc_o + acc_s + q_frag + _REG_OVERHEAD


def _smem(block_m: int, block_n: int, head_dim: int, itemsize: int, stages: int = 1) -> int:
    from flashgen.translators.render import tiles_bytes

    return tiles_bytes(block_m, block_n, head_dim, itemsize, stages)


class ModelScore(BaseModel):
    """What the occupancy model thinks of one set of tile parameters."""

    registers: int = Field(description="estimated registers per thread")
    smem_bytes: int
    blocks_per_sm: int = Field(description="resident blocks per SM by shared memory and registers")
    fits: bool = Field(description="within the register budget, the per-block shared memory and >= 1 block per SM")
    score: float = Field(description="higher is likelier fast: mma work per shared-memory byte, tile overhead, "
                         "occupancy")


def model_score(arch: str, dtype: DType, head_dim: int, params: dict[str, int]) -> ModelScore:
    from flashgen.translators.render import smem_itemsize, smem_limit

    itemsize = smem_itemsize(arch, dtype)
    block_m, block_n, warps = int(params["BLOCK_M"]), int(params["BLOCK_N"]), int(params["WARPS"])
    q_in_regs = bool(params.get("Q_IN_REGS", 1))
    smem_per_sm = {"sm_75": 64 << 10, "sm_86": 100 << 10, "sm_89": 100 << 10}.get(arch, 164 << 10)
    regs = estimate_registers(block_m, block_n, warps, head_dim, q_in_regs, itemsize)
    smem = _smem(block_m, block_n, head_dim, itemsize, int(params.get("STAGES", 1)))
    blocks = min(smem_per_sm // smem, 65536 // (max(regs, 64) * 32 * warps))
    rows_per_warp = block_m // warps
    # flops per smem byte read by one warp per key tile: QK^T + PV over (K, V [, Q])
    flops = 4 * rows_per_warp * block_n * head_dim
    bytes_read = (2 * block_n * head_dim + (0 if q_in_regs else rows_per_warp * head_dim)) * itemsize
    # fixed per-key-tile costs (two barriers, quad reductions, O rescale) amortize over block_n
    score = flops / bytes_read * block_n / (block_n + 48) * min(max(blocks, 0) * warps, 8) ** 0.25
    fits = regs <= _REG_BUDGET and smem <= smem_limit(arch) and blocks >= 1
    return ModelScore(registers=regs, smem_bytes=smem, blocks_per_sm=max(blocks, 0), fits=fits, score=score)


def model_params(arch: str, dtype: DType, head_dim: int) -> dict[str, int]:
    best: tuple[float, dict[str, int]] | None = None
    for warps in (4, 8):
        for rows_per_warp in (16, 32):
            block_m = warps * rows_per_warp
            for block_n in (16, 32, 64, 128):
                for q_in_regs in (True, False):
                    params = {"BLOCK_M": block_m, "BLOCK_N": block_n, "WARPS": warps, "STAGES": 1,
                              "Q_IN_REGS": int(q_in_regs)}
                    scored = model_score(arch, dtype, head_dim, params)
                    if scored.fits and (best is None or scored.score > best[0]):
                        best = (scored.score, params)
    if best is None:
        raise UsageError(f"no tile configuration fits {arch} for {dtype.value} d{head_dim}")
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


class TunedFile(BaseModel):
    gpu: str = Field(description="flashgen target name, e.g. h200")
    entries: dict[str, TunedEntry] = Field(default_factory=dict, description="tuned_key(...) -> entry")


def tuned_key(dtype: DType, variant: Variant, head_dim: int) -> str:
    return f"{dtype.value}/{variant.name}/d{head_dim}"


def tuned_path(gpu: str, directory: Path | None = None) -> Path:
    return (directory or TUNED_DIR) / f"{gpu}.json"


def load_tuned(gpu: str, directory: Path | None = None) -> TunedFile:
    """The tuned file of `gpu` (empty when there is none); a damaged file is a one-line UsageError."""
    path = tuned_path(gpu, directory)
    if not path.is_file():
        return TunedFile(gpu=gpu)
    try:
        return TunedFile.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise UsageError(f"{path} is not a tuned-parameters file: {' '.join(str(exc).split())[:300]}") from None


def save_tuned(tuned: TunedFile, directory: Path | None = None) -> Path:
    path = tuned_path(tuned.gpu, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = tuned.model_copy(update={"entries": dict(sorted(tuned.entries.items()))})
    path.write_text(ordered.model_dump_json(indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------

ParamsSource = Literal["tuned", "measured", "defaults", "model"]


class ParamsChoice(BaseModel):
    params: dict[str, int]
    source: ParamsSource
    detail: str = Field(description="where exactly, in words")


def choose_params_with_source(variant: Variant, target: str, dtype: DType, head_dim: int, *,
                               tuned_dir: Path | None = None) -> ParamsChoice:
    """Tile parameters and where they came from. `target` is an arch (sm_80: no tuned file applies) or a
    GPU name (h200: its tuned file is read first)."""
    from flashgen.translators.render import smem_itemsize, smem_limit

    gpu = None
    arch = target
    if not target.startswith("sm_"):
        from flashgen.targets import get_target

        resolved = get_target(target)
        gpu, arch = resolved.name, resolved.arch
    itemsize = smem_itemsize(arch, dtype)

    def fits(found: dict[str, int]) -> bool:
        return _smem(found["BLOCK_M"], found["BLOCK_N"], head_dim, itemsize, found.get("STAGES", 1)) <= smem_limit(arch)

    if gpu is not None:
        entry = load_tuned(gpu, tuned_dir).entries.get(tuned_key(dtype, variant, head_dim))
        if entry is not None and entry.arch == arch and fits(entry.params):
            path = tuned_path(gpu, tuned_dir)
            where = f"flashgen/translators/tuned/{path.name}" if path.parent == TUNED_DIR else str(path)
            return ParamsChoice(params=_with_schedule(entry.params, variant), source="tuned",
                                detail=f"{where} [{tuned_key(dtype, variant, head_dim)}]: {entry.geomean_ms:.4g} ms "
                                       f"geomean on {entry.gpu or gpu}, {entry.date}")
    order = launch_order(variant)
    for source, table, key in (("measured", MEASURED, (arch, dtype.value, head_dim, order)),
                               ("defaults", DEFAULTS, (_family(arch), dtype.value, head_dim))):
        found = table.get(key)
        if found is not None and fits(found):
            return ParamsChoice(params=_with_schedule(found, variant), source=source,  # type: ignore[arg-type]
                                detail=f"flashgen/translators/params.py {source.upper()}[{', '.join(map(str, key))}]")
    return ParamsChoice(params=_with_schedule(model_params(arch, dtype, head_dim), variant), source="model",
                        detail=f"flashgen.translators.params.model_params({arch}, {dtype.value}, d{head_dim})")


def choose_params(variant: Variant, target: str, dtype: DType, head_dim: int) -> dict[str, int]:
    """Tile parameters for a variant on a target. `target` is an arch (sm_80) or a GPU name (h200)."""
    return choose_params_with_source(variant, target, dtype, head_dim).params
