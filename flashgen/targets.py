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
import sys

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flashgen.errors import UsageError
from flashgen.variant import DType

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


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

    def __repr__(self) -> str:
        from flashgen.display import target_repr

        return target_repr(self)

    __str__ = __repr__  # print() too: one line (the fields are in model_dump())

    def _repr_html_(self) -> str:
        from flashgen.display import target_html

        return target_html(self)


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

# Per-SM rates per arch, from which a new GPU's peaks follow (flashgen/target_files.py: `targets add` and
# `targets detect`): dense tensor flop/clock/SM with fp32 accumulate per input dtype, FP32 FMA flop/clock/SM
# (2 x CUDA cores), L2 read bytes/clock/SM. Each is the table above divided back: T4 65 TFLOPS / (40 SM x 1.59 GHz)
# = 1024 [TU]; A100 312 / (108 x 1.41) = 2048 [GA100]; A10 125 / (72 x 1.695) = 1024 [A10-DS]; L4 121 / (58 x 2.04)
# = 1024 [L4-DS]; H100 989.4 / (132 x 1.83) = 4096 [GH100]; tf32 half the fp16 rate on 8.x and 9.0; GeForce parts
# (RTX 3090, RTX 4090) run fp32 accumulate at half these tensor rates. FP32: 64 cores/SM on 7.5 and 8.0, 128 on 8.6,
# 8.9 and 9.0 [CC]. L2: [GPUB] A100 5400 / (108 x 1.41) = 35.5; H200 9700 / (132 x 1.83) = 40.2; [L2RULE] for the rest.
SM_RATES: dict[str, dict[str, float]] = {
    "sm_75": {"fp16": 1024, "fp32": 128, "l2_bytes_per_clk": 23.0},
    "sm_80": {"fp16": 2048, "bf16": 2048, "tf32": 1024, "fp32": 128, "l2_bytes_per_clk": 35.5},
    "sm_86": {"fp16": 1024, "bf16": 1024, "tf32": 512, "fp32": 256, "l2_bytes_per_clk": 14.7},
    "sm_89": {"fp16": 1024, "bf16": 1024, "tf32": 512, "fp32": 256, "l2_bytes_per_clk": 14.7},
    "sm_90": {"fp16": 4096, "bf16": 4096, "tf32": 2048, "fp32": 256, "l2_bytes_per_clk": 40.2},
}
#: the [CC] facts per compute capability the table above is built from (a new GPU's file takes them by its capability)
ARCH_FACTS: dict[tuple[int, int], dict] = {(7, 5): _CC75, (8, 0): _CC80, (8, 6): _CC86, (8, 9): _CC89, (9, 0): _CC90}


def _normalize(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key.removeprefix("nvidia")


_LOOKUP: dict[str, Target] = {}
for _target in _TARGET_LIST:
    for _label in (_target.name, _target.marketing_name, *_target.aliases):
        _LOOKUP[_normalize(_label)] = _target


_BUILT_IN = frozenset(TARGETS)


def register_target(target: Target) -> Target:
    """Add a GPU the table lacks (flashgen/target_files.py: a user's target file, `--targets FILE.toml`), or replace
    the user's earlier one of that name; a name, marketing name or alias that is a built-in target's or another
    target's is refused in one line."""
    labels = [_normalize(label) for label in (target.name, target.marketing_name, *target.aliases)]
    for label in labels:
        known = _LOOKUP.get(label)
        if known is not None and known != target and (known.name != target.name or known.name in _BUILT_IN):
            raise UsageError(f"target {target.name!r}: the name {label!r} is already the target {known.name!r}"
                             + (" (built in)" if known.name in _BUILT_IN else ""))
    old = TARGETS.get(target.name)
    if old is not None and old != target:  # the user's file changed: its labels go with it
        _TARGET_LIST.remove(old)
        for label in [k for k, v in _LOOKUP.items() if v is old]:
            del _LOOKUP[label]
    if old is None or old != target:
        _TARGET_LIST.append(target)
    TARGETS[target.name] = target
    for label in labels:
        _LOOKUP[label] = target
    return target


_user_targets_read: list[str] = []  # the config folder whose target files were read (once per folder)


def user_targets_dir():
    """Where `flashgen targets add` keeps the user's target files: `<config>/targets` (flashgen.paths.config_dir)."""
    from flashgen.paths import config_dir

    return config_dir() / "targets"


def load_user_targets() -> list[Target]:
    """Register the target files `flashgen targets add` wrote (the user's config folder), once per folder; a file that
    no longer validates is named on stderr in one line and skipped (the others still load)."""
    folder = user_targets_dir()
    if str(folder) in _user_targets_read:
        return []
    _user_targets_read.append(str(folder))
    loaded = []
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        try:
            loaded.append(register_target(read_target_file(path).to_target()))
        except UsageError as exc:
            print(f"notice: skipped the target file {exc}", file=sys.stderr)
    return loaded


# ---------------------------------------------------------------------------------------------- target files
# A GPU the table lacks, as a user writes it (TOML; flashgen/target_files.py: `targets add`, `--targets`, `detect`):
# what the arch cannot give (SMs, clock, L2, memory bandwidth); the rest follows from the compute capability
# (ARCH_FACTS) and the peaks from the arch's per-SM rates (SM_RATES) unless the file gives them.

_MB_FILE = 1024 * 1024


class TargetFile(BaseModel):
    """A GPU the table lacks, as a user writes it (docs/batch.md, "New hardware")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$", description="lower-case key, e.g. rtx6000ada")
    marketing_name: str = Field(min_length=1, max_length=100)
    aliases: tuple[str, ...] = ()
    compute_capability: tuple[int, int]
    sm_count: int = Field(gt=0, le=4096)
    boost_clock_mhz: float = Field(gt=0, le=10000, description="the clock the peaks are computed at")
    l2_mb: float | None = Field(default=None, gt=0, le=4096)
    l2_bytes: int | None = Field(default=None, gt=0)
    mem_bandwidth_gbs: float = Field(gt=0, le=100000)
    fp32_accumulate_half_rate: bool = Field(default=False, description="GeForce parts: fp16/bf16 mma with fp32 "
                                            "accumulate at half the tensor rate")
    peak_tflops: dict[str, float] | None = Field(default=None, description="dense tensor TFLOP/s per input dtype "
                                                 "(fp32 = FMA); else from the arch's per-SM rates")
    l2_bandwidth_gbs: float | None = Field(default=None, gt=0)
    smem_per_sm_bytes: int | None = Field(default=None, gt=0)
    smem_per_block_bytes: int | None = Field(default=None, gt=0)
    regs_per_sm: int | None = Field(default=None, gt=0)
    max_threads_per_sm: int | None = Field(default=None, gt=0)
    max_blocks_per_sm: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _known(self) -> TargetFile:
        cc = tuple(self.compute_capability)
        if cc not in ARCH_FACTS:
            known = ", ".join(f"{a}.{b}" for a, b in ARCH_FACTS)
            raise ValueError(f"compute capability {cc[0]}.{cc[1]}: flashgen has no translator backend for "
                             f"sm_{cc[0]}{cc[1]} (known: {known})")
        if (self.l2_mb is None) == (self.l2_bytes is None):
            raise ValueError("give the L2 size once: l2_mb or l2_bytes")
        for dtype, value in (self.peak_tflops or {}).items():
            if dtype not in ("fp16", "bf16", "tf32", "fp32") or not value > 0:
                raise ValueError(f"peak_tflops.{dtype} = {value!r}: dtypes are fp16, bf16, tf32, fp32, each > 0")
        return self

    def to_target(self) -> Target:
        facts = dict(ARCH_FACTS[tuple(self.compute_capability)])
        rates = SM_RATES[facts["arch"]]
        clock_ghz = self.boost_clock_mhz / 1000
        peaks = self.peak_tflops or {}
        if not peaks:
            for dtype in ("fp16", "bf16", "tf32", "fp32"):
                if dtype in rates:
                    half = self.fp32_accumulate_half_rate and dtype in ("fp16", "bf16")
                    peaks[dtype] = round(rates[dtype] * (0.5 if half else 1) * self.sm_count * clock_ghz / 1000, 1)
        for field in ("smem_per_sm_bytes", "smem_per_block_bytes", "max_threads_per_sm", "max_blocks_per_sm"):
            if getattr(self, field) is not None:
                facts[field] = getattr(self, field)
        extra = {"regs_per_sm": self.regs_per_sm} if self.regs_per_sm is not None else {}
        l2_bw = self.l2_bandwidth_gbs or round(rates["l2_bytes_per_clk"] * self.sm_count * clock_ghz)
        return Target(name=self.name, aliases=self.aliases, marketing_name=self.marketing_name, **facts, **extra,
                      sm_count=self.sm_count, l2_bytes=self.l2_bytes or int(self.l2_mb * _MB_FILE),
                      boost_clock_mhz=self.boost_clock_mhz, peak_tflops=peaks, mem_bandwidth_gbs=self.mem_bandwidth_gbs,
                      l2_bandwidth_gbs=l2_bw)


def _target_file_error(path: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "__root__")
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return f"{path}: unknown key {where!r} (keys: {', '.join(TargetFile.model_fields)})"
    if kind == "missing":
        return f"{path}: missing key {where!r}"
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ").replace("Input should be", "must be", 1)
    return f"{path}: {where + ': ' if where else ''}{msg}"


def parse_target_file(text: str, path: str = "<target>") -> TargetFile:
    """A target file's text, validated; one-line UsageError otherwise."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not TOML: {exc}") from None
    try:
        return TargetFile.model_validate(data)
    except ValidationError as exc:
        raise UsageError(_target_file_error(path, exc)) from None


def read_target_file(path) -> TargetFile:
    """A target file, read and validated; one-line UsageError otherwise."""
    from flashgen.errors import InputError, read_text_input

    try:
        text = read_text_input(str(path))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    return parse_target_file(text, str(path))


def get_target(name: str) -> Target:
    """The target called `name`: its key, marketing name or an alias, ignoring case, spaces, dashes
    and a leading "NVIDIA" (then the user's target files). Raises UsageError (one line, listing the known names)
    otherwise."""
    target = _LOOKUP.get(_normalize(name)) if isinstance(name, str) else None
    if target is None and isinstance(name, str):
        load_user_targets()
        target = _LOOKUP.get(_normalize(name))
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


class RoleDataflow(BaseModel):
    """The Hopper dataflow of an arch (docs/llm-tl.md, "Hopper dataflow"): a block split into a producer role that
    loads tiles asynchronously (TMA) into rings of shared stages and a consumer role that computes on them
    (warp specialization). What its kernel implements, read from here by the TL checker, the library and the
    translator's sm90 backend (the one place these facts live)."""

    model_config = ConfigDict(frozen=True)
    max_stages: int = Field(description="the deepest ring of K/V stages the kernel implements")
    dtypes: tuple[str, ...] = Field(description="input dtypes its tensor-core path takes (others: the plain dataflow)")
    producer_warps: int = Field(description="warps of the producer role (one warpgroup; one thread issues the copies)")
    rows_per_consumer_warp: int = Field(description="query rows per consumer warp (a warpgroup of 4 owns 64: wgmma m64)")
    split_kv: bool = Field(default=False, description="whether split-KV decode is written in it")


#: archs with a Hopper dataflow; Role blocks, staged buffers and async copies are refused elsewhere
ROLE_DATAFLOW: dict[str, RoleDataflow] = {
    # [PTX] cp.async.bulk.tensor (TMA) and mbarrier tx-counts, wgmma with both operands in shared memory, setmaxnreg:
    # sm_90a. Stages: the sm90 kernel's rings are 1..3 deep (two or three 64-row consumer warpgroups and 3 stages of
    # 128x128 K/V tiles at d128 fill about 228 KB of shared memory; benchmarks/kernel_dev/NOTES.md, session 3).
    "sm_90": RoleDataflow(max_stages=3, dtypes=("fp16", "bf16"), producer_warps=4, rows_per_consumer_warp=16),
}


def role_dataflow(arch: str) -> RoleDataflow | None:
    """The arch's Hopper dataflow (sm_90, sm_90a), or None where programs have no roles."""
    return ROLE_DATAFLOW.get(arch.removesuffix("a"))


def writes_role_dataflow(arch: str, dtype: DType | str, split_kv: bool = False) -> bool:
    """Whether a program for `arch` in `dtype` is written in the Hopper dataflow (what the library renders, and
    what the arch's warp-specialized kernel translates); else the plain form."""
    flow = role_dataflow(arch)
    return flow is not None and DType(dtype).value in flow.dtypes and (flow.split_kv or not split_kv)


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
