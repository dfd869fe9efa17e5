"""Fakes of the layers around the agent, for CPU tests of the loop: TL and CUDA are small texts whose
markers decide what each check says (SYNTAX_ERROR, WRONG_MASK, COMPILE_ERROR, SERIALIZED_WGMMA, WRONG_KERNEL, TIME=ms)."""

from __future__ import annotations

import re
from pathlib import Path

from flashgen.abi import KernelManifest, Launch
from flashgen.agent.environment import (
    Build,
    CpuCheck,
    Environment,
    Timing,
    Verification,
)
from flashgen.variant import DType, Variant

PARAMS = [{"BLOCK_M": 64, "BLOCK_N": 64}, {"BLOCK_M": 128, "BLOCK_N": 64}, {"BLOCK_M": 128, "BLOCK_N": 128}]


def sketch_tl(extra: str = "") -> str:
    return f"Kernel attn\n  Copy Q from global to shared\n  Compute GEMM Q, K and get S\n{extra}end\n"


def full_tl(params: dict[str, int] | None = None, extra: str = "") -> str:
    p = params or PARAMS[0]
    return (f"Target sm_80 dtype fp16 accum fp32 head_dim 64\nParams BLOCK_M={p['BLOCK_M']} BLOCK_N={p['BLOCK_N']}\n"
            f"Kernel attn\n  Copy Q from global to shared\n  Compute GEMM Q, K and get S\n{extra}end\n")


def cuda(extra: str = "", time_ms: float = 1.0) -> str:
    return (f'#include "flashgen_abi.cuh"\n// TIME={time_ms}\n{extra}\n'
            'extern "C" __global__ void fg_attn(const FlashgenAttnParams p) {}\n')


def manifest(task_variant: Variant | None = None) -> KernelManifest:
    return KernelManifest(name="fg_attn", arch="sm_80", dtype=DType.fp16, head_dim=64, variant=task_variant or Variant(),
                          launches=[Launch(kernel="fg_attn", grid=("cdiv(N, 64)", "H", "B"), threads=128)],
                          params={"BLOCK_M": 64})


def fenced(kind: str, code: str, prose: str = "Here it is.") -> str:
    return f"{prose}\n\n```{kind}\n{code}```\n"


def cuda_reply(extra: str = "", time_ms: float = 1.0) -> str:
    return fenced("cuda", cuda(extra, time_ms)) + "\n```json\n" + manifest().model_dump_json() + "\n```\n"


class FakeEnvironment(Environment):
    def __init__(self, gpu: bool = False, baseline_ms: float = 1.0):
        self.gpu, self.baseline_ms = gpu, baseline_ms
        self.calls: list[str] = []

    def check_supported(self, variant, target, dtype, head_dim) -> None:
        pass

    @staticmethod
    def tl_reference() -> str:
        return "LLM-TL REFERENCE (fake)"

    def worked_example(self, target, dtype, head_dim):
        return full_tl(), cuda(), manifest(Variant(causal=True))

    def choose_params(self, variant, target, dtype, head_dim):
        return PARAMS

    def library_tl(self, variant, target, dtype, head_dim, form, params=None):
        return sketch_tl() if form == "sketch" else full_tl(params)

    def check_tl(self, text, variant, target, dtype, head_dim, full) -> CpuCheck:
        self.calls.append("check_full" if full else "check_sketch")
        if "SYNTAX_ERROR" in text:
            line = next(i for i, l in enumerate(text.splitlines(), 1) if "SYNTAX_ERROR" in l)
            return CpuCheck(ok=False, repair="repair_syntax", diagnostics=[f"kernel.tl:{line}:3: unexpected 'SYNTAX_ERROR'"])
        if full and not text.startswith("Target"):
            return CpuCheck(ok=False, repair="repair_check", diagnostics=["kernel.tl:1:1: this is a sketch"])
        if full and "WRONG_MASK" in text:
            return CpuCheck(ok=False, repair="repair_interpret", shape="B=1,H=2,N=77,M=133,D=64",
                            summary="O: 300 of 9856 elements differ; first at (b=0, h=0): query rows 0..5 of 77")
        counts = {"mma_flops": 4e6, "vector_flops": 1e5, "sfu_ops": 1e4, "bytes": {"global_read": 1e5}} if full else None
        return CpuCheck(ok=True, counts=counts)

    def translate(self, tl_text, target):
        return cuda(), manifest()

    def build(self, source, manifest, target) -> Build:
        self.calls.append("build")
        if "COMPILE_ERROR" in source:
            return Build(ok=False, feedback='kernel.cu(3): error: identifier "COMPILE_ERROR" is undefined')
        warnings = (["ptxas: warning [C7520]: Potential Performance Loss: wgmma.mma_async instructions are serialized "
                     "due to the presence of Extern calls in the function 'fg_attn'"] if "SERIALIZED_WGMMA" in source else [])
        return Build(ok=True, resources={"fg_attn": {"registers": 96, "shared_static_bytes": 0, "spill_store_bytes": 0,
                                                     "spill_load_bytes": 0, "stack_frame_bytes": 0}},
                     toolchain="nvcc fake", warnings=warnings)

    def gpu_available(self) -> bool:
        return self.gpu

    def verify(self, source, manifest, build) -> Verification:
        self.calls.append("verify")
        if "WRONG_KERNEL" in source:
            return Verification(ran=True, ok=False, summary="O differs at (b=0, h=1): query rows 0..15 (the first rows)")
        return Verification(ran=True, ok=True, summary="all cases pass")

    def bench(self, source, manifest, build, target) -> Timing:
        self.calls.append("bench")
        ms = float(re.search(r"TIME=([\d.]+)", source).group(1))
        return Timing(ran=True, shape="B=4,H=16,N=4096,M=4096,D=64", time_ms=ms, tflops=100.0 / ms,
                      baselines_ms={"sdpa_flash": self.baseline_ms}, roofline_percent=50.0 / ms)

    def open_store(self, path=None):
        raise AssertionError("tests pass a store")


def make_store(tmp_path: Path):
    from flashgen.harness.store import Store

    return Store(tmp_path / "store")
