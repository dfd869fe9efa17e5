"""Static checks of an LLM-TL program: names, shapes, memory levels, parameters and target budgets.

`check(program, target=None)` returns every problem found as a Diagnostic (errors and warnings);
it never raises on a bad program. Shapes are compared by evaluating them with the program's params
and head_dim (runtime sizes get probe values); a slice extent must be the same for two different
probe assignments of the loop variables, i.e. it must not depend on them.
"""

from __future__ import annotations

import math
import random
from typing import Any

from flashgen import operators
from flashgen.targets import tensor_cores_take
from flashgen.tl_spec import ast
from flashgen.tl_spec.diagnostics import Diagnostic
from flashgen.tl_spec.printer import format_expr
from flashgen.tl_spec.roles import RoleRules
from flashgen.tl_spec.symbols import Ctx as _Ctx
from flashgen.tl_spec.symbols import Sym as _Sym
from flashgen.variant import DType, head_dim_problem, head_dim_v_problem

# probe values for runtime sizes: distinct, not multiples of common tiles
_PROBES = ({"B": 3, "H": 12, "KVH": 4, "N": 1001, "M": 1237}, {"B": 5, "H": 20, "KVH": 5, "N": 517, "M": 389})
_EXPECTED_GLOBALS = {
    "Q": (["B", "H", "N", "D"], "input dtype"), "K": (["B", "KVH", "M", "D"], "input dtype"),
    "V": (["B", "KVH", "M", "D"], "input dtype"), "O": (["B", "H", "N", "D"], "input dtype"),
    "LSE": (["B", "H", "N"], "fp32"),
}
# The most iterations a loop may have (issue 12): no loop of an attention kernel runs more often than
# there are (batch, head, query, key) points, B*H*N*M at the probe sizes above (a flattened grid, a
# loop over key tiles or splits stays far below it), and never needs more than 2^20 even where that
# product is small: 2^20 tokens is above the longest sequence any model is run at, and a tile count or
# split count is smaller still. A literal `range(1000000000)` is refused here instead of making the
# interpreter spin (its own operation budget stops what the probes cannot see).
MAX_LOOP_TRIPS = 1 << 20
_REG_OVERHEAD = 24  # addresses, loop counters, predicates: registers a kernel needs besides its tiles


class _Checker:
    def __init__(self, program: ast.Program, target: Any):
        self.p = program
        self.target = target
        self.diags: list[Diagnostic] = []
        self.scopes: list[dict[str, _Sym]] = []
        self.dtype = program.target.dtype if program.target else DType.fp16
        self.rng = random.Random(0)
        self.rules = RoleRules(self)  # the Hopper dataflow's rules (roles.py)

    # ------------------------------------------------------------------ reporting
    def err(self, node: Any, message: str, hint: str | None = None, severity: str = "error") -> None:
        loc = getattr(node, "loc", None) or ast.Loc()
        self.diags.append(Diagnostic(file=self.p.filename, line=loc.line, col=loc.col, severity=severity,
                                     message=message, hint=hint))

    def warn(self, node: Any, message: str, hint: str | None = None) -> None:
        self.err(node, message, hint, "warning")

    # ------------------------------------------------------------------ scopes
    def lookup(self, name: str) -> _Sym | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def define(self, sym: _Sym, node: Any) -> None:
        old = self.lookup(sym.name)
        if old is not None:
            where = f" at line {old.loc.line}" if old.loc else f" as a {old.kind}"
            self.err(node, f"'{sym.name}' is already defined{where}", "give it a name of its own")
            return
        self.scopes[-1][sym.name] = sym

    # ------------------------------------------------------------------ probe evaluation
    def probe(self, expr: Any, which: int, node: Any, index_names: bool = False) -> Any:
        """Value of an expression under probe assignment `which` (None where it is not a scalar)."""
        if isinstance(expr, ast.Num):
            return expr.value
        if isinstance(expr, ast.Name):
            sym = self.lookup(expr.id)
            if sym is None:
                return None
            return sym.probe[which]
        if isinstance(expr, ast.Unary):
            v = self.probe(expr.operand, which, node)
            return None if v is None else operators.UNARY[expr.op].scalar(v)
        if isinstance(expr, ast.Binary):
            a, b = self.probe(expr.left, which, node), self.probe(expr.right, which, node)
            if a is None or b is None:
                return None
            try:
                return operators.BINARY[expr.op].scalar(a, b)
            except (ZeroDivisionError, OverflowError):
                return None
        if isinstance(expr, ast.Call):
            args = [self.probe(a, which, node) for a in expr.args]
            func = operators.FUNCTIONS.get(expr.func)
            if any(a is None for a in args) or func is None or func.scalar is None or len(args) != func.arity:
                return None
            try:
                return func.scalar(*args)
            except (TypeError, ValueError, ZeroDivisionError, OverflowError):
                return None
        return None

    def static_dims(self, exprs: list[Any], node: Any) -> tuple[int, ...] | None:
        dims = []
        for e in exprs:
            a, b = self.probe(e, 0, node), self.probe(e, 1, node)
            if a is None or a != b or float(a) != int(a):
                self.err(e, f"shape '{format_expr(e)}' is not a constant (use params, D and numbers)",
                         "a local tile's shape is fixed at compile time, e.g. [BLOCK_M, D]")
                return None
            if int(a) <= 0:
                self.err(e, f"shape '{format_expr(e)}' is {int(a)}; it must be positive")
                return None
            dims.append(int(a))
        return tuple(dims)

    # ------------------------------------------------------------------ names in expressions
    def names_in(self, expr: Any, node: Any, allow_index: bool = False, allow_tensors: bool = True) -> None:
        for sub in ast.walk_expr(expr):
            if isinstance(sub, ast.Subscript):
                self.subscript(sub, allowed=allow_index and allow_tensors)
                continue
            if isinstance(sub, ast.Call):
                if sub.func not in ast.FUNCTIONS:
                    self.err(sub, f"unknown function '{sub.func}'", f"functions: {', '.join(ast.FUNCTIONS)}")
                elif len(sub.args) != ast.FUNCTIONS[sub.func]:
                    self.err(sub, f"{sub.func} takes {ast.FUNCTIONS[sub.func]} argument(s), got {len(sub.args)}")
            if not isinstance(sub, ast.Name):
                continue
            if sub.id in ast.INDEX_NAMES:
                if not allow_index:
                    self.err(sub, f"{sub.id} exists only inside an elementwise Compute on a tile",
                             "bounds and indices use loop variables and Let scalars")
                continue
            sym = self.lookup(sub.id)
            if sym is None:
                hint = None
                if sub.id in ast.VARIANT_SCALARS:
                    hint = f"'{sub.id}' is defined only when the Variant line declares it"
                self.err(sub, f"undefined name '{sub.id}'", hint)
                continue
            if sym.kind == "input":
                self.err(sub, f"'{sub.id}' is a call-time tensor: read an element, {sub.id}[{', '.join(['i'] * len(sym.shape or (0,)))}]")
                continue
            if sym.kind == "tensor":
                if not allow_tensors:
                    self.err(sub, f"'{sub.id}' is a tensor; an index or bound is a scalar expression")
                elif sym.level is ast.Level.global_:
                    self.err(sub, f"'{sub.id}' is a global tensor; Copy a tile of it to registers first",
                             "Compute works on shared and register tiles")
                else:
                    self.read(sym, sub)

    def subscript(self, sub: ast.Subscript, allowed: bool) -> None:
        """`T[i, ...]`: a declared call-time tensor, one integer index per dim, indices without tiles; a constant index
        that is out of range whatever the sizes (below 0, or past a dim given as a number) is an error (any other index
        is clamped into its dim)."""
        name = sub.tensor
        if not allowed:
            self.err(sub, f"'{name}[...]': a call-time tensor is read only in a Compute expression",
                     "loop bounds, Lets, shapes and copy indices use sizes, params, loop variables and Lets")
            return
        sym = self.lookup(name)
        if sym is None or sym.kind != "input":
            if name == ast.ALIBI_SLOPES:
                hint = "alibi_slopes exists in an ALiBi program: add alibi to the Variant line"
            elif sym is None:
                hint = f"declare it at program level: Tensor {name} shape [B] dtype int32 fill 0 to M"
            else:
                hint = "only the tensors of Tensor lines (and alibi_slopes) are indexed in an expression"
            self.err(sub, f"'{name}' is not a call-time tensor" if sym is not None else f"undefined tensor '{name}'", hint)
            return
        dims = sym.shape or ()
        if len(sub.indices) != len(dims):
            self.err(sub, f"'{name}' has {len(dims)} dims; the index gives {len(sub.indices)}")
            return
        fixed = sym.fixed_dims or (0,) * len(dims)
        for item, dim in zip(sub.indices, fixed):
            tiles = [n.id for n in ast.walk_expr(item) if isinstance(n, ast.Name) and (self.lookup(n.id) is not None
                                                                                      and self.lookup(n.id).kind == "tensor")]
            if tiles:
                self.err(item, f"an index of '{name}' reads the tile '{tiles[0]}'",
                         "indices are positions (q_idx, k_idx), loop variables, Lets, sizes and numbers")
                continue
            if any(n in ast.INDEX_NAMES for n in ast.expr_names(item)):
                continue
            values = {self.probe(item, which, sub) for which in (0, 1)}
            if len(values) != 1 or None in values:
                continue
            value = values.pop()
            if isinstance(value, bool) or float(value) != int(value):
                self.err(item, f"an index of '{name}' is not an integer: {value}", "use // for integer division")
            elif value < 0 or 0 < dim <= value:
                self.err(item, f"index {int(value)} of '{name}' is out of range whatever the sizes"
                               + (f" (the dim has {dim} elements)" if value >= 0 else ""),
                         "indices are clamped into their dim: one always outside reads the edge element")

    def tensor_decl(self, stmt: ast.TensorDecl) -> None:
        """`Tensor NAME shape [..] dtype int32|fp32 fill LO to HI [sorted]` at program level."""
        from flashgen.abi import MAX_MOD_RANK, MAX_MOD_TENSORS, MOD_TENSOR_SIZES

        decls = self.p.tensor_decls
        if decls.index(stmt) == MAX_MOD_TENSORS:
            self.err(stmt, f"more than {MAX_MOD_TENSORS} Tensor lines: a kernel takes at most {MAX_MOD_TENSORS} "
                           "call-time tensors (FlashgenAttnParams.mod_tensors)")
        if stmt.name == ast.ALIBI_SLOPES:
            self.err(stmt, f"'{ast.ALIBI_SLOPES}' is the builtin ALiBi slopes of an ALiBi program",
                     "give the tensor another name")
            return
        dims: list[Any] = []
        fixed: list[int] = []  # per axis: the number a dim is given as, 0 for a size
        for e in stmt.shape:
            if isinstance(e, ast.Name) and e.id in MOD_TENSOR_SIZES:
                dims.append(self.lookup(e.id).probe[0] if self.lookup(e.id) else 1)
                fixed.append(0)
            elif isinstance(e, ast.Num) and isinstance(e.value, int) and e.value >= 1:
                dims.append(e.value)
                fixed.append(e.value)
            else:
                fixed.append(0)
                self.err(e, f"dim '{format_expr(e)}' of tensor '{stmt.name}': a size ({', '.join(MOD_TENSOR_SIZES)}) "
                            "or a positive integer")
                dims.append(1)
        if not 1 <= len(dims) <= MAX_MOD_RANK:
            self.err(stmt, f"tensor '{stmt.name}' has {len(dims)} dims; a call-time tensor has 1 to {MAX_MOD_RANK}")
        for bound in (stmt.low, stmt.high):
            self.names_in(bound, stmt, allow_tensors=False)
        for which, probe in enumerate(_PROBES):
            lo, hi = self.probe(stmt.low, which, stmt), self.probe(stmt.high, which, stmt)
            if lo is None or hi is None:
                continue
            if stmt.dtype == "int32" and (float(lo) != int(lo) or float(hi) != int(hi)):
                self.err(stmt, f"tensor '{stmt.name}' is int32: its fill bounds are integers, got "
                               f"{format_expr(stmt.low)} to {format_expr(stmt.high)} = {lo} to {hi}")
                break
            if hi < lo:
                sizes = ", ".join(f"{k}={v}" for k, v in probe.items())
                self.err(stmt, f"tensor '{stmt.name}': fill {format_expr(stmt.low)} to {format_expr(stmt.high)} is "
                               f"empty at {sizes} ({lo} to {hi})", "the fill is LO to HI with LO <= HI")
                break
        sym = _Sym(stmt.name, "input", loc=stmt.loc, shape=tuple(dims))
        sym.fixed_dims = tuple(fixed)
        self.define(sym, stmt)

    def read(self, sym: _Sym, node: Any) -> None:
        self.rules.read(sym, node)
        if sym.kind == "tensor" and sym.level is not ast.Level.global_ and not sym.written and not sym.reported:
            sym.reported = True
            self.err(node, f"'{sym.name}' is read before anything writes it (allocations start uninitialised)",
                     f"initialise it first, e.g. Compute {sym.name} = 0")

    def write(self, sym: _Sym, ctx: _Ctx) -> None:
        sym.written = True
        if ctx.seq_depth > 0:
            sym.written_in_loop = True

    def tensor(self, name: str, node: Any) -> _Sym | None:
        sym = self.lookup(name)
        if sym is None:
            self.err(node, f"undefined tensor '{name}'", "Allocate it first")
            return None
        if sym.kind != "tensor":
            self.err(node, f"'{name}' is a {sym.kind}, not a tensor")
            return None
        return sym

    # ------------------------------------------------------------------ program
    def run(self) -> list[Diagnostic]:
        p = self.p
        if not p.is_full:
            return self.diags  # a sketch: the parser already checked its structure
        builtins: dict[str, _Sym] = {}
        head_dim = p.target.head_dim  # type: ignore[union-attr]
        for name in (*ast.SIZE_NAMES, *ast.CONSTANTS, *ast.RUNTIME_SCALARS):
            vals = []
            for probe in _PROBES:
                env = {**probe, "D": head_dim, "DV": p.target.dv, "KV_GROUP": probe["H"] // probe["KVH"],  # type: ignore
                       "scale": 0.125, **ast.CONSTANTS}
                vals.append(env[name])
            builtins[name] = _Sym(name, "builtin", probe=(vals[0], vals[1]))
        if p.variant is None:
            self.err(p.target, "a full program needs a Variant line (what it computes)", "Variant softmax causal")
        else:
            if p.variant.softcap is not None:
                builtins["softcap"] = _Sym("softcap", "builtin", probe=(p.variant.softcap, p.variant.softcap))
            if p.variant.window is not None:
                builtins["window"] = _Sym("window", "builtin", probe=(p.variant.window, p.variant.window))
            for side in ("window_left", "window_right"):  # the two-sided window's bounded sides
                if (bound := getattr(p.variant, side)) is not None:
                    builtins[side] = _Sym(side, "builtin", probe=(bound, bound))
            if p.variant.alibi:  # the caller's ALiBi slopes (or the standard ones), [B, H] fp32
                builtins[ast.ALIBI_SLOPES] = _Sym(ast.ALIBI_SLOPES, "input", shape=(_PROBES[0]["B"], _PROBES[0]["H"]))
        self.scopes = [builtins, {}]
        for name, value in p.params.items():
            if name in builtins:
                self.err(p.target, f"param '{name}' shadows a builtin name", "rename the param")
                continue
            if value <= 0 and (name.startswith("BLOCK_") or name in ("WARPS", "STAGES", "SPLITS")):
                self.err(p.target, f"param {name} = {value} must be positive")
            self.scopes[-1][name] = _Sym(name, "param", probe=(value, value))
        self.check_params()
        ctx = _Ctx()
        for stmt in p.body:
            if isinstance(stmt, ast.Comment):
                continue
            if isinstance(stmt, ast.Allocate):
                if stmt.level is not ast.Level.global_:
                    self.err(stmt, f"a {stmt.level.value} tensor is allocated outside a Kernel",
                             "shared and register tensors live inside a Kernel's parallel loops")
                self.allocate(stmt, ctx)
            elif isinstance(stmt, ast.Kernel):
                self.kernel(stmt)
            elif isinstance(stmt, ast.TensorDecl):
                self.tensor_decl(stmt)
            else:
                self.err(stmt, "a statement outside a Kernel in a full program",
                         "wrap the statements in `Kernel NAME` ... `end`")
        self.check_globals()
        self.rules.finish()
        return self.diags

    def check_params(self) -> None:
        p, t = self.p, self.p.target
        assert t is not None
        params = p.params
        mma = self.mma_shape()
        warps = params.get("WARPS")
        if warps and "BLOCK_M" in params and params["BLOCK_M"] % (16 * warps):
            self.err(t, f"BLOCK_M = {params['BLOCK_M']} is not a multiple of 16 * WARPS = {16 * warps}",
                     "each warp computes 16-row slices of the query tile")
        head_dim_ok = (problem := head_dim_problem(t.head_dim)) is None
        if not head_dim_ok:
            self.err(t, problem)
        if t.head_dim_v is not None and (problem := head_dim_v_problem(t.head_dim_v)) is not None:
            self.err(t, problem)
        if mma is not None:
            # a head dim short of the k-step is no error: the kernel pads its tiles with zero columns
            # (flashgen.translators.plan.padded_head_dim), so only the contract above binds it
            if head_dim_ok and t.head_dim % mma.n:
                self.err(t, f"head_dim {t.head_dim} is not a multiple of {mma.n}, the n of {mma.instruction}")
            block_n = params.get("BLOCK_N")
            if block_n and block_n % mma.k:
                self.err(t, f"BLOCK_N = {block_n} is not a multiple of {mma.k}, the k of {mma.instruction} "
                            f"(the P @ V GEMM contracts over BLOCK_N)", "use a multiple of 16")
        if "STAGES" in params and params["STAGES"] < 1:
            self.err(t, "STAGES must be at least 1")
        if self.target is not None:
            threads = 32 * (warps or 4)
            if threads > self.target.max_threads_per_block:
                self.err(t, f"WARPS = {warps} gives {threads} threads; {self.target.name} allows "
                            f"{self.target.max_threads_per_block} per block")
            # bf16 and fp32 on a target without those mma inputs are legal: the program converts its
            # tiles to fp16 on the way into shared memory (`Copy ... as scaled fp16`, docs/turing-dtypes.md).

    def mma_shape(self) -> Any:
        """The mma.sync shape the translator would pick for the dtype (largest k), or a default."""
        want = "tf32" if self.dtype is DType.fp32 else self.dtype.value
        if self.target is not None:
            shapes = [m for m in self.target.mma if want in m.input_dtypes and m.requires_arch is None]
            if shapes:
                return max(shapes, key=lambda m: m.k)
        from flashgen.targets import MmaShape

        return MmaShape(instruction=f"mma.sync.aligned.m16n8k{8 if want == 'tf32' else 16}", m=16, n=8,
                        k=8 if want == "tf32" else 16, input_dtypes=(want,))

    def check_globals(self) -> None:
        p = self.p
        declared = {a.name: a for a in p.global_allocations}
        anchor = p.target
        for name, (dims, dtype_rule) in _EXPECTED_GLOBALS.items():
            if name in ("V", "O") and p.target is not None and p.target.head_dim_v is not None:
                dims = [*dims[:-1], "DV"]  # V's and O's own head dim
            alloc = declared.get(name)
            needed = name != "LSE" or (p.variant is not None and p.variant.return_lse)
            if alloc is None:
                if needed:
                    self.err(anchor, f"no global '{name}' declared",
                             f"Allocate {name} in global shape [{', '.join(dims)}] dtype "
                             f"{'fp32' if name == 'LSE' else self.dtype.value}")
                continue
            if name == "LSE" and not needed:
                self.warn(alloc, "LSE is declared but the variant does not return it", "add return_lse to Variant")
            got = [format_expr(e) for e in alloc.shape or []]
            if got != dims:
                self.err(alloc, f"global '{name}' has shape [{', '.join(got)}], expected [{', '.join(dims)}]")
            want = DType.fp32 if dtype_rule == "fp32" else self.dtype
            if alloc.dtype is not want:
                self.err(alloc, f"global '{name}' has dtype {alloc.dtype.value if alloc.dtype else 'none'}, "
                                f"expected {want.value}")
        for name in ("O", "LSE"):
            sym = self.scopes[1].get(name) if len(self.scopes) > 1 else None
            needed = name == "O" or (p.variant is not None and p.variant.return_lse)
            if sym is not None and needed and not sym.written:
                self.err(declared[name], f"output '{name}' is never written",
                         f"Copy the result from registers: Copy ... from register to global {name}[...]")

    # ------------------------------------------------------------------ statements
    def allocate(self, stmt: ast.Allocate, ctx: _Ctx) -> None:
        if stmt.shape is None or stmt.dtype is None:
            self.err(stmt, f"Allocate {stmt.name} needs a shape and a dtype in full TL", "Allocate S_r in register "
                     "shape [BLOCK_M, BLOCK_N] dtype fp32")
        sym = _Sym(stmt.name, "tensor", loc=stmt.loc, level=stmt.level, dtype=stmt.dtype)
        if stmt.level is ast.Level.global_:
            sym.written = stmt.name in ("Q", "K", "V")
            dims = []
            for e in stmt.shape or []:
                self.names_in(e, stmt, allow_tensors=False)
                dims.append(0)
            sym.shape = tuple(dims)
        else:
            if stmt.shape is not None:
                for e in stmt.shape:
                    self.names_in(e, stmt, allow_tensors=False)
                sym.shape = self.static_dims(stmt.shape, stmt)
                if sym.shape is not None and len(sym.shape) not in (1, 2):
                    self.err(stmt, f"'{stmt.name}' has {len(sym.shape)} dims; a local tensor is a row vector [r] "
                                   f"or a tile [r, c]")
            if stmt.offset is not None:
                if stmt.level is not ast.Level.shared:
                    self.err(stmt.offset, "only shared buffers take an offset")
                self.names_in(stmt.offset, stmt, allow_tensors=False)
            sym.in_loop = ctx.seq_depth > 0
            ctx.kernel_tensors.append(sym)
            self.rules.allocate(stmt, sym)
            if stmt.level is ast.Level.register and stmt.dtype is not None and stmt.dtype not in (DType.fp32,
                                                                                                 self.dtype):
                self.err(stmt, f"register tensor of dtype {stmt.dtype.value} in a {self.dtype.value} program",
                         f"registers hold fp32 accumulators or {self.dtype.value} operands")
        self.define(sym, stmt)

    def kernel(self, k: ast.Kernel) -> None:
        for other in self.p.kernels:
            if other is not k and other.name == k.name and other.loc and k.loc and other.loc.line < k.loc.line:
                self.err(k, f"a second Kernel named '{k.name}'")
        ctx = _Ctx(kernel=k)
        self.scopes.append({})
        self.block(k.body, ctx, grid_level=True)
        self.scopes.pop()
        self.budgets(k, ctx)

    def block(self, stmts: list[Any], ctx: _Ctx, grid_level: bool = False) -> None:
        real = [s for s in stmts if not isinstance(s, ast.Comment)]
        if any(isinstance(s, ast.Role) for s in real):
            self.rules.block_structure(real, ctx)
        for i, stmt in enumerate(real):
            if isinstance(stmt, ast.ForLoop):
                self.loop(stmt, ctx, grid_level and not ctx.grid_done, after=real[i + 1:])
                continue
            if not isinstance(stmt, ast.Let):
                ctx.grid_done = True
            self.statement(stmt, ctx)

    def loop(self, loop: ast.ForLoop, ctx: _Ctx, grid_level: bool, after: list[Any]) -> None:
        if loop.text is not None:
            self.err(loop, "a sketch loop (free text range) in a full program",
                     "for n_blk in range(0, cdiv(M, BLOCK_N))")
        if loop.parallel:
            if not grid_level:
                self.err(loop, "a parallel loop inside a sequential part of the kernel",
                         "parallel loops (the launch grid) must enclose everything else in their Kernel")
            elif after:
                self.err(after[0], "a statement after a parallel loop at the same level",
                         "put it inside the parallel loop, or in another Kernel")
        probes = []
        for bound in (loop.start, loop.stop):
            if bound is not None:
                self.names_in(bound, loop, allow_tensors=False)
        trips = []
        for which in (0, 1):
            lo = self.probe(loop.start, which, loop) if loop.start is not None else None
            probes.append(lo)
            hi = self.probe(loop.stop, which, loop) if loop.stop is not None else None
            try:
                trips.append(None if lo is None or hi is None else float(hi) - float(lo))
            except (TypeError, ValueError, OverflowError):
                trips.append(None)
        self.loop_trips(loop, trips)
        his = [self.probe(loop.stop, which, loop) if loop.stop is not None else None for which in (0, 1)]
        self.rules.remember_bounds(loop, (probes[0], his[0], probes[1], his[1]))
        self.scopes.append({})
        # a probe value for the variable: the start, which exists for every non-empty loop
        sym = _Sym(loop.var, "loop", loc=loop.loc, probe=(probes[0], probes[1]))
        if sym.probe[0] is not None:
            sym.probe = (sym.probe[0] + 1, sym.probe[1] + 2)  # distinct, so extents that depend on it show
        self.define(sym, loop)
        if not loop.parallel:
            ctx.seq_depth += 1
            ctx.grid_done = True
        self.rules.enter_loop(loop)
        self.block(loop.body, ctx, grid_level=loop.parallel and grid_level)
        self.rules.exit_loop(loop)
        if not loop.parallel:
            ctx.seq_depth -= 1
        self.scopes.pop()

    def loop_trips(self, loop: ast.ForLoop, trips: list[Any]) -> None:
        """Refuse a loop that runs more often than any real shape needs (MAX_LOOP_TRIPS)."""
        hint = "bound it by the sizes: range(cdiv(M, BLOCK_N)), range(B), range(SPLITS)"
        if trips[0] is not None and trips[0] == trips[1]:  # a count that does not depend on the sizes
            if trips[0] > MAX_LOOP_TRIPS:
                self.err(loop, f"loop 'for {loop.var}' runs {trips[0]:.3g} times whatever the shape: beyond any real "
                               f"shape (a fixed loop count is at most {MAX_LOOP_TRIPS})", hint)
            return
        for which, count in enumerate(trips):
            sizes = _PROBES[which]
            limit = max(MAX_LOOP_TRIPS, sizes["B"] * sizes["H"] * sizes["N"] * sizes["M"])
            if count is not None and count > limit:
                self.err(loop, f"loop 'for {loop.var}' runs {count:.3g} times at B={sizes['B']}, H={sizes['H']}, "
                               f"N={sizes['N']}, M={sizes['M']}: more than B*H*N*M, beyond any real shape", hint)
                return

    def role_block(self, role: ast.Role, ctx: _Ctx) -> None:
        """`Role producer|consumer warps W` ... `end`: its own scope (a role's registers and Lets are its own)."""
        if self.rules.role is not None:
            return  # a role inside a role: reported by block_structure
        self.rules.enter_role(role)
        self.scopes.append({})
        self.block(role.body, ctx, grid_level=False)
        self.scopes.pop()
        self.rules.exit_role(role)

    def statement(self, stmt: Any, ctx: _Ctx) -> None:
        if not self.rules.statement_allowed(stmt):
            return
        if isinstance(stmt, ast.Role):
            self.role_block(stmt, ctx)
        elif isinstance(stmt, ast.SYNC_TYPES):
            self.rules.sync(stmt, ctx)
        elif isinstance(stmt, ast.Let):
            self.names_in(stmt.value, stmt, allow_tensors=False)
            self.define(_Sym(stmt.name, "let", loc=stmt.loc,
                             probe=(self.probe(stmt.value, 0, stmt), self.probe(stmt.value, 1, stmt))), stmt)
        elif isinstance(stmt, ast.Allocate):
            if stmt.level is ast.Level.global_:
                self.err(stmt, "a global tensor allocated inside a Kernel", "declare global tensors before the kernels")
            elif not ctx.grid_done:
                self.err(stmt, "a local tensor allocated outside the innermost parallel loop",
                         "allocate shared and register tensors inside the grid loops (one block's storage)")
            self.allocate(stmt, ctx)
        elif isinstance(stmt, ast.Copy):
            self.copy(stmt, ctx)
        elif isinstance(stmt, ast.ComputeGemm):
            self.gemm(stmt, ctx)
        elif isinstance(stmt, ast.ComputeOnlineSoftmax):
            self.online_softmax(stmt, ctx)
        elif isinstance(stmt, ast.ComputeAssign):
            self.assign(stmt, ctx)
        elif isinstance(stmt, ast.Reshape):
            self.reshape(stmt, ctx)
        elif isinstance(stmt, ast.Kernel):
            self.err(stmt, "a Kernel inside a Kernel", "close the first with `end`")
        elif isinstance(stmt, ast.TensorDecl):
            self.err(stmt, "a Tensor line inside a Kernel", "declare call-time tensors at program level, beside the "
                                                            "global Allocates")
        elif isinstance(stmt, ast.ComputeText):
            self.err(stmt, "a free-form Compute (sketch) in a full program",
                     "write an expression: Compute NAME = EXPR, or GEMM / OnlineSoftmax")

    def copy(self, stmt: ast.Copy, ctx: _Ctx) -> None:
        if stmt.dst is None:
            self.err(stmt, "a Copy without a destination (sketch form) in a full program",
                     "Copy K[b, h, k0 : k0 + BLOCK_N, 0 : D] from global to shared K_s")
            return
        src, dst = self.tensor(stmt.src.name, stmt.src), self.tensor(stmt.dst.name, stmt.dst)
        if src is None or dst is None:
            return
        ok = True
        for ref, sym, level, side in ((stmt.src, src, stmt.src_level, "from"), (stmt.dst, dst, stmt.dst_level, "to")):
            if sym.level is not level:
                ok = False
                self.err(ref, f"'{sym.name}' lives in {sym.level.value} memory but the Copy says {side} "
                              f"{level.value}", f"Copy {stmt.src.name} from {src.level.value} to {dst.level.value} "
                                                f"{stmt.dst.name}" if src.level and dst.level else None)
            if ref.transposed:
                self.err(ref, "^T marks a GEMM operand; a Copy does not transpose")
        if not ok:
            return
        if src.level is ast.Level.global_ and dst.level is ast.Level.global_:
            self.err(stmt, "a Copy from global to global", "stage it through shared memory or registers")
            return
        if dst.level is ast.Level.global_ and dst.name in ("Q", "K", "V"):
            self.err(stmt.dst, f"'{dst.name}' is an input; a kernel cannot write it")
            return
        self.rules.copy(stmt, src, dst, ctx)
        self.copy_dtype(stmt, src, dst)
        if src.level is ast.Level.global_ or dst.level is ast.Level.global_:
            glob_ref, glob, local_ref, local = (stmt.src, src, stmt.dst, dst) if src.level is ast.Level.global_ \
                else (stmt.dst, dst, stmt.src, src)
            if local_ref.index is not None:
                self.err(local_ref, "only the global side of a Copy is indexed")
            if glob_ref.index is None:
                self.err(glob_ref, f"the global side '{glob.name}' needs an index",
                         f"{glob.name}[b, h, r0 : r0 + BLOCK_M, 0 : D]")
            else:
                self.global_index(glob_ref, glob, local)
        else:
            for ref in (stmt.src, stmt.dst):
                if ref.index is not None:
                    self.err(ref, "a shared/register tensor is used whole; only the global side of a Copy is indexed")
            if src.shape and dst.shape and src.shape != dst.shape:
                self.err(stmt, f"Copy of {list(src.shape)} into {list(dst.shape)}")
        self.read(src, stmt.src)
        dst.accumulator = src.accumulator
        self.write(dst, ctx)

    def copy_dtype(self, stmt: ast.Copy, src: _Sym, dst: _Sym) -> None:
        """A load into shared memory keeps the input dtype, or converts with `as scaled fp16` where the
        tensor cores do not take bf16/fp32 (the tile is then an fp16 tile, counted so by the budgets)."""
        load = src.level is ast.Level.global_ and dst.level is ast.Level.shared
        scaled_form = "as scaled fp16"
        if stmt.scaled_to is None:
            if load and src.dtype is not None and dst.dtype is not None and src.dtype is not dst.dtype:
                hint = (f"convert on the load: Copy ... to shared {dst.name} {scaled_form}"
                        if dst.dtype is DType.fp16 and self.dtype in (DType.bf16, DType.fp32)
                        else f"Allocate {dst.name} ... dtype {src.dtype.value}")
                self.err(stmt, f"Copy of {src.dtype.value} '{src.name}' into {dst.dtype.value} shared tile "
                               f"'{dst.name}' without a conversion", hint)
            return
        if not load:
            self.err(stmt, f"`as scaled {stmt.scaled_to.value}` converts a load from global into shared memory; this "
                           f"Copy goes from {src.level.value} to {dst.level.value}",
                     "write it on the Copy ... from global to shared that loads the tile")
        elif stmt.scaled_to is not DType.fp16:
            self.err(stmt, f"`as scaled {stmt.scaled_to.value}`: a load converts only to fp16", scaled_form)
        elif self.dtype not in (DType.bf16, DType.fp32):
            self.err(stmt, f"`{scaled_form}` in an {self.dtype.value} program: there is nothing to convert",
                     f"drop `{scaled_form}`")
        elif dst.dtype is not None and dst.dtype is not DType.fp16:
            self.err(stmt, f"`{scaled_form}` into '{dst.name}' of dtype {dst.dtype.value}; the converted tile is fp16",
                     f"Allocate {dst.name} in shared ... dtype fp16")
        elif self.target is not None and tensor_cores_take(self.target.arch, self.dtype):
            self.warn(stmt, f"the tensor cores of {self.target.name} take {self.dtype.value}: converting to fp16 "
                            f"loses range and precision, and no translator for {self.target.arch} implements it",
                      f"drop `{scaled_form}` and Allocate {dst.name} ... dtype {self.dtype.value}")

    def global_index(self, ref: ast.Ref, glob: _Sym, local: _Sym) -> None:
        assert ref.index is not None
        if glob.shape is not None and len(ref.index) != len(glob.shape):
            self.err(ref, f"'{glob.name}' has {len(glob.shape)} dims; the index gives {len(ref.index)}")
            return
        slices = [i for i in ref.index if isinstance(i, ast.Slice)]
        if local.shape is not None and len(slices) != len(local.shape):
            self.err(ref, f"the index selects a {len(slices)}-dim tile but '{local.name}' has {len(local.shape)} dims",
                     "one `start : stop` slice per tile dim, a single index for every other dim")
            return
        for item in ref.index:
            if isinstance(item, ast.Point):
                self.names_in(item.index, ref, allow_tensors=False)
                continue
            self.names_in(item.start, ref, allow_tensors=False)
            self.names_in(item.stop, ref, allow_tensors=False)
            extents = []
            for which in (0, 1):
                a, b = self.probe(item.start, which, ref), self.probe(item.stop, which, ref)
                extents.append(None if a is None or b is None else b - a)
            dim = local.shape[slices.index(item)] if local.shape else None
            if None in extents:
                continue
            if extents[0] != extents[1]:
                self.err(item, f"the extent of slice '{format_expr(item.start)} : {format_expr(item.stop)}' depends on "
                               f"loop variables", "write start : start + TILE")
            elif dim is not None and extents[0] != dim:
                self.err(item, f"slice '{format_expr(item.start)} : {format_expr(item.stop)}' spans {extents[0]} "
                               f"elements but '{local.name}' has {dim} along that dim")

    def gemm(self, stmt: ast.ComputeGemm, ctx: _Ctx) -> None:
        a, b = self.tensor(stmt.a.name, stmt.a), self.tensor(stmt.b.name, stmt.b)
        c = self.tensor(stmt.out, stmt)
        if a is None or b is None or c is None:
            return
        bad = False
        for ref, sym in ((stmt.a, a), (stmt.b, b)):
            if ref.index is not None:
                self.err(ref, "a GEMM operand is a whole shared or register tile (no index)")
                bad = True
            if sym.level is ast.Level.global_:
                self.err(ref, f"GEMM operand '{sym.name}' is in global memory",
                         f"Copy a tile of it to shared memory first (Copy {sym.name}[...] from global to shared ...)")
                bad = True
            elif sym.accumulator:
                self.err(ref, f"GEMM operand '{sym.name}' is the fp32 accumulator of another GEMM (missing Reshape)",
                         f"Reshape {sym.name} into an {self.dtype.value} register tile and use that")
                bad = True
            elif sym.level is ast.Level.register and sym.dtype is not None and sym.dtype is not self.dtype:
                self.err(ref, f"GEMM operand '{sym.name}' is {sym.dtype.value}; operands are {self.dtype.value}",
                         "Reshape the accumulator into an operand tile")
                bad = True
        if stmt.a.transposed:
            self.err(stmt.a, "the A operand of a GEMM cannot be transposed", "transpose B instead: A, B^T")
        if c.level is not ast.Level.register or c.dtype not in (None, DType.fp32):
            self.err(stmt, f"GEMM result '{c.name}' must be an fp32 register tile (the accumulator)")
            bad = True
        if not bad and a.shape and b.shape and c.shape:
            if len(a.shape) != 2 or len(b.shape) != 2 or len(c.shape) != 2:
                self.err(stmt, "GEMM operands and result are 2-dim tiles")
            else:
                m, k = a.shape
                kb, n = (b.shape[1], b.shape[0]) if stmt.b.transposed else b.shape
                if k != kb or c.shape != (m, n):
                    hint = "is B stored [n, k]? then write B^T" if not stmt.b.transposed and b.shape[1] == k else None
                    self.err(stmt, f"GEMM shapes do not match: [{m}, {k}] @ [{kb}, {n}] -> {list(c.shape)}", hint)
                self.gemm_dims(stmt, m, n, k)
        self.read(a, stmt.a)
        self.read(b, stmt.b)
        if stmt.accumulate:
            self.read(c, stmt)
        self.write(c, ctx)
        c.accumulator = True

    def gemm_dims(self, stmt: Any, m: int, n: int, k: int) -> None:
        mma = self.mma_shape()
        warps = self.rules.consumer_warps() or self.p.params.get("WARPS", 1)
        if m % (mma.m * warps):
            self.err(stmt, f"the GEMM's {m} rows do not split into {warps} warps of {mma.m} rows ({mma.instruction})",
                     "make BLOCK_M a multiple of 16 * WARPS")
        # the head dim is checked on its own (check_params); as a GEMM's k the kernel pads it with zero columns
        head_dim = self.p.target.head_dim
        if n % mma.n and n not in (head_dim, self.p.target.dv):
            self.err(stmt, f"the GEMM's n = {n} is not a multiple of {mma.n} ({mma.instruction})")
        if k % mma.k and k != head_dim:
            self.err(stmt, f"the GEMM's k = {k} is not a multiple of {mma.k} ({mma.instruction})")

    def online_softmax(self, stmt: ast.ComputeOnlineSoftmax, ctx: _Ctx) -> None:
        if stmt.rescale is None:
            self.err(stmt, "OnlineSoftmax without `and rescale O` in a full program",
                     "Compute OnlineSoftmax S_r with max m_i, sum l_i and rescale O_r")
        names = [stmt.scores, stmt.max, stmt.sum] + ([stmt.rescale] if stmt.rescale else [])
        syms = [self.tensor(n, stmt) for n in names]
        if any(s is None for s in syms):
            return
        for s in syms:
            if s.level is not ast.Level.register:  # type: ignore[union-attr]
                self.err(stmt, f"OnlineSoftmax works on register tensors; '{s.name}' is in {s.level.value}")  # type: ignore
                return
        s, m, l = syms[0], syms[1], syms[2]
        if s.shape and m.shape and l.shape:  # type: ignore[union-attr]
            rows = s.shape[0]  # type: ignore[union-attr]
            if len(s.shape) != 2 or m.shape != (rows,) or l.shape != (rows,):  # type: ignore[union-attr]
                self.err(stmt, "OnlineSoftmax wants scores [r, c] and row vectors max [r], sum [r]")
            if len(syms) == 4 and syms[3].shape and (len(syms[3].shape) != 2 or syms[3].shape[0] != rows):  # type: ignore
                self.err(stmt, "the rescaled accumulator must have the scores' rows")
        for sym in syms:
            self.read(sym, stmt)  # type: ignore[arg-type]
        for sym in syms:
            self.write(sym, ctx)  # type: ignore[arg-type]

    def assign(self, stmt: ast.ComputeAssign, ctx: _Ctx) -> None:
        target = self.tensor(stmt.target, stmt)
        self.names_in(stmt.expr, stmt, allow_index=True)
        if target is None:
            return
        if target.level is ast.Level.global_:
            self.err(stmt, f"Compute on global memory ('{target.name}')",
                     "Copy a tile to registers, compute there, Copy the result back")
            return
        self.expr_shape(stmt.expr, target, stmt, reduce_depth=0)
        self.write(target, ctx)

    def expr_shape(self, expr: Any, target: _Sym, stmt: Any, reduce_depth: int) -> None:
        """Every tensor must fit the destination: rank at most the target's (2 inside rowmax/rowsum), same rows."""
        if not target.shape:
            return
        rank = len(target.shape) + reduce_depth
        if isinstance(expr, ast.Call) and expr.func in ast.REDUCTIONS:
            if len(target.shape) + reduce_depth >= 2:
                self.err(expr, f"{expr.func} of a row vector: it reduces a [rows, cols] tile")
            for a in expr.args:
                self.expr_shape(a, target, stmt, reduce_depth + 1)
            return
        if isinstance(expr, ast.Name):
            if expr.id == "k_idx" and rank < 2:
                self.err(expr, "k_idx in a row-vector Compute: there is no key column here")
            sym = self.lookup(expr.id)
            if sym is None or sym.kind != "tensor" or not sym.shape or sym.level is ast.Level.global_:
                return
            if len(sym.shape) > rank:
                self.err(expr, f"'{sym.name}' {list(sym.shape)} does not fit '{target.name}' {list(target.shape)}",
                         "reduce it with rowmax/rowsum")
            elif sym.shape[0] != target.shape[0]:
                self.err(expr, f"'{sym.name}' has {sym.shape[0]} rows, '{target.name}' has {target.shape[0]}")
            elif len(sym.shape) == 2 and rank == 2 and reduce_depth == 0 and sym.shape[1] != target.shape[1]:
                self.err(expr, f"'{sym.name}' {list(sym.shape)} does not fit '{target.name}' {list(target.shape)}")
            return
        for sub in {ast.Unary: lambda e: [e.operand], ast.Binary: lambda e: [e.left, e.right],
                    ast.Call: lambda e: e.args, ast.Subscript: lambda e: e.indices}.get(type(expr), lambda e: [])(expr):
            self.expr_shape(sub, target, stmt, reduce_depth)

    def reshape(self, stmt: ast.Reshape, ctx: _Ctx) -> None:
        src, dst = self.tensor(stmt.src, stmt), self.tensor(stmt.dst, stmt)
        if src is None or dst is None:
            return
        if src.level is not ast.Level.register or dst.level is not ast.Level.register:
            self.err(stmt, "Reshape turns a register accumulator into a register operand; both must be registers")
        elif src.shape and dst.shape and src.shape != dst.shape:
            self.err(stmt, f"Reshape of {list(src.shape)} into {list(dst.shape)}")
        elif dst.dtype is not None and dst.dtype is not self.dtype:
            self.err(stmt, f"Reshape into '{dst.name}' of dtype {dst.dtype.value}; operands are {self.dtype.value}")
        self.read(src, stmt)
        self.write(dst, ctx)
        dst.accumulator = False

    # ------------------------------------------------------------------ budgets
    def budgets(self, kernel: ast.Kernel, ctx: _Ctx) -> None:
        if self.target is None:
            return
        stages = self.p.params.get("STAGES", 1)
        warps = self.rules.consumer_warps() or self.p.params.get("WARPS", 4)
        smem = 0
        acc_regs = operand_regs = 0.0
        allocs = {a.name: a for a in _allocations(kernel)}
        # GEMM inputs held in registers are operand fragments, whatever their dtype (fp32 in an fp32 program)
        gemm_inputs = {ref.name for g in _walk(kernel.body) if isinstance(g, ast.ComputeGemm) for ref in (g.a, g.b)}
        for sym in ctx.kernel_tensors:
            if not sym.shape or sym.dtype is None:
                continue
            size = math.prod(sym.shape) * sym.dtype.itemsize
            if sym.level is ast.Level.shared:
                # a role program states its rings (`stages`); otherwise a buffer loaded in a loop is multi-buffered
                copies = sym.stages or (1 if self.rules.program_has_roles else stages if sym.written_in_loop else 1)
                alloc = allocs.get(sym.name)
                off = self.probe(alloc.offset, 0, alloc) if alloc is not None and alloc.offset is not None else None
                if isinstance(off, (int, float)):
                    smem = max(smem, int(off) + size * copies)
                else:
                    smem += size * copies
            elif sym.level is ast.Level.register:
                if sym.dtype is DType.fp32 and sym.name not in gemm_inputs:
                    acc_regs += size / 4
                else:
                    operand_regs += size / 4
        t = self.target
        if smem > t.smem_per_block_bytes:
            self.err(kernel, f"kernel '{kernel.name}' needs {smem} bytes of shared memory; {t.name} allows "
                             f"{t.smem_per_block_bytes} per block",
                     "lower BLOCK_N, BLOCK_M or STAGES (buffers loaded in a loop count STAGES times)")
        threads = 32 * warps
        # fp32 tiles stay resident for the whole loop: over the limit they surely spill (an error); operand
        # tiles may be streamed from shared memory or converted in place, so they only warn
        resident = acc_regs / threads + _REG_OVERHEAD
        total = (acc_regs + operand_regs) / threads + _REG_OVERHEAD
        has_gemm = any(isinstance(s, ast.ComputeGemm) for s in _walk(kernel.body))
        if resident > t.max_regs_per_thread and not has_gemm:
            self.warn(kernel, f"kernel '{kernel.name}' holds about {resident:.0f} registers per thread in fp32 tiles; "
                              f"{t.name} allows {t.max_regs_per_thread}",
                      "with no GEMM the translator may loop over the tile instead of spreading it over threads")
        elif resident > t.max_regs_per_thread:
            self.err(kernel, f"kernel '{kernel.name}' keeps about {resident:.0f} registers per thread in fp32 tiles; "
                             f"{t.name} allows {t.max_regs_per_thread} (it would spill)",
                     "lower BLOCK_M or BLOCK_N, or raise WARPS")
        elif total > t.max_regs_per_thread:
            self.warn(kernel, f"kernel '{kernel.name}' holds about {total:.0f} registers per thread if its operand "
                              f"tiles stay in registers; {t.name} allows {t.max_regs_per_thread}",
                      "the translator must stream operand fragments from shared memory")


def _walk(stmts: list[Any]):
    for s in stmts:
        yield s
        if isinstance(s, ast.BLOCK_TYPES):
            yield from _walk(s.body)


def _allocations(kernel: ast.Kernel) -> list[ast.Allocate]:
    out: list[ast.Allocate] = []

    def walk(stmts: list[Any]) -> None:
        for s in stmts:
            if isinstance(s, ast.Allocate):
                out.append(s)
            elif isinstance(s, ast.BLOCK_TYPES):
                walk(s.body)

    walk(kernel.body)
    return out


def resolve_target(program: ast.Program, target: Any = None) -> Any:
    """The Target to check budgets against: the one given (a Target or a name), else the known target
    of the program's arch with the least shared memory per block (the conservative one), else None."""
    from flashgen.targets import TARGETS, get_target

    if isinstance(target, str):
        return get_target(target)
    if target is not None:
        return target
    if program.target is None:
        return None
    same_arch = [t for t in TARGETS.values() if t.arch == program.target.arch.removesuffix("a")]
    return min(same_arch, key=lambda t: t.smem_per_block_bytes) if same_arch else None


def check(program: ast.Program, target: Any = None) -> list[Diagnostic]:
    """Every problem in `program` (errors and warnings), in source order. `target` (a Target or its
    name) sets the shared-memory and register budgets; by default the program's arch decides."""
    if deep := ast.nesting_problem(program):  # the parser refuses these; a program built otherwise stops here
        node, message = deep
        loc = node.loc or ast.Loc()
        return [Diagnostic(file=program.filename, line=loc.line, col=loc.col, message=message,
                           hint="split the expression over several lines; nest fewer blocks")]
    resolved = resolve_target(program, target)
    if program.size_params:  # each range of sizes is a program of its own params: check every one
        classes = program.size_classes()
        found = {(d.line, d.col, d.message): d for d in _Checker(classes[-1][1], resolved).run()}  # the Params line's
        for line, (_, one) in zip(program.size_params, classes):
            for d in _Checker(one, resolved).run():
                if (d.line, d.col, d.message) not in found:  # only at that line's sizes: say so
                    found[(d.line, d.col, d.message)] = d.model_copy(
                        update={"message": f"{d.message} (with `Params when {line.condition}`, line "
                                           f"{line.loc.line if line.loc else '?'})"})
        diags = list(found.values())
    else:
        diags = _Checker(program, resolved).run()
    if resolved is not None and program.target is not None and resolved.arch != program.target.arch.removesuffix("a"):
        diags.append(Diagnostic(file=program.filename, line=program.target.loc.line if program.target.loc else 1,
                                col=1, severity="warning",
                                message=f"the program is written for {program.target.arch}; checking against "
                                        f"{resolved.name} ({resolved.arch})"))
    if program.target is not None and resolved is None:
        diags.append(Diagnostic(file=program.filename, line=program.target.loc.line if program.target.loc else 1,
                                col=1, severity="warning",
                                message=f"no known GPU has arch {program.target.arch}; budgets not checked"))
    return sorted(diags, key=lambda d: (d.line, d.col))
