"""The `Backend` base: one code path of the CUDA translator.

A backend is chosen once per `flashgen.targets.Target` (`flashgen.translators.backends.backend_for`) and named
in the `KernelPlan` (`plan.backend`, beside `plan.target`). It owns everything that differs between code paths:
its kernel template(s) and arch header(s) (in its folder), and the facts the planner, the parameter choice, the
search and the renderer ask for (max stages, shared-memory element size, the tensor-core instructions it uses,
nvcc flags, parameter tables, the tile search space). The GPU's own limits (shared memory per block and per SM,
SM count) are read from the Target, never from an arch string.

Shared by every backend: the kernel skeleton `translators/templates/attention_fwd.cu.j2` (its blocks are the
FA2 interleave with one K and one V buffer, over any `tile_loader` with issue()/land()), a backend template
extending it where the path differs, and the shared headers in `translators/include/flashgen/` (common.cuh,
mma.cuh, attn_warp.cuh).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from flashgen.targets import TARGETS, Target, gencode_flags
from flashgen.translators.plan import POSITION_NAMES, KernelPlan, NormKind, expression_names, padded_head_dim
from flashgen.variant import SUPPORTED_HEAD_DIMS, DType, head_dim_problem, head_dims_tag

BACKENDS_DIR = Path(__file__).resolve().parent
TRANSLATORS_DIR = BACKENDS_DIR.parent
SHARED_TEMPLATES = TRANSLATORS_DIR / "templates"
SHARED_INCLUDE = TRANSLATORS_DIR / "include"
#: the shared kernel skeleton (in SHARED_TEMPLATES); a backend template `{% extends %}` it
SKELETON = "attention_fwd.cu.j2"

_CTYPE = {DType.fp16: "fg::f16", DType.bf16: "fg::bf16", DType.fp32: "fg::f32"}
_TF32_NOTE = "fp32 inputs run on tf32 tensor cores (10-bit mantissa products, fp32 accumulation)"


def tile_bytes(rows: int, cols: int, itemsize: int) -> int:
    """st_layout<rows, cols, itemsize>::BYTES (common.cuh): XOR swizzle, or one chunk of padding per row."""
    chunk_elems = 16 // itemsize
    chunks = cols // chunk_elems
    row_elems = cols if chunks % 8 == 0 else cols + chunk_elems
    return rows * row_elems * itemsize


def tiles_bytes(block_m: int, block_n: int, head_dim: int, itemsize: int, stages: int = 1,
                head_dim_v: int | None = None, o_staged: bool = True) -> int:
    """Q's tile plus `stages` K and V tiles each, padded_head_dim columns wide (the skeleton's D_PAD). With a V head
    dim of its own each tile counts at its own width: V's at Dv's padding (DV_PAD), and Q's region holds O's staging
    tile too (BLOCK_M x DV_PAD, written over Q's after the key loop) where O is `o_staged` through it."""
    cols = padded_head_dim(head_dim, itemsize)
    if head_dim_v is None:
        return tile_bytes(block_m, cols, itemsize) + 2 * stages * tile_bytes(block_n, cols, itemsize)
    cols_v = padded_head_dim(head_dim_v, itemsize)
    q_region = max(tile_bytes(block_m, cols, itemsize), tile_bytes(block_m, cols_v, itemsize) if o_staged else 0)
    return q_region + stages * (tile_bytes(block_n, cols, itemsize) + tile_bytes(block_n, cols_v, itemsize))


def v_names(plan: KernelPlan, itemsize: int) -> dict:
    """The names V's and O's width goes by in a kernel template: D's own (D, D_PAD, K's layout for V's tile, Q's for
    O's staging, the warp GEMMs' P V) where V has no head dim of its own, so that those kernels render as they always
    have; else DV's (DV, DV_PAD, VLayout, OLayout, VMma::pv: constants and types the template defines then). Also
    `own_dv`, `dv_pad` (DV_PAD's value) and `dims_tag` (d64, d192v128)."""
    own = plan.head_dim_v is not None
    return dict(own_dv=own, dv_pad=padded_head_dim(plan.dv, itemsize), dims_tag=head_dims_tag(plan.head_dim, plan.head_dim_v),
                v_dim="DV" if own else "D", v_pad="DV_PAD" if own else "D_PAD",
                v_layout="VLayout" if own else "KLayout", o_layout="OLayout" if own else "QLayout",
                q_region="Q_REGION_ELEMS" if own else "QLayout::ELEMS", pv_mma="VMma::pv" if own else "mma.pv")


def score_exprs(plan: KernelPlan, term_slot: str, share_key_terms: bool = True) -> dict:
    """The score functions as a template writes them, `score_exprs` [(expr, name)] per ScoreMod, and `key_terms`,
    the key-only calls (ScoreMod.key_terms, e.g. `fg::cos_approx((float)kpos)`) that templates/key_terms.cu.j2
    computes once per column and warp where `share_key_terms`: the expressions then read `kt<n>[term_slot]`,
    `term_slot` being the C of the score's slot 2j + c (column 8j + 2t + c) in the path's accumulator loop. Without
    it the expressions are as lowered and every score calls the function itself."""
    terms: list[str] = []
    exprs = []
    for mod in plan.score_mods:
        expr = mod.expr
        for term in mod.key_terms if share_key_terms else ():
            if term not in terms:
                terms.append(term)
            expr = expr.replace(term, f"kt{terms.index(term)}[{term_slot}]")
        exprs.append((expr, mod.name))
    return dict(score_exprs=exprs, key_terms=terms)



def positions_per_score(plan: KernelPlan, share_key_terms: bool = True) -> bool:
    """True when a score function still computes on a query or key position for every score once its key-only
    calls are shared (score_exprs): ALiBi's distance, a relative-position bias; not `s + 0.25 * cos(k_idx)` with its
    term shared, nor softcap. Such a softmax phase runs longer per score than plain's and than the overlap inside a
    warpgroup hides."""
    exprs = score_exprs(plan, "0", share_key_terms)["score_exprs"]
    return any(expression_names(expr) & POSITION_NAMES for expr, _ in exprs)

def score_units(plan: KernelPlan, distance_terms: bool = False) -> dict:
    """How a template turns a score into the softmax's log2 units, decided once for every path: `softmax`;
    `raw_scores`, no score function (a stored score is multiplied by scale * log2 e in each exponent's FFMA);
    `log2e_in_exponent`, score functions whose output (natural units) takes log2 e in that FFMA rather than in a
    multiply of each score (ALiBi +2-5 %, `s + 0.25 * cos(k_idx)` with its shared term +2-5 % on the H200);
    `score_fold`, the plan.FactoredScore of a lone score function in that form, softcap's C * tanh(s / C): the
    template stores tanh(acc * (scale / C)) and `score_out_log2`, C * log2 e, is the softmax's multiplier (every
    path; softcap 30 bf16 d128 on an H100: the sm90 path +13 / +5 % at 4k / 512, 0.73 -> 0.81 of plain's TF/s,
    session 23; the sm80 / sm75 skeleton's key-tile loop 1790 -> 1415 instructions at d128, +0.3..1.9 % on an
    H100, where that path is bound by the SFU and mma.sync: NOTES.md, sessions 24-25). `distance` is the score function with a plan.DistanceTerm (distance_form) for a
    path that treats it tile by tile (`distance_terms`: sm90; docs/translators.md). Softcap unfolded keeps the
    multiply by log2 e: bound by the SFU, it measured 2-7 % slower with log2 e alone in the FFMA, in two runs
    (NOTES.md, sessions 10 and 23)."""
    softmax = plan.norm.kind is NormKind.softmax
    raw = softmax and not plan.score_mods
    mods = plan.score_mods
    fold = mods[0].factored if softmax and len(mods) == 1 and not mods[0].key_terms else None
    return dict(softmax=softmax, raw_scores=raw, score_fold=fold,
                score_out_log2=fold.out_factor * math.log2(math.e) if fold else None,
                log2e_in_exponent=softmax and not raw and (plan.variant.softcap is None or fold is not None),
                distance=distance_form(plan) if distance_terms else None)


def distance_form(plan: KernelPlan) -> dict | None:
    """The score function whose distance term a template treats tile by tile (plan.DistanceTerm; ALiBi bf16 d128
    +7 / +3 % at 4k / 512 on an H100, 0.84 -> 0.92 of plain's TF/s): its index among the score functions, its name
    and the term, where exactly one has one and no shared key-only term (which the template writes into the
    expression in place of the call). None otherwise."""
    found = [(i, mod) for i, mod in enumerate(plan.score_mods) if mod.distance is not None]
    if len(found) != 1 or found[0][1].key_terms:
        return None
    index, mod = found[0]
    return dict(index=index, mod=mod.name, term=mod.distance)


class SearchSpace(BaseModel):
    """The tile parameters `flashgen tune` screens (flashgen.translators.search), one tuple per key."""

    model_config = ConfigDict(frozen=True)

    block_m: tuple[int, ...] = (64, 128, 256)
    block_n: tuple[int, ...] = (16, 32, 64, 128)  # 16: the only key tile that fits d256 in fp32 or on Turing
    warps: tuple[int, ...] = (4, 8)
    stages: tuple[int, ...] = (1, 2)
    q_in_regs: tuple[int, ...] = (0, 1)
    # launch orders (GROUP_HEADS): the variant's default first (plan.default_group_heads), then the other
    group_heads: tuple[int, ...] = (1, 0)


Params = dict[str, int]


def tile_params(bm: int, bn: int, w: int, q: int, s: int = 1) -> Params:
    """A parameter-table entry: BLOCK_M, BLOCK_N, WARPS, Q_IN_REGS, STAGES."""
    return {"BLOCK_M": bm, "BLOCK_N": bn, "WARPS": w, "STAGES": s, "Q_IN_REGS": q}


class Backend:
    """One code path. Subclasses set the class attributes and override what their path does differently."""

    #: the backend's name, as plan.backend carries it: the folder's name (sm75, sm80)
    name: ClassVar[str]
    #: the archs (Target.arch) this path is chosen for, unless `supports` says otherwise
    archs: ClassVar[tuple[str, ...]]
    #: the deepest K/V buffering its templates implement (plan.stages in 1..max_stages)
    max_stages: ClassVar[int]
    #: the tensor-core instructions its headers emit, per input dtype (docs; checked against the Target in tests)
    mma_instructions: ClassVar[dict[str, str]]
    #: its arch header, included as flashgen/<name> from its folder's include/flashgen/
    arch_header: ClassVar[str]
    head_dims: ClassVar[tuple[int, ...]] = SUPPORTED_HEAD_DIMS
    #: spill-checked starting points: (dtype, head_dim) -> params (flashgen.translators.params.choose_params)
    defaults: ClassVar[dict[tuple[str, int], Params]] = {}
    #: parameters measured on a GPU: (arch, dtype, head_dim, launch order) -> params, read before `defaults`
    measured: ClassVar[dict[tuple[str, str, int, str], Params]] = {}
    #: tiles measured faster over a range of sizes than the `measured` entry of the same key: key -> ((size, op,
    #: bound, params), ...), written as `Params when` lines (the first that holds wins; flashgen.tl_spec.ast.SizeParams)
    measured_by_size: ClassVar[dict[tuple[str, str, int, str], tuple[tuple[str, str, int, Params], ...]]] = {}
    search_space: ClassVar[SearchSpace] = SearchSpace()
    #: True where the backend renders its kernels itself (`render`) instead of through the shared skeleton
    own_renderer: ClassVar[bool] = False
    #: True where it translates programs written in the Hopper dataflow (Role blocks, docs/llm-tl.md) and only those
    #: (a program without roles goes to the target's next path); False: the plain dataflow
    role_dataflow: ClassVar[bool] = False

    # ------------------------------------------------------------------ where it lives
    @property
    def folder(self) -> Path:
        return Path(inspect.getfile(type(self))).resolve().parent

    @property
    def include_dir(self) -> Path:
        """Its headers, as <include_dir>/flashgen/<header> (so `-I include_dir` finds "flashgen/<header>")."""
        return self.folder / "include"

    @property
    def source_label(self) -> str:
        """Where its parameter tables are, for ParamsChoice.detail."""
        return f"flashgen/translators/backends/{self.name}"

    # ------------------------------------------------------------------ the choice
    def supports(self, target: Target) -> bool:
        return target.arch in self.archs

    def accepts(self, variant, dtype) -> bool:
        """Whether this path implements the variant in the dtype (either None: not known yet). A target's first
        backend that does not is passed over for the next one that supports the target (backend_for)."""
        return True

    def choice_note(self, target: Target) -> str:
        """Why this path translates for `target` (meta.json's code_path): by default, it is the target's only one."""
        return f"the {self.name} path is the translator's path for {target.arch}"

    def head_dim_problem(self, head_dim: int) -> str | None:
        """Why this path does not take `head_dim` (one sentence), or None when it does."""
        if head_dim in self.head_dims:
            return None
        return head_dim_problem(head_dim) or f"head dim {head_dim} is not supported by the {self.name} path"

    def validate(self, plan: KernelPlan) -> None:
        """Raise UsageError for a plan this path cannot render (beyond stages and shared memory)."""

    def render(self, plan: KernelPlan):
        """(source, manifest) for a backend with `own_renderer`; the others render through the shared skeleton."""
        raise NotImplementedError(f"backend {self.name} renders through the shared skeleton")

    # ------------------------------------------------------------------ facts
    def compile_arch(self, target: Target) -> str:
        """The nvcc arch its kernels for `target` are written for (KernelManifest.arch)."""
        return target.arch

    def nvcc_flags(self, target: Target) -> tuple[str, ...]:
        """The -gencode flags for its kernels on `target` (flashgen.harness.compile.ARCH_FLAGS[compile_arch])."""
        return gencode_flags(self.compile_arch(target))

    def tensor_cores_take(self, target: Target, dtype: DType) -> bool:
        """Whether the target's mma instructions take `dtype` inputs as they are (fp32 through tf32)."""
        want = "tf32" if DType(dtype) is DType.fp32 else DType(dtype).value
        return want in target.tensor_dtypes

    def smem_itemsize(self, target: Target, dtype: DType) -> int:
        """Bytes per shared-memory element."""
        return DType(dtype).itemsize

    def smem_limit(self, target: Target) -> int:
        """Dynamic shared memory one block may use (the target's opt-in maximum)."""
        return target.smem_per_block_bytes

    def smem_bytes(self, plan: KernelPlan) -> int:
        """Dynamic shared memory of the plan's kernel."""
        item = self.smem_itemsize(plan.target, plan.dtype)
        return tiles_bytes(plan.block_m, plan.block_n, plan.head_dim, item, plan.stages, plan.head_dim_v)

    def model_smem_per_sm(self, target: Target) -> int:
        """Shared memory per SM the occupancy model (params.model_score) counts resident blocks against."""
        return target.smem_per_sm_bytes

    def split_sm_count(self, target: Target) -> int:
        """The SM count the split-KV split count is written for: the largest among the known GPUs of the target's
        arch, so that one manifest serves every GPU of the arch as before (target.sm_count would change the
        manifests of T4, A10 and L4: for the lead, see docs/translators.md)."""
        return max([t.sm_count for t in TARGETS.values() if t.arch == target.arch] or [target.sm_count])

    # ------------------------------------------------------------------ rendering
    def template(self, plan: KernelPlan) -> str:
        """The template that renders the plan's kernel (a name under SHARED_TEMPLATES or BACKENDS_DIR)."""
        return SKELETON

    def warp_mma(self, plan: KernelPlan) -> str:
        q = str(plan.q_in_regs).lower()
        if plan.dtype is DType.fp32:
            return f"fg::warp::attn_mma_tf32<MT, D, BLOCK_N, {q}, BLOCK_M>"
        return f"fg::warp::attn_mma16<T, MT, D, D_PAD, BLOCK_N, {q}, BLOCK_M>"

    def packed_p(self, plan: KernelPlan) -> bool:
        """P packed to 16 bits straight after the exponentials (fp32/tf32 keeps fp32 P)."""
        return plan.norm.kind is NormKind.softmax and plan.dtype is not DType.fp32

    def warp_mma_v(self, plan: KernelPlan) -> str:
        """The warp GEMMs whose P V a kernel with a V head dim of its own runs (over DV, V's tile DV_PAD wide): the
        same structs as `warp_mma`, at V's width."""
        if plan.dtype is DType.fp32:
            return "fg::warp::attn_mma_tf32<MT, DV, BLOCK_N, false, BLOCK_M>"
        return "fg::warp::attn_mma16<T, MT, DV, DV_PAD, BLOCK_N, false, BLOCK_M>"

    def context(self, plan: KernelPlan) -> dict:
        """The template variables this backend provides."""
        itemsize = self.smem_itemsize(plan.target, plan.dtype)
        return dict(ctype=_CTYPE[plan.dtype], arch_header=self.arch_header, warp_mma=self.warp_mma(plan),
                    packed_p=self.packed_p(plan), d_pad=padded_head_dim(plan.head_dim, itemsize),
                    **v_names(plan, itemsize), warp_mma_v=self.warp_mma_v(plan) if plan.head_dim_v else "",
                    # the skeleton's score loop: acc_s[mt][nt][c], column 8 nt + 2t + (c & 1)
                    **score_exprs(plan, "nt * 2 + (c & 1)"))

    def notes(self, plan: KernelPlan) -> str:
        """KernelManifest.notes: how the dtype is handled."""
        return _TF32_NOTE if plan.dtype is DType.fp32 else ""

    def __repr__(self) -> str:
        return f"<backend {self.name}>"
