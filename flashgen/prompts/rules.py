"""The target's rules and which step gets each: the one place that decides what a model is told about the arch.

Every rule holds for some targets (`when`, over `Facts`: the GPU's capabilities, the dtype, the variant) and says
itself differently per step: the opening prompts (sketch, params, translate) carry the full text, the repair
prompts a one-line reminder of the rules their phase broke most often. A step missing from a rule's `says` does not
get it. The Hopper dataflow's own teaching for the sketch and params steps is the `_hopper.j2` partial (included by
sketch.j2 and params.j2, owned with the language); the rules here add what the translation needs.

Facts come from the contracts only (flashgen.targets, flashgen.abi) and the harness's include rule, so a rule
cannot disagree with the checker, the translator or the harness about a number."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from flashgen.targets import Target, tensor_cores_take, writes_role_dataflow
from flashgen.variant import DType, Variant

OPENING_STEPS = ("sketch", "params", "translate")


@dataclass(frozen=True)
class Facts:
    """What the rules are about: one target, dtype and variant."""

    gpu: str
    arch: str
    dtype: str
    smem_kb: int
    cp_async: bool
    converts: bool  # the tensor cores do not take the dtype: tiles are converted to fp16 (`as scaled fp16`)
    roles: bool  # the program is written in the Hopper dataflow (Role blocks)
    tf32: bool  # fp32 inputs run on tf32 tensor cores
    mma: str  # the mma.sync instruction the plain path uses for this dtype
    split_kv: bool
    headers: str  # the includes the harness allows, as a list for prose

    @classmethod
    def of(cls, target: Target, dtype: DType | str, variant: Variant) -> Facts:
        dt = DType(dtype).value
        converts = not tensor_cores_take(target.arch, dt)
        want = "fp16" if converts else ("tf32" if dt == "fp32" else dt)
        shapes = [m for m in target.mma if want in m.input_dtypes and m.instruction.startswith("mma.sync")]
        mma = max(shapes, key=lambda m: m.k).instruction if shapes else "mma.sync"
        return cls(gpu=target.marketing_name, arch=target.arch, dtype=dt, smem_kb=target.smem_per_block_bytes // 1024,
                   cp_async=target.has_cp_async, converts=converts,
                   roles=writes_role_dataflow(target.arch, dt, variant.split_kv), tf32=dt == "fp32" and not converts,
                   mma=mma, split_kv=variant.split_kv, headers=_headers())


def _headers() -> str:
    from flashgen.abi import ABI_INCLUDE
    from flashgen.harness.static_check import ALLOWED_HEADERS, ALLOWED_PREFIXES

    shown = [ABI_INCLUDE, "cuda_fp16.h", "cuda_bf16.h", "cuda_pipeline.h", "mma.h", "stdint.h"]
    assert set(shown) <= ALLOWED_HEADERS, "the include rule changed: update the headers the prompt names"
    return ", ".join(f"`{h}`" for h in shown) + ", " + ", ".join(f"`{p}...`" for p in ALLOWED_PREFIXES if p != "flashgen/")


@dataclass(frozen=True)
class Rule:
    key: str
    when: Callable[[Facts], bool]
    says: dict[str, str] = field(default_factory=dict)  # step or repair stage -> text (str.format over Facts)


RULES: tuple[Rule, ...] = (
    Rule("converted-tiles", lambda f: f.converts, {
        "sketch": "The tensor cores of {gpu} take fp16 only, so a {dtype} program converts its tiles on the way into "
                  "shared memory: write each load of Q, K and V as `Copy X from global to shared as scaled fp16`.",
        "params": "The tensor cores of {gpu} take fp16 only ({mma}), so a {dtype} program converts its tiles on the "
                  "way into shared memory: allocate Q_s, K_s and V_s with **dtype fp16** and load them with `Copy "
                  "... from global to shared X_s as scaled fp16` (each tile scaled by its own power of two, folded "
                  "back exactly after the GEMMs). Everything else keeps the program's types: the register operand "
                  "tiles (Q_r, P_r) are **{dtype}**, the accumulators (S_r, O_r) and row vectors fp32. The checker "
                  "rejects a register tile of dtype fp16 in a {dtype} program, and a load into an fp16 tile without "
                  "`as scaled fp16`.",
        "repair_check": "{arch} {dtype}: Q_s, K_s, V_s are fp16 tiles loaded `as scaled fp16`; register operand "
                        "tiles (Q_r, P_r) stay {dtype}, accumulators fp32.",
        "translate": "{gpu} has no {dtype} MMA, so the kernel converts each Q, K and V tile to fp16 on its way into "
                     "shared memory as x * 2^-e, e from the tile's largest |x| (a block-wide max; max * 2^-e in "
                     "[2^14, 2^15)). The fp32 scores are multiplied by 2^(e_q + e_k) right after Q K^T, before the "
                     "scale, score modifications and masks; O accumulates in units of 2^o_exp, the largest V-tile "
                     "exponent so far (a tile with a larger exponent rescales O, one with a smaller scales its P "
                     "before P is rounded to fp16), and the epilogue multiplies it back. The worked example does "
                     "exactly this.",
        "repair_wrong": "{arch} {dtype}: the per-tile power-of-two scales must be folded back: 2^(e_q + e_k) on the "
                        "scores after Q K^T, the V exponent on O.",
    }),
    Rule("register-staged-loads", lambda f: not f.cp_async, {
        "params": "{arch} has no cp.async: tiles are loaded through registers and the kernel keeps one K/V buffer "
                  "(a STAGES above 1 is translated as 1).",
        "translate": "{arch} has no cp.async: load global -> registers -> shared memory (16-byte vector loads), "
                     "zero-filling rows past N or M. MMAs: {mma} (fp16 in, fp32 accumulate; a k = 16 step is two "
                     "of them); ldmatrix (.x4, .trans) exists.",
    }),
    Rule("native-mma", lambda f: not f.converts and not f.roles and not f.tf32, {
        "params": "The tensor cores of {gpu} take {dtype} directly ({mma}): the shared and operand tiles are "
                  "{dtype}; `as scaled fp16` is rejected on {arch}.",
    }),
    Rule("cp-async-mma", lambda f: f.cp_async and not f.roles and not f.tf32, {
        "translate": "MMAs: {mma} with {dtype} inputs and fp32 accumulation; fragments with ldmatrix (.x4; .trans "
                     "for V); tile loads with 16-byte cp.async (commit_group / wait_group; a source size of 0 "
                     "zero-fills the rows past N or M), K and V double-buffered when STAGES is 2.",
    }),
    Rule("tf32", lambda f: f.tf32, {
        "params": "fp32 inputs run on tf32 tensor cores ({mma}): the shared and operand tiles are fp32, the GEMM k "
                  "a multiple of 8; `as scaled fp16` is rejected on {arch}.",
        "translate": "fp32 inputs run on tf32 tensor cores: round the operands with cvt.rna.tf32.f32 (P too, before "
                     "P V), {mma} tf32 with fp32 accumulation; ldmatrix cannot transpose 32-bit elements, so read "
                     "the fragments with scalar shared-memory loads; cp.async for the tile loads.",
    }),
    Rule("hopper-kernel", lambda f: f.roles, {
        "translate": "The program is written in the Hopper dataflow; translate it as the worked example does: a "
                     "warp-specialized kernel whose warpgroup 0 is the producer (one thread issues the TMA loads, "
                     "`cp.async.bulk.tensor` through the tensor maps, onto mbarriers, into the rings of stages) and "
                     "whose consumer warpgroups (64 query rows each) run `wgmma.mma_async` (S = Q K^T with both "
                     "operands in shared memory, O += P V with P from registers) and release each stage after its "
                     "last read; `setmaxnreg` moves registers from the producer to the consumers. The entry takes a "
                     "second parameter, `const __grid_constant__ FlashgenTensorMaps maps`; the manifest lists the "
                     "maps it reads in `tensor_maps` (the harness encodes them, 128-byte swizzle) and says "
                     '`"arch": "sm_90a"` (wgmma and setmaxnreg need sm_90a; the harness builds for it).',
        "repair_compile": "{arch}: wgmma and setmaxnreg need the manifest's `\"arch\": \"sm_90a\"`; an entry that "
                          "takes `FlashgenTensorMaps` needs `tensor_maps` in the manifest, and one without it none.",
    }),
    Rule("shared-memory", lambda f: True, {
        "params": "Shared memory: at most {smem_kb} KB per block on {gpu} (the checker counts a buffer that is "
                  "multi-buffered or staged once per stage).",
        "repair_check": "Shared memory: at most {smem_kb} KB per block.",
        "repair_slow": "Shared memory: at most {smem_kb} KB per block.",
        "translate": "Shared memory: put the tiles in dynamic shared memory (`extern __shared__`) and give each "
                     "launch's bytes in its `smem_bytes`. Before launching, the harness raises every launch with "
                     "`smem_bytes` > 0 to that size (cudaFuncAttributeMaxDynamicSharedMemorySize), so more than "
                     "48 KB works, up to {smem_kb} KB per block on {gpu} (static `__shared__` arrays included).",
    }),
    Rule("self-contained", lambda f: True, {
        "translate": "The source is self-contained device code, checked before nvcc runs: it includes only "
                     "{headers} (and the C headers such as `math.h`); no libraries (cuBLAS, cuDNN, CUTLASS, CUB, "
                     "thrust, torch), no CUDA runtime or driver calls, no malloc/new, no printf, no kernel launches "
                     "(the manifest lists them); every function is `__device__` or an entry point.",
    }),
)


def rules_for(stage: str, target: Target, dtype: DType | str, variant: Variant) -> list[str]:
    """The rules `stage` (an opening step or a repair prompt) gives for this target, dtype and variant, in RULES'
    order: the full texts at an opening step, the reminders at a repair."""
    facts = Facts.of(target, dtype, variant)
    return [rule.says[stage].format(**vars(facts)) for rule in RULES if stage in rule.says and rule.when(facts)]


def reference_for(text: str, target: Target, dtype: DType | str, variant: Variant) -> str:
    """The language reference as this task needs it: its sections on the Hopper dataflow and on split-KV decode
    only where the program is written so (each else stands as one line saying where it applies, so that the
    reference's pointers to it still land), every internal name removed (flashgen.prompts.internal.for_model)."""
    from flashgen.prompts.internal import for_model

    facts = Facts.of(target, dtype, variant)
    keep = {"Hopper dataflow": (facts.roles, "written only for sm_90 in fp16 or bf16 (Role blocks, stages, async "
                                             "copies); not this task's form"),
            "split-KV": (facts.split_kv, "only for a split_kv variant; not this task")}
    parts = re.split(r"(?m)^(?=## )", text)
    out = []
    for part in parts:
        heading = part.split("\n", 1)[0]
        topic = next((t for t in keep if heading.startswith("## ") and t in heading), None)
        if topic is None or keep[topic][0]:
            out.append(part)
        else:
            out.append(f"{heading}\n({keep[topic][1]}.)\n\n")
    return for_model("".join(out)).strip()
