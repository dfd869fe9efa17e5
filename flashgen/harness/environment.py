"""The one door to the layers up to the harness (tl_spec, translators, harness, targets, roofline): what the
agent calls, and what the harness's own suite builds its kernels through (the expert's first answer).

The agent's loop and expert only call `Environment` methods and read the small outcome models below
(flashgen.agent.environment hands them on), so a change in another layer's API is absorbed here. It lives
at the top of the harness, not in the agent, because the harness uses it too (harness.suite). Tests pass a
fake with the same methods.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from flashgen.abi import ABI_HEADER, KernelManifest
from flashgen.errors import FlashgenError, UsageError
from flashgen.variant import DType, Shape, Variant

REPO_ROOT = Path(__file__).resolve().parents[2]


class LayerMissing(FlashgenError):
    """A layer the agent needs is not installed or not built yet."""


class CpuCheck(BaseModel):
    """parse + check + interpret of a TL text on the CPU."""

    ok: bool
    repair: str | None = Field(default=None, description="repair stage when not ok: repair_syntax | repair_check | "
                               "repair_interpret")
    diagnostics: list[str] = Field(default_factory=list)
    excerpt: str = ""
    summary: str = ""
    shape: str = ""
    counts: dict[str, Any] | None = Field(default=None, description="OpCounts of the interpreted run (roofline)")


class Build(BaseModel):
    """static check + nvcc of one CUDA source."""

    ok: bool
    feedback: str = ""
    resources: dict[str, Any] = Field(default_factory=dict, description="per entry: registers, smem, spills")
    warnings: list[str] = Field(default_factory=list, description="ptxas's warnings on a build that succeeded (one "
                                "line each), e.g. wgmma serialized, which costs a Hopper kernel 20-30 %")
    toolchain: str = ""
    handle: Any = Field(default=None, exclude=True, description="what the harness needs to load the binary")


class Verification(BaseModel):
    ran: bool
    ok: bool | None = None
    summary: str = ""


class Timing(BaseModel):
    ran: bool
    shape: str = ""
    time_ms: float | None = None
    tflops: float | None = None
    baselines_ms: dict[str, float] = Field(default_factory=dict)
    roofline_percent: float | None = None
    visible_share: float | None = Field(default=None, description="a kernel with a mask function: the share of the "
                                        "(query, key) pairs it leaves at the timed shape and call-time tensors, "
                                        "which `tflops` counts; None: the variant's own pairs")
    plain_ms: float | None = Field(default=None, description="a kernel with score or mask functions: flashgen's own "
                                   "kernel of the same variant without them, timed beside it")
    plain_ratio: float | None = Field(default=None, description="our TF/s (over the pairs we compute) over that "
                                      "plain kernel's: the measure a kernel with functions is held to")

    @property
    def best_baseline(self) -> tuple[str, float] | None:
        if not self.baselines_ms:
            return None
        name = min(self.baselines_ms, key=self.baselines_ms.__getitem__)
        return name, self.baselines_ms[name]

    @property
    def speedup(self) -> float | None:
        """Best baseline time over ours: >= 1 means at least as fast as every baseline."""
        best = self.best_baseline
        return None if best is None or not self.time_ms else best[1] / self.time_ms


# The sizes the CPU interpreter runs each TL program at: several query and key blocks with ragged
# ends, N != M both ways (bottom-right alignment; rows that see no key when N > M), two kv heads
# each read by `kv_group` query heads.
def interpret_shapes(variant: Variant, head_dim: int, head_dim_v: int | None = None) -> list[Shape]:
    kv_heads = 2
    heads = kv_heads * variant.kv_group
    return [Shape(B=1, H=heads, KVH=kv_heads, N=77, M=133, D=head_dim, DV=head_dim_v),
            Shape(B=1, H=heads, KVH=kv_heads, N=70, M=45, D=head_dim, DV=head_dim_v)]


# the shape timings and roofline estimates are given at (FlashAttention's usual benchmark size)
ROOFLINE_SHAPE = Shape(B=4, H=16, N=4096, M=4096, D=128)


class Environment:
    """The real layers. Every method imports its layer lazily so that the agent imports cheaply and
    a missing layer is one clear error."""

    # ----------------------------------------------------------------------------- targets, docs

    def target(self, name: str):
        from flashgen.targets import get_target

        return get_target(name)

    def check_supported(self, variant: Variant, target, dtype: DType, head_dim: int,
                        head_dim_v: int | None = None) -> None:
        """Raise UsageError (one line) when the translator cannot build this combination (`head_dim_v`: V's and O's
        own head dim, None: head_dim)."""
        from flashgen.translators.rules import plan_for_variant

        plan_for_variant(variant, target, dtype, head_dim, head_dim_v=head_dim_v)  # raises UsageError naming it

    @staticmethod
    @lru_cache(maxsize=1)
    def tl_reference() -> str:
        for path in (REPO_ROOT / "docs" / "llm-tl.md", Path(__file__).resolve().parents[1] / "tl_spec" / "llm-tl.md"):
            if path.is_file():
                return path.read_text()
        # an installed wheel without the docs: the AST module's summary is the next best thing
        from flashgen.tl_spec import ast

        return "(docs/llm-tl.md is not installed here; the AST summary follows)\n\n" + (ast.__doc__ or "")

    def hardware_facts(self, target) -> list[tuple[str, str]]:
        mma = ", ".join(sorted({f"{m.instruction} ({'/'.join(m.input_dtypes)})" for m in target.mma
                                if set(m.input_dtypes) & {"fp16", "bf16"}}))
        return [
            ("GPU", f"{target.marketing_name} ({target.arch}, compute capability {target.compute_capability[0]}."
                    f"{target.compute_capability[1]})"),
            ("SMs", str(target.sm_count)),
            ("shared memory per block (opt-in max)", f"{target.smem_per_block_bytes // 1024} KB"),
            ("shared memory per SM", f"{target.smem_per_sm_bytes // 1024} KB"),
            ("registers per SM / max per thread", f"{target.regs_per_sm} / {target.max_regs_per_thread}"),
            ("max threads per SM / per block", f"{target.max_threads_per_sm} / {target.max_threads_per_block}"),
            ("L2", f"{target.l2_bytes // (1024 * 1024)} MB"),
            ("tensor-core instructions", mma),
            ("dense tensor TFLOP/s", ", ".join(f"{k} {v:g}" for k, v in sorted(target.peak_tflops.items()))),
            ("memory bandwidth", f"{target.mem_bandwidth_gbs:g} GB/s"),
            ("cp.async", "yes" if target.has_cp_async else "no"),
            ("bf16 mma", "yes" if target.has_bf16_mma else "no (a bf16 program loads its tiles `as scaled fp16`; see "
                                                           "the rules below)"),
        ]

    def worked_example(self, target, dtype: DType, head_dim: int,
                       head_dim_v: int | None = None) -> tuple[str, str, KernelManifest]:
        """A library program and its reference translation, for the stage-2 prompt. The plain
        variant (causal when asking for plain would show the answer verbatim is fine: the prompt
        says the variant differs only in the masks). Returns the TL, the CUDA and the launch manifest."""
        from flashgen.translators.params import choose_params

        example = Variant(causal=True)
        dims = {"head_dim_v": head_dim_v} if head_dim_v is not None else {}
        tl = self.library_tl(example, target, dtype, head_dim, form="full",
                             params=dict(choose_params(example, target, dtype, head_dim, **dims)), **dims)
        source, manifest = self.translate(tl, target)
        return tl, source, manifest

    def abi_header(self) -> str:
        return ABI_HEADER.read_text()

    # ----------------------------------------------------------------------------- TL

    def choose_params(self, variant: Variant, target, dtype: DType, head_dim: int,
                      head_dim_v: int | None = None) -> list[dict[str, int]]:
        """Parameter candidates, best first: the choice of flashgen.translators.params (tuned file, measured
        table, defaults or model; what the expert writes first), then the rest of the search space that passes
        the CPU filters, in flashgen.translators.search's order (the expert moves down it after timing feedback)."""
        from flashgen.translators.params import choose_params
        from flashgen.translators.search import candidate_params

        dims = {"head_dim_v": head_dim_v} if head_dim_v is not None else {}
        first = dict(choose_params(variant, target, dtype, head_dim, **dims))
        return [first, *(p for p in candidate_params(variant, target, dtype, head_dim, **dims) if p != first)]

    def size_params(self, variant: Variant, target, dtype: DType, head_dim: int,
                    head_dim_v: int | None = None) -> list:
        """The tiles for ranges of sizes (`Params when` lines) that go with choose_params' first candidate."""
        from flashgen.translators.params import choose_size_params

        return choose_size_params(variant, target, dtype, head_dim, head_dim_v=head_dim_v)

    def params_source(self, variant: Variant, target, dtype: DType, head_dim: int,
                      params: dict[str, Any], head_dim_v: int | None = None) -> dict[str, str]:
        """Where a kernel's tile parameters came from: the choice's source (tuned, measured, defaults, model)
        when they are that choice, else 'provider' (a model's own, or the expert's next search candidate)."""
        from flashgen.translators.params import choose_params_with_source

        choice = choose_params_with_source(variant, target, dtype, head_dim, head_dim_v=head_dim_v)
        if all(params.get(k) == v for k, v in choice.params.items()):
            return {"source": choice.source, "detail": choice.detail}
        return {"source": "provider", "detail": "not the default choice: written by the provider (a model's own, "
                                                "or the expert's next search candidate after timing feedback)"}

    def code_path(self, tl_text: str, target) -> dict[str, Any] | None:
        """Which of the translator's code paths the kernel's TL takes on `target`, and why (the backend's own
        reason for taking it, then the lowering's notes, e.g. why the sm80 path took a program on sm_90); None when
        the TL does not lower (a model's CUDA may still have built)."""
        from flashgen.tl_spec.parser import parse
        from flashgen.translators import lower
        from flashgen.translators.backends import get_backend

        try:
            plan, notes = lower(parse(tl_text), target)
        except Exception:  # noqa: BLE001 - the record says nothing rather than failing the outputs
            return None
        return {"backend": plan.backend, "why": [get_backend(plan.backend).choice_note(target), *notes]}

    def library_tl(self, variant: Variant, target, dtype: DType, head_dim: int, form: str,
                   params: dict[str, int] | None = None, mods=None, head_dim_v: int | None = None,
                   size_params: list | None = None) -> str:
        """The library's program; with `mods` (flashgen.mods.Mods) the score and mask functions written into it;
        `head_dim_v`: V's and O's own head dim (None: head_dim); `size_params`: `Params when` lines (the tiles
        for ranges of sizes that go with the first choice: size_params())."""
        from flashgen.tl_spec import library

        text = library.render(variant, dtype=dtype, arch=target.arch, head_dim=head_dim, params=params, form=form,
                              head_dim_v=head_dim_v, size_params=size_params)
        if mods is None:
            return text
        from flashgen.mods import apply

        return apply(text, mods, variant)

    def parse(self, text: str, filename: str = "<tl>"):
        from flashgen.tl_spec.parser import parse

        return parse(text, filename)

    def check_tl(self, text: str, variant: Variant, target, dtype: DType, head_dim: int, full: bool,
                 reference_tl: str | None = None, scale: float | None = None,
                 head_dim_v: int | None = None) -> CpuCheck:
        """Parse; for a full program also check it and interpret it on the CPU against the fp64 reference: the
        variant's (flashgen.reference), or with `reference_tl` that program's own fp64 interpretation on the same
        inputs (a kernel computing what no Variant describes; the program itself when it is that text). `scale`:
        the softmax scale both run with (None: 1/sqrt(D)); `head_dim_v`: the task's V head dim (None: head_dim), the
        shapes' DV."""
        from flashgen.tl_spec.diagnostics import (
            TLRuntimeError,
            TLSyntaxError,
            errors_only,
        )

        try:
            program = self.parse(text, "kernel.tl" if full else "sketch.tl")
        except TLSyntaxError as exc:
            diags = [str(d) for d in exc.diagnostics] or [str(exc)]
            line = exc.diagnostics[0].line if exc.diagnostics else None
            return CpuCheck(ok=False, repair="repair_syntax", diagnostics=diags, excerpt=_excerpt(text, line))
        if not full:
            return CpuCheck(ok=True)
        if not program.is_full:
            return CpuCheck(ok=False, repair="repair_check", diagnostics=[
                "kernel.tl:1:1: this is a sketch: a full program starts with the Target, Variant and Params lines"])
        from flashgen.tl_spec.checker import check

        problems = [str(d) for d in errors_only(check(program, target))]
        if program.variant is not None and program.variant != variant:
            problems.append(f"kernel.tl:2:1: the Variant line says {program.variant.name}, the task is {variant.name}")
        if problems:
            return CpuCheck(ok=False, repair="repair_check", diagnostics=problems)
        from flashgen.harness.verify import compare_outputs
        from flashgen.reference import attention
        from flashgen.tl_spec.interpreter import interpret

        reference = None  # the reference program, when it is another text than this one
        if reference_tl is not None and reference_tl.split() != text.split():
            reference = self.parse(reference_tl, "reference.tl")
        from flashgen.reference import random_alibi_slopes

        if (program.target.head_dim_v or program.target.head_dim) != (head_dim_v or program.target.head_dim):
            want = f"head_dim_v {head_dim_v}" if head_dim_v is not None else "no head_dim_v (V's head dim is D's)"
            return CpuCheck(ok=False, repair="repair_check", diagnostics=[
                f"kernel.tl:1:1: the Target line says V head dim {program.target.dv}; the task has {want}"])
        for i, shape in enumerate(interpret_shapes(variant, head_dim, head_dim_v)):
            # ALiBi: the first shape with the standard slopes, the second with the caller's (B, H), as FlashAttention
            caller = variant.alibi and i == 1
            call = {"alibi_slopes": random_alibi_slopes(shape.B, shape.H, i, per_batch=True)} if caller else None
            try:
                result = interpret(program, shape, seed=i, scale=scale, inputs=call)
            except (TLRuntimeError, UsageError) as exc:
                return CpuCheck(ok=False, repair="repair_interpret", shape=_shape_text(shape),
                                summary=f"the interpreter stopped: {exc}")
            q, k, v = (result.inputs[name] for name in ("Q", "K", "V"))
            if reference_tl is None:
                want_o, want_lse = attention(q, k, v, variant, result.scale,
                                             alibi_slopes=result.inputs.get("alibi_slopes"))
            else:  # the program's own fp64 meaning (or the reference program's): still every output written, finite
                wanted = result.outputs if reference is None else _defined_by(reference, shape, result)
                want_o, want_lse = np.asarray(wanted["O"], dtype=np.float64), wanted.get("LSE")
            lse = result.outputs.get("LSE") if variant.return_lse else None
            check = compare_outputs(np.asarray(result.outputs["O"], dtype=np.float64), want_o, dtype, variant, shape.M,
                                    lse=None if lse is None else np.asarray(lse, dtype=np.float64),
                                    lse_ref=want_lse if lse is not None else None, seed=i,
                                    block_m=program.params.get("BLOCK_M"), block_n=program.params.get("BLOCK_N"))
            if variant.return_lse and lse is None:
                return CpuCheck(ok=False, repair="repair_check", diagnostics=[
                    "kernel.tl: the variant returns LSE but the program writes no global LSE"])
            if not check.ok:
                why = ("; this shape runs with the caller's ALiBi slopes (B, H), the one before with the standard ones: "
                       "read the slope of batch b, head h as alibi_slopes[b, h]") if caller else ""
                return CpuCheck(ok=False, repair="repair_interpret", shape=_shape_text(shape),
                                summary=check.detail + why)
        return CpuCheck(ok=True, counts=self._roofline_counts(program, variant, head_dim, head_dim_v))

    @staticmethod
    def _roofline_counts(program, variant: Variant, head_dim: int, head_dim_v: int | None = None) -> dict[str, Any]:
        """OpCounts at the benchmark's shape (ROOFLINE_SHAPE). Every (batch, kv head) group runs the same
        program, so one group is interpreted and its counts scaled."""
        from flashgen.tl_spec.interpreter import interpret

        big = ROOFLINE_SHAPE
        one = Shape(B=1, H=variant.kv_group, KVH=1, N=big.N, M=big.M, D=head_dim, DV=head_dim_v)
        counts = interpret(program, one, seed=0).counts
        factor = big.B * big.H / one.H
        return {"mma_flops": counts.mma_flops * factor, "vector_flops": counts.vector_flops * factor,
                "sfu_ops": counts.sfu_ops * factor, "bytes": {k: v * factor for k, v in counts.bytes.items()},
                "shape": _shape_text(Shape(B=big.B, H=big.H, N=big.N, M=big.M, D=head_dim, DV=head_dim_v))}

    def format_tl(self, text: str) -> str:
        from flashgen.tl_spec.printer import format_program

        return format_program(self.parse(text))

    # ----------------------------------------------------------------------------- CUDA

    def translate(self, tl_text: str, target) -> tuple[str, KernelManifest]:
        program = self.parse(tl_text)
        try:
            from flashgen.translators import translate
        except ImportError:  # until the TL lowering lands: the rule-based plan of the program's variant
            from flashgen.translators.render import render
            from flashgen.translators.rules import plan_for_variant

            decl = program.target
            return render(plan_for_variant(program.variant, target, decl.dtype, decl.head_dim,
                                           params=program.params))
        translation = translate(program, target)
        return translation.source, translation.manifest

    def translation_problem(self, tl_text: str, target) -> str | None:
        """Why the reference translator would refuse this program on `target` (its plan against the backend's
        limits: stages, shared memory, the path's own rules), in one line; None where it would translate. Lowers
        and validates only, without writing the CUDA."""
        from flashgen.translators.lower import check_translates

        try:
            check_translates(self.parse(tl_text), target)
        except FlashgenError as exc:
            return " ".join(str(exc).split())
        return None

    def manifest_for(self, tl_text: str, target) -> KernelManifest:
        """The launch manifest the reference translator derives from a TL program (used when a
        model gives CUDA without a manifest)."""
        return self.translate(tl_text, target)[1]

    def build(self, source: str, manifest: KernelManifest, target) -> Build:
        from flashgen.harness.compile import compile_cuda

        problems = self._static_problems(source, manifest)
        if problems:
            return Build(ok=False, feedback="static check:\n" + "\n".join(f"- {p}" for p in problems))
        result = compile_cuda(source, target.arch)  # sm_90a where the source needs it (compile.build_arch)
        if not result.ok:
            return Build(ok=False, feedback=result.feedback_text())
        resources = {name: usage.model_dump(include={"registers", "shared_static_bytes", "spill_store_bytes",
                                                     "spill_load_bytes", "stack_frame_bytes"})
                     for name, usage in sorted(result.kernels.items())}
        return Build(ok=True, resources=resources, toolchain=_nvcc_release(result.nvcc_version), handle=result,
                     warnings=result.ptxas_warnings)

    @staticmethod
    def _static_problems(source: str, manifest: KernelManifest) -> list[str]:
        try:
            from flashgen.harness.static_check import static_check
        except ImportError:  # not built yet: nvcc still judges the source
            return []
        return [str(p) for p in (static_check(source, manifest) or [])]

    def gpu_available(self) -> bool:
        from flashgen.harness.worker import have_gpu

        return bool(have_gpu())

    def _worker(self):
        if getattr(self, "_gpu_worker", None) is None:
            from flashgen.harness.worker import GpuWorker

            self._gpu_worker = GpuWorker()
        return self._gpu_worker

    def gpu_name(self) -> str | None:
        """The name of the GPU that verify and bench ran on (asked of their worker, so that CUDA stays out of this
        process), or None: no worker ran, or it cannot tell."""
        worker = getattr(self, "_gpu_worker", None)
        if worker is None:
            return None
        result = worker.call("flashgen.harness.device:environment_info", timeout_s=60)
        return (result.value or {}).get("gpu") if result.ok and isinstance(result.value, dict) else None

    def verify(self, source: str, manifest: KernelManifest, build: Build, scale: float | None = None) -> Verification:
        """`scale`: the softmax scale the kernel and the reference run with (None: 1/sqrt(D))."""
        from flashgen.harness.worker import KernelInput

        # the worker compiles the source for the GPU it runs on (the target's arch may differ)
        report = self._worker().verify(KernelInput(manifest=manifest, source=source), scale=scale)
        return Verification(ran=True, ok=bool(report.ok), summary=report.summary or report.error or "")

    def bench(self, source: str, manifest: KernelManifest, build: Build, target, scale: float | None = None,
              mods=None) -> Timing:
        """`scale`: the softmax scale the kernel and the baselines run with (None: 1/sqrt(D)); `mods`: the score and
        mask functions the kernel computes (flashgen.mods.Mods): its TF/s counts the pairs a mask function leaves, as
        `flashgen bench` counts a variant's own mask, and flashgen's own kernel without the functions is timed
        beside it (Timing.plain_ms and plain_ratio, the measure such a kernel is held to)."""
        from flashgen.harness.worker import KernelInput

        big = ROOFLINE_SHAPE
        shape = Shape(B=big.B, H=big.H, KVH=big.H // manifest.variant.kv_group, N=big.N, M=big.M, D=manifest.head_dim,
                      DV=manifest.head_dim_v)
        kernels = [KernelInput(manifest=manifest, source=source)]
        if mods is not None and (plain := self._plain_twin(manifest, target)) is not None:
            kernels.append(plain)  # timed second, in the same worker and job (its baselines are the same)
        result = self._worker().bench(kernels, [shape], scale=scale)
        if not result.ok:
            return Timing(ran=False, shape=_shape_text(shape))
        return _timing_from(result.value, shape, manifest, _mask_share(mods, manifest, shape))

    def _plain_twin(self, manifest: KernelManifest, target):
        """flashgen's own kernel of the manifest's variant, dtype and head dims on `target` without score or mask
        functions (the library's program at the first parameter choice), as a KernelInput; None where there is
        none to build."""
        from flashgen.harness.worker import KernelInput

        try:
            source, plain, _tl = self.expert_kernel(manifest.variant, target, manifest.dtype, manifest.head_dim,
                                                    manifest.head_dim_v)
        except FlashgenError:
            return None
        return KernelInput(manifest=plain, source=source)

    def expert_kernel(self, variant: Variant, target, dtype: DType, head_dim: int,
                      head_dim_v: int | None = None) -> tuple[str, KernelManifest, str]:
        """(CUDA source, manifest, full TL) of the library's program for `target` at the first parameter choice,
        through the reference translator: the expert provider's first answer. Raises FlashgenError (one line) for a
        combination the translator cannot build."""
        from flashgen.translators.params import choose_params_with_source

        dims = {"head_dim_v": head_dim_v} if head_dim_v is not None else {}
        self.check_supported(variant, target, dtype, head_dim, **dims)
        choice = choose_params_with_source(variant, target.name, dtype, head_dim, **dims)
        tl = self.library_tl(variant, target, dtype, head_dim, form="full", params=dict(choice.params), **dims,
                             size_params=choice.by_size)
        source, manifest = self.translate(tl, target)
        return source, manifest, tl

    def roofline(self, counts: dict[str, Any] | None, target, dtype: DType) -> dict[str, Any] | None:
        if counts is None:
            return None
        from flashgen.roofline import OpCounts, estimate

        est = estimate(OpCounts(**counts), target, dtype)
        return est.model_dump()

    # ----------------------------------------------------------------------------- store

    def open_store(self, path: str | Path | None = None):
        from flashgen.harness.store import Store

        return Store(path) if path is not None else Store()


def _defined_by(reference, shape: Shape, result) -> dict[str, Any]:
    """The reference program's fp64 outputs on `result`'s inputs, and `result`'s own where the reference defines
    nothing: values it leaves unwritten (NaN), or all of them when it does not run (a user's broken program is the
    reference of its repair only where it means something)."""
    from flashgen.tl_spec.diagnostics import TLRuntimeError
    from flashgen.tl_spec.interpreter import interpret

    try:
        ref = interpret(reference, shape, inputs=result.inputs, scale=result.scale).outputs
    except (TLRuntimeError, UsageError):
        return result.outputs
    own = result.outputs
    return {name: np.where(np.isnan(value), own[name], value) if name in own and np.shape(own[name]) == np.shape(value)
            else value for name, value in ref.items()}


def _mask_share(mods, manifest: KernelManifest, shape: Shape) -> float | None:
    """The share of (query, key) pairs a mask function leaves at `shape`, over the call-time tensors the timing passed
    (filled from bench.BENCH_SEED, as the timing fills them); None without a mask function, or for one the count
    cannot evaluate (it reads the score)."""
    if mods is None or mods.mask_mod is None:
        return None
    from flashgen.harness.bench import BENCH_SEED
    from flashgen.mods import visible_share

    return visible_share(mods, manifest.variant, manifest.call_tensors, shape, BENCH_SEED)


def _timing_from(report, shape: Shape, manifest: KernelManifest, mask_share: float | None = None) -> Timing:
    """The harness's BenchReport -> Timing: our median beside each baseline's that ran; TF/s over the pairs the
    variant's mask leaves, or `mask_share` of all of them for a kernel with a mask function. A second kernel entry
    is the plain twin Environment.bench timed after ours (kernel entries follow the inputs' order; the twin may
    carry our kernel's name)."""
    kernels = [entry for entry in report.entries if entry.kind == "kernel"]
    mine = [entry for entry in kernels if entry.name == manifest.name][:1]
    ours, plain = (_median(mine[0]) if mine else None), (_median(kernels[1]) if len(kernels) > 1 else None)
    baselines = {entry.name: entry.stats.median_ms for entry in report.entries
                 if entry.kind == "baseline" and entry.ok and entry.stats is not None}
    from flashgen.roofline import attention_flops, pair_flops

    plain_flops = attention_flops(shape, manifest.variant)  # the benchmark's count: the pairs the variant leaves
    flops = plain_flops if mask_share is None else pair_flops(shape, mask_share * shape.N * shape.M)
    tflops = flops / (ours * 1e-3) / 1e12 if ours else None
    return Timing(ran=ours is not None, shape=_shape_text(shape), time_ms=ours, tflops=tflops,
                  baselines_ms=baselines, visible_share=mask_share, plain_ms=plain,
                  plain_ratio=tflops / (plain_flops / (plain * 1e-3) / 1e12) if tflops and plain else None)


def _median(entry) -> float | None:
    return entry.stats.median_ms if entry.ok and entry.stats is not None else None


def _nvcc_release(version_text: str) -> str:
    """'nvcc 13.0.48' from `nvcc --version` (the full text holds build dates and paths)."""
    import re

    m = re.search(r"release [\d.]+, V([\d.]+)", version_text)
    return f"nvcc {m.group(1)}" if m else ""


def _shape_text(shape: Shape) -> str:
    return (f"B={shape.B},H={shape.H},KVH={shape.kv_heads},N={shape.N},M={shape.M},D={shape.D}"
            + (f",DV={shape.DV}" if shape.DV is not None else ""))


def _excerpt(text: str, line: int | None, context: int = 2) -> str:
    if line is None:
        return ""
    lines = text.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{'>' if n == line else ' '}{n:4d} | {lines[n - 1]}" for n in range(lo, hi + 1))


def manifest_from_json(text: str) -> KernelManifest:
    return KernelManifest.model_validate(json.loads(text))
