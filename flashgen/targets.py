"""GPU targets: the hardware facts translators, the checker and the roofline model need.

Every number names its source in a comment. Abbreviations used there:
- [CC]   CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" table
         (shared memory per SM / per block opt-in, registers, threads and blocks per SM).
- [THR]  CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table
         (16 results/clock/SM for the special-function unit on 7.5, 8.x and 9.0).
- [PTX]  PTX ISA, "Warp-level matrix multiply-accumulate instructions" (mma shapes per type and the
         minimum sm) and "Asynchronous warpgroup level matrix multiply" (wgmma, sm_90a only).
- [TU]   NVIDIA Turing GPU Architecture whitepaper (T4 and Quadro RTX 8000 appendix tables).
- [GA100] NVIDIA A100 Tensor Core GPU Architecture whitepaper; [A100-DS] A100 80GB datasheet.
- [GA102] NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3090, A10 tables).
- [A10-DS] NVIDIA A10 datasheet.  [L4-DS] NVIDIA L4 datasheet.
- [ADA]  NVIDIA Ada GPU Architecture whitepaper (RTX 4090 table).
- [GH100] NVIDIA H100 Tensor Core GPU Architecture whitepaper; [H100-DS] H100 datasheet.
- [H200-DS] NVIDIA H200 datasheet (sparse figures halved for dense).
- [ANCHORS] /work/shared/reference/anchors.md: measured on one H200 (device query + benchmarks).
- [GPUB]  te42kyfo/gpu-benches (github), gpu-l2-cache/*.txt: L2 read bandwidth measured with one block
          per SM re-reading an L2-resident buffer (files h200.txt, h100_pcie.txt, a100_80.txt, l40.txt);
          its README's cuda-cache example gives 2544 GB/s L2 read on a V100 PCIe (80 SMs, 1380 MHz).
- [L2RULE] where no measurement of the part was found: a measured part's L2 bytes/clock/SM times this
          part's SM count and boost clock. Ada/GA102 from the L40 (AD102, 142 SMs, 2490 MHz boost,
          5.2 TB/s [GPUB] -> 14.7 B/clk/SM; GA102 has no published figure, so it takes its successor's
          rate); Turing from the V100 (23.0 B/clk/SM [GPUB]), whose memory hierarchy TU104 shares
          (Jia et al., "Dissecting the NVidia Turing T4 GPU via Microbenchmarking", arXiv 1903.07486).

Tensor TFLOP/s are dense (no 2:4 sparsity) with fp32 accumulation, the way flashgen's kernels
accumulate. GeForce parts (RTX 3090, RTX 4090) run fp16/bf16 mma with fp32 accumulate at half
their fp16-accumulate rate; those rows use the fp32-accumulate figure. "fp32" is plain FP32 FMA
throughput (CUDA cores, 2 flops per FMA), not a tensor rate.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from flashgen.errors import UsageError
from flashgen.variant import DType


class MmaShape(BaseModel):
    model_config = ConfigDict(frozen=True)
    instruction: str = Field(description="e.g. mma.sync.aligned.m16n8k16")
    m: int
    n: int
    k: int
    input_dtypes: tuple[str, ...] = Field(description="fp16, bf16, tf32, ...")
    accumulate: str = "fp32"
    n_choices: tuple[int, ...] = Field(default=(), description="wgmma: every N the instruction takes (n is the largest)")
    requires_arch: str | None = Field(default=None, description="nvcc arch the instruction needs when not the target's "
                                      "plain arch, e.g. sm_90a for wgmma")


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
    l2_bandwidth_gbs: float = Field(description="L2 read bandwidth all SMs together can draw (microbenchmark "
                                    "figure or [L2RULE]); the roofline's rate for traffic that re-reads tiles")
    has_cp_async: bool
    has_bf16_mma: bool
    # Added fields (the roofline and the checker use them).
    boost_clock_mhz: float = Field(description="clock the datasheet's peak figures are computed at")
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_threads_per_block: int = 1024
    sfu_ops_per_clk_per_sm: int = Field(default=16, description="[THR] exp2/log2/rcp/rsqrt/sin/cos results per clock per SM")
    shared_bytes_per_clk_per_sm: int = Field(default=128, description="32 banks x 4 bytes per clock [CC shared memory section]")
    feature_arch: str | None = Field(default=None, description="arch-specific nvcc target unlocking extra instructions "
                                     "(sm_90a: wgmma, setmaxnreg)")
    has_tma: bool = False
    measured: dict[str, float] = Field(default_factory=dict, description="measured ceilings on a real device: "
                                       "'<dtype>_gemm_tflops', 'copy_gbs' (read + write), 'l2_gbs'")

    @property
    def tensor_dtypes(self) -> tuple[str, ...]:
        """Input dtypes some mma instruction of this target takes."""
        return tuple(sorted({d for shape in self.mma for d in shape.input_dtypes}))


_KB = 1024
_MB = 1024 * 1024

# [PTX] mma.sync shapes. Turing (sm_75) has fp16 m16n8k8 (and the older m8n8k4) plus integer
# m8n8k16; bf16 and tf32 mma start at sm_80.
_MMA_SM75 = (
    MmaShape(instruction="mma.sync.aligned.m16n8k8", m=16, n=8, k=8, input_dtypes=("fp16",)),
    MmaShape(instruction="mma.sync.aligned.m8n8k16", m=8, n=8, k=16, input_dtypes=("s8", "u8"), accumulate="s32"),
)
_MMA_SM80 = (
    MmaShape(instruction="mma.sync.aligned.m16n8k16", m=16, n=8, k=16, input_dtypes=("fp16", "bf16")),
    MmaShape(instruction="mma.sync.aligned.m16n8k8", m=16, n=8, k=8, input_dtypes=("fp16", "bf16")),
    MmaShape(instruction="mma.sync.aligned.m16n8k8", m=16, n=8, k=8, input_dtypes=("tf32",)),
)
# [PTX] wgmma: M=64 per warpgroup, N any multiple of 8 in 8..256, K=16 for fp16/bf16 and 8 for tf32.
_WGMMA_N = tuple(range(8, 257, 8))
_MMA_SM90 = _MMA_SM80 + (
    MmaShape(instruction="wgmma.mma_async.sync.aligned.m64n256k16", m=64, n=256, k=16, input_dtypes=("fp16", "bf16"),
             n_choices=_WGMMA_N, requires_arch="sm_90a"),
    MmaShape(instruction="wgmma.mma_async.sync.aligned.m64n256k8", m=64, n=256, k=8, input_dtypes=("tf32",),
             n_choices=_WGMMA_N, requires_arch="sm_90a"),
)

# Per-compute-capability facts, all [CC]: max shared memory per SM, max per block (opt-in),
# resident threads and blocks per SM.
_CC75 = {"arch": "sm_75", "compute_capability": (7, 5), "smem_per_sm_bytes": 64 * _KB,
         "smem_per_block_bytes": 64 * _KB, "max_threads_per_sm": 1024, "max_blocks_per_sm": 16, "mma": _MMA_SM75,
         "has_cp_async": False, "has_bf16_mma": False}
_CC80 = {"arch": "sm_80", "compute_capability": (8, 0), "smem_per_sm_bytes": 164 * _KB,
         "smem_per_block_bytes": 163 * _KB, "max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "mma": _MMA_SM80,
         "has_cp_async": True, "has_bf16_mma": True}
_CC86 = {"arch": "sm_86", "compute_capability": (8, 6), "smem_per_sm_bytes": 100 * _KB,
         "smem_per_block_bytes": 99 * _KB, "max_threads_per_sm": 1536, "max_blocks_per_sm": 16, "mma": _MMA_SM80,
         "has_cp_async": True, "has_bf16_mma": True}
_CC89 = {"arch": "sm_89", "compute_capability": (8, 9), "smem_per_sm_bytes": 100 * _KB,
         "smem_per_block_bytes": 99 * _KB, "max_threads_per_sm": 1536, "max_blocks_per_sm": 24, "mma": _MMA_SM80,
         "has_cp_async": True, "has_bf16_mma": True}
_CC90 = {"arch": "sm_90", "compute_capability": (9, 0), "smem_per_sm_bytes": 228 * _KB,
         "smem_per_block_bytes": 227 * _KB, "max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "mma": _MMA_SM90,
         "has_cp_async": True, "has_bf16_mma": True, "feature_arch": "sm_90a", "has_tma": True}

_TARGET_LIST = [
    Target(
        name="t4", aliases=("tesla t4", "nvidia t4"), marketing_name="NVIDIA T4", **_CC75,
        sm_count=40,  # [TU] T4: 40 SMs (2560 CUDA cores)
        l2_bytes=4 * _MB,  # [TU] 4 MB L2
        boost_clock_mhz=1590,  # [TU] T4 boost clock
        peak_tflops={"fp16": 65.0,  # [TU] 65 TFLOPS mixed-precision FP16/FP32 = 40 SM x 1024 flop/clk x 1.59 GHz
                     "fp32": 8.1},  # [TU] 8.1 TFLOPS single precision
        mem_bandwidth_gbs=320,  # [TU] 320 GB/s GDDR6
        l2_bandwidth_gbs=1465,  # [L2RULE] 23.0 B/clk/SM (V100) x 40 SMs x 1.59 GHz
    ),
    Target(
        name="rtx8000", aliases=("quadro rtx 8000", "rtx 8000", "quadro rtx8000", "quadro 8000"),
        marketing_name="NVIDIA Quadro RTX 8000", **_CC75,
        sm_count=72,  # [TU] full TU102: 72 SMs (4608 CUDA cores)
        l2_bytes=6 * _MB,  # [TU] TU102 6 MB L2
        boost_clock_mhz=1770,  # [TU] Quadro RTX 8000 boost clock
        peak_tflops={"fp16": 130.5,  # [TU] 130.5 TFLOPS FP16 tensor with FP32 accumulate (Quadro: full rate)
                     "fp32": 16.3},  # [TU] 16.3 TFLOPS single precision
        mem_bandwidth_gbs=672,  # [TU] 672 GB/s GDDR6
        l2_bandwidth_gbs=2935,  # [L2RULE] 23.0 B/clk/SM (V100) x 72 SMs x 1.77 GHz
    ),
    Target(
        name="a100", aliases=("a100-sxm", "a100 sxm4", "a100-80gb", "a100 80gb", "a100-sxm4-80gb", "nvidia a100"),
        marketing_name="NVIDIA A100 SXM4 80GB", **_CC80,
        sm_count=108,  # [GA100] A100: 108 SMs
        l2_bytes=40 * _MB,  # [GA100] 40 MB L2
        boost_clock_mhz=1410,  # [GA100] A100 boost clock
        peak_tflops={"fp16": 312.0, "bf16": 312.0,  # [GA100]/[A100-DS] 312 TFLOPS dense FP16/BF16 tensor
                     "tf32": 156.0,  # [A100-DS] 156 TFLOPS dense TF32
                     "fp32": 19.5},  # [A100-DS] 19.5 TFLOPS FP32
        mem_bandwidth_gbs=2039,  # [A100-DS] A100 80GB SXM: 2,039 GB/s HBM2e
        l2_bandwidth_gbs=5400,  # [GPUB] a100_80.txt: 5.3-5.5 TB/s for L2-resident sets of 2-28 MB
    ),
    Target(
        name="a10", aliases=("nvidia a10", "a10-24gb"), marketing_name="NVIDIA A10", **_CC86,
        sm_count=72,  # [GA102] A10: 72 SMs (9216 CUDA cores)
        l2_bytes=6 * _MB,  # [GA102] GA102 6 MB L2
        boost_clock_mhz=1695,  # [A10-DS] boost clock
        peak_tflops={"fp16": 125.0, "bf16": 125.0,  # [A10-DS] 250 sparse -> 125 dense (data-center part: full-rate fp32 acc)
                     "tf32": 62.5,  # [A10-DS] 125 sparse -> 62.5 dense
                     "fp32": 31.2},  # [A10-DS] 31.2 TFLOPS FP32
        mem_bandwidth_gbs=600,  # [A10-DS] 600 GB/s GDDR6
        l2_bandwidth_gbs=1795,  # [L2RULE] 14.7 B/clk/SM (L40) x 72 SMs x 1.695 GHz
    ),
    Target(
        name="rtx3090", aliases=("3090", "rtx 3090", "geforce rtx 3090"), marketing_name="NVIDIA GeForce RTX 3090",
        **_CC86,
        sm_count=82,  # [GA102] RTX 3090: 82 SMs (10496 CUDA cores)
        l2_bytes=6 * _MB,  # [GA102] 6 MB L2
        boost_clock_mhz=1695,  # [GA102] RTX 3090 boost clock
        peak_tflops={"fp16": 71.0, "bf16": 71.0,  # [GA102] 71 TFLOPS FP16/BF16 tensor with FP32 accumulate (142 with FP16 acc)
                     "tf32": 35.6,  # [GA102] 35.6 TFLOPS TF32 tensor
                     "fp32": 35.6},  # [GA102] 35.6 TFLOPS FP32
        mem_bandwidth_gbs=936,  # [GA102] 936 GB/s GDDR6X
        l2_bandwidth_gbs=2045,  # [L2RULE] 14.7 B/clk/SM (L40) x 82 SMs x 1.695 GHz
    ),
    Target(
        name="l4", aliases=("nvidia l4",), marketing_name="NVIDIA L4", **_CC89,
        sm_count=58,  # [L4-DS]/[ADA] AD104 as L4: 58 SMs (7424 CUDA cores)
        l2_bytes=48 * _MB,  # [ADA] AD104 48 MB L2
        boost_clock_mhz=2040,  # [L4-DS] boost clock
        peak_tflops={"fp16": 121.0, "bf16": 121.0,  # [L4-DS] 242 sparse -> 121 dense
                     "tf32": 60.0,  # [L4-DS] 120 sparse -> 60 dense
                     "fp32": 30.3},  # [L4-DS] 30.3 TFLOPS FP32
        mem_bandwidth_gbs=300,  # [L4-DS] 300 GB/s GDDR6
        l2_bandwidth_gbs=1740,  # [L2RULE] 14.7 B/clk/SM (L40) x 58 SMs x 2.04 GHz
    ),
    Target(
        name="rtx4090", aliases=("4090", "rtx 4090", "geforce rtx 4090"), marketing_name="NVIDIA GeForce RTX 4090",
        **_CC89,
        sm_count=128,  # [ADA] RTX 4090: 128 SMs (16384 CUDA cores)
        l2_bytes=72 * _MB,  # [ADA] 72 MB L2
        boost_clock_mhz=2520,  # [ADA] boost clock
        peak_tflops={"fp16": 165.2, "bf16": 165.2,  # [ADA] 165.2 TFLOPS FP16/BF16 tensor with FP32 accumulate (330.3 FP16 acc)
                     "tf32": 82.6,  # [ADA] 82.6 TFLOPS TF32 tensor
                     "fp32": 82.6},  # [ADA] 82.6 TFLOPS FP32
        mem_bandwidth_gbs=1008,  # [ADA] 1008 GB/s GDDR6X
        l2_bandwidth_gbs=4745,  # [L2RULE] 14.7 B/clk/SM (L40) x 128 SMs x 2.52 GHz
    ),
    Target(
        name="h100", aliases=("h100-sxm", "h100 sxm", "h100-sxm5", "h100 sxm5", "h100-80gb", "nvidia h100"),
        marketing_name="NVIDIA H100 SXM5 80GB", **_CC90,
        sm_count=132,  # [GH100] H100 SXM5: 132 SMs
        l2_bytes=50 * _MB,  # [GH100] H100 SXM5: 50 MB L2
        boost_clock_mhz=1830,  # [GH100] tensor peak = 132 SM x 4096 dense fp16 flop/clk x 1.83 GHz
        peak_tflops={"fp16": 989.4, "bf16": 989.4,  # [GH100] 989.4 dense FP16/BF16 tensor
                     "tf32": 494.7,  # [GH100] 494.7 dense TF32
                     "fp32": 66.9},  # [GH100] 66.9 FP32 (at the 1980 MHz max boost, not 1830)
        mem_bandwidth_gbs=3350,  # [H100-DS] 3.35 TB/s HBM3
        l2_bandwidth_gbs=9700,  # as H200 (same GH100 SMs and clock); [GPUB] h100_pcie.txt: 6.9 TB/s on
        # the 114-SM PCIe part, which throttles under L2 load (x 132/114 x 1830/1755 would give 8.3)
    ),
    Target(
        name="h200", aliases=("h200-sxm", "h200 sxm", "h200-141gb", "nvidia h200"),
        marketing_name="NVIDIA H200 SXM 141GB", **_CC90,
        sm_count=132,  # [H200-DS]/[ANCHORS] 132 SMs (same GH100 configuration as H100 SXM)
        l2_bytes=60 * _MB,  # [ANCHORS] device query on an H200: 60 MB L2
        boost_clock_mhz=1830,  # as H100 SXM [GH100]; the H200 datasheet's tensor peaks match it
        peak_tflops={"fp16": 989.5, "bf16": 989.5,  # [H200-DS] 1,979 sparse -> 989.5 dense
                     "tf32": 494.5,  # [H200-DS] 989 sparse -> 494.5 dense
                     "fp32": 67.0},  # [H200-DS] 67 TFLOPS FP32 (at the 1980 MHz max boost, as H100)
        mem_bandwidth_gbs=4800,  # [H200-DS] 4.8 TB/s HBM3e
        l2_bandwidth_gbs=9700,  # [GPUB] h200.txt: 9.5-10.1 TB/s for L2-resident sets of 10-40 MB
        measured={"bf16_gemm_tflops": 702.0,  # [ANCHORS] bf16 8192^3 GEMM, do_bench median
                  "copy_gbs": 4270.0},  # [ANCHORS] device copy, read + write
    ),
]

TARGETS: dict[str, Target] = {t.name: t for t in _TARGET_LIST}


def _normalize(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key.removeprefix("nvidia")


_LOOKUP: dict[str, Target] = {}
for _target in _TARGET_LIST:
    for _label in (_target.name, _target.marketing_name, *_target.aliases):
        _LOOKUP[_normalize(_label)] = _target


def get_target(name: str) -> Target:
    """The target called `name`: its key, marketing name or an alias, ignoring case, spaces, dashes
    and a leading "NVIDIA". Raises UsageError (one line, listing the known names) otherwise."""
    target = _LOOKUP.get(_normalize(name)) if isinstance(name, str) else None
    if target is None:
        raise UsageError(f"unknown GPU {name!r}; known: {', '.join(TARGETS)} (aliases such as h100-sxm, "
                         f"'quadro rtx 8000', 4090 work too)")
    return target


def tensor_cores_take(arch: str, dtype: DType | str) -> bool:
    """Whether the mma instructions of `arch` (every known GPU of it in TARGETS) take `dtype` inputs,
    fp32 through tf32. False means a program converts its tiles: `Copy ... as scaled fp16`. An arch no known
    GPU has is assumed to take it."""
    want = "tf32" if DType(dtype) is DType.fp32 else DType(dtype).value
    return all(want in t.tensor_dtypes for t in TARGETS.values() if t.arch == arch.removesuffix("a"))


def resolve_target(target: Target | str) -> Target:
    """A Target from a Target, a GPU name (h200, any alias) or an arch (sm_80: the first known GPU of that arch in
    the table, t4 for sm_75; sm_90a: the first whose feature arch it is). The one place a name or an arch string
    becomes a Target."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str) and target.startswith("sm_"):
        for known in _TARGET_LIST:
            if known.arch == target:
                return known
        for known in _TARGET_LIST:
            if known.feature_arch == target:
                return known
        raise UsageError(f"no known GPU has arch {target!r}; known: "
                         f"{', '.join(dict.fromkeys(t.arch for t in _TARGET_LIST))}")
    return get_target(target)


def gencode_flags(arch: str) -> tuple[str, ...]:
    """nvcc's -gencode flags that build a cubin for `arch` (sm_80; sm_90a for the arch-specific Hopper target)."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise UsageError(f"unknown arch {arch!r}: expected sm_<major><minor>[a], e.g. sm_80 or sm_90a")
    number = arch.removeprefix("sm_")
    return (f"-gencode=arch=compute_{number},code=sm_{number}",)
