"""The sm75 backend: Turing (T4, Quadro RTX 8000).

mma.sync m16n8k8 with fp16 inputs only (m16n8k16 is two of them, mma.cuh), no cp.async: a tile is staged through
registers (`tile_loader` in include/flashgen/sm75.cuh: issue() loads into registers, land() stores them), so one
K/V stage. bf16 and fp32 inputs run on the fp16 tensor cores as per-tile power-of-two scaled fp16 tiles
(attention_fwd_scaled.cu.j2, docs/turing-dtypes.md); fp16 renders the shared skeleton.
"""

from __future__ import annotations

from flashgen.targets import Target
from flashgen.translators.backends.base import Backend, tile_params, tiles_bytes
from flashgen.translators.plan import KernelPlan, choice_head_dim
from flashgen.variant import DType

_P = tile_params
_NOTE = ("{dtype} inputs on sm_75 run on fp16 tensor cores: each Q/K/V tile is stored as fp16 x * 2^-e "
         "(e from the tile's max |x|), scales folded back exactly in fp32 (docs/turing-dtypes.md)")


class Sm75Backend(Backend):
    name = "sm75"
    archs = ("sm_75",)
    max_stages = 1
    mma_instructions = {"fp16": "mma.sync.aligned.m16n8k8", "bf16": "mma.sync.aligned.m16n8k8 (scaled fp16 tiles)",
                        "fp32": "mma.sync.aligned.m16n8k8 (scaled fp16 tiles)"}
    arch_header = "sm75.cuh"
    # 64 KB of shared memory and the register-staged loads (a K or V tile in flight per thread); bf16/fp32 use fp16
    # tiles too (scaled on the way in), fp32 stages twice the registers per tile. Checked spill-free with ptxas.
    defaults = {
        **{("fp16", d): _P(64, 64, 4, 1) for d in (64, 96)},
        ("fp16", 128): _P(64, 32, 4, 1),
        ("fp16", 256): _P(64, 16, 4, 0),
        **{(dt, 64): _P(64, 64, 4, 1) for dt in ("bf16", "fp32")},
        **{(dt, d): _P(64, 32, 4, 1) for dt in ("bf16", "fp32") for d in (96, 128)},
        **{(dt, 256): _P(64, 16, 4, 0) for dt in ("bf16", "fp32")},
    }

    def scaled(self, plan: KernelPlan) -> bool:
        """bf16/fp32: per-tile power-of-two scaled fp16 tiles on the fp16-only tensor cores."""
        return not self.tensor_cores_take(plan.target, plan.dtype)

    def smem_itemsize(self, target: Target, dtype: DType) -> int:
        # where the tensor cores do not take the dtype, tiles are staged as scaled fp16 (docs/turing-dtypes.md)
        return DType.fp16.itemsize if not self.tensor_cores_take(target, dtype) else DType(dtype).itemsize

    def smem_bytes(self, plan: KernelPlan) -> int:
        # scaled tiles store O from registers: Q's region holds no O staging tile
        tiles = tiles_bytes(plan.block_m, plan.block_n, plan.head_dim, self.smem_itemsize(plan.target, plan.dtype),
                            plan.stages, plan.head_dim_v, o_staged=not self.scaled(plan))
        # scaled tiles: one fp32 block-max slot per warp for each of the Q, K and V loaders
        return tiles + (3 * 4 * plan.warps if self.scaled(plan) else 0)

    def early_words(self, plan: KernelPlan) -> int:
        """16-byte words per thread a scaled tile loader keeps in flight across the GEMMs (the rest of the tile is
        read inside land()). Chosen spill-free with ptxas for sm_75 at every head dim: from d240 up the O accumulator
        (D/2 registers a thread at 16 rows a warp) leaves no room (d240 and d248 causal bf16 spill with 4). A V head
        dim of its own counts as the larger of D and Dv (plan.choice_head_dim)."""
        return 0 if choice_head_dim(plan.head_dim, plan.head_dim_v) >= 240 else 4

    def template(self, plan: KernelPlan) -> str:
        return "sm75/attention_fwd_scaled.cu.j2" if self.scaled(plan) else super().template(plan)

    def warp_mma(self, plan: KernelPlan) -> str:
        if self.scaled(plan):
            return f"fg::warp::attn_mma16<fg::f16, MT, D, D_PAD, BLOCK_N, {str(plan.q_in_regs).lower()}, BLOCK_M>"
        return super().warp_mma(plan)

    def warp_mma_v(self, plan: KernelPlan) -> str:
        if self.scaled(plan):
            return "fg::warp::attn_mma16<fg::f16, MT, DV, DV_PAD, BLOCK_N, false, BLOCK_M>"
        return super().warp_mma_v(plan)

    def packed_p(self, plan: KernelPlan) -> bool:
        # the rescaled tiles keep fp32 P (P is scaled to V's tile unit before it is rounded to fp16)
        return super().packed_p(plan) and not self.scaled(plan)

    def context(self, plan: KernelPlan) -> dict:
        return {**super().context(plan), "turing_early_words": self.early_words(plan)}

    def notes(self, plan: KernelPlan) -> str:
        return _NOTE.format(dtype=plan.dtype.value) if self.scaled(plan) else super().notes(plan)


BACKEND = Sm75Backend()

__all__ = ["BACKEND", "Sm75Backend"]
