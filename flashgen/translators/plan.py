"""KernelPlan: everything the CUDA renderer needs to emit one attention forward kernel.

A plan is the meeting point of two producers and one consumer:
- `flashgen.translators.lower` turns a full TL program into a plan (the paper's translation step);
- `flashgen.translators.rules.plan_for_variant` builds the same plan directly from a `Variant` (the
  rule-based path, used by tests and benchmarks); the expression pieces below serve both;
- `flashgen.translators.render.render(plan)` turns a plan into CUDA source + KernelManifest.
A plan names its code path (`backend`, chosen once from the `target` by
flashgen.translators.backends.backend_for) and carries the Target whose limits it was planned against.
This module is the bottom of flashgen.translators: it imports no other translator module.

The elementwise pieces are C expressions evaluated inside the kernel. The names they may use are
fixed (see `EXPR_NAMES`); anything else must be a literal or be defined by a `Prologue` entry.

Names visible to expressions (all `int` unless said otherwise):
  s          float: the current score of one (query row, key column) element. Score modifications see
             it already multiplied by p.scale; each modification's expression is the *new* value of s.
  qpos       absolute query row index, 0 <= qpos < seqlen_q (the row in Q/O, not shifted)
  kpos       absolute key index, 0 <= kpos < seqlen_k (the row in K/V)
  diag       seqlen_k - seqlen_q: the bottom-right alignment offset; query row i sits at key
             position i + diag (flashgen.variant conventions), so causal is `kpos <= qpos + diag`
  head       query head index;  heads: number of query heads;  kv_head: the K/V head it reads
  seqlen_q, seqlen_k, batch
  b          batch index (score modifications, masks and prologue entries)
  m_block    query tile index (rows m_block*BLOCK_M ..);  n_block: key tile index (tile-range
             expressions, `mask_tile` and `skip_tile` only)
  BLOCK_M, BLOCK_N    the tile sizes (compile-time constants)
  p          the kernel's FlashgenAttnParams: the caller's ALiBi slopes and call-time tensors are read through it
             (`alibi_slope_c`, `mod_tensor_c`; the only member reads an expression makes)
  plus every name a `Prologue` entry defines (computed once per thread block, before the loop),
  and the interval functions of the tile tests (`fg::iv::...`, INTERVAL_HEADER; qualified names are never checked).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flashgen.errors import UsageError
from flashgen.operators import FUNCTIONS
from flashgen.targets import Target
from flashgen.variant import DType, Norm, Variant, head_dim_problem, head_dim_v_problem

Arch = Literal["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
ARCHES: tuple[str, ...] = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
#: the head dims the tile tables (backends' `measured` and `defaults`) were measured or spill-checked at; any other
#: supported head dim (flashgen.variant.SUPPORTED_HEAD_DIMS, a backend's `head_dims` default) takes the entry of
#: `native_head_dim`, the nearest of these at or above it
NATIVE_HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
#: the interval functions of the tile tests (flashgen.translators.tiles): their header and C namespace
INTERVAL_HEADER = "flashgen/interval.cuh"
INTERVAL_NS = "fg::iv::"
#: bytes of a row one tensor-core k-step reads: m16n8k16 and wgmma k16 on 16-bit elements, m16n8k8 on tf32
MMA_K_BYTES = 32


def native_head_dim(head_dim: int) -> int:
    """The native head dim whose tile parameters `head_dim` takes: the nearest at or above it (its tiles hold as
    many columns or more, so they fit the registers and shared memory that `head_dim` needs)."""
    return min(d for d in NATIVE_HEAD_DIMS if d >= head_dim)


def padded_head_dim(head_dim: int, itemsize: int) -> int:
    """Columns of the Q, K and V tiles in shared memory for elements of `itemsize` bytes there: D rounded up to the
    tensor cores' k-step (16 for 16-bit, 8 for tf32), the extra columns zero (written by the tile loaders or, on the
    sm90 path, by TMA past the tensor map's D columns), so that Q K^T over them adds nothing. A V head dim of its
    own (Dv) pads the same way, for V's tile and O's staging tile: P V never multiplies the padding (its N stops at
    Dv, the last 8 columns alone where Dv % 16 == 8)."""
    k = MMA_K_BYTES // itemsize
    return -(-head_dim // k) * k


def choice_head_dim(head_dim: int, head_dim_v: int | None = None) -> int:
    """The head dim whose tile-table entries a kernel of (D, Dv) takes: the larger of the two (its O accumulator or
    its Q fragments and K tile, whichever is the wider, hold no more than that entry's); D without a Dv."""
    return head_dim if head_dim_v is None else max(head_dim, head_dim_v)

#: the names an expression reads a score's query or key position through (the kernel computes them per element)
POSITION_NAMES = frozenset({"qpos", "kpos", "diag"})
EXPR_NAMES = POSITION_NAMES | frozenset({
    "s", "head", "heads", "kv_head", "seqlen_q", "seqlen_k", "batch", "b",
    "m_block", "n_block", "BLOCK_M", "BLOCK_N", "p",
})
#: the C of each size a call-time tensor's dim may name (flashgen.abi.MOD_TENSOR_SIZES; D is the kernel's constant)
SIZE_C = {"B": "batch", "H": "heads", "KVH": "p.kv_heads", "N": "seqlen_q", "M": "seqlen_k"}
# C functions and keywords an expression may call or contain besides names.
C_BUILTINS = frozenset({
    "fmaxf", "fminf", "fabsf", "expf", "exp2f", "__expf", "__exp2f", "logf", "log2f", "__logf", "tanhf",
    "sqrtf", "rsqrtf", "min", "max", "abs", "float", "int", "true", "false", "INFINITY", "static_cast", "const",
    "nullptr",
}) | {part for f in FUNCTIONS.values() if f.c_float for name in f.c_float for part in name.split("::")}


class FactoredScore(BaseModel):
    """A score function of the form `out_factor * g(s * in_factor)` with out_factor > 0 (softcap's C * tanh(s / C)),
    split so that a backend can store g's value and give out_factor to the softmax's multiplier (the running max,
    every exponent and the LSE read it, and a positive factor commutes with the max), and fold in_factor into the
    scale: one multiply a score where the whole form takes three."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expr: str = Field(description="C float expression of g(s): the function's value over out_factor, at s * in_factor")
    in_factor: float = Field(description="what the scaled score is multiplied by before g")
    out_factor: float = Field(gt=0, description="what g's value is multiplied by: the score in natural units")


class DistanceTerm(BaseModel):
    """A score function of the form `rest + weight * |qpos + offset - kpos|` (ALiBi's -slope * |qpos + diag - kpos|,
    a user's `s - w * abs(q_idx - k_idx)`), split so that a backend can treat a tile whose distances all have one
    sign, where |.| is linear: there the term is the tile's value at one score plus a compile-time step times the
    weight, one FFMA a score instead of an integer add, a conversion and an FFMA."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rest: str = Field(description="C float expression: the function less the distance term (`s` for ALiBi)")
    weight: str = Field(description="C float expression, the same for every score of a block: `-alibi_slope`")
    offset: str = Field(description="C int expression, the same for every score of a block: `diag`")


class ScoreMod(BaseModel):
    """One elementwise change of the fp32 score, applied in list order after scaling by p.scale."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="what it is, for comments in the generated source: 'softcap', 'alibi'")
    expr: str = Field(description="C float expression giving the new s, e.g. '30.0f * fg::tanh_fast(s * (1.0f / 30.0f))'")
    uses_positions: bool = Field(description="True when expr reads qpos/kpos/diag (the kernel then computes them "
                                 "for every element of every tile, not only on boundary tiles)")
    key_terms: tuple[str, ...] = Field(default=(), description="the C, as it appears in expr, of each call of an SFU "
                                       "function (cos, exp, ...) on the key position and block constants alone "
                                       "(`fg::cos_approx((float)kpos)`): the same for every row of a column, so a "
                                       "backend may compute it once per column and share it")
    factored: FactoredScore | None = Field(default=None, description="expr as out_factor * g(s * in_factor), where "
                                           "the lowering found it in that form (the expression stays whole in expr)")
    distance: DistanceTerm | None = Field(default=None, description="expr as rest + weight * |qpos + offset - kpos|, "
                                          "where the lowering found it in that form (expr stays whole)")


class Prologue(BaseModel):
    """A per-block constant the expressions need, e.g. the ALiBi slope of this head."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ctype: Literal["float", "int"]
    name: str = Field(pattern=r"^[A-Za-z_]\w*$")
    expr: str = Field(description="C expression over head, heads, seqlen_q, seqlen_k, batch, diag")


class KeyRange(BaseModel):
    """`visible` as one interval of keys per query row: key kpos is visible to query qpos iff lo <= kpos < hi (a
    bound None: that side unbounded), lo and hi C int expressions over qpos and block invariants. A kernel can then
    mask a tile's scores against two per-row limits, not per score (the sm90 path's row_key_limits)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lo: str | None = Field(default=None, description="C int expression: the row's first visible key")
    hi: str | None = Field(default=None, description="C int expression: one past the row's last visible key")
    hi_rises: bool = Field(default=False, description="hi never falls as qpos rises, so a block of rows sees no key "
                                                      "at or past its last row's hi (causal, windows)")


class NormKind(str, Enum):
    softmax = "softmax"   # online softmax, exp2 with log2(e) folded into the scale, running max/sum rescale
    relu = "relu"         # p = p_expr, no running statistics, no final division
    sigmoid = "sigmoid"   # p = p_expr, likewise


class Normalization(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: NormKind
    p_expr: str | None = Field(default=None, description="C float expression of s giving p for relu/sigmoid "
                               "(invisible keys get p = 0 regardless); None for softmax, whose p is exp2-based")
    zero_at_masked: bool = Field(default=False, description="p_expr is exactly 0 at s = -inf: a backend may set an "
                                 "invisible key's score to -inf and apply p_expr to every score after the mask, as "
                                 "softmax does (the sm90 path: p_expr inside the mask's loop left ptxas short of "
                                 "registers for the wgmma pipeline, which it serialized; NOTES.md, session 20)")

    @model_validator(mode="after")
    def _p_expr_matches_kind(self) -> Normalization:
        if (self.kind is NormKind.softmax) != (self.p_expr is None):
            raise ValueError("p_expr is required for relu/sigmoid and must be None for softmax")
        return self


class KernelPlan(BaseModel):
    """One forward attention kernel (plus the split-KV combine kernel when variant.split_kv)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_]\w*$", description="entry symbol prefix; the split-KV combine "
                      "kernel is NAME_combine")
    arch: Arch = Field(description="target compute capability (the target's arch)")
    target: Target = Field(description="the GPU the plan was made for: its limits (shared memory, SMs) are the ones "
                           "the plan is checked against")
    backend: str = Field(description="the code path that renders it (flashgen.translators.backends: sm75, sm80)")
    dtype: DType = Field(description="element type of Q, K, V and O")
    head_dim: int = Field(description="D, one of SUPPORTED_HEAD_DIMS (multiples of 8 in 8..256)")
    head_dim_v: int | None = Field(default=None, description="Dv, V's and O's own head dim (the PV GEMM's N, V's tile "
                                   "width, O), by the rule of D; None: D (one head dim for Q, K, V and O)")
    block_m: int = Field(description="query rows per thread block (16 * warps * rows-tiles-per-warp)")
    block_n: int = Field(description="keys per inner-loop tile (multiple of 16)")
    warps: int = Field(ge=1, le=16, description="warps per block, each owning block_m / warps query rows")
    stages: int = Field(ge=1, le=3, description="K/V pipeline depth: 1 = FA2 interleave (V(n) in flight during "
                        "QK^T, K(n-1) during softmax+PV); 2 = K and V each double-buffered")
    variant: Variant = Field(description="the function this kernel implements")
    score_mods: list[ScoreMod] = Field(default_factory=list, description="applied to s in order")
    prologue: list[Prologue] = Field(default_factory=list, description="per-block constants for the expressions")
    visible: str | None = Field(default=None, description="C bool expression: key kpos is visible to query qpos; "
                                "None = all keys visible. Keys >= seqlen_k are always masked by the kernel")
    key_range: KeyRange | None = Field(default=None, description="`visible` exactly as a per-row interval of keys, "
                                       "where it is one (every condition linear in kpos with coefficient +-1); "
                                       "None: it is not, or all keys are visible")
    norm: Normalization
    write_lse: bool = Field(description="write the natural-log LSE (fp32) of each row to p.lse")
    kv_tile_begin: str = Field(default="0", description="C int expression: first key tile of query tile m_block")
    kv_tile_end: str = Field(default="(seqlen_k + BLOCK_N - 1) / BLOCK_N",
                             description="C int expression: one past the last key tile of m_block (may be <= begin: "
                             "then the block writes O = 0, LSE = -inf)")
    mask_tile: str = Field(default="false", description="C bool expression over m_block, n_block: this key tile "
                           "holds an invisible key for some row of the query tile (the kernel adds the "
                           "seqlen_k tail itself); tiles where it is false skip the `visible` test")
    skip_tile: str = Field(default="false", description="C bool expression over m_block, n_block (as mask_tile): "
                           "conservatively, no key of this tile is visible to any valid row of the query tile "
                           "(flashgen.translators.tiles: a mask's interval bounds over the tile); the kernel neither "
                           "loads nor computes such a tile, and a block whose every tile is one writes O = 0, "
                           "LSE = -inf. \"false\": none is skipped (the key loop keeps its range)")
    q_in_regs: bool = Field(default=True, description="Q fragments loaded once into registers (else re-read from "
                            "shared memory each tile, saving registers for large head dims)")
    group_heads: int = Field(default=1, ge=0, description="launch order: the query blocks of this many (batch, head) "
                             "pairs launch together, query block outermost (causal: longest rows first); 0 = all "
                             "pairs. 1 keeps the CTAs resident at once on few heads, whose K/V then come from L2; "
                             "all pairs start every causal block's longest rows first, for the shortest tail")

    @model_validator(mode="after")
    def _check(self) -> KernelPlan:
        if (problem := head_dim_problem(self.head_dim)) is not None:
            raise ValueError(problem)
        if self.head_dim_v is not None and (problem := head_dim_v_problem(self.head_dim_v)) is not None:
            raise ValueError(problem)
        if self.head_dim_v == self.head_dim:
            raise ValueError(f"head_dim_v {self.head_dim_v} is head_dim: give None (the kernel of one head dim)")
        if self.block_n % 16 or self.block_m % (16 * self.warps):
            raise ValueError(f"block_m={self.block_m} must be a multiple of 16*warps={16 * self.warps} "
                             f"and block_n={self.block_n} a multiple of 16")
        if (self.norm.kind.value != self.variant.norm.value):
            raise ValueError("norm kind disagrees with the variant's norm")
        if self.write_lse and self.norm.kind is not NormKind.softmax:
            raise ValueError("LSE exists only for softmax")
        return self

    @property
    def skips_tiles(self) -> bool:
        """Whether the kernel tests each key tile with skip_tile (else its key loop walks its whole range)."""
        return self.skip_tile != "false"

    @property
    def skip_prologue(self) -> list[Prologue]:
        """The per-block constants skip_tile reads (what a path that tests tiles outside the block's prologue, sm90's
        producer, carries to the test)."""
        names = expression_names(self.skip_tile)
        return [c for c in self.prologue if c.name in names]

    @property
    def uses_intervals(self) -> bool:
        """Whether a tile test calls the interval functions (INTERVAL_HEADER, included only then)."""
        return INTERVAL_NS in self.skip_tile or INTERVAL_NS in self.mask_tile

    @property
    def dv(self) -> int:
        """V's and O's head dim: head_dim_v, or head_dim."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def rows_per_warp(self) -> int:
        return self.block_m // self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps


# not a member name (p.alibi_slopes reads `p`) nor a qualified one (fg::iv::lt, std::min: never a kernel's local)
_IDENT = re.compile(r"(?<![.\w:])[A-Za-z_]\w*(?!\w)(?!::)")


def expression_names(expr: str) -> set[str]:
    """Identifiers an expression uses, minus float-literal suffixes (1.0f), member names and builtins."""
    stripped = re.sub(r"(?<![\w.])\d+\.?\d*(?:[eE][-+]?\d+)?[fF]?", " ", expr)
    return {n for n in _IDENT.findall(stripped) if n not in C_BUILTINS}


def substitute_name(expr: str, name: str, c: str) -> str:
    """The C expression with every use of identifier `name` (as expression_names finds them: not a member or a
    qualified name) replaced by the parenthesized C `c`."""
    return _IDENT.sub(lambda m: f"({c})" if m.group(0) == name else m.group(0), expr)


def check_expressions(plan: KernelPlan) -> None:
    """Raise UsageError naming any identifier an expression uses that the kernel does not define."""
    known = EXPR_NAMES | {p.name for p in plan.prologue}
    pieces = [("visible", plan.visible), ("kv_tile_begin", plan.kv_tile_begin), ("kv_tile_end", plan.kv_tile_end),
              ("mask_tile", plan.mask_tile), ("skip_tile", plan.skip_tile), ("p_expr", plan.norm.p_expr)]
    if plan.key_range is not None:
        pieces += [("key_range lo", plan.key_range.lo), ("key_range hi", plan.key_range.hi)]
    pieces += [(f"score_mod {m.name}", m.expr) for m in plan.score_mods]
    pieces += [(f"score_mod {m.name}, factored", m.factored.expr) for m in plan.score_mods if m.factored]
    pieces += [(f"score_mod {m.name}, distance", c) for m in plan.score_mods if m.distance
               for c in (m.distance.rest, m.distance.weight, m.distance.offset)]
    pieces += [(f"prologue {p.name}", p.expr) for p in plan.prologue]
    for what, expr in pieces:
        if expr is None:
            continue
        unknown = expression_names(expr) - known
        if unknown:
            raise UsageError(f"kernel plan {plan.name}: {what} expression {expr!r} uses undefined name(s) "
                             f"{sorted(unknown)}")


def _cfloat(x: float) -> str:
    return f"{float(x)!r}f".replace("inff", "INFINITY")


# --- the C of what a kernel reads through FlashgenAttnParams besides Q, K, V (the ABI's alibi_slopes, mod_tensors) ---

def alibi_slope_c(b: str, h: str) -> str:
    """C float: the ALiBi slope of batch `b`, head `h` (C ints, in range): the caller's (FlashgenAttnParams.alibi_slopes,
    FlashAttention's (H) or (B, H) slopes) or, where the caller gives none (a null pointer), the standard
    2^(-8 (h + 1) / H). A per-block constant: it goes into the plan's prologue, so every backend reads it alike."""
    return (f"(p.alibi_slopes != nullptr ? p.alibi_slopes[{b} * p.alibi_stride_b + {h}] "
            f": exp2f(-8.0f * (float)({h} + 1) / (float)heads))")


def mod_tensor_c(slot: int, dtype: str, indices: list[str]) -> str:
    """C: element `indices` (C ints, already clamped into the dims) of call-time tensor `slot`
    (FlashgenAttnParams.mod_tensors, its element strides mod_strides[slot]), int for int32, float for fp32."""
    ctype = "int" if dtype == "int32" else "float"
    offset = " + ".join(f"{i} * p.mod_strides[{slot}][{axis}]" for axis, i in enumerate(indices))
    return f"static_cast<const {ctype}*>(p.mod_tensors[{slot}])[{offset}]"


# --- the rule-based construction of the variant-specific pieces (reusable by lower.py) ---

def score_mods_for(variant: Variant) -> tuple[list[ScoreMod], list[Prologue]]:
    mods: list[ScoreMod] = []
    prologue: list[Prologue] = []
    if variant.softcap is not None:
        c = variant.softcap
        tanh = FUNCTIONS["tanh"].c_float[0]
        mods.append(ScoreMod(name="softcap", expr=f"{_cfloat(c)} * {tanh}(s * {_cfloat(1.0 / c)})", uses_positions=False,
                             factored=FactoredScore(expr=f"{tanh}(s)", in_factor=1.0 / c, out_factor=c)))
    if variant.alibi:
        prologue.append(Prologue(ctype="float", name="alibi_slope", expr=alibi_slope_c("b", "head")))
        mods.append(ScoreMod(name="alibi", expr="s - alibi_slope * fabsf((float)(qpos + diag - kpos))",
                             uses_positions=True, distance=DistanceTerm(rest="s", weight="-alibi_slope", offset="diag")))
    return mods, prologue


def visibility_for(variant: Variant) -> tuple[str | None, str, str, str, KeyRange | None]:
    """(visible, kv_tile_begin, kv_tile_end, mask_tile, key_range) for the variant's mask."""
    all_tiles_end = "(seqlen_k + BLOCK_N - 1) / BLOCK_N"
    if variant.two_sided:
        return _two_sided_visibility(variant, all_tiles_end)
    if not variant.causal:
        return None, "0", all_tiles_end, "false", None
    # last visible key of the tile's last row is (m_block+1)*BLOCK_M - 1 + diag
    end = f"min({all_tiles_end}, max(0, ((m_block + 1) * BLOCK_M + diag + BLOCK_N - 1) / BLOCK_N))"
    causal_mask = "(n_block + 1) * BLOCK_N - 1 > m_block * BLOCK_M + diag"
    if variant.window is None:
        return "kpos <= qpos + diag", "0", end, causal_mask, KeyRange(hi="qpos + diag + 1", hi_rises=True)
    w = variant.window
    # first visible key of the tile's first row is m_block*BLOCK_M + diag - (W - 1)
    begin = f"max(0, m_block * BLOCK_M + diag - {w - 1}) / BLOCK_N"
    visible = f"kpos <= qpos + diag && qpos + diag - kpos < {w}"
    window_mask = f"(m_block + 1) * BLOCK_M - 1 + diag - n_block * BLOCK_N >= {w}"
    return (visible, begin, end, f"({causal_mask}) || ({window_mask})",
            KeyRange(lo=f"qpos + diag - {w - 1}", hi="qpos + diag + 1", hi_rises=True))


def _two_sided_visibility(variant: Variant, all_tiles_end: str) -> tuple[str, str, str, str, KeyRange]:
    """FlashAttention's window size (left, right), not causal: keys qpos + diag - left .. qpos + diag + right; the
    key-tile range skips the tiles before the first row's window and after the last row's."""
    left, right = variant.window_left, variant.window_right
    conds, masks, begin, end = [], [], "0", all_tiles_end
    lo = hi = None
    if right is not None:
        conds.append(f"kpos <= qpos + diag + {right}")
        hi = f"qpos + diag + {right + 1}"
        # last visible key of the tile's last row is (m_block+1)*BLOCK_M - 1 + diag + right
        end = f"min({all_tiles_end}, max(0, ((m_block + 1) * BLOCK_M + diag + {right} + BLOCK_N - 1) / BLOCK_N))"
        masks.append(f"(n_block + 1) * BLOCK_N - 1 > m_block * BLOCK_M + diag + {right}")
    if left is not None:
        conds.append(f"qpos + diag - kpos <= {left}")
        lo = f"qpos + diag - {left}"
        # first visible key of the tile's first row is m_block*BLOCK_M + diag - left
        begin = f"max(0, m_block * BLOCK_M + diag - {left}) / BLOCK_N"
        masks.append(f"(m_block + 1) * BLOCK_M - 1 + diag - n_block * BLOCK_N > {left}")
    return (" && ".join(conds), begin, end, " || ".join(f"({m})" for m in masks),
            KeyRange(lo=lo, hi=hi, hi_rises=hi is not None))


def normalization_for(variant: Variant) -> tuple[Normalization, list[Prologue]]:
    if variant.norm is Norm.softmax:
        return Normalization(kind=NormKind.softmax), []
    if variant.norm is Norm.relu:
        # relu as a select: flashgen.translators.cexpr says why
        return (Normalization(kind=NormKind.relu, p_expr="(s > 0.0f ? s : 0.0f) * inv_seqlen_k", zero_at_masked=True),
                [Prologue(ctype="float", name="inv_seqlen_k", expr="1.0f / (float)seqlen_k")])
    return (Normalization(kind=NormKind.sigmoid, p_expr="1.0f / (1.0f + __expf(log_seqlen_k - s))",
                          zero_at_masked=True),
            [Prologue(ctype="float", name="log_seqlen_k", expr="logf((float)seqlen_k)")])


def launch_order(variant: Variant) -> str:
    """"causal" where query blocks differ in work (causal rows, windows; split-KV decode has its own grid), else
    "full": the two want different launch orders (GROUP_HEADS)."""
    return "causal" if variant.causal and not variant.split_kv else "full"


def default_group_heads(variant: Variant) -> int:
    """GROUP_HEADS when a table or a tuned file does not say: 1 for full rows (one head's query blocks back to back,
    so K/V come from L2: +4% at d128 on the H200 against all heads interleaved), 0 for causal rows (every head's
    longest blocks first: +4-7% against one head at a time, whose last heads' long blocks end the launch late)."""
    return 0 if launch_order(variant) == "causal" else 1


def tile_fields(params: dict[str, int], variant: Variant) -> dict[str, Any]:
    """KernelPlan's fields from tile parameters (BLOCK_M, BLOCK_N, WARPS, STAGES; optional Q_IN_REGS and
    GROUP_HEADS, whose absence means Q in registers and the variant's default launch order)."""
    return dict(block_m=int(params["BLOCK_M"]), block_n=int(params["BLOCK_N"]), warps=int(params["WARPS"]),
                stages=int(params["STAGES"]), q_in_regs=bool(params.get("Q_IN_REGS", 1)),
                group_heads=int(params.get("GROUP_HEADS", default_group_heads(variant))))
