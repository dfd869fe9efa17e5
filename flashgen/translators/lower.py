"""Full LLM-TL -> KernelPlan: the rule-based front half of the translator.

The lowering reads the program's dataflow, not its Variant line: the score transforms, masks, the
normalization, the epilogue and the key-tile loop bounds are all compiled from the TL expressions
(flashgen.translators.cexpr), so a new mask or score function written in TL translates.

What it looks for in the one kernel holding the GEMMs (a second kernel is allowed as the split-KV combine):
- parallel loops over B, H, cdiv(N, BLOCK_M) (and SPLITS): the launch grid;
- one sequential key loop `for n in range(START, STOP)` loading K/V tiles [n*BLOCK_N, +BLOCK_N);
  START/STOP (Lets inlined) become kv_tile_begin/kv_tile_end;
- tile loads `as scaled fp16` only where the arch's tensor cores do not take the program's dtype (bf16/fp32
  on sm_75): that is how the translator stores those tiles anyway (docs/turing-dtypes.md);
- `Compute GEMM Q, K^T and get S`, then the steps on S, in order:
    * `S = S * c` with c a product of constants and `scale`: a change of units (tracked, not emitted);
    * `S = where(cond, S, -inf)` (or `where(cond, -inf, S)`, `S + where(cond, 0, -inf)`): a mask; the
      conjuncts of cond become the visibility predicate (the key tail `k_idx < M` is the kernel's own),
      and a box bound over the tile's rows/keys gives `mask_tile` when cond is linear in q_idx/k_idx; interval
      bounds over the tile (flashgen.translators.tiles) give `skip_tile` (the tiles no key of which can be visible,
      the Variant line's own masks left to the key loop's range) and `mask_tile` for the other conditions;
    * anything else: a score modification, an fp32 C expression in the plan's `s` (natural units,
      already times p.scale), with block-invariant factors hoisted into prologue constants;
- the normalization: `OnlineSoftmax` (or its explicit steps, recognised by running them on sample tiles
  against the composite; exp2 or exp), or for relu/sigmoid the last step (often `where(cond, g(S), 0)`)
  giving p = g(s);
- `Reshape S into P`, `Compute GEMM P, V and accumulate O`;
- the epilogue after the loop (O / l and the LSE), checked by running it on sample rows.

A program in the Hopper dataflow (Role blocks: a producer loading Q once and K/V into rings of stages, a consumer
computing; docs/llm-tl.md) is read by backends/sm90/dataflow.py: its roles give the plan's stages (the rings' depth)
and warps (the consumer's), and the same computation in the plain dataflow is lowered as above. It is translated by
a path with `role_dataflow` (sm90); pinned to another path (`backend=`), its roles are flattened, with a note. A
program without roles goes to the target's plain path (on sm_90 the sm80 path, mma.sync and cp.async), with a note.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from flashgen import operators
from flashgen.abi import KernelManifest
from flashgen.errors import UsageError
from flashgen.targets import Target, resolve_target
from flashgen.tl_spec import ast
from flashgen.tl_spec.printer import format_expr, format_program
from flashgen.translators import tiles
from flashgen.translators.backends import BACKENDS, backend_for, get_backend
from flashgen.translators.backends.sm90 import dataflow as hopper
from flashgen.translators.cexpr import (
    CEnv,
    CExprError,
    NameInfo,
    Poly,
    TensorInfo,
    UnsupportedConstruct,
    compile_expr,
    evaluate,
    from_poly,
    infer_ctype,
    substitute,
    to_poly,
)
from flashgen.translators.plan import (
    POSITION_NAMES,
    SIZE_C,
    DistanceTerm,
    FactoredScore,
    KernelPlan,
    KeyRange,
    Normalization,
    NormKind,
    Prologue,
    ScoreMod,
    alibi_slope_c,
    expression_names,
    mod_tensor_c,
    tile_fields,
)
from flashgen.variant import Norm, Shape, head_dim_v_problem, head_dims_tag

LOG2E = ast.CONSTANTS["log2e"]
_REL_TOL = 1e-9


class Translation(BaseModel):
    """The result of translating one full TL program for one target."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: str
    manifest: KernelManifest
    plan: KernelPlan
    notes: list[str] = []


# --------------------------------------------------------------------------- helpers

def _line(node: Any) -> int | None:
    loc = getattr(node, "loc", None)
    return loc.line if loc is not None else None


def _same(a: Any, b: Any) -> bool:
    """Structural equality after normalization (q0 + BLOCK_M == BLOCK_M + q0)."""
    pa, pb = to_poly(a), to_poly(b)
    return pa.add(pb, -1).terms == {}


def _N(name: str) -> ast.Name:
    return ast.Name(id=name)


def _num(v: float) -> ast.Num:
    return ast.Num(value=v)


def _bin(op: str, a: Any, b: Any) -> ast.Binary:
    return ast.Binary(op=op, left=a, right=b)


def _reads_key_alone(expr: Any, invariant: set[str], needs_key: bool = True) -> bool:
    """Whether `expr` reads k_idx (where `needs_key`) and block constants alone, no tensor: one value a key column."""
    names = _names(expr)
    return (not needs_key or "k_idx" in names) and names <= invariant | {"k_idx"} and not ast.tensors_read(expr)


def _names(expr: Any) -> set[str]:
    return set(ast.expr_names(expr))


def _diag_hook(p: Poly) -> Poly:
    """`M - N` (times c) in a sum -> `diag` (times c): the plan's name for the bottom-right offset."""
    m = (("M", 1),)
    n = (("N", 1),)
    cm, cn = p.terms.get(m), p.terms.get(n)
    if cm is None or cn is None or cm != -cn or not isinstance(cm, int):
        return p
    out = p.copy()
    del out.terms[m], out.terms[n]
    return out.add(Poly.atom(_N("diag")).scale_by(cm))


def _conjuncts(cond: Any) -> list[Any]:
    if isinstance(cond, ast.Binary) and cond.op == "and":
        return _conjuncts(cond.left) + _conjuncts(cond.right)
    return [cond]


def _is_neg_inf(expr: Any) -> bool:
    try:
        v = evaluate(expr, {})
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return False
    return isinstance(v, (int, float, np.floating)) and math.isinf(float(v)) and float(v) < 0


def _is_zero(expr: Any) -> bool:
    try:
        v = evaluate(expr, {})
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return False
    return isinstance(v, (int, float, np.floating, np.integer)) and float(v) == 0.0


def _close(a: Any, b: Any) -> bool:
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    with np.errstate(all="ignore"):
        return _close_arrays(a, b)


def _close_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    same_nan = np.isnan(a) == np.isnan(b)
    finite = np.isfinite(a) & np.isfinite(b)
    same_inf = np.where(np.isinf(a) | np.isinf(b), a == b, True)
    close = np.where(finite, np.abs(a - b) <= _REL_TOL * (1 + np.abs(b)), True)
    return bool(np.all(same_nan & same_inf & np.where(np.isnan(a), True, close)))


# The online-softmax composite, as docs/llm-tl.md defines it; the explicit form of a program is run
# against this on sample tiles (BASE is 2 for the composite; an explicit program may use e).
_COMPOSITE_STEPS = [
    ("m_new", "max(m, rowmax(S))"),
    ("m_use", "where(m_new == -inf, 0, m_new)"),
    ("alpha", "EXP(m - m_use)"),
    ("S", "EXP(S - m_use)"),
    ("l", "l * alpha + rowsum(S)"),
    ("O", "O * alpha"),
    ("m", "m_new"),
]


def _composite(state: dict[str, np.ndarray], base2: bool) -> dict[str, np.ndarray]:
    exp = np.exp2 if base2 else np.exp
    s, m, l, o = state["S"], state["m"], state["l"], state["O"]
    with np.errstate(all="ignore"):
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        m_use = np.where(m_new == -np.inf, 0.0, m_new)
        alpha = exp(m - m_use)
        p = exp(s - m_use)
        return {"S": p, "l": l * alpha + p.sum(axis=-1, keepdims=True), "O": o * alpha, "m": m_new}


def _sample_state(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, cols, d = 5, 8, 3
    s = rng.standard_normal((rows, cols)) * 3
    s[1, :] = -np.inf  # a row that sees nothing in this tile
    s[2, ::3] = -np.inf
    m = rng.standard_normal((rows, 1)) * 2
    m[1, 0] = -np.inf
    m[3, 0] = -np.inf  # a row that has seen nothing yet
    l = np.abs(rng.standard_normal((rows, 1))) + 0.5
    l[3, 0] = 0.0
    l[1, 0] = 0.0
    o = rng.standard_normal((rows, d))
    o[3, :] = 0.0
    o[1, :] = 0.0
    return {"S": s, "m": m, "l": l, "O": o}


@dataclass
class _Units:
    """The TL score value S equals k * scale**p * s, where s is the plan's score (natural units)."""

    k: float = 1.0
    p: int = -1


@dataclass
class _Step:
    stmt: ast.ComputeAssign
    kind: str  # "scale" | "mask" | "mod" | "p"
    expr: Any  # Lets inlined, the score renamed to SCORE
    factor: tuple[float, int] = (1.0, 0)  # scale steps: (k, p)
    cond: Any = None  # mask / p steps
    value: Any = None  # p steps: g(S)


SCORE = "__S"


@dataclass
class _Lowering:
    program: ast.Program
    target: Target
    fast_math: bool = False
    backend_name: str | None = None  # a code path other than the target's choice (sm80 on an H200, to compare)
    notes: list[str] = field(default_factory=list)
    skip_tile: str = field(default="false", init=False)  # the plan's skip_tile (visibility() sets it)
    key_range: KeyRange | None = field(default=None, init=False)  # the plan's key_range (visibility() sets it)

    def __post_init__(self) -> None:
        self.arch = self.target.arch
        # the one choice of the code path, carried in the plan (refined in run() once the dtype and variant are known)
        self.backend = get_backend(self.backend_name) if self.backend_name else backend_for(self.target)
        if not self.backend.supports(self.target):
            raise UnsupportedConstruct(f"the {self.backend.name} path does not translate for {self.target.name}")

    # ------------------------------------------------------------------ errors
    def fail(self, node: Any, message: str) -> UnsupportedConstruct:
        line = _line(node)
        return UnsupportedConstruct(f"line {line}: {message}" if line else message)

    def from_cexpr(self, exc: CExprError, stmt: Any) -> UnsupportedConstruct:
        line = exc.line or _line(stmt)
        return UnsupportedConstruct(f"line {line}: {exc.message}" if line else exc.message)

    # ------------------------------------------------------------------ entry
    def run(self, name: str | None) -> KernelPlan:
        prog = self.program
        if not prog.is_full or prog.variant is None:
            raise UnsupportedConstruct("a sketch cannot be translated: write the full program (Target, Variant and "
                                       "Params lines, global Allocates, a Kernel with explicit loops)")
        self.variant = prog.variant
        decl = prog.target
        assert decl is not None
        if (problem := self.backend.head_dim_problem(decl.head_dim)) is not None:
            raise self.fail(decl, problem)
        if decl.head_dim_v is not None and (problem := head_dim_v_problem(decl.head_dim_v)) is not None:
            raise self.fail(decl, problem)
        if decl.accum.value != "fp32":
            raise self.fail(decl, f"accum {decl.accum.value} is not supported by the {self.arch} translator "
                                  "(supported: fp32)")
        if decl.arch != self.arch:
            self.notes.append(f"the program was written for {decl.arch}; translated for {self.arch}")
        self.dtype, self.head_dim = decl.dtype, decl.head_dim
        # V's and O's own head dim (the Target line's head_dim_v); one equal to D makes the kernel of one head dim
        self.head_dim_v = None if decl.head_dim_v in (None, decl.head_dim) else decl.head_dim_v
        chosen = backend_for(self.target, self.variant, self.dtype) if not self.backend_name else self.backend
        self.flow: hopper.HopperDataflow | None = None
        if ast.role_program(prog):
            chosen, prog = self.read_roles(prog, chosen)
        elif chosen.role_dataflow and not self.backend_name:
            plain = backend_for(self.target, self.variant, self.dtype, roles=False)
            self.notes.append(f"the program has no Role blocks (the Hopper dataflow, docs/llm-tl.md): the {plain.name} "
                              f"path translates it on {self.arch}; the {chosen.name} path takes programs written "
                              f"with a producer and a consumer role")
            self.backend = chosen = plain
        if not chosen.accepts(self.variant, self.dtype):
            raise self.fail(decl, f"the {chosen.name} path does not take {self.dtype.value}"
                                  f"{' split-KV' if self.variant.split_kv else ''}")
        if chosen is not self.backend:
            self.notes.append(f"{self.dtype.value}{' split-KV' if self.variant.split_kv else ''} on {self.arch}: the "
                              f"{self.backend.name} path does not take it; translated by the {chosen.name} path")
            self.backend = chosen
        self.params = dict(prog.params)
        self.program = prog
        self.shapes = {s.name: len(s.shape or []) for s in prog.statements() if isinstance(s, ast.Allocate)}
        self.levels = {s.name: s.level for s in prog.statements() if isinstance(s, ast.Allocate)}

        kernel = self.attention_kernel()
        self.grid_and_block(kernel)
        loop = self.key_loop
        self.walk_pre()
        self.walk_loop(loop)
        if self.flow is not None and self.backend.role_dataflow:
            try:
                hopper.gemm_operands(self.flow, *self.gemms, self.levels)
            except hopper.DataflowError as exc:
                raise self.fail(exc.node, exc.message) from None
        steps = self.classify_chain()
        mods, prologue, visible_conds, norm, p_conds = self.lower_chain(steps)
        visible_conds += p_conds
        visible, mask_tile = self.visibility(visible_conds)
        begin, end = self.tile_range(loop)
        write_lse = self.epilogue()
        return self.build_plan(name, mods, prologue, visible, mask_tile, norm, write_lse, begin, end)

    # ------------------------------------------------------------------ the Hopper dataflow
    def read_roles(self, prog: ast.Program, chosen: Any) -> tuple[Any, ast.Program]:
        """A program with Role blocks: its dataflow (self.flow) and the same computation in the plain dataflow."""
        kernel = next((k for k in prog.kernels if any(isinstance(s, ast.ComputeGemm) for s in _walk(k.body))), None)
        if kernel is None:
            raise UnsupportedConstruct("the program has no Kernel holding the GEMMs")
        first = next(iter(prog.roles), kernel)
        if not chosen.role_dataflow:
            if not self.backend_name:
                paths = [b for b in BACKENDS if b.role_dataflow]
                why = (f"which does not take {self.dtype.value}{' split-KV' if self.variant.split_kv else ''}"
                       if any(b.supports(self.target) for b in paths) else
                       f"and {self.target.name} ({self.arch}) has none")
                raise self.fail(first, f"Role blocks (the Hopper dataflow) are translated by a warp-specialized path "
                                       f"({', '.join(b.name for b in paths)}), {why}: write the program without roles")
        try:
            flow, flat = hopper.read(prog, kernel)
        except hopper.DataflowError as exc:
            raise self.fail(exc.node, exc.message) from None
        if not chosen.role_dataflow:
            self.notes.append(f"the Role blocks (Hopper dataflow) are flattened for the {chosen.name} path: its own "
                              "loads and barriers replace the roles' handshakes (the same computation)")
        else:
            self.flow = flow
        return chosen, flat

    # ------------------------------------------------------------------ structure
    def attention_kernel(self) -> ast.Kernel:
        kernels = self.program.kernels
        if not kernels:
            raise UnsupportedConstruct("the program has no `Kernel ... end` block")
        with_gemm = [k for k in kernels if any(isinstance(s, ast.ComputeGemm) for s in _walk(k.body))]
        if len(with_gemm) != 1:
            where = with_gemm[1] if len(with_gemm) > 1 else kernels[0]
            raise self.fail(where, f"{len(with_gemm)} kernels hold GEMMs: the {self.arch} translator takes one "
                                   "attention kernel (plus a split-KV combine kernel)")
        attn = with_gemm[0]
        others = [k for k in kernels if k is not attn]
        if others:
            if not self.variant.split_kv or len(others) != 1 or kernels.index(others[0]) < kernels.index(attn):
                raise self.fail(others[0], f"Kernel {others[0].name}: a second kernel is supported only as the "
                                           "split-KV combine after the attention kernel (Variant split_kv)")
            self.check_combine(others[0])
        elif self.variant.split_kv:
            raise self.fail(attn, "Variant split_kv needs a combine kernel after the attention kernel")
        self.kernel = attn
        return attn

    def check_combine(self, kernel: ast.Kernel) -> None:
        stmts = list(_walk(kernel.body))
        if any(isinstance(s, (ast.ComputeGemm, ast.ComputeOnlineSoftmax)) for s in stmts):
            raise self.fail(kernel, f"Kernel {kernel.name}: the split-KV combine must not hold GEMMs or softmax")
        reads = {s.src.name for s in stmts if isinstance(s, ast.Copy) and s.src_level is ast.Level.global_}
        writes = {s.dst.name for s in stmts if isinstance(s, ast.Copy) and s.dst is not None
                  and s.dst_level is ast.Level.global_}
        if "O" not in writes or not reads or reads & {"Q", "K", "V"}:
            raise self.fail(kernel, f"Kernel {kernel.name}: a split-KV combine reads the partial results "
                                    "(workspace tensors) and writes O")
        self.combine_writes_lse = "LSE" in writes
        self.notes.append(f"Kernel {kernel.name} (line {_line(kernel)}) is rendered as the translator's LSE-weighted "
                          "split-KV combine")

    def grid_and_block(self, kernel: ast.Kernel) -> None:
        """Flatten the parallel loops into grid variables and the per-block statement list."""
        self.lets: dict[str, Any] = {}
        self.grid: dict[str, str] = {}  # role -> loop var
        self.grid_vars: dict[str, str] = {}  # loop var -> role
        block: list[Any] = []
        level = kernel.body
        while True:
            loops = [s for s in level if isinstance(s, ast.ForLoop) and s.parallel]
            if len(loops) > 1:
                raise self.fail(loops[1], "two parallel loops side by side: the grid is one nest of parallel loops")
            if not loops:
                block.extend(level)
                break
            at = level.index(loops[0])
            if any(not isinstance(s, ast.Comment) for s in level[at + 1:]):
                after = next(s for s in level[at + 1:] if not isinstance(s, ast.Comment))
                raise self.fail(after, "a statement after a parallel loop at the same level: per-block work goes "
                                       "inside the innermost parallel loop")
            block.extend(level[:at])
            self.grid_loop(loops[0], block)
            level = loops[0].body
        for s in block:
            if isinstance(s, ast.ForLoop) and s.parallel:
                raise self.fail(s, "a parallel loop inside the block")
        missing = [r for r in ("batch", "head", "m") if r not in self.grid]
        if missing:
            raise self.fail(kernel, f"Kernel {kernel.name}: no parallel loop over "
                                    f"{', '.join({'batch': 'B', 'head': 'H', 'm': 'cdiv(N, BLOCK_M)'}[r] for r in missing)}")
        if self.variant.split_kv and "split" not in self.grid:
            raise self.fail(kernel, "Variant split_kv needs a parallel loop over range(SPLITS)")
        seq = [s for s in block if isinstance(s, ast.ForLoop)]
        key_loops = [s for s in seq if any(isinstance(t, ast.ComputeGemm) for t in _walk(s.body))]
        if len(key_loops) != 1:
            raise self.fail(seq[0] if seq else kernel, "the translator needs exactly one sequential key loop holding "
                                                       "the two GEMMs")
        for s in seq:
            if s is not key_loops[0]:
                raise self.fail(s, f"a second sequential loop (`for {s.var}`): only the key loop is supported")
        inner = [s for s in _walk(key_loops[0].body) if isinstance(s, ast.ForLoop)]
        if inner:
            raise self.fail(inner[0], f"a loop inside the key loop (`for {inner[0].var}`) is not supported by the "
                                      f"{self.arch} translator")
        self.key_loop = key_loops[0]
        at = block.index(self.key_loop)
        self.pre, self.post = block[:at], block[at + 1:]

    def grid_loop(self, loop: ast.ForLoop, block: list[Any]) -> None:
        self.collect_lets(block)
        start, stop = self.inline(loop.start), self.inline(loop.stop)
        if not _is_zero(start):
            raise self.fail(loop, f"parallel loop `for {loop.var}` must start at 0")
        roles = {"batch": _N("B"), "head": _N("H"), "m": ast.Call(func="cdiv", args=[_N("N"), _N("BLOCK_M")]),
                 "split": _N("SPLITS")}
        for role, ref in roles.items():
            if _same(stop, ref):
                if role in self.grid:
                    raise self.fail(loop, f"two parallel loops over range({format_expr(ref)})")
                if role == "split" and not self.variant.split_kv:
                    raise self.fail(loop, "a parallel loop over SPLITS needs Variant split_kv")
                self.grid[role] = loop.var
                self.grid_vars[loop.var] = role
                return
        raise self.fail(loop, f"parallel loop over range({format_expr(loop.stop)}): the {self.arch} translator maps "
                              "parallel loops onto B, H, cdiv(N, BLOCK_M) and SPLITS")

    def collect_lets(self, stmts: list[Any]) -> None:
        for s in stmts:
            if isinstance(s, ast.Let) and s.name not in self.lets:
                self.lets[s.name] = self.inline(s.value)

    def inline(self, expr: Any) -> Any:
        return substitute(expr, self.lets) if expr is not None else None

    # ------------------------------------------------------------------ before the loop
    def walk_pre(self) -> None:
        self.collect_lets(self.pre)
        self.origin: dict[str, str] = {}  # local buffer -> global tensor it holds a tile of
        self.inits: dict[str, Any] = {}
        for s in self.pre:
            if isinstance(s, ast.Copy):
                self.copy(s, in_loop=False)
            elif isinstance(s, ast.ComputeAssign):
                self.inits[s.target] = s
            elif isinstance(s, (ast.ComputeGemm, ast.ComputeOnlineSoftmax, ast.Reshape)):
                raise self.fail(s, "a GEMM, softmax or Reshape before the key loop is not supported")
        if "Q" not in self.origin.values():
            raise self.fail(self.kernel, "the query tile is never loaded (Copy Q[b, h, q0 : q0 + BLOCK_M, 0 : D] ...)")

    def copy(self, s: ast.Copy, in_loop: bool) -> None:
        if s.scaled_to is not None:
            self.check_scaled(s)
        if s.src_level is ast.Level.global_:
            g = s.src.name
            if s.dst is None:
                raise self.fail(s, "a Copy from global needs a destination tile")
            if g == "Q" and not in_loop:
                self.check_rows(s, s.src, "m", "BLOCK_M", kv=False)
            elif g in ("K", "V") and in_loop:
                self.check_rows(s, s.src, "n", "BLOCK_N", kv=True)
            else:
                raise self.fail(s, f"Copy of {g} from global {'inside' if in_loop else 'before'} the key loop: the "
                                   f"{self.arch} translator loads the Q tile once and K/V tiles in the key loop")
            self.origin[s.dst.name] = g
        elif s.dst_level is ast.Level.global_:
            raise self.fail(s, "a store to global memory inside or before the key loop")
        else:
            if s.dst is None:
                raise self.fail(s, "a local Copy needs a destination tile")
            if s.src.name in self.origin:
                self.origin[s.dst.name] = self.origin[s.src.name]

    def check_scaled(self, s: ast.Copy) -> None:
        """`Copy ... as scaled fp16`: the per-tile scaled fp16 tiles the translator uses where the tensor cores do
        not take bf16/fp32 (sm_75, docs/turing-dtypes.md). Where they do, it would be a slower, lossy path that no
        translator implements."""
        form = f"`as scaled {s.scaled_to.value}`"
        if s.src_level is not ast.Level.global_ or s.dst_level is not ast.Level.shared:
            raise self.fail(s, f"Copy of {s.src.name} {form}: only a load from global to shared converts")
        if s.scaled_to.value != "fp16" or self.dtype.value not in ("bf16", "fp32"):
            raise self.fail(s, f"Copy of {s.src.name} {form} in a {self.dtype.value} program: the {self.arch} "
                               "translator converts only bf16/fp32 tiles to scaled fp16")
        if self.backend.tensor_cores_take(self.target, self.dtype):
            raise self.fail(s, f"Copy of {s.src.name} {form}: the {self.arch} tensor cores take {self.dtype.value} "
                               f"tiles as they are; the {self.arch} translator does not convert them (drop {form} and "
                               f"keep the shared tile {self.dtype.value})")

    def check_rows(self, s: ast.Copy, ref: ast.Ref, var_role: str, block: str, kv: bool) -> None:
        """Q[b, h, m*BLOCK_M : +BLOCK_M, 0 : D] or K/V[b, h (// KV_GROUP), n*BLOCK_N : +BLOCK_N, 0 : D] (V's columns
        0 : DV where the Target line gives V a head dim of its own)."""
        width = "DV" if ref.name == "V" and self.program.target.head_dim_v is not None else "D"
        want = (f"{ref.name}[b, h{' // KV_GROUP' if kv and self.variant.kv_group > 1 else ''}, "
                f"{'k0 : k0 + BLOCK_N' if kv else 'q0 : q0 + BLOCK_M'}, 0 : {width}]")
        idx = ref.index or []
        if len(idx) != 4 or not isinstance(idx[0], ast.Point) or not isinstance(idx[1], ast.Point) \
                or not isinstance(idx[2], ast.Slice) or not isinstance(idx[3], ast.Slice):
            raise self.fail(s, f"Copy of {ref.name}: expected an index like {want}")
        var = self.grid.get(var_role) if var_role == "m" else getattr(self, "key_var", None)
        b, h, rows, cols = (self.inline(i.index) if isinstance(i, ast.Point) else i for i in idx)
        start, stop = self.inline(rows.start), self.inline(rows.stop)
        ok = (_same(b, _N(self.grid["batch"])) and _same(start, _bin("*", _N(var or "?"), _N(block)))
              and _same(stop, _bin("+", start, _N(block))) and _is_zero(self.inline(cols.start))
              and _same(self.inline(cols.stop), _N(width)))
        hv = _N(self.grid["head"])
        if kv:
            grouped = any(_same(h, _bin("//", hv, g)) for g in (_N("KV_GROUP"), _bin("//", _N("H"), _N("KVH"))))
            ok = ok and (grouped or (self.variant.kv_group == 1 and _same(h, hv)))
        else:
            ok = ok and _same(h, hv)
        if not ok:
            raise self.fail(s, f"Copy of {ref.name}: the {self.arch} translator loads tiles like {want}")

    # ------------------------------------------------------------------ the key loop
    def walk_loop(self, loop: ast.ForLoop) -> None:
        self.key_var = loop.var
        self.collect_lets(loop.body)
        order: list[Any] = []
        for s in _walk(loop.body):
            if isinstance(s, ast.Copy):
                self.copy(s, in_loop=True)
            elif isinstance(s, (ast.ComputeGemm, ast.ComputeAssign, ast.ComputeOnlineSoftmax, ast.Reshape)):
                order.append(s)
            elif isinstance(s, ast.ComputeText):
                raise self.fail(s, f"free-form `Compute {s.text}` (a sketch line) cannot be translated")
        if {"K", "V"} - set(self.origin.values()):
            raise self.fail(loop, "the key loop must load K and V tiles")
        gemms = [s for s in order if isinstance(s, ast.ComputeGemm)]
        if len(gemms) != 2:
            raise self.fail(gemms[2] if len(gemms) > 2 else loop, f"{len(gemms)} GEMMs in the key loop: the "
                                                                  f"{self.arch} translator takes S = Q K^T and O += P V")
        qk, pv = gemms
        if not (self.origin.get(qk.a.name) == "Q" and self.origin.get(qk.b.name) == "K" and qk.b.transposed
                and not qk.a.transposed and not qk.accumulate):
            raise self.fail(qk, "the first GEMM must be `Compute GEMM Q_tile, K_tile^T and get S`")
        if not (self.origin.get(pv.b.name) == "V" and not pv.b.transposed and not pv.a.transposed):
            raise self.fail(pv, "the second GEMM must be `Compute GEMM P, V_tile and accumulate O`")
        if not pv.accumulate:
            raise self.fail(pv, f"`... and get {pv.out}` restarts the output every key tile: use `and accumulate`")
        self.gemms = (qk, pv)
        if order[0] is not qk:
            raise self.fail(order[0], "a Compute before the Q K^T GEMM in the key loop is not supported")
        after_pv = [s for s in order[order.index(pv) + 1:]]
        if after_pv:
            raise self.fail(after_pv[0], "a Compute after the P V GEMM in the key loop is not supported by the "
                                         f"{self.arch} translator (rescale O before the GEMM)")
        self.out_acc = pv.out
        middle = order[1:order.index(pv)]
        reshapes = [s for s in middle if isinstance(s, ast.Reshape)]
        if len(reshapes) != 1 or reshapes[0].dst != pv.a.name or middle[-1] is not reshapes[0]:
            raise self.fail(pv, f"the P operand {pv.a.name} must come from `Reshape <scores> into {pv.a.name}` "
                                "right before this GEMM")
        self.scores_in = qk.out
        self.scores_out = reshapes[0].src
        self.body_steps = middle[:-1]

    def classify_chain(self) -> list[_Step]:
        """Split the steps between the GEMMs into the score chain and the normalization block."""
        cur = self.scores_in
        chain: list[_Step] = []
        self.norm_block: list[Any] = []
        for i, s in enumerate(self.body_steps):
            if isinstance(s, ast.ComputeOnlineSoftmax) or self.is_norm_step(s, cur):
                self.norm_block = self.body_steps[i:]
                break
            assert isinstance(s, ast.ComputeAssign)
            if self.shapes.get(s.target) != 2 or self.levels.get(s.target) is not ast.Level.register:
                raise self.fail(s, f"`Compute {s.target} = ...` between the GEMMs: only steps on the score tile "
                                   "and the softmax statistics are supported")
            expr = self.inline(s.expr)
            if cur not in _names(expr):
                raise self.fail(s, f"`Compute {s.target} = ...` does not read the scores {cur}")
            expr = substitute(expr, {cur: _N(SCORE)})
            chain.append(self.classify_step(s, expr))
            cur = s.target
        self.scores_last = cur
        if self.norm_block:
            if cur != self.scores_out and not any(
                    (isinstance(t, ast.ComputeAssign) and t.target == self.scores_out) for t in self.norm_block):
                raise self.fail(self.norm_block[0], f"the softmax must produce the tile that becomes P "
                                                    f"({self.scores_out})")
        elif cur != self.scores_out:
            raise self.fail(self.body_steps[-1] if self.body_steps else self.key_loop,
                            f"Reshape reads {self.scores_out} but the scores are in {cur}")
        return chain

    def is_norm_step(self, s: Any, cur: str) -> bool:
        if not isinstance(s, ast.ComputeAssign):
            return True
        if self.shapes.get(s.target) != 2 or s.target == self.out_acc:
            return True
        return any(isinstance(n, ast.Call) and n.func in ast.REDUCTIONS for n in ast.walk_expr(s.expr)) or any(
            self.shapes.get(n) == 1 for n in _names(s.expr))

    def classify_step(self, s: ast.ComputeAssign, expr: Any) -> _Step:
        poly = to_poly(expr)
        if len(poly.terms) == 1:
            (f, c), = poly.terms.items()
            exps = dict(f)
            if exps.get(SCORE) == 1 and set(exps) <= {SCORE, "scale"} and isinstance(c, (int, float)) and c != 0:
                return _Step(s, "scale", expr, (float(c), exps.get("scale", 0)))
        cond = self.mask_condition(expr)
        if cond is not None:
            return _Step(s, "mask", expr, cond=cond)
        return _Step(s, "mod", expr)

    def mask_condition(self, expr: Any) -> Any | None:
        """cond when expr is where(cond, S, -inf), where(cond, -inf, S) (negated) or S + where(cond, 0, -inf)."""
        def is_s(e: Any) -> bool:
            return isinstance(e, ast.Name) and e.id == SCORE

        if isinstance(expr, ast.Call) and expr.func == "where" and len(expr.args) == 3:
            c, a, b = expr.args
            if SCORE in _names(c):
                return None
            if is_s(a) and _is_neg_inf(b):
                return c
            if is_s(b) and _is_neg_inf(a):
                return ast.Unary(op="not", operand=c, loc=c.loc)
        if isinstance(expr, ast.Binary) and expr.op == "+":
            for x, w in ((expr.left, expr.right), (expr.right, expr.left)):
                if is_s(x) and isinstance(w, ast.Call) and w.func == "where" and len(w.args) == 3 \
                        and SCORE not in _names(w.args[0]):
                    c, a, b = w.args
                    if _is_zero(a) and _is_neg_inf(b):
                        return c
                    if _is_zero(b) and _is_neg_inf(a):
                        return ast.Unary(op="not", operand=c, loc=c.loc)
        return None

    # ------------------------------------------------------------------ score chain -> plan pieces
    def lower_chain(self, steps: list[_Step]):
        softmax = bool(self.norm_block)
        if softmax != (self.variant.norm is Norm.softmax):
            where = self.norm_block[0] if self.norm_block else self.key_loop
            raise self.fail(where, f"Variant says {self.variant.norm.value} but the key loop "
                                   f"{'has' if softmax else 'has no'} online softmax")
        base2 = self.norm_base2 = self.check_norm_block() if softmax else True
        target_k = LOG2E if (softmax and base2) else 1.0
        if not softmax:
            if not steps or steps[-1].kind == "scale":
                raise self.fail(self.body_steps[-1] if self.body_steps else self.key_loop,
                                f"{self.variant.norm.value} attention needs a step giving P from the scores "
                                "(e.g. `Compute S = where(k_idx < M, relu(S) / M, 0)`)")
            last = steps[-1]
            last.kind = "p"
            e = last.expr
            if isinstance(e, ast.Call) and e.func == "where" and _is_zero(e.args[2]) and SCORE not in _names(e.args[0]):
                last.cond, last.value = e.args[0], e.args[1]
            else:
                last.cond, last.value = None, e
        # units after each step: pure scalings ahead of a step fix the units that step should leave
        later_k, later_p = [1.0] * (len(steps) + 1), [0] * (len(steps) + 1)
        for i in range(len(steps) - 1, -1, -1):
            k, p = steps[i].factor if steps[i].kind == "scale" else (1.0, 0)
            later_k[i], later_p[i] = later_k[i + 1] * k, later_p[i + 1] + p
        units = _Units()
        mods: list[ScoreMod] = []
        self.prologue: list[Prologue] = []
        visible: list[Any] = []
        p_conds: list[Any] = []
        norm: Normalization | None = None
        for i, st in enumerate(steps):
            if st.kind == "scale":
                units = _Units(units.k * st.factor[0], units.p + st.factor[1])
            elif st.kind == "mask":
                if units.k <= 0:
                    raise self.fail(st.stmt, "a mask on negated scores is not supported")
                visible.extend((c, st.stmt) for c in _conjuncts(st.cond))
            elif st.kind == "mod":
                want = _Units(target_k / later_k[i + 1], -later_p[i + 1])
                mods.append(self.score_mod(st, units, want))
                units = want
            else:  # the p step of relu / sigmoid
                if self.variant.norm is Norm.softmax:
                    raise AssertionError
                p_expr = self.p_expression(st, units)
                if st.cond is not None:
                    p_conds.extend((c, st.stmt) for c in _conjuncts(st.cond))
                self.check_masked_p_is_zero(st, units, any(x.kind == "mask" for x in steps[:i]))
                norm = Normalization(kind=NormKind(self.variant.norm.value), p_expr=p_expr,
                                     zero_at_masked=self.p_at_masked(st) is True)
        if softmax:
            if units.p != 0:
                scalings = [x.stmt for x in steps if x.kind == "scale"]
                stmt = scalings[-1] if scalings else (steps[0].stmt if steps else self.key_loop)
                raise self.fail(stmt, f"the scores reach the softmax multiplied by scale {units.p + 1} times: the "
                                      "kernel multiplies q.k by p.scale exactly once (write "
                                      "`Compute S = S * (scale * log2e)`)")
            if abs(units.k / target_k - 1) > 1e-12:
                factor = units.k / target_k
                mods.append(ScoreMod(name=f"units: the TL scores are {factor:g} x the natural-log scores",
                                     expr=f"s * {compile_expr(_num(factor), self.env('score'))}", uses_positions=False))
                self.notes.append(f"the TL's softmax runs on {factor:g} x the scaled scores; kept as a score mod")
            norm = Normalization(kind=NormKind.softmax)
        assert norm is not None
        return mods, self.prologue, visible, norm, p_conds

    def check_norm_block(self) -> bool:
        """Run the normalization block on sample tiles against the composite; True for exp2 units."""
        block = self.norm_block
        composite = [s for s in block if isinstance(s, ast.ComputeOnlineSoftmax)]
        if composite:
            if len(block) != 1:
                extra = next(s for s in block if not isinstance(s, ast.ComputeOnlineSoftmax))
                raise self.fail(extra, "a step next to OnlineSoftmax between the GEMMs is not supported")
            osm = composite[0]
            if osm.rescale != self.out_acc:
                raise self.fail(osm, f"OnlineSoftmax must rescale the output accumulator {self.out_acc}")
            if osm.scores != self.scores_last or osm.scores != self.scores_out:
                raise self.fail(osm, f"OnlineSoftmax must run on the score tile {self.scores_last} that becomes P")
            self.stats = (osm.max, osm.sum)
            self.check_inits()
            return True
        # explicit steps: find the statistics (row vectors set to -inf / 0 before the loop)
        vectors = [n for n, s in self.inits.items() if self.shapes.get(n) == 1]
        m_names = [n for n in vectors if _is_neg_inf(self.inits[n].expr)]
        l_names = [n for n in vectors if _is_zero(self.inits[n].expr)]
        for s in block:
            if not isinstance(s, ast.ComputeAssign):
                raise self.fail(s, "unexpected statement in the softmax steps")
        for m_name in m_names:
            for l_name in l_names:
                for base2 in (True, False):
                    if self.explicit_matches(block, m_name, l_name, base2):
                        self.stats = (m_name, l_name)
                        self.check_inits()
                        self.notes.append(f"explicit softmax steps (lines {_line(block[0])}-{_line(block[-1])}) "
                                          f"recognised as the online softmax ({'exp2' if base2 else 'exp'})")
                        return base2
        raise self.fail(block[0], "these normalization steps are not the online softmax (running max, rescale by "
                                  "exp2(m_old - m_new), row sums; see OnlineSoftmax in docs/llm-tl.md) and no other "
                                  f"normalization is supported by the {self.arch} translator")

    def explicit_matches(self, block: list[Any], m: str, l: str, base2: bool) -> bool:
        state = _sample_state()
        values: dict[str, Any] = {self.scores_last: state["S"], m: state["m"], l: state["l"],
                                  self.out_acc: state["O"]}
        try:
            for s in block:
                values[s.target] = evaluate(self.inline(s.expr), values)
        except (KeyError, TypeError, ValueError):
            return False
        want = _composite(state, base2)
        got = {"S": values.get(self.scores_out), "m": values[m], "l": values[l], "O": values[self.out_acc]}
        return all(got[k] is not None and np.shape(got[k]) == np.shape(want[k]) and _close(got[k], want[k])
                   for k in want)

    def check_inits(self) -> None:
        m, l = self.stats
        for name, test, what in ((self.out_acc, _is_zero, "0"), (m, _is_neg_inf, "-inf"), (l, _is_zero, "0")):
            init = self.inits.get(name)
            if init is None or not test(self.inline(init.expr)):
                raise self.fail(init or self.key_loop, f"{name} must start at {what} before the key loop "
                                                       f"(`Compute {name} = {what}`)")

    def score_poly(self, st: _Step, expr: Any, units: _Units) -> Poly:
        """expr with S := k * scale**p * s, `scale` cancelled where it can be."""
        s_poly = Poly({(("s", 1), ("scale", units.p)) if units.p else (("s", 1),): units.k},
                      {"s": _N("s"), "scale": _N("scale")})
        known = {n: _num(i.value) for n, i in self.env("score").names.items() if i.value is not None}
        try:
            return to_poly(substitute(expr, known), {SCORE: s_poly}, hook=_diag_hook)
        except CExprError as exc:
            raise self.from_cexpr(exc, st.stmt) from None

    def scale_free(self, st: _Step, poly: Poly, what: str) -> int:
        """The single exponent of `scale` over the terms; fails if scale sits inside a function."""
        for atom in poly.atoms.values():
            if "scale" in _names(atom) and not (isinstance(atom, ast.Name)):
                raise self.fail(st.stmt, f"{what} applies a function to the score before it is multiplied by "
                                         "scale: multiply S by scale first")
        exps = {dict(f).get("scale", 0) for f in poly.terms}
        if len(exps) > 1:
            raise self.fail(st.stmt, f"{what} adds terms in different units (some times scale, some not): "
                                     "multiply S by scale first")
        return exps.pop() if exps else 0

    def score_mod(self, st: _Step, units: _Units, want: _Units) -> ScoreMod:
        self.validate(st.stmt, st.expr, "score")
        poly = self.score_poly(st, st.expr, units)
        p = self.scale_free(st, poly, f"`Compute {st.stmt.target} = ...`")
        if p != want.p:
            raise self.fail(st.stmt, "the score chain multiplies S by scale more or less than once")
        poly = poly.drop("scale").scale_by(1.0 / want.k) if want.k != 1.0 else poly.drop("scale")
        rest, added = self.split_key_sum(poly)
        expr = self.hoist(rest)
        c = self.compile(expr, "score", st.stmt)
        terms = self.key_terms(expr, c, st.stmt)
        if added is not None:
            # the key-only sum as one parenthesized term, so that a backend shares it whole (one value a column) and
            # each score pays one add for it (an FFMA with the scale's multiply); it is the score's last addend
            term = f"({self.compile(self.hoist(added), 'score', st.stmt)})"
            c, terms = (f"{c} + {term}" if rest.terms else term), (term, *terms)
        text = f"{st.stmt.target} = {format_expr(st.stmt.expr)}"
        return ScoreMod(name=f"TL line {_line(st.stmt)}: {text}", expr=c,
                        uses_positions=bool(expression_names(c) & POSITION_NAMES),
                        key_terms=terms, factored=None if added is not None else self.factored(rest, st.stmt),
                        distance=None if added is not None else self.distance_term(rest, st.stmt))

    def distance_term(self, poly: Poly, stmt: Any) -> DistanceTerm | None:
        """The score function as rest + weight * |q_idx + offset - k_idx| (plan.DistanceTerm) where exactly one term
        of its normal form holds abs() of such a distance (q_idx and k_idx with opposite unit coefficients, the
        offset a block-invariant integer: a template tests a tile's side on integers) times block-invariant factors
        alone: ALiBi's. None otherwise."""
        invariant = self.invariant_names()
        found = []
        for factors, coef in poly.terms.items():
            for key, exp in factors:
                atom = poly.atoms[key]
                if not (exp == 1 and isinstance(atom, ast.Call) and atom.func == "abs" and len(atom.args) == 1):
                    continue
                arg = to_poly(atom.args[0], hook=_diag_hook)
                sign = arg.terms.get((("q_idx", 1),))
                if sign not in (1, -1) or arg.terms.get((("k_idx", 1),)) != -sign:
                    continue
                offset = Poly({f: c * sign for f, c in arg.terms.items()
                               if f not in ((("q_idx", 1),), (("k_idx", 1),))}, dict(arg.atoms))
                others = [poly.atoms[k] for k, _ in factors if k != key]
                integer = not offset.terms or not self.is_float(from_poly(offset))
                if integer and _names(from_poly(offset)) <= invariant and all(_names(a) <= invariant for a in others):
                    found.append((factors, coef, key, offset))
        if len(found) != 1:
            return None
        factors, coef, key, offset = found[0]
        rest = Poly({f: c for f, c in poly.terms.items() if f != factors}, dict(poly.atoms))
        weight = Poly({tuple((k, e) for k, e in factors if k != key): coef}, dict(poly.atoms))
        return DistanceTerm(rest=self.compile(self.hoist(rest), "score", stmt),
                            weight=self.compile(self.hoist(weight), "score", stmt),
                            offset=self.compile(from_poly(offset), "score", stmt) if offset.terms else "0")

    def factored(self, poly: Poly, stmt: Any) -> FactoredScore | None:
        """The score function as out_factor * g(s * in_factor) (plan.FactoredScore) where its normal form is one
        term, a positive number times one call of one argument, that argument the score times a number: softcap's
        C * tanh(s / C). None otherwise."""
        if len(poly.terms) != 1:
            return None
        ((factors, out_factor),) = poly.terms.items()
        if not isinstance(out_factor, (int, float)) or out_factor <= 0 or len(factors) != 1 or factors[0][1] != 1:
            return None
        call = poly.atoms[factors[0][0]]
        if not isinstance(call, ast.Call) or len(call.args) != 1:
            return None
        arg = to_poly(call.args[0], hook=_diag_hook)
        if len(arg.terms) != 1:
            return None
        ((arg_factors, in_factor),) = arg.terms.items()
        if arg_factors != (("s", 1),) or not isinstance(in_factor, (int, float)):
            return None
        g = self.compile(ast.Call(func=call.func, args=[_N("s")]), "score", stmt)
        return FactoredScore(expr=g, in_factor=float(in_factor), out_factor=float(out_factor))

    def split_key_sum(self, poly: Poly) -> tuple[Poly, Poly | None]:
        """(the rest, the key-only addends) of a score function's normal form, where those addends read k_idx and
        block constants alone and call an SFU function (`0.25 * cos(k_idx)` in `s + 0.25 * cos(k_idx)`): the same
        for every row of a column. (poly, None) where there are none."""
        from flashgen.operators import FUNCTIONS

        invariant = self.invariant_names()

        def key_only(f) -> bool:
            atoms = [poly.atoms[k] for k, _ in f]
            return bool(atoms) and all(_reads_key_alone(a, invariant, needs_key=False) for a in atoms) \
                and any("k_idx" in _names(a) for a in atoms)

        def calls_sfu(f) -> bool:
            return any(isinstance(n, ast.Call) and FUNCTIONS[n.func].sfu
                       for k, _ in f for n in ast.walk_expr(poly.atoms[k]))

        added = {f: c for f, c in poly.terms.items() if key_only(f)}
        if not any(calls_sfu(f) for f in added):
            return poly, None
        rest = {f: c for f, c in poly.terms.items() if f not in added}
        return Poly(rest, dict(poly.atoms)), Poly(added, dict(poly.atoms))

    def key_terms(self, expr: Any, c: str, stmt: Any) -> tuple[str, ...]:
        """The C of each outermost call of an SFU function (flashgen.operators: cos, exp, ...) in `expr` whose
        arguments read k_idx and block constants alone, in order, each once: a column's value for every row.
        Only calls, whose C is an atom (`fg::cos_approx(...)`), so each appears in `c` as it is compiled alone."""
        from flashgen.operators import FUNCTIONS

        invariant = self.invariant_names()
        found: list[str] = []

        def walk(e: Any) -> None:
            if isinstance(e, ast.Call):
                if FUNCTIONS[e.func].sfu and _reads_key_alone(e, invariant):
                    term = self.compile(e, "score", stmt)
                    if term in c and term not in found:
                        found.append(term)
                    return
                for a in e.args:
                    walk(a)
            elif isinstance(e, ast.Unary):
                walk(e.operand)
            elif isinstance(e, ast.Binary):
                walk(e.left)
                walk(e.right)

        walk(expr)
        return tuple(found)

    def p_expression(self, st: _Step, units: _Units) -> str:
        self.validate(st.stmt, st.expr, "score")
        poly = self.score_poly(st, st.value, units)
        if self.scale_free(st, poly, f"`Compute {st.stmt.target} = ...`") != 0:
            raise self.fail(st.stmt, "P is computed from scores not multiplied by scale exactly once")
        return self.compile(self.hoist(poly.drop("scale")), "score", st.stmt)

    def check_masked_p_is_zero(self, st: _Step, units: _Units, after_mask: bool) -> None:
        if after_mask and self.p_at_masked(st) not in (None, True):
            raise self.fail(st.stmt, "P is not 0 for a key masked with -inf earlier: mask with `where(cond, ..., 0)` "
                                     "in this step")

    def p_at_masked(self, st: _Step) -> bool | None:
        """Whether the p step's value is exactly 0 at a score of -inf (at sample positions and sizes); None where
        it reads what the sample does not give (a call-time tensor)."""
        vals = {SCORE: np.full(4, -np.inf), "q_idx": np.arange(4), "k_idx": np.arange(4)[::-1],
                **self.sample_sizes()}
        try:
            with np.errstate(all="ignore"):
                p = evaluate(self.strip_scale(st.value), vals)
        except KeyError:
            return None
        return bool(np.all(np.asarray(p) == 0))

    def strip_scale(self, expr: Any) -> Any:
        return substitute(expr, {"scale": _num(0.125)})

    def sample_sizes(self) -> dict[str, Any]:
        sizes = {"M": 37, "N": 29, "H": 4, "B": 2, "D": self.head_dim, "DV": self.head_dim_v or self.head_dim,
                 "KV_GROUP": self.variant.kv_group,
                 "KVH": 4 // max(1, self.variant.kv_group) or 1, "diag": 8, **self.params}
        if self.variant.softcap is not None:
            sizes["softcap"] = self.variant.softcap
        if self.variant.window is not None:
            sizes["window"] = self.variant.window
        for side in ("window_left", "window_right"):  # the two-sided window's bounded sides
            if (bound := getattr(self.variant, side)) is not None:
                sizes[side] = bound
        sizes[self.grid["head"]] = 1
        return sizes

    def hoist(self, poly: Poly) -> Any:
        """Block-invariant factors of each term (and inside functions) -> prologue constants."""
        invariant_names = self.invariant_names()

        def invariant(e: Any) -> bool:
            return _names(e) <= invariant_names

        def trivial(e: Any) -> bool:  # a name or a constant (a tensor read is neither: it is read once per block)
            return isinstance(e, ast.Name) or not (_names(e) or ast.tensors_read(e))

        def rebuild(e: Any) -> Any:
            if isinstance(e, ast.Call):
                return ast.Call(func=e.func, args=[go_expr(a) for a in e.args])
            if isinstance(e, ast.Unary):
                return ast.Unary(op=e.op, operand=go_expr(e.operand))
            if isinstance(e, ast.Binary):
                return ast.Binary(op=e.op, left=go_expr(e.left), right=go_expr(e.right))
            return e

        def go_expr(e: Any) -> Any:
            if invariant(e) and not trivial(e):
                return self.prologue_name(e)
            return go(to_poly(e, hook=_diag_hook))

        def go(p: Poly) -> Any:
            out = Poly()
            for f, c in p.terms.items():
                inv = tuple((k, e) for k, e in f if invariant(p.atoms[k]))
                var = tuple((k, e) for k, e in f if not invariant(p.atoms[k]))
                term = Poly.const(c)
                for k, e in var:
                    a = rebuild(p.atoms[k])
                    term = term.mul(Poly.atom(a, e))
                if inv:
                    inv_poly = Poly({inv: 1}, dict(p.atoms))
                    inv_expr = from_poly(inv_poly, self.is_float)
                    if len(inv) == 1 and inv[0][1] == 1 and trivial(p.atoms[inv[0][0]]):
                        term = term.mul(inv_poly)
                    else:
                        term = term.mul(Poly.atom(self.prologue_name(inv_expr)))
                out = out.add(term)
            return from_poly(out, self.is_float)

        return go(poly)

    def invariant_names(self) -> set[str]:
        return ({"M", "N", "H", "B", "D", "DV", "KV_GROUP", "diag", "softcap", "window", "window_left", "window_right", "inf",
                 self.grid["head"]}
                | ({self.grid["batch"]} if "batch" in self.grid else set())
                | set(self.params) | set(ast.CONSTANTS) | {p.name for p in self.prologue})

    def is_float(self, e: Any) -> bool:
        try:
            return infer_ctype(e, self.env("score", lenient=True)) == "float"
        except CExprError:
            return False

    def prologue_name(self, expr: Any) -> ast.Name:
        env = self.env("prologue")
        try:
            c = compile_expr(expr, env)
            ctype = infer_ctype(expr, env)
        except CExprError as exc:
            raise self.from_cexpr(exc, None) from None
        for p in self.prologue:
            if p.expr == c:
                return _N(p.name)
        name = f"tl_c{len(self.prologue)}"
        self.prologue.append(Prologue(ctype="float" if ctype == "float" else "int", name=name, expr=c))
        return _N(name)

    # ------------------------------------------------------------------ visibility
    def note_padded_keys(self, conds: list[tuple[Any, Any]]) -> None:
        """The kernel always masks keys past M; say so when the TL's own conditions would not."""
        n, m = 29, 37
        q, k = np.meshgrid(np.arange(n), np.arange(m, m + 16), indexing="ij")
        vals = {**self.sample_sizes(), "N": n, "M": m, "q_idx": q, "k_idx": k}
        visible = np.ones(q.shape, dtype=bool)
        try:
            for c, _ in conds:
                visible &= np.asarray(evaluate(self.fold_known(c), vals), dtype=bool)
        except (KeyError, TypeError, ValueError, ArithmeticError):
            return
        if visible.any():
            self.notes.append("the TL does not mask the padded keys past M of the last key tile (e.g. "
                              "`where(k_idx < M, S, -inf)`); the kernel always does")

    def visibility(self, conds: list[tuple[Any, Any]]) -> tuple[str | None, str]:
        self.note_padded_keys(conds)
        kept: list[tuple[Any, Any]] = []
        for c, stmt in conds:
            self.validate(stmt, c, "score")
            c = self.fold_known(c)
            le = self.as_le_zero(c)
            if le is not None and le.add(to_poly(_bin("-", _N("k_idx"), _N("M"))).add(Poly.const(1)), -1).terms == {}:
                continue  # k_idx < M: the kernel masks the key tail itself
            try:
                v = evaluate(c, {})
                if bool(np.all(v)):
                    continue
            except (KeyError, TypeError):
                pass
            kept.append((c, stmt))
        if not kept:
            return None, "false"
        texts, tile_tests = [], []
        for c, stmt in kept:
            element = self.hoist_reads(from_poly(to_poly(c, hook=_diag_hook), self.is_float))
            texts.append(self.compile(element, "score", stmt))
            tile_tests.append(self.tile_violation(c, stmt))
        visible = " && ".join(f"({t})" if len(kept) > 1 and ("||" in t or "?" in t) else t for t in texts)
        self.key_range = self.key_range_of(kept)
        bounds = [self.interval_test(c) for c, _ in kept]
        self.skip_tile = self.skip_test(kept, bounds)
        # a condition the linear box test does not take: masked where its interval bounds say it may fail
        tile_tests = [t if t is not None else b.may_fail_c() for t, b in zip(tile_tests, bounds)]
        if any(t is None for t in tile_tests):
            self.notes.append("a visibility condition is neither linear in q_idx/k_idx nor bounded over a tile "
                              "(flashgen.translators.tiles): every key tile is masked")
            return visible, "true"
        mask_tile = " || ".join(f"({t})" if len(tile_tests) > 1 else t for t in tile_tests)  # type: ignore[misc]
        return visible, mask_tile

    def key_range_of(self, conds: list[tuple[Any, Any]]) -> KeyRange | None:
        """The conditions' conjunction as lo <= kpos < hi per row (plan.key_range), where every one of them (and
        every part of an `and`) is a comparison of integers linear in k_idx with coefficient +-1 whose other terms
        do not read k_idx: L <= 0 with L = k_idx + R gives hi = 1 - R, with L = R - k_idx gives lo = R; several
        bounds on a side, their max (lo) or min (hi). None where any is not of that form. hi_rises where every hi
        reads q_idx only as + c * q_idx (c > 0) or not at all (a min of such bounds rises too)."""
        los: list[str] = []
        his: list[str] = []
        his_rise: list[bool] = []

        def take(c: Any, stmt: Any) -> bool:
            if isinstance(c, ast.Binary) and c.op == "and":
                return take(c.left, stmt) and take(c.right, stmt)
            le = self.as_le_zero(c)
            key = (("k_idx", 1),)
            if le is None or le.terms.get(key) not in (1, -1):
                return False
            coef = le.terms[key]
            rest = Poly({f: v for f, v in le.terms.items() if f != key}, dict(le.atoms))
            if any("k_idx" in _names(rest.atoms[a]) for f in rest.terms for a, _ in f):
                return False
            bound = Poly.const(1).add(rest, -1) if coef == 1 else rest
            text = self.compile(self.hoist_reads(from_poly(_diag_hook(bound), self.is_float)), "score", stmt)
            (his if coef == 1 else los).append(text)
            if coef == 1:  # hi rises with the row where q_idx enters it alone, with a positive coefficient
                his_rise.append(all(c > 0 and f == (("q_idx", 1),) for f, c in bound.terms.items()
                                    if any("q_idx" in _names(bound.atoms[a]) for a, _ in f)))
            return True

        if not conds or not all(take(c, stmt) for c, stmt in conds):
            return None

        def fold(side: list[str], fn: str) -> str | None:
            out = None
            for text in side:
                out = text if out is None else f"{fn}({out}, {text})"
            return out

        return KeyRange(lo=fold(los, "max"), hi=fold(his, "min"), hi_rises=bool(his) and all(his_rise))

    def interval_test(self, c: Any) -> tiles.Cond:
        """The interval bounds of condition c over a tile (flashgen.translators.tiles): its leaves are the tile C's
        block-invariant ints (sizes, the head and batch index, prologue constants, a tensor read at block-invariant
        indices hoisted into one)."""
        env = self.env("tile")
        invariant = self.invariant_names()

        def leaf(e: Any) -> tiles.Leaf | None:
            if isinstance(e, ast.Subscript):
                if not _names(e) <= invariant:
                    return None  # a read at the tile's positions: the caller's values are not bounded
                e = self.hoist_reads(e)
            info = env.names.get(e.id) if isinstance(e, ast.Name) else None
            if info is None or info.ctype != "int" or info.c is None:
                return None
            return tiles.Leaf(c=info.c, expr=e, positive=info.positive, nonneg=info.nonneg)

        return tiles.analyse(c, leaf)

    def own_masks(self) -> list[Poly]:
        """The Variant line's own masks (flashgen.variant: causal, the sliding window, a two-sided window's sides) as
        `L <= 0`: the key loop's range is what bounds them (the library's programs stop it at the diagonal and the
        window), so the tile skip test leaves them out."""
        v = self.variant
        row_key = _bin("-", _bin("+", _N("q_idx"), _N("M")), _N("N"))  # row q_idx's own key, q_idx + M - N
        conds = []
        if v.causal:
            conds.append(_bin("<=", _N("k_idx"), row_key))
        if v.window is not None:
            conds.append(_bin("<", _bin("-", row_key, _N("k_idx")), _num(v.window)))
        if v.window_right is not None:
            conds.append(_bin("<=", _N("k_idx"), _bin("+", row_key, _num(v.window_right))))
        if v.window_left is not None:
            conds.append(_bin("<=", _bin("-", row_key, _N("k_idx")), _num(v.window_left)))
        return [p for p in (self.as_le_zero(c) for c in conds) if p is not None]

    def skip_test(self, kept: list[tuple[Any, Any]], bounds: list[tiles.Cond]) -> str:
        """plan.skip_tile: some condition provably holds nowhere in the tile, so no key of it is visible. The Variant
        line's own masks are left to the key loop's range (own_masks); "false" where nothing is left to test."""
        own = self.own_masks()
        tests = []
        for (c, _), b in zip(kept, bounds):
            le = self.as_le_zero(c)
            if le is not None and any(le.add(o, -1).terms == {} for o in own):
                continue
            if (test := b.never_c()) is not None and test not in tests:
                tests.append(test)
        return " || ".join(tests) or "false"

    def hoist_reads(self, expr: Any) -> Any:
        """Tensor reads at block-invariant indices (`LEN[b]`) -> prologue constants (read once per block, not per
        element)."""
        invariant = self.invariant_names()

        def go(e: Any) -> Any:
            if isinstance(e, ast.Subscript) and _names(e) <= invariant:
                return self.prologue_name(e)
            if isinstance(e, ast.Unary):
                return ast.Unary(op=e.op, operand=go(e.operand), loc=e.loc)
            if isinstance(e, ast.Binary):
                return ast.Binary(op=e.op, left=go(e.left), right=go(e.right), loc=e.loc)
            if isinstance(e, ast.Call):
                return ast.Call(func=e.func, args=[go(a) for a in e.args], loc=e.loc)
            return e

        return go(expr)

    def as_le_zero(self, c: Any) -> Poly | None:
        """cond as `L <= 0` over integers, or None when it is not a comparison of integers."""
        negate = False
        while isinstance(c, ast.Unary) and c.op == "not":
            negate, c = not negate, c.operand
        if not isinstance(c, ast.Binary) or c.op not in ("<", "<=", ">", ">="):
            return None
        op = c.op
        if negate:
            op = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}[op]
        try:
            env = self.env("score", lenient=True)
            if infer_ctype(c.left, env) != "int" or infer_ctype(c.right, env) != "int":
                return None
        except CExprError:
            return None
        a, b = to_poly(c.left), to_poly(c.right)
        if op in ("<", "<="):
            diff = a.add(b, -1)
        else:
            diff = b.add(a, -1)
        if any(not isinstance(v, int) for v in diff.terms.values()):
            return None
        return diff.add(Poly.const(1)) if op in ("<", ">") else diff

    def fold_known(self, expr: Any) -> Any:
        """Names with a value known now (window, softcap, D, params but the tile sizes) -> numbers."""
        known = {n: _num(i.value) for n, i in self.env("score").names.items() if i.value is not None}
        return substitute(expr, known)

    def tile_violation(self, c: Any, stmt: Any) -> str | None:
        """C test, conservative: some (row, key) of tile (m_block, n_block) may violate c (None: cannot tell)."""
        while isinstance(c, ast.Unary) and c.op == "not" and isinstance(c.operand, ast.Unary) \
                and c.operand.op == "not":
            c = c.operand.operand
        if isinstance(c, ast.Unary) and c.op == "not" and isinstance(c.operand, ast.Binary) \
                and c.operand.op in ("and", "or"):  # De Morgan
            inner = c.operand
            c = ast.Binary(op="or" if inner.op == "and" else "and", left=ast.Unary(op="not", operand=inner.left),
                           right=ast.Unary(op="not", operand=inner.right))
        if isinstance(c, ast.Binary) and c.op in ("and", "or"):
            a, b = self.tile_violation(c.left, stmt), self.tile_violation(c.right, stmt)
            if a is None or b is None:
                return None
            # a conjunction fails where either part fails; a disjunction only where both may fail
            return f"({a}) {'||' if c.op == 'and' else '&&'} ({b})"
        le = self.as_le_zero(c)
        if le is None:
            return None
        lo_hi = {"q_idx": (_bin("*", _N("m_block"), _N("BLOCK_M")),
                           _bin("-", _bin("+", _bin("*", _N("m_block"), _N("BLOCK_M")), _N("BLOCK_M")), _num(1))),
                 "k_idx": (_bin("*", _N("n_block"), _N("BLOCK_N")),
                           _bin("-", _bin("+", _bin("*", _N("n_block"), _N("BLOCK_N")), _N("BLOCK_N")), _num(1)))}
        worst = Poly()
        for f, coef in le.terms.items():
            keys = dict(f)
            pos = [k for k in keys if k in lo_hi]
            if not pos:
                worst = worst.add(Poly({f: coef}, dict(le.atoms)))
                continue
            if len(keys) != 1 or keys[pos[0]] != 1:
                return None
            lo, hi = lo_hi[pos[0]]
            worst = worst.add(to_poly(hi if coef > 0 else lo).scale_by(coef))
        for f in worst.terms:
            if any(_names(worst.atoms[k]) & {"q_idx", "k_idx"} for k, _ in f):
                return None
        constant = worst.const_value()
        worst = worst.add(Poly.const(constant), -1)
        test = _bin(">", from_poly(_diag_hook(worst)), _num(-constant))
        return self.compile(self.hoist_reads(test), "tile", stmt)

    # ------------------------------------------------------------------ key-tile range
    def tile_range(self, loop: ast.ForLoop) -> tuple[str, str]:
        start, stop = self.inline(loop.start), self.inline(loop.stop)
        for e in (start, stop):
            if loop.var in _names(e):
                raise self.fail(loop, f"the key loop's range uses its own variable {loop.var}")
        split_var = self.grid.get("split")
        if split_var is not None:
            start, stop = self.split_share(loop, start, stop, split_var)
        out = []
        for e in (start, stop):
            if e is None:
                out.append(None)
                continue
            out.append(self.compile(from_poly(to_poly(self.fold_known(e), hook=_diag_hook), self.is_float), "tile",
                                    loop))
        begin = out[0] if out[0] is not None else "0"
        end = out[1] if out[1] is not None else "(seqlen_k + BLOCK_N - 1) / BLOCK_N"
        return begin, end

    def split_share(self, loop: ast.ForLoop, start: Any, stop: Any, split_var: str) -> tuple[Any, Any]:
        """Drop the split-dependent arms of the range (the kernel clamps to its split's equal share) after
        checking on sample sizes that the TL's share is that one."""
        def strip(e: Any) -> Any | None:
            if split_var not in _names(e):
                return e
            if isinstance(e, ast.Call) and e.func in ("min", "max"):
                kept = [a for a in e.args if split_var not in _names(a)]
                return kept[0] if len(kept) == 1 else None
            return None

        base_start, base_stop = strip(start), strip(stop)
        bn = self.params.get("BLOCK_N", 64)
        for splits in sorted({self.params.get("SPLITS", 4), 1, 3}):
            for m in (1, 63, 64, 65, 200, 1000):
                tiles = -(-m // bn)
                per = -(-tiles // splits)
                for split in range(splits):
                    vals = {**self.sample_sizes(), "M": m, "N": 1, "SPLITS": splits, split_var: split,
                            self.grid["m"]: 0, self.grid["batch"]: 0}
                    try:
                        b, e = int(evaluate(start, vals)), int(evaluate(stop, vals))
                        b0 = int(evaluate(base_start, vals)) if base_start is not None else 0
                        e0 = int(evaluate(base_stop, vals)) if base_stop is not None else tiles
                    except (KeyError, TypeError, ValueError) as exc:
                        raise self.fail(loop, f"cannot evaluate the split-KV key range: {exc}") from None
                    rb, re_ = max(b0, split * per), min(e0, (split + 1) * per)
                    if not ((b >= e and rb >= re_) or (b, e) == (rb, re_)):
                        raise self.fail(loop, f"the split-KV key range range({format_expr(loop.start)}, "
                                              f"{format_expr(loop.stop)}) is not an equal share of the key tiles per "
                                              f"split (M={m}, SPLITS={splits}, split={split}: TL [{b}, {e}) vs "
                                              f"[{rb}, {re_}))")
        self.notes.append("split-KV: the split count is chosen at run time (manifest.num_splits); the TL's SPLITS="
                          f"{self.params.get('SPLITS')} fixed only the interpretation")
        return base_start, base_stop

    # ------------------------------------------------------------------ epilogue
    def epilogue(self) -> bool:
        self.collect_lets(self.post)
        softmax = self.variant.norm is Norm.softmax
        assigns = [s for s in self.post if isinstance(s, ast.ComputeAssign)]
        stores = [s for s in self.post if isinstance(s, ast.Copy)]
        for s in self.post:
            if isinstance(s, (ast.ComputeGemm, ast.ComputeOnlineSoftmax, ast.Reshape, ast.ComputeText)):
                raise self.fail(s, "only elementwise steps and stores may follow the key loop")
        split = self.variant.split_kv
        out_name, lse_name = ("O", "LSE")
        dests: dict[str, ast.Copy] = {}
        for s in stores:
            if s.dst_level is not ast.Level.global_ or s.dst is None:
                raise self.fail(s, "after the key loop only stores to global memory are supported")
            dests[s.dst.name] = s
        if split:
            parts = [n for n in dests if n not in ("O", "LSE")]
            if len(parts) != 2:
                raise self.fail(stores[0] if stores else self.kernel, "the split-KV attention kernel stores its "
                                                                      "partial O and LSE into two workspace tensors")
            o_part = next((n for n in parts if self.shapes.get(n) == 5), None)
            l_part = next((n for n in parts if self.shapes.get(n) == 4), None)
            if o_part is None or l_part is None:
                raise self.fail(stores[0], "the split-KV workspaces are [B, H, SPLITS, N, D] and [B, H, SPLITS, N]")
            out_name, lse_name = o_part, l_part
        if out_name not in dests:
            raise self.fail(self.kernel, f"the attention kernel never stores {out_name}")
        o_src = dests[out_name].src.name
        lse_src = dests[lse_name].src.name if lse_name in dests else None
        if not softmax:
            if assigns:
                raise self.fail(assigns[0], f"{self.variant.norm.value} attention stores the accumulator as it is: "
                                            "fold any factor into the P step")
            if o_src != self.out_acc:
                raise self.fail(dests[out_name], f"the store of O must read the accumulator {self.out_acc}")
            if lse_src is not None:
                raise self.fail(dests[lse_name], "LSE exists only for softmax")
            return False
        m, l = self.stats
        state = _sample_state()
        base2 = self.norm_base2
        values: dict[str, Any] = {self.out_acc: state["O"], m: state["m"], l: state["l"]}
        try:
            for s in assigns:
                values[s.target] = evaluate(self.inline(s.expr), values)
        except (KeyError, TypeError) as exc:
            raise self.fail(assigns[0] if assigns else self.kernel, f"the epilogue reads {exc}, which the "
                                                                    f"{self.arch} translator does not provide") from None
        with np.errstate(all="ignore"):
            want_o = np.where(state["l"] > 0, state["O"] / np.where(state["l"] > 0, state["l"], 1), 0.0)
            ln_l = np.log(np.where(state["l"] > 0, state["l"], 1))
            m_nat = state["m"] * (math.log(2) if base2 else 1.0)
            want_lse = np.where(state["l"] > 0, m_nat + ln_l, -np.inf)
        if o_src not in values or not _close(values[o_src], want_o):
            raise self.fail(dests[out_name], f"the stored O ({o_src}) is not O / l (0 for rows that saw no key)")
        if lse_src is not None and (lse_src not in values or not _close(values[lse_src], want_lse)):
            raise self.fail(dests[lse_name], f"the stored LSE ({lse_src}) is not the natural-log log-sum-exp "
                                             "(m + log2(l)) * ln2, -inf for rows that saw no key")
        write = (lse_src is not None) if not split else getattr(self, "combine_writes_lse", False)
        if write != self.variant.return_lse:
            self.notes.append(f"the program {'writes' if write else 'does not write'} LSE while the Variant says "
                              f"return_lse={self.variant.return_lse}; the kernel follows the program")
        return write

    # ------------------------------------------------------------------ C environments
    def env(self, context: str, lenient: bool = False) -> CEnv:
        """Names visible in C: 'score' (per element), 'tile' (tile ranges, mask_tile), 'prologue' (per block)."""
        pos: dict[str, Any] = {"ctype": "int", "nonneg": True}
        names: dict[str, NameInfo] = {
            "M": NameInfo("seqlen_k", positive=True), "N": NameInfo("seqlen_q", positive=True),
            "H": NameInfo("heads", positive=True), "B": NameInfo("batch", positive=True),
            "D": NameInfo(value=self.head_dim, positive=True), "KV_GROUP": NameInfo(value=self.variant.kv_group),
            "DV": NameInfo(value=self.head_dim_v or self.head_dim, positive=True),
            "diag": NameInfo("diag"), "BLOCK_M": NameInfo("BLOCK_M", positive=True),
            "BLOCK_N": NameInfo("BLOCK_N", positive=True),
            self.grid["head"]: NameInfo("head", **pos, below="heads"),
        }
        for k, v in self.params.items():
            if k not in names:
                names[k] = NameInfo(value=v, positive=v > 0, nonneg=v >= 0)
        if self.variant.softcap is not None:
            names["softcap"] = NameInfo(value=float(self.variant.softcap), ctype="float")
        if self.variant.window is not None:
            names["window"] = NameInfo(value=int(self.variant.window))
        for side in ("window_left", "window_right"):  # the two-sided window's bounded sides: constants, as window
            if (bound := getattr(self.variant, side)) is not None:
                names[side] = NameInfo(value=int(bound))
        if "batch" in self.grid:  # the batch index: `b` in every kernel's C (mask_tile reads it through LEN[b])
            names.setdefault(self.grid["batch"], NameInfo("b", **pos, below="batch"))
        if context in ("score", "tile"):
            names[self.grid["m"]] = NameInfo("m_block", **pos)
            names["m_block"] = NameInfo("m_block", **pos)
        if context == "score":
            names.update({SCORE: NameInfo("s", "float"), "s": NameInfo("s", "float"),
                          "q_idx": NameInfo("qpos", **pos), "k_idx": NameInfo("kpos", **pos)})
        if context in ("score", "tile"):  # the prologue is computed before the tile range and every tile's test
            for p in getattr(self, "prologue", []):
                names[p.name] = NameInfo(p.name, p.ctype)
        if context == "tile":
            names["n_block"] = NameInfo("n_block", **pos)
        if lenient:
            for n in ("q_idx", "k_idx", "n_block", "m_block"):
                names.setdefault(n, NameInfo(n, **pos))
            names.setdefault("s", NameInfo("s", "float"))
            names.setdefault(SCORE, NameInfo("s", "float"))
            names.setdefault("scale", NameInfo("scale", "float"))

        def hint(name: str) -> str:
            if name == "scale":
                return "the kernel applies scale to q.k itself"
            if name == self.grid.get("batch"):
                return "the batch index is not available to elementwise steps"
            if name in ("q_idx", "k_idx"):
                return "positions exist only in steps on the score tile"
            if name == getattr(self, "key_var", None):
                return "use k_idx for key positions"
            if name in self.shapes:
                return f"{name} is a tensor; steps on the scores may read only the scores, positions and sizes"
            return "known: q_idx, k_idx, B, H, N, M, D, KV_GROUP, the head index, params, constants"

        return CEnv(names=names, tensors=self.tensor_infos(), fast_math=self.fast_math, translator=self.arch,
                    undefined_hint=hint)

    def tensor_infos(self) -> dict[str, TensorInfo]:
        """The call-time tensors in C: each `Tensor` line's slot of FlashgenAttnParams.mod_tensors, and in an ALiBi
        program `alibi_slopes` (the caller's or the standard slopes, plan.alibi_slope_c)."""
        infos: dict[str, TensorInfo] = {}
        for slot, decl in enumerate(self.program.tensor_decls):
            dims = tuple(SIZE_C.get(d.id, str(self.head_dim)) if isinstance(d, ast.Name) else str(d.value)
                         for d in decl.shape)
            infos[decl.name] = TensorInfo("int" if decl.dtype == "int32" else "float", dims,
                                          lambda idx, slot=slot, dtype=decl.dtype: mod_tensor_c(slot, dtype, idx))
        if self.variant.alibi:
            infos[ast.ALIBI_SLOPES] = TensorInfo("float", ("batch", "heads"), lambda idx: alibi_slope_c(*idx))
        return infos

    def validate(self, stmt: Any, expr: Any, context: str) -> None:
        """Compile the original (located) expression once so errors name the TL line and construct."""
        original = getattr(stmt, "expr", None)
        try:
            env = self.env(context, lenient=False)
            env.names.setdefault("scale", NameInfo("scale", "float"))
            if original is not None:
                cur_names = _names(original) & set(self.shapes)
                env.names.update({n: NameInfo("s", "float") for n in cur_names if self.shapes.get(n) == 2})
                compile_expr(self.inline(original), env)
            compile_expr(expr, env)
        except CExprError as exc:
            raise self.from_cexpr(exc, stmt) from None

    def compile(self, expr: Any, context: str, stmt: Any) -> str:
        try:
            return compile_expr(expr, self.env(context))
        except CExprError as exc:
            raise self.from_cexpr(exc, stmt) from None

    def role_params(self, params: dict[str, int]) -> None:
        """The Hopper dataflow decides the ring's depth (the staged allocations) and the warps (the consumer's)."""
        try:
            stages = hopper.check(self.flow, params["BLOCK_M"], self.arch)
        except hopper.DataflowError as exc:
            raise self.fail(exc.node, exc.message) from None
        for key, value, what in (("STAGES", stages, "the K/V rings have"), ("WARPS", self.flow.consumer_warps,
                                                                             "the consumer role has")):
            if key in self.params and self.params[key] != value:
                self.notes.append(f"Params {key} = {self.params[key]} but {what} {value}: the kernel uses {value}")
            params[key] = value
        self.params = {**self.params, "STAGES": stages, "WARPS": self.flow.consumer_warps}

    # ------------------------------------------------------------------ the plan
    def build_plan(self, name, mods, prologue, visible, mask_tile, norm, write_lse, begin, end) -> KernelPlan:
        from flashgen.translators.params import TILE_KEYS, choose_params

        # as before the backends: Params a program leaves out come from the tables or the model, not a tuned file
        defaults = choose_params(self.variant, self.target, self.dtype, self.head_dim, tuned=False,
                                 backend=self.backend.name, head_dim_v=self.head_dim_v)
        params = {**defaults, **{k: v for k, v in self.params.items() if k in TILE_KEYS}}
        if self.flow is not None:
            self.role_params(params)
        deepest = self.backend.max_stages
        if not 1 <= params["STAGES"] <= deepest:
            self.notes.append(f"STAGES={params['STAGES']}: the {self.arch} translator buffers K and V at most "
                              f"{deepest} deep and uses STAGES={deepest}")
            params["STAGES"] = deepest
        if "WARPS" not in self.params:
            while params["WARPS"] > 1 and params["BLOCK_M"] % (16 * params["WARPS"]):
                params["WARPS"] //= 2
        for k in ("BLOCK_M", "BLOCK_N", "WARPS"):
            if k not in self.params:
                self.notes.append(f"{k} not in Params: {params[k]} chosen by flashgen.translators.params")
        kernel_name = name or re.sub(r"\W", "_", f"fg_{self.kernel.name}_{self.variant.name}_{self.dtype.value}_"
                                                  f"{head_dims_tag(self.head_dim, self.head_dim_v)}_{self.arch}")
        try:
            return KernelPlan(
                name=kernel_name, arch=self.arch, target=self.target, backend=self.backend.name, dtype=self.dtype,
                head_dim=self.head_dim, head_dim_v=self.head_dim_v,
                **tile_fields(params, self.variant),
                variant=self.variant.model_copy(update={"return_lse": write_lse})
                if not self.variant.split_kv and write_lse != self.variant.return_lse else self.variant,
                score_mods=mods, prologue=prologue, visible=visible, norm=norm, write_lse=write_lse,
                kv_tile_begin=begin, kv_tile_end=end, mask_tile=mask_tile, skip_tile=self.skip_tile,
                key_range=self.key_range)
        except ValueError as exc:
            msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors()) \
                if hasattr(exc, "errors") else str(exc)
            raise UnsupportedConstruct(f"Params {', '.join(f'{k} = {v}' for k, v in params.items())}: {msg}") from None


def _walk(stmts: list[Any]):
    for s in stmts:
        yield s
        if isinstance(s, ast.BLOCK_TYPES):
            yield from _walk(s.body)



# --------------------------------------------------------------------------- public API

def lower(program: ast.Program, target: Any, *, name: str | None = None,
          fast_math: bool = False, backend: str | None = None) -> tuple[KernelPlan, list[str]]:
    """Full TL program -> (KernelPlan, notes). `target` is a flashgen.targets.Target, a GPU name or an
    arch (sm_80: the first known GPU of it). Raises UnsupportedConstruct naming the construct and its line."""
    lowering = _Lowering(program, resolve_target(target), fast_math=fast_math, backend_name=backend)
    plan = lowering.run(name)
    return plan, lowering.notes


def check_translates(program: ast.Program, target: Any, *, name: str | None = None) -> None:
    """Lower each range's program (ast.Program.size_classes) and check its plan against the backend's limits
    (render.validate_plan: stages, shared memory, the path's own rules) without writing the CUDA; raises the
    FlashgenError (UnsupportedConstruct, UsageError) that translating would."""
    from flashgen.translators.render import validate_plan

    for _when, one in program.size_classes():
        plan, _notes = lower(one, target, name=name)
        validate_plan(plan)


def translate(program: ast.Program, target: Any, *, name: str | None = None, fast_math: bool = False,
              backend: str | None = None) -> Translation:
    """Full TL program -> CUDA source + KernelManifest (+ the plan and notes). `backend` names a code path other
    than the target's own choice (flashgen.translators.backends)."""
    from flashgen.abi import MAX_MOD_TENSORS
    from flashgen.tl_spec.tensors import spec_of
    from flashgen.translators.render import render

    if program.size_params:
        return _translate_by_size(program, target, name=name, fast_math=fast_math, backend=backend)
    decls = program.tensor_decls
    if len(decls) > MAX_MOD_TENSORS:
        raise UnsupportedConstruct(f"line {_line(decls[MAX_MOD_TENSORS])}: {len(decls)} Tensor lines; a kernel takes "
                                   f"at most {MAX_MOD_TENSORS} call-time tensors (FlashgenAttnParams.mod_tensors)")
    plan, notes = lower(program, target, name=name, fast_math=fast_math, backend=backend)
    try:
        source, manifest = render(plan)
    except UsageError as exc:
        raise UnsupportedConstruct(f"{exc}") from None
    try:
        manifest.mod_tensors = [spec_of(d).text for d in decls]  # slot i of FlashgenAttnParams.mod_tensors
    except ValueError as exc:
        raise UnsupportedConstruct(f"line {_line(decls[0])}: {' '.join(str(exc).split())}") from None
    if decls or not computes_declared_variant(program):  # what call-time tensors mean only the TL says
        manifest.reference_tl = format_program(program)
        notes.append("the TL computes something its Variant line does not describe: the kernel is verified "
                     "against the TL's own fp64 interpretation")
    if notes:
        manifest.notes = "; ".join(filter(None, [manifest.notes, *notes]))
    return Translation(source=source, manifest=manifest, plan=plan, notes=notes)


def _translate_by_size(program: ast.Program, target: Any, *, name: str | None, fast_math: bool,
                       backend: str | None) -> Translation:
    """A program with `Params when` lines: one kernel per range of sizes (ast.Program.size_classes), in one source
    and one manifest whose launches each run where their range's condition holds (Launch.when), with their own
    tensor maps. The `Params` line's kernel keeps the program's name; a `when` line's takes a suffix from its
    condition (`_n_le_1024`)."""
    classes = program.size_classes()
    base = translate(classes[-1][1], target, name=name, fast_math=fast_math, backend=backend)
    parts = []
    for line, (when, one) in zip(program.size_params, classes):
        tag = f"{line.size.lower()}_{operators.NAMES[line.op]}_{line.bound}"
        parts.append((when, line, translate(one, target, name=f"{base.plan.name}_{tag}", fast_math=fast_math,
                                            backend=backend)))
    kept = ("arch", "dtype", "head_dim", "head_dim_v", "variant", "workspace_floats", "num_splits", "mod_tensors")
    for _, line, part in parts:
        if part.plan.backend != base.plan.backend:
            raise UnsupportedConstruct(f"line {_line(line)}: `Params when {line.condition}` takes the "
                                       f"{part.plan.backend} path where the Params line takes {base.plan.backend}; "
                                       "the kernels of one program take one path")
        if differs := [k for k in kept if getattr(part.manifest, k) != getattr(base.manifest, k)]:
            raise UnsupportedConstruct(f"line {_line(line)}: `Params when {line.condition}` changes the kernel's "
                                       f"{', '.join(differs)} (split-KV's chunks follow BLOCK_M); tiles per size are "
                                       "for kernels whose launches alone differ")
    launches = []
    for when, _, part in [*parts, (classes[-1][0], None, base)]:
        own_maps = part.manifest.tensor_maps if part.manifest.tensor_maps != base.manifest.tensor_maps else None
        launches += [launch.model_copy(update={"when": when, "tensor_maps": own_maps})
                     for launch in part.manifest.launches]
    tiles = lambda m: "x".join(str(m.params[k]) for k in ("BLOCK_M", "BLOCK_N"))  # noqa: E731
    note = "tiles by size: " + "; ".join([f"{line.condition}: {tiles(part.manifest)}" for _, line, part in parts]
                                         + [f"else {tiles(base.manifest)}"])
    notes = list(dict.fromkeys([*base.notes, *(n for _, _, part in parts for n in part.notes), note]))
    manifest = base.manifest.model_copy(update={
        "launches": launches, "notes": "; ".join(filter(None, [base.manifest.notes, note])),
        # the reference, where the TL is it, is the whole program (its fp64 meaning is the same at every size)
        "reference_tl": format_program(program) if base.manifest.reference_tl is not None else None})
    source = "\n".join(part.source for _, _, part in parts) + "\n" + base.source
    return Translation(source=source, manifest=manifest, plan=base.plan, notes=notes)


def computes_declared_variant(program: ast.Program) -> bool:
    """Whether the program's fp64 interpretation matches flashgen.reference for its declared Variant,
    on two small shapes (N < M and N > M, with GQA where declared): a custom mask or score function
    written in TL does not, and then the TL itself is the reference."""
    from flashgen.tl_spec import compare

    assert program.variant is not None and program.target is not None
    group = program.variant.kv_group
    for n, m in ((37, 53), (53, 37)):
        shape = Shape(B=1, H=2 * group, KVH=2, N=n, M=m, D=program.target.head_dim, DV=program.target.head_dim_v)
        if not compare(program, shape, seed=n).rel_err < 1e-9:
            return False
    return True


def manifest_for(program: ast.Program, target: Any, *, name: str | None = None) -> KernelManifest:
    """The launches the reference translator would use for this program: what a model-written CUDA
    translation of it must define (entry names) and is run with."""
    return translate(program, target, name=name).manifest
