"""GPU targets: the hardware facts translators, the checker and the roofline model need.

(The data table is filled in below; every number names its source in a comment.)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MmaShape(BaseModel):
    model_config = ConfigDict(frozen=True)
    instruction: str = Field(description="e.g. mma.sync.aligned.m16n8k16")
    m: int
    n: int
    k: int
    input_dtypes: tuple[str, ...] = Field(description="fp16, bf16, tf32, ...")
    accumulate: str = "fp32"


class Target(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(description="canonical lower-case key, e.g. a100")
    aliases: tuple[str, ...] = ()
    marketing_name: str
    arch: str = Field(description="sm_75, sm_80, sm_86, sm_89, sm_90")
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int = Field(description="opt-in maximum dynamic shared memory per block")
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    l2_bytes: int
    mma: tuple[MmaShape, ...]
    peak_tflops: dict[str, float] = Field(description="dense tensor-core TFLOP/s per input dtype (fp32 = plain FMA)")
    mem_bandwidth_gbs: float
    has_cp_async: bool
    has_bf16_mma: bool
