"""The sm90 backend: Hopper's own path (H100, H200): TMA, wgmma and warp specialization (sm_90a).

A persistent grid (one CTA per SM walking the work tiles): a producer warpgroup (one thread issuing
`cp.async.bulk.tensor` loads that complete on mbarriers) feeds a ring of STAGES 128-byte-swizzled K/V stages and
runs on into the next work tile; consumer warpgroups of 64 query rows each run S = Q K^T with both operands in
shared memory and O += P V with P from registers, the next tile's S issued before this one's P V (kernel.py,
templates/attention_fwd.cu.j2, the primitives in include/flashgen/sm90.cuh). It takes fp16 and bf16; fp32 (tf32) and split-KV decode stay on the sm80 path, which
`accepts` says and the lowering notes. It translates programs written in the Hopper dataflow (Role blocks, staged
async copies: docs/llm-tl.md); their roles, warps and stages are read and checked by dataflow.py. What the kernel
implements (stages, dtypes, warps per role) is flashgen.targets.ROLE_DATAFLOW["sm_90"].
"""

from __future__ import annotations

from flashgen.targets import Target, role_dataflow
from flashgen.translators.backends.base import Backend, SearchSpace
from flashgen.translators.backends.sm90 import kernel
from flashgen.translators.plan import KernelPlan
from flashgen.variant import DType, Variant


def _p(bm: int, bn: int, stages: int = 2) -> dict[str, int]:
    # WARPS counts the consumer warps (4 per 64-row warpgroup); the producer warpgroup comes on top
    return {"BLOCK_M": bm, "BLOCK_N": bn, "WARPS": bm // 16, "STAGES": stages, "Q_IN_REGS": 1}


_FLOW = role_dataflow("sm_90")
assert _FLOW is not None


class Sm90Backend(Backend):
    name = "sm90"
    archs = ("sm_90",)
    max_stages = _FLOW.max_stages
    role_dataflow = True
    mma_instructions = {"fp16": "wgmma.mma_async.sync.aligned.m64n256k16 (m64nNk16, N = BLOCK_N and D)",
                        "bf16": "wgmma.mma_async.sync.aligned.m64n256k16 (m64nNk16, N = BLOCK_N and D)"}
    arch_header = "sm90.cuh"
    own_renderer = True
    # On the H200 (benchmarks/kernel_dev/NOTES.md), bf16, N 512..16k, B*N = 16k; fp16 follows bf16. Session 3:
    # d64 three consumers 192x128 (+9 % over 128x128 at 16k); d256 128x80 (+4 % over 128x64, O from registers).
    # Session 6, with O through TMA stores wherever its staging fits (kernel.schedule): d128 128x128 for every row
    # (+12 / +8 / +5 / +1 % over session 3's 128x176, whose O must leave from registers, at N = 512 / 1k / 4k / 16k);
    # causal d256 128x64, whose O goes out two chunks at a time (+34 / +23 / +1 % over 128x80 at 512 / 1k / 4k, -9 %
    # at 16k: causal d256 at small N was the grid's worst shape). Session 10: full-row d256 128x64 too (O two chunks
    # at a time), +19 / +9 / +4 / +1 / -2 % over 128x80 from registers at N = 512 / 1k / 2k / 4k / 16k.
    measured = {
        **{("sm_90", dt, 64, order): _p(192, 128) for dt in ("fp16", "bf16") for order in ("full", "causal")},
        **{("sm_90", dt, 128, order): _p(128, 128) for dt in ("fp16", "bf16") for order in ("full", "causal")},
        **{("sm_90", dt, 256, order): _p(128, 64) for dt in ("fp16", "bf16") for order in ("full", "causal")},
    }
    # Sessions 10 and 11 (bf16, the snake walk): causal d64 at 128x128 +12 / +10 % and +11 / +10 % over 192x128 at
    # N = 512 / 1k, -3 % at 2k: the third consumer's 64 rows of the last query block are a third empty where N is
    # short (ncu at N = 512: 1.35x cuDNN's scores computed).
    measured_by_size = {("sm_90", dt, 64, "causal"): (("N", "<=", 1024, _p(128, 128)),) for dt in ("fp16", "bf16")}
    defaults = {(dt, d): _p(*tiles) for dt in ("fp16", "bf16")
                for d, tiles in ((64, (192, 128)), (96, (128, 128)), (128, (128, 128)), (256, (128, 80)))}
    search_space = SearchSpace(block_m=(128, 192), block_n=(64, 80, 96, 128, 176), warps=(8, 12), stages=(2, 3),
                               q_in_regs=(1,), group_heads=(1, 0))

    def accepts(self, variant: Variant | None, dtype: DType | None) -> bool:
        """fp16/bf16 without split-KV (flashgen.targets.ROLE_DATAFLOW); the rest stays on the sm80 path."""
        return (dtype is None or DType(dtype).value in _FLOW.dtypes) \
            and not (variant and variant.split_kv and not _FLOW.split_kv)

    def choice_note(self, target: Target) -> str:
        # the measurement behind the choice: docs/performance.md ("sm_80 path beside the sm_90 path")
        return (f"the Hopper path, taken on {target.arch} for fp16/bf16: measured faster than the sm80 path on every "
                "shape of the Hopper grid on the H200 (docs/performance.md)")

    def compile_arch(self, target: Target) -> str:
        return target.feature_arch or "sm_90a"

    def smem_bytes(self, plan: KernelPlan) -> int:
        return kernel.smem_bytes(plan)

    def validate(self, plan: KernelPlan) -> None:
        kernel.validate(plan)

    def render(self, plan: KernelPlan):
        return kernel.render(plan)

    def notes(self, plan: KernelPlan) -> str:
        return kernel.NOTES.format(consumers=kernel.consumers(plan))


BACKEND = Sm90Backend()
