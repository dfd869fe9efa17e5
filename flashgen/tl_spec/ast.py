"""The LLM-TL abstract syntax tree: what the parser produces and the checker, interpreter, printer and
translators read. docs/llm-tl.md is the language reference; this module is its typed mirror.

A program is a list of lines. A *full* program starts with the three header lines
(`Target`, `Variant`, `Params`), declares its global tensors with `Allocate ... in global`, then holds
one or more `Kernel NAME ... end` blocks. A *sketch* has no header and may hold bare statements.

Every node carries `loc` (line and column, 1-based) for diagnostics. `loc` is excluded from
`model_dump()` and from `==`, so `parse(format_program(p)) == p` compares structure only.

Shapes of the things a translator looks for (see `Program` helpers at the bottom):
- GEMMs: `ComputeGemm` (C = A @ B, or A @ B^T when `b.transposed`); `accumulate` means C += ...
- elementwise transforms on the scores, in order: the `ComputeAssign` statements between the GEMM
  that produces S and the normalization (`ComputeOnlineSoftmax`, or explicit steps);
- normalization: `ComputeOnlineSoftmax` (composite) or the explicit rowmax/exp2/rowsum steps;
- epilogue: the `ComputeAssign`s after the key loop (O / l, LSE) and the `Copy ... to global`;
- loop bounds: `ForLoop.start` / `ForLoop.stop` (half-open, exactly as written);
- tile params: `Program.params`, and per range of a size (`Params when N <= 1024: ...`) `Program.size_params`
  (`Program.params_at`, `Program.size_classes`);
- the Hopper dataflow (sm_90): `Role` blocks (a producer that loads, a consumer that computes), staged shared
  buffers (`Allocate.stages`), asynchronous copies (`Copy.is_async`, `Copy.stage`) and the stage handshakes
  `Acquire`, `Wait`, `Release` (`Program.roles`, `role_program`).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flashgen import operators
from flashgen.variant import DType, Variant


class Loc(BaseModel):
    """A position in the source text: 1-based line and column."""

    model_config = ConfigDict(frozen=True)
    line: int = 1
    col: int = 1


class Node(BaseModel):
    """Base of every AST node. Equality ignores `loc` (structure only)."""

    model_config = ConfigDict(extra="forbid")
    loc: Loc | None = Field(default=None, exclude=True, repr=False)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.model_dump() == other.model_dump()  # type: ignore[union-attr]

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------- expressions

class Num(Node):
    """A numeric literal. Integers stay `int` (index arithmetic), others are `float`."""

    kind: Literal["num"] = "num"
    value: int | float


class Name(Node):
    """A name: a loop variable, a `Let` scalar, a param, a size, a builtin or a tensor."""

    kind: Literal["name"] = "name"
    id: str


class Unary(Node):
    """`-x` or `not x`."""

    kind: Literal["unary"] = "unary"
    op: Literal["-", "not"]
    operand: Expr


class Binary(Node):
    """Arithmetic (`+ - * / // %`), comparison (`< <= > >= == !=`) or logic (`and or`).
    `/` is true division, `//` floor division (as Python), `%` floor modulo."""

    kind: Literal["binary"] = "binary"
    op: Literal["+", "-", "*", "/", "//", "%", "<", "<=", ">", ">=", "==", "!=", "and", "or"]
    left: Expr
    right: Expr


class Call(Node):
    """A builtin function call; `func` is one of `FUNCTIONS`."""

    kind: Literal["call"] = "call"
    func: str
    args: list[Expr]


class Subscript(Node):
    """`T[i, j]`: one element of a call-time tensor T (a `Tensor` line, or the builtin `alibi_slopes`): one integer
    index per dim, each clamped into its dim (flashgen.operators.read_clamped). Only in a Compute's expression."""

    kind: Literal["subscript"] = "subscript"
    tensor: str
    indices: list[Expr]


Expr = Annotated[Num | Name | Unary | Binary | Call | Subscript, Field(discriminator="kind")]

#: builtin functions -> number of arguments (what each means: flashgen.operators). Elementwise unless noted:
#: rowmax and rowsum reduce a [rows, cols] tile over its columns -> [rows]; cdiv is ceil(a / b) on integers
FUNCTIONS: dict[str, int] = {f.name: f.arity for f in operators.FUNCTIONS.values()}
#: functions that count as special-function-unit (transcendental) ops
SFU_FUNCTIONS = frozenset(f.name for f in operators.FUNCTIONS.values() if f.sfu)
REDUCTIONS = frozenset(f.name for f in operators.FUNCTIONS.values() if f.reduction)

#: runtime sizes: batch, heads, kv heads, query length, key length, head dim, H // KVH, V's and O's head dim (the
#: Target line's head_dim_v; D where it has none)
SIZE_NAMES = ("B", "H", "KVH", "N", "M", "D", "KV_GROUP", "DV")
#: numeric constants
CONSTANTS = {"inf": float("inf"), "log2e": 1.4426950408889634, "ln2": 0.6931471805599453}
#: the runtime softmax scale (1/sqrt(D) unless the caller gives one)
RUNTIME_SCALARS = ("scale",)
#: values taken from the `Variant` line (defined only when the variant has them)
VARIANT_SCALARS = ("softcap", "window", "window_left", "window_right")
#: inside an elementwise Compute: absolute query row / key position of each element of the destination
INDEX_NAMES = ("q_idx", "k_idx")
#: the builtin call-time tensor of an ALiBi program ([B, H] fp32): the caller's slopes (FlashAttention's
#: alibi_slopes, (H) or (B, H)), or the standard 2^(-8 (h + 1) / H) when the caller gives none
ALIBI_SLOPES = "alibi_slopes"
TENSOR_DTYPES = ("int32", "fp32")


# --------------------------------------------------------------------------- references

class Point(Node):
    """One index (a scalar coordinate) in a global reference, e.g. `b` in `Q[b, h, ...]`."""

    kind: Literal["point"] = "point"
    index: Expr


class Slice(Node):
    """A half-open range `start : stop` in a global reference; its extent is a tile dimension."""

    kind: Literal["slice"] = "slice"
    start: Expr
    stop: Expr


IndexItem = Annotated[Point | Slice, Field(discriminator="kind")]


class Ref(Node):
    """A tensor reference: `K_s`, `K_s^T` (GEMM operand, transposed), or `Q[b, h, q0 : q0 + BLOCK_M, 0 : D]`
    (global side of a Copy). `index is None` means the whole tensor."""

    name: str
    index: list[IndexItem] | None = None
    transposed: bool = False


# --------------------------------------------------------------------------- statements

class Level(str, Enum):
    """Memory level of a tensor."""

    global_ = "global"
    shared = "shared"
    register = "register"


class Comment(Node):
    """A full-line `# ...` comment, kept so that `tl fmt --write` does not lose it."""

    kind: Literal["comment"] = "comment"
    text: str


class Allocate(Node):
    """`Allocate NAME in LEVEL shape [d0, d1, ...] dtype DT [offset BYTES]`.

    Global allocations sit at program level; the names Q, K, V are inputs, O and LSE outputs, any
    other global name is an fp32 workspace (split-KV partials). Shared and register allocations sit
    inside a kernel; they start poisoned (NaN) until written. `offset` places a shared buffer at a
    byte offset of the kernel's dynamic shared memory (buffers may alias). `shape`/`dtype` are None
    only in sketches. `stages` (Hopper dataflow, shared only): a ring of that many tiles of the shape, filled by
    the producer role's asynchronous copies one stage at a time (`... stages STAGES`)."""

    kind: Literal["allocate"] = "allocate"
    name: str
    level: Level
    shape: list[Expr] | None = None
    dtype: DType | None = None
    stages: Expr | None = None
    offset: Expr | None = None


class Copy(Node):
    """`Copy SRC from LEVEL to LEVEL [DST] [as scaled DT]`. Exactly one side of a full-TL copy is a global
    indexed reference (load: global -> shared/register; store: register -> global) or both sides are local
    (shared -> register, register -> shared). Loads zero-fill out-of-bounds rows; stores drop them.
    Sketches write only `Copy K from global to shared` (dst is None).

    `scaled_to` (`as scaled fp16`): a global -> shared load that stores the tile in this dtype, scaled by
    a power of two chosen per tile, for tensor cores that do not take the program's dtype (bf16/fp32 on
    sm_75, docs/turing-dtypes.md). The scale is exact and folded back after the GEMMs; the fp64
    interpreter does not emulate the rounding, so it is a plain copy there.

    `is_async` (`... async`, Hopper dataflow: the producer role's TMA load): the tile lands later; the consumer
    sees it only after `Wait DST [stage S]`. `stage` names the stage of a staged destination
    (`Copy K[...] from global to shared K_s stage n_blk async`)."""

    kind: Literal["copy"] = "copy"
    src: Ref
    src_level: Level
    dst_level: Level
    dst: Ref | None = None
    stage: Expr | None = None
    is_async: bool = False
    scaled_to: DType | None = None


class ComputeGemm(Node):
    """`Compute GEMM A, B and get C` (C = A @ B) or `... and accumulate C` (C += A @ B).
    `B^T` multiplies by B transposed. A is [m, k] (shared, or a register operand fragment), B is
    [n, k] when transposed else [k, n] (shared or register), C is [m, n] fp32 register (accumulator)."""

    kind: Literal["gemm"] = "gemm"
    a: Ref
    b: Ref
    out: str
    accumulate: bool = False


class ComputeOnlineSoftmax(Node):
    """`Compute OnlineSoftmax S with max m, sum l and rescale O` — the composite step of the online
    softmax, with S in log2 units (scale * log2e already applied), m and l fp32 row vectors and O
    the fp32 accumulator. Exactly (docs/llm-tl.md):
        m_new = max(m, rowmax(S)); m_use = where(m_new == -inf, 0, m_new)
        alpha = exp2(m - m_use); S = exp2(S - m_use); l = l * alpha + rowsum(S); O = O * alpha; m = m_new
    `rescale` is None in a sketch that omits it."""

    kind: Literal["online_softmax"] = "online_softmax"
    scores: str
    max: str
    sum: str
    rescale: str | None = None


class ComputeAssign(Node):
    """`Compute NAME = EXPR`: elementwise over the destination's shape (row vectors broadcast along
    columns, scalars everywhere); `rowmax`/`rowsum` reduce a tile to a row vector."""

    kind: Literal["assign"] = "assign"
    target: str
    expr: Expr


class ComputeText(Node):
    """A sketch-only free-form `Compute ...` line (anything after `Compute`), kept verbatim."""

    kind: Literal["compute_text"] = "compute_text"
    text: str


class Reshape(Node):
    """`Reshape SRC into DST`: the fp32 accumulator (C-fragment) of one GEMM becomes an operand
    (A-fragment, input dtype) of the next. Required between chained GEMMs."""

    kind: Literal["reshape"] = "reshape"
    src: str
    dst: str


class Let(Node):
    """`Let NAME = EXPR`: an integer scalar (per grid point), e.g. `Let q0 = m_blk * BLOCK_M`."""

    kind: Literal["let"] = "let"
    name: str
    value: Expr


class ForLoop(Node):
    """`for VAR in [parallel] range(START, STOP)` ... `end`, half-open, interpreted exactly as written.
    `parallel` loops map onto the launch grid and must enclose every sequential loop of the kernel.
    In a sketch the range may be free text (`text`), then start/stop are None."""

    kind: Literal["for"] = "for"
    var: str
    parallel: bool = False
    start: Expr | None = None
    stop: Expr | None = None
    text: str | None = None
    body: list[Stmt] = Field(default_factory=list)


class Role(Node):
    """`Role producer|consumer warps W` ... `end` (Hopper dataflow, sm_90): the block's warps split into two roles
    that run at the same time. The producer (one warpgroup, `warps 4`) only loads: `Acquire` a stage, then an
    `async` Copy into it; the consumer (WARPS warps, 16 query rows each) computes: `Wait` for a stage before it
    reads it, `Release` it after its last read. Both sit, one of each, inside the innermost parallel loop.
    `warps` is None only in a sketch."""

    kind: Literal["role"] = "role"
    role: Literal["producer", "consumer"]
    warps: Expr | None = None
    body: list[Stmt] = Field(default_factory=list)


class Acquire(Node):
    """`Acquire BUF stage S` (producer): wait until slot S % stages of the staged buffer BUF is free (released by
    the consumer after the stage that used it `stages` steps before), then own it for the next async copy."""

    kind: Literal["acquire"] = "acquire"
    buffer: str
    stage: Expr | None = None


class Wait(Node):
    """`Wait BUF [stage S]` (consumer): wait until the async copy into BUF (its stage S when staged) has landed;
    from here until the matching Release, reads of BUF see that stage."""

    kind: Literal["wait"] = "wait"
    buffer: str
    stage: Expr | None = None


class Release(Node):
    """`Release BUF stage S` (consumer): the consumer is done with stage S of BUF; the producer may refill its slot.
    No read of BUF may follow in the same step."""

    kind: Literal["release"] = "release"
    buffer: str
    stage: Expr | None = None


#: the statements that handshake on a stage (Hopper dataflow)
SYNC_TYPES = (Acquire, Wait, Release)


class TensorDecl(Node):
    """`Tensor NAME shape [d0, ...] dtype int32|fp32 fill LO to HI [sorted]` (program level): a small tensor the caller
    passes at call time (flashgen.abi.ModTensor), read in Compute expressions as `NAME[i, ...]`. Dims are sizes
    (B, H, KVH, N, M, D) or positive integers. The fill (for `tl run`, verification and timing, where no caller gives
    one): uniform integers LO..HI both included (int32) or reals in [LO, HI) (fp32), LO and HI expressions over the
    sizes; `sorted`: ascending along the last axis. Without `fill` the parser writes flashgen.abi.DEFAULT_FILL."""

    kind: Literal["tensor"] = "tensor"
    name: str
    shape: list[Expr]
    dtype: Literal["int32", "fp32"]
    low: Expr
    high: Expr
    sorted: bool = False


class Kernel(Node):
    """`Kernel NAME` ... `end`: one launch. Several kernels run in order (split-KV: partial, combine)."""

    kind: Literal["kernel"] = "kernel"
    name: str
    body: list[Stmt] = Field(default_factory=list)


Stmt = Annotated[
    Comment | Allocate | Copy | ComputeGemm | ComputeOnlineSoftmax | ComputeAssign | ComputeText | Reshape | Let | ForLoop
    | Kernel | Role | Acquire | Wait | Release | TensorDecl,
    Field(discriminator="kind"),
]

#: statements with a body (closed by `end`)
BLOCK_TYPES = (Kernel, ForLoop, Role)


# --------------------------------------------------------------------------- header and program

class TargetDecl(Node):
    """`Target ARCH dtype DT accum fp32 head_dim D [head_dim_v DV]`: what the program is written for. `head_dim_v`:
    V's and O's own head dim (V [B, KVH, M, DV], O [B, H, N, DV]; Q K^T over D, P V over DV), None where it is D."""

    arch: str = Field(description="sm_75, sm_80, sm_86, sm_89, sm_90")
    dtype: DType
    accum: DType = DType.fp32
    head_dim: int
    head_dim_v: int | None = None

    @property
    def dv(self) -> int:
        """The size DV: head_dim_v, or head_dim where the line gives none."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v


#: the params a `Params when ...` line may set for a range of sizes: the tile shape and schedule, which change how
#: the kernel computes, never what (a param an expression reads stays one value at every size)
TILE_PARAMS = ("BLOCK_M", "BLOCK_N", "WARPS", "STAGES", "Q_IN_REGS", "GROUP_HEADS")
#: the sizes a `Params when` condition compares
SIZE_CONDITION_NAMES = ("B", "H", "KVH", "N", "M")


class SizeParams(Node):
    """`Params when N <= 1024: BLOCK_M = 128, WARPS = 8`: tile params that replace the `Params` line's at the
    sizes where the condition holds (the first such line that holds wins: Program.at_sizes). `condition` is one
    comparison of a size with an integer, as text (`N <= 1024`: flashgen.abi.eval_condition reads it, the
    manifest's Launch.when)."""

    size: str
    op: str
    bound: int
    params: dict[str, int]

    @property
    def condition(self) -> str:
        return f"{self.size} {self.op} {self.bound}"

    @property
    def negation(self) -> str:
        return f"{self.size} {operators.NEGATED[self.op]} {self.bound}"

    @classmethod
    def over(cls, size: str, op: str, bound: int, tiles: dict[str, int], base: dict[str, int]) -> SizeParams:
        """The line that gives a range `tiles` on top of `base`: the params where the two differ."""
        return cls(size=size, op=op, bound=bound, params={k: v for k, v in tiles.items() if base.get(k) != v})


class Program(Node):
    """A parsed LLM-TL program (full or sketch)."""

    filename: str = Field(default="<tl>", exclude=True)
    target: TargetDecl | None = None
    variant: Variant | None = None
    params: dict[str, int] = Field(default_factory=dict)
    size_params: list[SizeParams] = Field(default_factory=list)
    body: list[Stmt] = Field(default_factory=list)

    def at_sizes(self, sizes: dict[str, int]) -> Program:
        """The program of the range these sizes (B, H, KVH, N, M) fall in (size_classes): the first `Params when`
        line's that holds there, else the `Params` line's."""
        from flashgen.abi import eval_condition

        return next(one for when, one in self.size_classes() if when is None or eval_condition(when, sizes))

    def params_at(self, sizes: dict[str, int]) -> dict[str, int]:
        """The params at these sizes: the `Params` line's, with the first `Params when` line that holds there laid
        over them."""
        return dict(self.at_sizes(sizes).params)

    def size_classes(self) -> list[tuple[str | None, Program]]:
        """One program per range of sizes, each with its params and no `Params when` lines, and the condition of
        its range (every `when` line's, less the earlier lines' ranges; last the `Params` line's own, where none
        holds); [(None, self)] without `Params when` lines."""
        if not self.size_params:
            return [(None, self)]
        classes: list[tuple[str | None, Program]] = []
        earlier: list[str] = []
        for line in self.size_params:
            classes.append((" and ".join([line.condition, *earlier]),
                            self.model_copy(update={"params": {**self.params, **line.params}, "size_params": []})))
            earlier.append(line.negation)
        classes.append((" and ".join(earlier), self.model_copy(update={"size_params": []})))
        return classes

    @property
    def is_full(self) -> bool:
        return self.target is not None

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.body if isinstance(s, Kernel)]

    @property
    def global_allocations(self) -> list[Allocate]:
        return [s for s in self.body if isinstance(s, Allocate)]

    @property
    def tensor_decls(self) -> list[TensorDecl]:
        """The call-time tensors (`Tensor` lines), in declaration order: the order of FlashgenAttnParams.mod_tensors."""
        return [s for s in self.body if isinstance(s, TensorDecl)]

    def statements(self) -> list[Any]:
        """Every statement, depth first in source order (kernels, loops and roles before their bodies)."""
        out: list[Any] = []

        def walk(stmts: list[Any]) -> None:
            for s in stmts:
                out.append(s)
                if isinstance(s, BLOCK_TYPES):
                    walk(s.body)

        walk(self.body)
        return out

    @property
    def roles(self) -> list[Role]:
        """Every Role block (Hopper dataflow), in source order."""
        return [s for s in self.statements() if isinstance(s, Role)]


def role_program(program: Program) -> bool:
    """Whether the program is written in the Hopper dataflow: it has Role blocks (or, malformed, staged buffers,
    async copies or stage handshakes without them)."""
    return any(isinstance(s, (Role, *SYNC_TYPES)) or (isinstance(s, Allocate) and s.stages is not None)
               or (isinstance(s, Copy) and (s.is_async or s.stage is not None)) for s in program.statements())


Unary.model_rebuild()
Binary.model_rebuild()
Call.model_rebuild()
Subscript.model_rebuild()
TensorDecl.model_rebuild()
ForLoop.model_rebuild()
Role.model_rebuild()
Kernel.model_rebuild()
Program.model_rebuild()


# Nesting limits (issue 12): the parser refuses deeper input in one line, so that the recursive checker,
# printer, interpreter and translators never meet a RecursionError. A real kernel nests 3-6 blocks
# (Kernel, grid loops, the key loop) and its expressions about 6 levels; the limits are far above that
# and far below Python's recursion limit (1000 frames; each level costs the walkers 2-3 frames).
MAX_BLOCK_DEPTH = 32
MAX_EXPR_DEPTH = 64


def nesting_problem(program: Program) -> tuple[Any, str] | None:
    """(node, message) for the first block or expression nested deeper than the limits, else None.
    Iterative, so it is safe on any input."""
    stack: list[tuple[Any, int]] = [(s, 1) for s in program.body]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, BLOCK_TYPES):
            if depth > MAX_BLOCK_DEPTH:
                return node, f"blocks nested more than {MAX_BLOCK_DEPTH} deep"
            stack.extend((s, depth + 1) for s in node.body)
            parts = [node.start, node.stop] if isinstance(node, ForLoop) else [node.warps] if isinstance(node, Role) \
                else []
        else:
            parts = [node]
        if any(nesting_problem_expr(p) for p in parts):
            return node, f"an expression nested more than {MAX_EXPR_DEPTH} deep"
    return None


def nesting_problem_expr(expr: Any) -> bool:
    """True when an expression is nested deeper than MAX_EXPR_DEPTH (iterative)."""
    todo: list[tuple[Any, int]] = [(expr, 1)]
    while todo:
        e, d = todo.pop()
        if isinstance(e, list):
            todo.extend((x, d) for x in e)
        elif isinstance(e, Node):
            if d > MAX_EXPR_DEPTH:
                return True
            todo.extend((v, d + 1) for k, v in e.__dict__.items() if k != "loc")
    return False


def walk_expr(expr: Any):
    """Yield every node of an expression tree (pre-order)."""
    yield expr
    if isinstance(expr, Unary):
        yield from walk_expr(expr.operand)
    elif isinstance(expr, Binary):
        yield from walk_expr(expr.left)
        yield from walk_expr(expr.right)
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from walk_expr(a)
    elif isinstance(expr, Subscript):
        for a in expr.indices:
            yield from walk_expr(a)


def expr_names(expr: Any) -> list[str]:
    """Names an expression reads, in order (with repeats); the call-time tensors it reads are `tensors_read`'s."""
    return [n.id for n in walk_expr(expr) if isinstance(n, Name)]


def tensors_read(expr: Any) -> list[str]:
    """The call-time tensors an expression reads (`T[i]`), in order (with repeats)."""
    return [n.tensor for n in walk_expr(expr) if isinstance(n, Subscript)]


def substitute(expr: Any, mapping: dict[str, Any]) -> Any:
    """A copy of an expression with names replaced by expressions (`mapping`: name -> expression); locations kept."""
    if isinstance(expr, Name):
        return mapping.get(expr.id, expr)
    if isinstance(expr, Unary):
        return Unary(op=expr.op, operand=substitute(expr.operand, mapping), loc=expr.loc)
    if isinstance(expr, Binary):
        return Binary(op=expr.op, left=substitute(expr.left, mapping), right=substitute(expr.right, mapping),
                      loc=expr.loc)
    if isinstance(expr, Call):
        return Call(func=expr.func, args=[substitute(a, mapping) for a in expr.args], loc=expr.loc)
    if isinstance(expr, Subscript):
        return Subscript(tensor=expr.tensor, indices=[substitute(a, mapping) for a in expr.indices], loc=expr.loc)
    return expr
