"""Tile parameters (BLOCK_M, BLOCK_N, WARPS, STAGES, Q_IN_REGS) per target, dtype and head dim.

Two sources, in order: MEASURED, a committed table of values found by search on a GPU (keyed by arch
family, dtype, head dim); otherwise a small model: candidates that fit the target's per-block shared memory
and an estimated 255-register budget, scored by tensor-core work per shared-memory byte read (the mma.sync
path is bound by ldmatrix traffic), by resident blocks per SM, and by tail waste of the key tile.
"""

from __future__ import annotations

from flashgen.errors import UsageError
from flashgen.variant import DType, Variant

# (arch family, dtype, head_dim) -> params. Families: "sm80" (sm_80..sm_90, mma.sync path), "sm75".
# Filled from benchmarks/kernel_dev measurements on the H200 (see benchmarks/kernel_dev/NOTES.md).
# Run 2 on the H200 (results/bench_r2.json), bf16, causal and not, N 512..16k, geomean FLASH/ours:
# d64: 128x64w4q1 0.97 (vs 256x64w8 0.89, 128x32w4 0.74, 64x64w4 0.67); d128: 128x128w8q1 0.90,
# 128x64w4q0 0.91 but 196 B of spills on sm_80, 64x64w4 0.80. fp16 tracked bf16 in run 1.
MEASURED: dict[tuple[str, str, int], dict[str, int]] = {
    **{("sm80", dt, 64): {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 1, "Q_IN_REGS": 1} for dt in ("fp16", "bf16")},
    **{("sm80", dt, 128): {"BLOCK_M": 128, "BLOCK_N": 128, "WARPS": 8, "STAGES": 1, "Q_IN_REGS": 1} for dt in ("fp16", "bf16")},
}

# Starting points before measurement: FA2-shaped tiles checked spill-free with `nvcc -Xptxas -v` for sm_80
# (4 warps x 32 rows keep Q in registers at d64; 8 warps x 16 rows from d96 up keep O + S under 255 registers).
_P = lambda bm, bn, w, q: {"BLOCK_M": bm, "BLOCK_N": bn, "WARPS": w, "STAGES": 1, "Q_IN_REGS": q}
DEFAULTS: dict[tuple[str, str, int], dict[str, int]] = {
    **{("sm80", dt, 64): _P(128, 64, 4, 1) for dt in ("fp16", "bf16")},
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


def estimate_registers(block_m: int, block_n: int, warps: int, head_dim: int, q_in_regs: bool, itemsize: int) -> int:
    rows = block_m // warps
    acc_o = rows * head_dim // 32
    acc_s = rows * block_n // 32
    q_frag = rows * head_dim * (4 if itemsize == 4 else 2) // 4 // 32 if q_in_regs else 0
    return acc_o + acc_s + q_frag + _REG_OVERHEAD


def _smem(block_m: int, block_n: int, head_dim: int, itemsize: int) -> int:
    from flashgen.translators.render import _tile_bytes

    return _tile_bytes(block_m, head_dim, itemsize) + 2 * _tile_bytes(block_n, head_dim, itemsize)


def model_params(arch: str, dtype: DType, head_dim: int) -> dict[str, int]:
    from flashgen.translators.render import smem_limit

    limit = smem_limit(arch)
    from flashgen.translators.render import smem_itemsize

    itemsize = smem_itemsize(arch, dtype)
    smem_per_sm = {"sm_75": 64 << 10, "sm_86": 100 << 10, "sm_89": 100 << 10}.get(arch, 164 << 10)
    best: tuple[float, dict[str, int]] | None = None
    for warps in (4, 8):
        for rows_per_warp in (16, 32):
            block_m = warps * rows_per_warp
            for block_n in (16, 32, 64, 128):
                for q_in_regs in (True, False):
                    regs = estimate_registers(block_m, block_n, warps, head_dim, q_in_regs, itemsize)
                    smem = _smem(block_m, block_n, head_dim, itemsize)
                    if regs > _REG_BUDGET or smem > limit:
                        continue
                    blocks = min(smem_per_sm // smem, 65536 // (max(regs, 64) * 32 * warps))
                    if blocks < 1:
                        continue
                    # flops per smem byte read by one warp per key tile: QK^T + PV over (K, V [, Q])
                    flops = 4 * rows_per_warp * block_n * head_dim
                    bytes_read = (2 * block_n * head_dim + (0 if q_in_regs else rows_per_warp * head_dim)) * itemsize
                    # fixed per-key-tile costs (two barriers, quad reductions, O rescale) amortize over block_n
                    score = flops / bytes_read * block_n / (block_n + 48) * min(blocks * warps, 8) ** 0.25
                    params = {"BLOCK_M": block_m, "BLOCK_N": block_n, "WARPS": warps, "STAGES": 1,
                              "Q_IN_REGS": int(q_in_regs)}
                    if best is None or score > best[0]:
                        best = (score, params)
    if best is None:
        raise UsageError(f"no tile configuration fits {arch} for {dtype.value} d{head_dim}")
    return best[1]


def choose_params(variant: Variant, target: str, dtype: DType, head_dim: int) -> dict[str, int]:
    """Tile parameters for a variant on a target. `target` is an arch (sm_80) or a GPU name (h200)."""
    arch = target
    if not target.startswith("sm_"):
        from flashgen.targets import get_target

        arch = get_target(target).arch
    from flashgen.translators.render import smem_itemsize, smem_limit

    key = (_family(arch), dtype.value, head_dim)
    itemsize = smem_itemsize(arch, dtype)
    for table in (MEASURED, DEFAULTS):
        found = table.get(key)
        if found is not None and _smem(found["BLOCK_M"], found["BLOCK_N"], head_dim, itemsize) <= smem_limit(arch):
            return dict(found)
    return model_params(arch, dtype, head_dim)
