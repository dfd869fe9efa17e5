"""Run a full LLM-TL program on the CPU in float64, tile by tile, exactly as written.

Every grid point of a kernel (the product of its `parallel` loops) runs at once: a local tensor of
shape [r, c] is held as an array (G, r, c), a `Let` scalar as (G,). Sequential loops whose bounds
differ between grid points run from the smallest start to the largest stop with a per-point
`active` mask, so a bound is honoured exactly per point. Allocations start as NaN so that a missing
initialisation shows up in the result. Loads zero-fill out-of-range rows; stores drop them.
A converting load (`Copy ... to shared K_s as scaled fp16`) is a plain copy here: its per-tile
power-of-two scale is exact, and the interpreter does not emulate fp16 (or any) rounding.

Byte counts: `global_read`/`global_write` are every Copy from/to global as written (a K tile read by
each query tile counts each time: L2 traffic); `dram_read`/`dram_write` are the compulsory DRAM
traffic, each global tensor's size once if any Copy reads it and once if any Copy writes it.

`compare` runs a program and measures its error against `flashgen.reference.attention` for the
program's declared variant.

The Hopper dataflow (Role blocks, docs/llm-tl.md): the roles of a block run as coroutines. The scheduler runs the
producer as far ahead as its Acquires allow, then the consumer until it waits for a copy not issued yet (or releases
a stage, when the producer gets to run again). An async copy's tile lands in its slot's *pending* copy and becomes
what the consumer reads only at the matching Wait; a read of a slot that was not awaited sees its old content (NaN
until the first Wait). Release frees the slot and poisons what the consumer sees of it (the producer may refill it at
any time). Acquire waits until the slot's previous use is released; a copy into a slot that was not acquired lands
anyway (a race: it overwrites a tile the consumer may not have awaited yet). When every role waits, the run stops
with one line naming the buffer and stage each waits for (TLRuntimeError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from flashgen import operators
from flashgen.errors import UsageError
from flashgen.reference import alibi_table, attention, random_inputs
from flashgen.roofline import OpCounts
from flashgen.tl_spec import ast
from flashgen.tl_spec.diagnostics import TLBudgetError, TLRuntimeError
from flashgen.variant import DType, Shape, default_scale

INPUT_NAMES = ("Q", "K", "V")
OUTPUT_NAMES = ("O", "LSE")

# The operation budget (issue 12): a program may do at most BUDGET_FACTOR times the work of a full
# attention at the run's shape, counted in element operations: every statement costs G (grid points)
# times the elements it writes (a GEMM m*n*k per point), every statement and loop iteration at least
# STEP_UNITS (the Python cost of one step, about what numpy does in the same time). Tiles up to 256
# rows pad N and M; the library uses about 3 units per B*H*(N+256)*(M+256)*(D+16) and the largest
# custom programs a few times that, so 32x leaves room while `range(1000000000)` stops in seconds.
BUDGET_FACTOR = 32
STEP_UNITS = 4096
# the largest array the interpreter allocates (a global tensor, a grid of local tiles): 2 GiB of float64
MAX_ARRAY_ELEMENTS = 1 << 28


def op_budget(shape: Shape) -> float:
    """The interpreter's operation budget at `shape` (element operations, see BUDGET_FACTOR)."""
    return float(BUDGET_FACTOR * shape.B * shape.H * (shape.N + 256) * (shape.M + 256) * (shape.D + 16))


class InterpretResult(BaseModel):
    """Outputs of one run (float64 arrays: O (B, H, N, D), LSE (B, H, N) when declared) and the work done."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    outputs: dict[str, Any]
    counts: OpCounts
    inputs: dict[str, Any]
    scale: float


class CompareResult(BaseModel):
    """Error of a program against the fp64 reference of its declared variant."""

    variant: str
    shape: Shape
    seed: int
    max_abs_err: float
    rel_err: float
    counts: OpCounts


@dataclass
class _Buffer:
    name: str
    level: ast.Level
    dtype: DType
    shape: tuple[int, ...]
    data: np.ndarray  # global: the tensor itself; local: (G, *shape)
    rows: np.ndarray | None = None  # (G, shape[0]) absolute row coordinate (query row / key position)
    cols: np.ndarray | None = None  # (G, shape[1])
    is_accumulator: bool = False
    ring: _Ring | None = None  # an asynchronously loaded shared buffer (Hopper dataflow): its slots


@dataclass
class _Ring:
    """The slots of an async-loaded shared buffer (one slot when it has no `stages`): what the consumer sees
    (`visible`), what the last copy into each slot brought (`pending`, visible from the matching Wait on), and per
    grid point and slot how often it was acquired, filled, awaited and released."""

    stages: int
    visible: np.ndarray  # (S, G, *shape)
    pending: np.ndarray
    vis_rows: np.ndarray  # (S, G, shape[0]) coordinates travelling with the data
    pend_rows: np.ndarray
    vis_cols: np.ndarray | None
    pend_cols: np.ndarray | None
    acquired: np.ndarray  # (G, S) counts
    filled: np.ndarray
    waited: np.ndarray
    released: np.ndarray
    current: np.ndarray  # (G,) the slot the consumer last waited for, -1 before any


class _Blocked:
    """What a role coroutine yields while it cannot go on: the statement, the buffer, the stage and slot."""

    def __init__(self, stmt: Any, what: str, stage: int, slot: int):
        self.stmt, self.what, self.stage, self.slot = stmt, what, stage, slot


_PROGRESS = object()  # yielded by the consumer after a Release: the producer may go on


@dataclass
class _Counter:
    mma: float = 0.0
    vector: float = 0.0
    sfu: float = 0.0
    bytes: dict[str, float] = field(default_factory=dict)
    # global tensors some Copy read / wrote: each costs its whole size in DRAM traffic once (re-reads of a
    # tile by other grid points are served by L2, so they count only in global_read/global_write)
    globals_read: set[str] = field(default_factory=set)
    globals_written: set[str] = field(default_factory=set)

    def add_bytes(self, key: str, value: float) -> None:
        self.bytes[key] = self.bytes.get(key, 0.0) + value

    def compulsory_dram_bytes(self, globals_: dict[str, _Buffer]) -> dict[str, float]:
        """'dram_read' / 'dram_write': the bytes of every global tensor read / written at least once."""
        def size(name: str) -> float:
            return float(math.prod(globals_[name].shape) * globals_[name].dtype.itemsize)

        return {"dram_read": sum(map(size, sorted(self.globals_read))),
                "dram_write": sum(map(size, sorted(self.globals_written)))}


def _where(node: Any, program: ast.Program) -> str:
    loc = getattr(node, "loc", None)
    return f"{program.filename}:{loc.line}:{loc.col}" if loc else program.filename


class _Run:
    def __init__(self, program: ast.Program, shape: Shape, inputs: dict[str, np.ndarray], scale: float, seed: int = 0):
        self.program = program
        self.shape = shape
        self.counter = _Counter()
        self.budget = op_budget(shape)
        self.used = 0.0
        self.running: list[ast.ForLoop] = []  # the sequential loops now running, innermost last
        t = program.target
        assert t is not None and program.variant is not None
        self.constants: dict[str, float | int] = dict(ast.CONSTANTS)
        self.constants.update({"B": shape.B, "H": shape.H, "KVH": shape.kv_heads, "N": shape.N, "M": shape.M,
                               "D": shape.D, "KV_GROUP": shape.H // shape.kv_heads, "scale": scale, "DV": shape.dv})
        if program.variant.softcap is not None:
            self.constants["softcap"] = float(program.variant.softcap)
        if program.variant.window is not None:
            self.constants["window"] = int(program.variant.window)
        for side in ("window_left", "window_right"):  # the two-sided window's bounded sides
            if (bound := getattr(program.variant, side)) is not None:
                self.constants[side] = int(bound)
        # the tile params at this shape (a `Params when` line's where one holds): the tiles the kernel runs them with
        self.constants.update(program.params_at(shape.sizes))
        self.G = 1
        self.scalars: dict[str, Any] = {}
        self.locals: dict[str, _Buffer] = {}
        self.globals: dict[str, _Buffer] = {}
        self.steps = 0  # statements executed: the role scheduler's measure of progress
        self.async_targets = {s.dst.name for s in program.statements()
                              if isinstance(s, ast.Copy) and s.is_async and s.dst is not None}
        for alloc in program.global_allocations:
            dims = tuple(self._static_int(e, alloc) for e in alloc.shape or [])
            if alloc.name in INPUT_NAMES:
                data = np.asarray(inputs[alloc.name], dtype=np.float64)
                if data.shape != dims:
                    raise self.error(alloc, f"input {alloc.name} has shape {list(data.shape)} but is declared "
                                            f"{list(dims)}")
            else:
                self._array_cap(math.prod(dims), alloc, f"global tensor {alloc.name} {list(dims)}")
                data = np.full(dims, np.nan)
            self.globals[alloc.name] = _Buffer(alloc.name, ast.Level.global_, alloc.dtype or t.dtype, dims, data)
        self.tensors = self._call_time_tensors(inputs, seed)

    def _call_time_tensors(self, inputs: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
        """The tensors `T[i]` reads: each `Tensor` line's (given in `inputs` by name, else filled by its rule from
        `seed`) and, in an ALiBi program, `alibi_slopes` (B, H): the given (H) or (B, H) slopes, else the standard."""
        from flashgen.tl_spec.tensors import fill_all, sizes_of, spec_of

        s = self.shape
        specs = [spec_of(decl) for decl in self.program.tensor_decls]
        sizes = sizes_of(s)
        missing = [spec for spec in specs if spec.name not in inputs]
        try:
            filled = fill_all(missing, sizes, seed) if missing else {}
        except ValueError as exc:
            decl = next(d for d in self.program.tensor_decls if str(exc).startswith(f"{d.name}: "))
            raise self.error(decl, str(exc)) from None
        tensors: dict[str, np.ndarray] = {}
        for decl, spec in zip(self.program.tensor_decls, specs):
            value = np.asarray(inputs[spec.name] if spec.name in inputs else filled[spec.name])
            if value.shape != spec.dims(sizes):
                raise self.error(decl, f"tensor {spec.name} has shape {list(value.shape)} but is declared "
                                       f"{list(spec.dims(sizes))}")
            if spec.dtype == "int32" and not np.array_equal(value, np.round(value)):
                raise self.error(decl, f"tensor {spec.name} is int32 but holds non-integer values")
            tensors[spec.name] = value.astype(np.int64 if spec.dtype == "int32" else np.float64)
        if self.program.variant is not None and self.program.variant.alibi:
            try:
                tensors[ast.ALIBI_SLOPES] = alibi_table(s.B, s.H, inputs.get(ast.ALIBI_SLOPES))
            except ValueError as exc:
                raise UsageError(f"{self.program.filename}: {exc}") from None
        return tensors

    # ------------------------------------------------------------------ helpers
    def error(self, node: Any, message: str) -> TLRuntimeError:
        return TLRuntimeError(f"{_where(node, self.program)}: {message}")

    def charge(self, units: float, node: Any) -> None:
        """Count `units` element operations against the budget; raises TLBudgetError past it."""
        self.used += max(float(units), STEP_UNITS)
        if self.used > self.budget:
            where = self.running[-1] if self.running else node
            what = f"loop 'for {where.var}'" if isinstance(where, ast.ForLoop) else "this statement"
            s = self.shape
            raise TLBudgetError(
                f"{_where(where, self.program)}: the interpreter's operation budget of {self.budget:.2g} element "
                f"operations ({BUDGET_FACTOR}x a full attention at B={s.B},H={s.H},N={s.N},M={s.M},D={s.D}) was "
                f"used up in {what}: a loop runs far more often, or a tile is far larger, than the shape needs")

    def _array_cap(self, elements: int, node: Any, what: str) -> None:
        if elements > MAX_ARRAY_ELEMENTS:
            raise TLBudgetError(f"{_where(node, self.program)}: {what} would hold {elements:.3g} values; the "
                                f"interpreter's limit is {MAX_ARRAY_ELEMENTS:.3g} (2 GiB) per array")

    def _static_int(self, expr: Any, node: Any) -> int:
        value = self.eval(expr, 0, node)
        if isinstance(value, np.ndarray):
            raise self.error(node, "a shape must not depend on loop variables")
        if float(value) != int(value):
            raise self.error(node, f"a shape must be an integer, got {value}")
        return int(value)

    def buffer(self, name: str, node: Any) -> _Buffer:
        buf = self.locals.get(name) or self.globals.get(name)
        if buf is None:
            raise self.error(node, f"'{name}' is not an allocated tensor")
        return buf

    def n_active(self, active: np.ndarray | None) -> int:
        return self.G if active is None else int(np.count_nonzero(active))

    def _index_values(self, value: Any, node: Any, active: np.ndarray | None) -> Any:
        """An index expression's value as int (uniform) or int64 (G,) array."""
        if isinstance(value, np.ndarray):
            check = value if active is None else value[active]
            if check.size and not np.all(np.isfinite(check) & (check == np.floor(check))):
                raise self.error(node, "an index or loop bound is not an integer (use // for integer division)")
            return np.where(np.isfinite(value), value, 0).astype(np.int64)
        if isinstance(value, bool) or not float(value).is_integer():
            raise self.error(node, f"an index or loop bound is not an integer: {value}")
        return int(value)

    # ------------------------------------------------------------------ expressions
    def eval(self, expr: Any, rank: int, node: Any, coords: tuple[Any, Any] = (None, None)) -> Any:
        """Evaluate in a context of `rank` tile dims: values broadcast as (G, *dims) (rank 0: (G,))."""
        if isinstance(expr, ast.Num):
            return expr.value
        if isinstance(expr, ast.Name):
            return self._name(expr, rank, coords)
        if isinstance(expr, ast.Unary):
            return UNARY_OPS[expr.op](self.eval(expr.operand, rank, node, coords))
        if isinstance(expr, ast.Binary):
            a = self.eval(expr.left, rank, node, coords)
            b = self.eval(expr.right, rank, node, coords)
            op = expr.op
            if op in ("//", "%") and isinstance(b, (int, float)) and b == 0:
                raise self.error(expr, "integer division by zero")
            return BINARY_OPS[op](a, b)
        if isinstance(expr, ast.Call):
            return self._call(expr, rank, node, coords)
        if isinstance(expr, ast.Subscript):
            return self._subscript(expr, rank, node, coords)
        raise self.error(node, f"not an expression: {type(expr).__name__}")

    def _subscript(self, expr: ast.Subscript, rank: int, node: Any, coords: tuple[Any, Any]) -> Any:
        """`T[i, ...]`: each index clamped into its dim (flashgen.operators.read_clamped, as the kernel's C)."""
        data = self.tensors.get(expr.tensor)
        if data is None:
            what = "exists only in an ALiBi program" if expr.tensor == ast.ALIBI_SLOPES else \
                "is not a call-time tensor (a Tensor line)"
            raise self.error(expr, f"'{expr.tensor}' {what}")
        if len(expr.indices) != data.ndim:
            raise self.error(expr, f"'{expr.tensor}' has {data.ndim} dims; the index gives {len(expr.indices)}")
        indices = []
        for item in expr.indices:
            value = self.eval(item, rank, node, coords)
            if isinstance(value, bool) or np.any(np.asarray(value) != np.floor(np.asarray(value, dtype=np.float64))):
                raise self.error(item, f"an index of '{expr.tensor}' is not an integer (use // for integer division)")
            indices.append(value)
        return operators.read_clamped(data, indices)

    def _name(self, expr: ast.Name, rank: int, coords: tuple[Any, Any]) -> Any:
        name = expr.id
        if name in self.locals:
            buf = self.locals[name]
            nd = len(buf.shape)
            if nd > rank:
                raise self.error(expr, f"'{name}' has {nd} dims where {rank} are expected here "
                                       f"(reduce it with rowmax/rowsum)")
            return buf.data.reshape(buf.data.shape + (1,) * (rank - nd))
        if name in self.scalars:
            v = self.scalars[name]
            return v.reshape((-1,) + (1,) * rank) if isinstance(v, np.ndarray) else v
        if name in ("q_idx", "k_idx"):
            rows, cols = coords
            if name == "q_idx":
                if rank < 1 or rows is None:
                    raise self.error(expr, "q_idx is defined only in a Compute on a tile whose rows come from Q")
                return rows.reshape(rows.shape + (1,) * (rank - 1))
            if rank < 2 or cols is None:
                raise self.error(expr, "k_idx is defined only in a Compute on a score tile whose columns come from K")
            return cols[:, None, :]
        if name in self.constants:
            return self.constants[name]
        if name in self.globals:
            raise self.error(expr, f"'{name}' is a global tensor: Copy a tile of it into registers first")
        raise self.error(expr, f"undefined name '{name}'")

    def _call(self, expr: ast.Call, rank: int, node: Any, coords: tuple[Any, Any]) -> Any:
        f = expr.func
        if f not in ast.FUNCTIONS:
            raise self.error(expr, f"unknown function '{f}'")
        if len(expr.args) != ast.FUNCTIONS[f]:
            raise self.error(expr, f"{f} takes {ast.FUNCTIONS[f]} argument(s), got {len(expr.args)}")
        if f in ast.REDUCTIONS:
            if rank < 1:
                raise self.error(expr, f"{f} gives one value per row; it cannot be used in a scalar expression")
            arg = self.eval(expr.args[0], 2, node, coords)
            if not isinstance(arg, np.ndarray) or arg.ndim != 3:
                raise self.error(expr, f"{f} needs a [rows, cols] tile")
            red = arg.max(axis=2) if f == "rowmax" else arg.sum(axis=2)
            return red if rank == 1 else red[:, :, None]
        args = [self.eval(a, rank, node, coords) for a in expr.args]
        return FUNCTIONS[f](*args)

    # ------------------------------------------------------------------ kernels
    def run_kernel(self, kernel: ast.Kernel) -> None:
        self.G = 1
        self.scalars = {}
        self.locals = {}
        self._grid_level(kernel.body, kernel)

    def _grid_level(self, stmts: list[Any], parent: Any) -> None:
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Comment):
                continue
            if isinstance(stmt, ast.Let):
                self._let(stmt, None)
                continue
            if isinstance(stmt, ast.ForLoop) and stmt.parallel:
                rest = [s for s in stmts[i + 1:] if not isinstance(s, ast.Comment)]
                if rest:
                    raise self.error(rest[0], "statements after a parallel loop at the same level "
                                              "(put them inside it, or in another Kernel)")
                self._expand_grid(stmt)
                self._grid_level(stmt.body, stmt)
                return
            self._block(stmts[i:], None)
            return

    def _expand_grid(self, loop: ast.ForLoop) -> None:
        if loop.text is not None:
            raise self.error(loop, "a sketch loop (free text) cannot run")
        start = self._index_values(self.eval(loop.start, 0, loop), loop.start, None)
        stop = self._index_values(self.eval(loop.stop, 0, loop), loop.stop, None)
        start = np.broadcast_to(np.asarray(start, dtype=np.int64), (self.G,))
        stop = np.broadcast_to(np.asarray(stop, dtype=np.int64), (self.G,))
        counts = np.maximum(stop - start, 0)
        total = int(counts.sum())
        self._array_cap(total, loop, f"the grid ({total} points)")
        self.charge(total, loop)
        owner = np.repeat(np.arange(self.G), counts)
        offset = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
        self.scalars = {k: (v[owner] if isinstance(v, np.ndarray) else v) for k, v in self.scalars.items()}
        self.scalars[loop.var] = (start[owner] + offset).astype(np.int64)
        self.G = int(owner.size)

    def _let(self, stmt: ast.Let, active: np.ndarray | None) -> None:
        value = self._index_values(self.eval(stmt.value, 0, stmt), stmt, active)
        if isinstance(value, np.ndarray) and value.shape != (self.G,):
            value = np.broadcast_to(value, (self.G,)).copy()
        self.scalars[stmt.name] = value

    def _block(self, stmts: list[Any], active: np.ndarray | None) -> None:
        roles_run = False
        for stmt in stmts:
            if isinstance(stmt, ast.Comment):
                continue
            if isinstance(stmt, ast.Role):
                if not roles_run:  # the block's roles run together, as soon as the first is reached
                    roles_run = True
                    self._run_roles([s for s in stmts if isinstance(s, ast.Role)], active)
                continue
            self.charge(self.G, stmt)
            self._statement(stmt, active)

    def _statement(self, stmt: Any, active: np.ndarray | None) -> None:
        self.steps += 1
        if isinstance(stmt, ast.Let):
            self._let(stmt, active)
        elif isinstance(stmt, ast.Allocate):
            self._allocate(stmt)
        elif isinstance(stmt, ast.Copy):
            self._copy(stmt, active)
        elif isinstance(stmt, ast.ComputeGemm):
            self._gemm(stmt, active)
        elif isinstance(stmt, ast.ComputeOnlineSoftmax):
            self._online_softmax(stmt, active)
        elif isinstance(stmt, ast.ComputeAssign):
            self._assign(stmt, active)
        elif isinstance(stmt, ast.Reshape):
            self._reshape(stmt, active)
        elif isinstance(stmt, ast.ForLoop):
            self._loop(stmt, active)
        elif isinstance(stmt, ast.SYNC_TYPES):
            # outside a role (a program the checker would refuse): it must not need to wait
            for signal in self._sync(stmt, active):
                if isinstance(signal, _Blocked):
                    raise self.error(stmt, f"deadlock: {self._blocked_text(signal)}, outside any role")
        elif isinstance(stmt, ast.Role):
            self._run_roles([stmt], active)
        elif isinstance(stmt, ast.Kernel):
            raise self.error(stmt, "a Kernel inside a Kernel")
        else:
            raise self.error(stmt, "a sketch statement cannot run; write it in full TL")

    # ------------------------------------------------------------------ roles (Hopper dataflow)
    def _run_roles(self, roles: list[ast.Role], active: np.ndarray | None) -> None:
        """Run the roles of a block as coroutines: producers first and as far ahead as their Acquires allow."""
        order = sorted(roles, key=lambda r: r.role != "producer")
        state = {id(r): {"scalars": dict(self.scalars), "locals": dict(self.locals), "running": list(self.running)}
                 for r in order}
        saved = (self.scalars, self.locals, self.running)
        gens = {id(r): self._role_body(r.body, active) for r in order}
        done: set[int] = set()
        blocked: dict[int, _Blocked] = {}
        try:
            while len(done) < len(order):
                before = self.steps
                for role in order:
                    if id(role) in done:
                        continue
                    own = state[id(role)]
                    self.scalars, self.locals, self.running = own["scalars"], own["locals"], own["running"]
                    blocked.pop(id(role), None)
                    while True:
                        try:
                            signal = next(gens[id(role)])
                        except StopIteration:
                            done.add(id(role))
                            break
                        if isinstance(signal, _Blocked):
                            blocked[id(role)] = signal
                            break
                        if role.role != "producer":
                            break  # a Release: let the producer refill the stage
                if len(done) < len(order) and self.steps == before:
                    waits = [f"the {r.role} {self._blocked_text(blocked[id(r)])}" for r in order if id(r) in blocked]
                    finished = [f"the {r.role} has finished" for r in order if id(r) in done]
                    first = next(blocked[id(r)] for r in order if id(r) in blocked)
                    raise self.error(first.stmt, "deadlock: " + "; ".join(waits + finished))
        finally:
            for gen in gens.values():
                gen.close()
            self.scalars, self.locals, self.running = saved

    def _blocked_text(self, b: _Blocked) -> str:
        line = b.stmt.loc.line if b.stmt.loc else "?"
        buf = b.stmt.buffer
        stage = f" stage {b.stage} (slot {b.slot})" if b.stmt.stage is not None else ""
        if b.what == "acquire":
            return f"waits at line {line} to acquire {buf}{stage}, which is not released"
        return f"waits at line {line} for {buf}{stage}, whose copy is not issued"

    def _role_body(self, stmts: list[Any], active: np.ndarray | None):
        """A role's statements as a coroutine: yields a _Blocked while a handshake cannot go on."""
        for stmt in stmts:
            if isinstance(stmt, ast.Comment):
                continue
            self.charge(self.G, stmt)
            if isinstance(stmt, ast.SYNC_TYPES):
                self.steps += 1
                yield from self._sync(stmt, active)
            elif isinstance(stmt, ast.ForLoop) and not stmt.parallel and stmt.text is None:
                self.steps += 1
                yield from self._role_loop(stmt, active)
            else:
                self._statement(stmt, active)

    def _role_loop(self, loop: ast.ForLoop, active: np.ndarray | None):
        start = self._index_values(self.eval(loop.start, 0, loop), loop.start, active)
        stop = self._index_values(self.eval(loop.stop, 0, loop), loop.stop, active)
        running = self.running  # this role's own (the scheduler swaps self.running between roles)
        running.append(loop)
        try:
            if not isinstance(start, np.ndarray) and not isinstance(stop, np.ndarray):
                for it in range(start, stop):
                    self.charge(self.G, loop)
                    self.scalars[loop.var] = it
                    yield from self._role_body(loop.body, active)
                return
            start_a = np.broadcast_to(np.asarray(start), (self.G,))
            stop_a = np.broadcast_to(np.asarray(stop), (self.G,))
            live = np.ones(self.G, bool) if active is None else active
            if not live.any():
                return
            for it in range(int(start_a[live].min()), int(stop_a[live].max())):
                self.charge(self.G, loop)
                inner = live & (start_a <= it) & (it < stop_a)
                if not inner.any():
                    continue
                self.scalars[loop.var] = np.full(self.G, it, dtype=np.int64)
                yield from self._role_body(loop.body, inner)
        finally:
            running.pop()

    def _slots(self, buf: _Buffer, stage: Any, active: np.ndarray | None, node: Any) -> tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]:
        """(live points, their slot, their stage value) of `stage` (0 for a buffer without stages)."""
        assert buf.ring is not None
        live = np.nonzero(np.ones(self.G, bool) if active is None else active)[0]
        value = 0 if stage is None else self._index_values(self.eval(stage, 0, node), node, active)
        value = np.broadcast_to(np.asarray(value, dtype=np.int64), (self.G,))[live]
        return live, value % buf.ring.stages, value

    def _ring_buffer(self, name: str, node: Any) -> _Buffer:
        buf = self.buffer(name, node)
        if buf.ring is None:
            raise self.error(node, f"'{name}' is not loaded asynchronously: no async copy fills it")
        return buf

    def _sync(self, stmt: Any, active: np.ndarray | None):
        """Acquire / Wait / Release (a generator: yields _Blocked until it can go on)."""
        buf = self._ring_buffer(stmt.buffer, stmt)
        ring = buf.ring
        assert ring is not None
        live, slot, stage = self._slots(buf, stmt.stage, active, stmt)
        if not live.size:
            return
        if isinstance(stmt, ast.Acquire):
            while not np.all(ring.acquired[live, slot] == ring.released[live, slot]):
                bad = int(np.argmax(ring.acquired[live, slot] != ring.released[live, slot]))
                yield _Blocked(stmt, "acquire", int(stage[bad]), int(slot[bad]))
            ring.acquired[live, slot] += 1
        elif isinstance(stmt, ast.Wait):
            while not np.all(ring.filled[live, slot] > ring.waited[live, slot]):
                bad = int(np.argmax(ring.filled[live, slot] <= ring.waited[live, slot]))
                yield _Blocked(stmt, "wait", int(stage[bad]), int(slot[bad]))
            ring.waited[live, slot] += 1
            ring.visible[slot, live] = ring.pending[slot, live]
            ring.vis_rows[slot, live] = ring.pend_rows[slot, live]
            if ring.vis_cols is not None:
                ring.vis_cols[slot, live] = ring.pend_cols[slot, live]
            ring.current[live] = slot
            self._ring_view(buf)
        else:
            ring.released[live, slot] += 1
            ring.visible[slot, live] = np.nan  # the producer may refill it at any time
            self._ring_view(buf)
            yield _PROGRESS

    def _ring_view(self, buf: _Buffer) -> None:
        """What the consumer reads of an async-loaded buffer: the slot it last waited for, per grid point."""
        ring = buf.ring
        assert ring is not None
        points = np.arange(self.G)
        cur = np.clip(ring.current, 0, None)
        data = ring.visible[cur, points]
        data[ring.current < 0] = np.nan
        buf.data = data
        buf.rows = ring.vis_rows[cur, points]
        buf.cols = ring.vis_cols[cur, points] if ring.vis_cols is not None else None

    def _async_copy(self, stmt: ast.Copy, src: _Buffer, dst: _Buffer, active: np.ndarray | None) -> None:
        """The tile goes into the slot's pending copy; the consumer sees it from the matching Wait on."""
        if dst.ring is None:
            raise self.error(stmt, f"'{dst.name}' is not a shared buffer an async copy can fill")
        ring = dst.ring
        data, coords, _ = self._gather(src, stmt.src, dst, active, stmt)
        live, slot, _stage = self._slots(dst, stmt.stage, active, stmt)
        data = np.broadcast_to(data, (self.G, *dst.shape))
        ring.pending[slot, live] = data[live]
        ring.pend_rows[slot, live] = np.broadcast_to(coords[0], (self.G, dst.shape[0]))[live]
        if ring.pend_cols is not None and len(coords) > 1:
            ring.pend_cols[slot, live] = np.broadcast_to(coords[1], (self.G, dst.shape[1]))[live]
        ring.filled[live, slot] += 1
        self.charge(math.prod(data.shape), stmt)
        n = live.size
        elems = math.prod(dst.shape)
        self.counter.add_bytes("global_read", elems * src.dtype.itemsize * n)
        self.counter.add_bytes("shared_write", elems * dst.dtype.itemsize * n)
        if n:
            self.counter.globals_read.add(src.name)

    def _loop(self, loop: ast.ForLoop, active: np.ndarray | None) -> None:
        if loop.parallel:
            raise self.error(loop, "a parallel loop inside a sequential part of a kernel; parallel loops must "
                                   "enclose everything else in their kernel")
        if loop.text is not None:
            raise self.error(loop, "a sketch loop (free text) cannot run")
        start = self._index_values(self.eval(loop.start, 0, loop), loop.start, active)
        stop = self._index_values(self.eval(loop.stop, 0, loop), loop.stop, active)
        self.running.append(loop)
        try:
            self._loop_range(loop, start, stop, active)
        finally:
            self.running.pop()

    def _loop_range(self, loop: ast.ForLoop, start: Any, stop: Any, active: np.ndarray | None) -> None:
        if not isinstance(start, np.ndarray) and not isinstance(stop, np.ndarray):
            for it in range(start, stop):
                self.charge(self.G, loop)
                self.scalars[loop.var] = it
                self._block(loop.body, active)
            return
        start_a = np.broadcast_to(np.asarray(start), (self.G,))
        stop_a = np.broadcast_to(np.asarray(stop), (self.G,))
        live = np.ones(self.G, bool) if active is None else active
        if not live.any():
            return
        lo, hi = int(start_a[live].min()), int(stop_a[live].max())
        for it in range(lo, hi):
            self.charge(self.G, loop)
            inner = live & (start_a <= it) & (it < stop_a)
            if not inner.any():
                continue
            self.scalars[loop.var] = np.full(self.G, it, dtype=np.int64)
            self._block(loop.body, inner)

    # ------------------------------------------------------------------ statements
    def _allocate(self, stmt: ast.Allocate) -> None:
        if stmt.level is ast.Level.global_:
            raise self.error(stmt, "global tensors are allocated at program level, before the kernels")
        if stmt.shape is None or stmt.dtype is None:
            raise self.error(stmt, "Allocate needs a shape and a dtype in full TL")
        dims = tuple(self._static_int(e, stmt) for e in stmt.shape)
        if len(dims) not in (1, 2):
            raise self.error(stmt, "a shared or register tensor has 1 dim (a row vector) or 2 dims (a tile)")
        if min(dims) < 0:
            raise self.error(stmt, f"a negative shape {list(dims)}")
        elements = self.G * math.prod(dims)
        self._array_cap(elements, stmt, f"'{stmt.name}' {list(dims)} over {self.G} grid points")
        self.charge(elements, stmt)
        buf = _Buffer(stmt.name, stmt.level, stmt.dtype, dims, np.full((self.G, *dims), np.nan))
        if stmt.level is ast.Level.shared and (stmt.stages is not None or stmt.name in self.async_targets):
            stages = 1 if stmt.stages is None else self._static_int(stmt.stages, stmt)
            if stages < 1:
                raise self.error(stmt, f"'{stmt.name}' has {stages} stages")
            self._array_cap(2 * stages * elements, stmt, f"the {stages} stages of '{stmt.name}'")
            G, S = self.G, stages
            cols = (lambda: np.zeros((S, G, dims[1]), np.int64)) if len(dims) > 1 else (lambda: None)
            buf.ring = _Ring(stages=S, visible=np.full((S, G, *dims), np.nan), pending=np.full((S, G, *dims), np.nan),
                             vis_rows=np.zeros((S, G, dims[0]), np.int64), pend_rows=np.zeros((S, G, dims[0]), np.int64),
                             vis_cols=cols(), pend_cols=cols(),
                             acquired=np.zeros((G, S), np.int64), filled=np.zeros((G, S), np.int64),
                             waited=np.zeros((G, S), np.int64), released=np.zeros((G, S), np.int64),
                             current=np.full(G, -1, np.int64))
            self._ring_view(buf)
        self.locals[stmt.name] = buf

    def _write(self, buf: _Buffer, value: Any, active: np.ndarray | None, node: Any) -> None:
        value = np.asarray(value, dtype=np.float64)
        target_shape = (self.G, *buf.shape)
        self.charge(math.prod(target_shape), node)
        try:
            value = np.broadcast_to(value, target_shape)
        except ValueError:
            raise self.error(node, f"a value of shape {list(value.shape[1:])} does not fit '{buf.name}' of shape "
                                   f"{list(buf.shape)}") from None
        if active is None:
            buf.data = value.copy()
        else:
            buf.data = np.where(active.reshape((-1,) + (1,) * len(buf.shape)), value, buf.data)

    def _check_level(self, ref: ast.Ref, level: ast.Level, buf: _Buffer, node: Any) -> None:
        if buf.level is not level:
            raise self.error(node, f"'{ref.name}' lives in {buf.level.value} memory, not {level.value}")

    def _copy(self, stmt: ast.Copy, active: np.ndarray | None) -> None:
        if stmt.dst is None:
            raise self.error(stmt, "a Copy needs a destination in full TL (sketch form cannot run)")
        src, dst = self.buffer(stmt.src.name, stmt), self.buffer(stmt.dst.name, stmt)
        self._check_level(stmt.src, stmt.src_level, src, stmt)
        self._check_level(stmt.dst, stmt.dst_level, dst, stmt)
        n = self.n_active(active)
        if src.level is ast.Level.global_ and dst.level is ast.Level.global_:
            raise self.error(stmt, "a Copy from global to global")
        if stmt.scaled_to is not None and not (src.level is ast.Level.global_ and dst.level is ast.Level.shared):
            raise self.error(stmt, f"`as scaled {stmt.scaled_to.value}` converts only a load from global to shared")
        if stmt.is_async:
            if src.level is not ast.Level.global_ or dst.level is not ast.Level.shared:
                raise self.error(stmt, "an async copy loads from global into shared memory")
            self._async_copy(stmt, src, dst, active)
            return
        if src.level is ast.Level.global_:
            data, coords, _ = self._gather(src, stmt.src, dst, active, stmt)
            self._write(dst, data, active, stmt)
            dst.rows = coords[0]
            dst.cols = coords[1] if len(coords) > 1 else None
            dst.is_accumulator = False
            elems = math.prod(dst.shape)
            self.counter.add_bytes("global_read", elems * src.dtype.itemsize * n)
            if n:
                self.counter.globals_read.add(src.name)
            if dst.level is ast.Level.shared:
                self.counter.add_bytes("shared_write", elems * dst.dtype.itemsize * n)
            return
        if dst.level is ast.Level.global_:
            if dst.name in INPUT_NAMES:
                raise self.error(stmt, f"'{dst.name}' is an input; it cannot be written")
            self._scatter(src, dst, stmt.dst, active, stmt)
            elems = math.prod(src.shape)
            self.counter.add_bytes("global_write", elems * dst.dtype.itemsize * n)
            if n:
                self.counter.globals_written.add(dst.name)
            if src.level is ast.Level.shared:
                self.counter.add_bytes("shared_read", elems * src.dtype.itemsize * n)
            return
        if stmt.src.index is not None or stmt.dst.index is not None:
            raise self.error(stmt, "only the global side of a Copy is indexed")
        if src.shape != dst.shape:
            raise self.error(stmt, f"Copy of shape {list(src.shape)} into {list(dst.shape)}")
        self._write(dst, src.data, active, stmt)
        dst.rows, dst.cols, dst.is_accumulator = src.rows, src.cols, src.is_accumulator
        elems = math.prod(src.shape)
        if src.level is ast.Level.shared:
            self.counter.add_bytes("shared_read", elems * src.dtype.itemsize * n)
        if dst.level is ast.Level.shared:
            self.counter.add_bytes("shared_write", elems * dst.dtype.itemsize * n)

    def _global_index(self, glob: _Buffer, ref: ast.Ref, local: _Buffer, active: np.ndarray | None, node: Any):
        """Per-dim index arrays broadcastable to (G, *local.shape), the tile coordinates, the in-bounds mask."""
        if ref.index is None:
            raise self.error(node, f"the global side '{ref.name}' needs an index, e.g. {ref.name}[b, h, r0 : r0 + "
                                   f"BLOCK_M, 0 : D]")
        if len(ref.index) != len(glob.shape):
            raise self.error(node, f"'{ref.name}' has {len(glob.shape)} dims; the index gives {len(ref.index)}")
        slices = [i for i in ref.index if isinstance(i, ast.Slice)]
        if len(slices) != len(local.shape):
            raise self.error(node, f"the index of '{ref.name}' selects a {len(slices)}-dim tile but "
                                   f"'{local.name}' has {len(local.shape)} dims")
        nd = len(local.shape)
        idx, coords = [], []
        valid = np.ones((self.G,) + (1,) * nd, bool)
        k = 0
        for dim, item in enumerate(ref.index):
            size = glob.shape[dim]
            if isinstance(item, ast.Point):
                p = self._index_values(self.eval(item.index, 0, node), item, active)
                p = np.broadcast_to(np.asarray(p, dtype=np.int64), (self.G,))
                live = p if active is None else p[active]
                if live.size and (live.min() < 0 or live.max() >= size):
                    bad = int(live.min() if live.min() < 0 else live.max())
                    raise self.error(item, f"index {bad} is out of range for dim {dim} of '{ref.name}' (size {size})")
                idx.append(np.clip(p, 0, size - 1).reshape((-1,) + (1,) * nd))
            else:
                start = self._index_values(self.eval(item.start, 0, node), item, active)
                stop = self._index_values(self.eval(item.stop, 0, node), item, active)
                extent = np.unique(np.broadcast_to(np.asarray(stop) - np.asarray(start), (self.G,))
                                   [active if active is not None else slice(None)])
                if extent.size > 1 or (extent.size == 1 and int(extent[0]) != local.shape[k]):
                    got = ", ".join(str(int(e)) for e in extent[:3])
                    raise self.error(item, f"slice {k} of '{ref.name}' spans {got} elements but '{local.name}' has "
                                           f"{local.shape[k]} along that dim")
                start_a = np.broadcast_to(np.asarray(start, dtype=np.int64), (self.G,))
                pos = start_a[:, None] + np.arange(local.shape[k])[None, :]
                coords.append(pos)
                shape = [self.G] + [1] * nd
                shape[1 + k] = local.shape[k]
                pos_b = pos.reshape(shape)
                valid = valid & (pos_b >= 0) & (pos_b < size)
                idx.append(np.clip(pos_b, 0, size - 1))
                k += 1
        return idx, coords, valid

    def _gather(self, glob: _Buffer, ref: ast.Ref, local: _Buffer, active: np.ndarray | None, node: Any):
        idx, coords, valid = self._global_index(glob, ref, local, active, node)
        data = glob.data[tuple(idx)]
        data = np.where(valid, data, 0.0)
        return np.broadcast_to(data, (self.G, *local.shape)), coords, valid

    def _scatter(self, local: _Buffer, glob: _Buffer, ref: ast.Ref, active: np.ndarray | None, node: Any) -> None:
        idx, _, valid = self._global_index(glob, ref, local, active, node)
        full = (self.G, *local.shape)
        mask = np.broadcast_to(valid, full)
        if active is not None:
            mask = mask & active.reshape((-1,) + (1,) * len(local.shape))
        where = tuple(np.broadcast_to(i, full)[mask] for i in idx)
        glob.data[where] = local.data[mask]

    def _gemm(self, stmt: ast.ComputeGemm, active: np.ndarray | None) -> None:
        a_buf, b_buf = self.buffer(stmt.a.name, stmt), self.buffer(stmt.b.name, stmt)
        c_buf = self.buffer(stmt.out, stmt)
        for ref, buf in ((stmt.a, a_buf), (stmt.b, b_buf)):
            if ref.index is not None:
                raise self.error(stmt, "GEMM operands are whole shared or register tiles (no index)")
            if buf.level is ast.Level.global_:
                raise self.error(stmt, f"GEMM operand '{ref.name}' is in global memory; Copy it to shared first")
            if len(buf.shape) != 2:
                raise self.error(stmt, f"GEMM operand '{ref.name}' is not a 2-dim tile")
        if stmt.a.transposed:
            raise self.error(stmt, "the A operand of a GEMM cannot be transposed")
        if c_buf.level is not ast.Level.register or len(c_buf.shape) != 2:
            raise self.error(stmt, f"GEMM result '{stmt.out}' must be a 2-dim register tile")
        a = a_buf.data
        b = np.swapaxes(b_buf.data, 1, 2) if stmt.b.transposed else b_buf.data
        m, k = a_buf.shape
        kb, n = (b_buf.shape[1], b_buf.shape[0]) if stmt.b.transposed else b_buf.shape
        if k != kb or c_buf.shape != (m, n):
            raise self.error(stmt, f"GEMM shapes do not match: [{m}, {k}] @ [{kb}, {n}] -> {list(c_buf.shape)}")
        self.charge(float(self.G) * m * n * k, stmt)
        product = np.matmul(a, b)
        self._write(c_buf, c_buf.data + product if stmt.accumulate else product, active, stmt)
        if not stmt.accumulate or c_buf.rows is None:
            c_buf.rows = a_buf.rows
            c_buf.cols = b_buf.rows if stmt.b.transposed else b_buf.cols
        c_buf.is_accumulator = True
        cnt = self.n_active(active)
        self.counter.mma += 2.0 * m * n * k * cnt
        for buf in (a_buf, b_buf):
            if buf.level is ast.Level.shared:
                self.counter.add_bytes("shared_read", math.prod(buf.shape) * buf.dtype.itemsize * cnt)

    def _online_softmax(self, stmt: ast.ComputeOnlineSoftmax, active: np.ndarray | None) -> None:
        if stmt.rescale is None:
            raise self.error(stmt, "OnlineSoftmax needs `and rescale O` in full TL")
        s, m, l, o = (self.buffer(n, stmt) for n in (stmt.scores, stmt.max, stmt.sum, stmt.rescale))
        if len(s.shape) != 2 or m.shape != (s.shape[0],) or l.shape != m.shape or len(o.shape) != 2 \
                or o.shape[0] != s.shape[0]:
            raise self.error(stmt, "OnlineSoftmax wants S [r, c], max and sum [r], and the accumulator [r, d]")
        m_new = np.maximum(m.data, s.data.max(axis=2))
        m_use = np.where(m_new == -np.inf, 0.0, m_new)
        alpha = np.exp2(m.data - m_use)
        p = np.exp2(s.data - m_use[:, :, None])
        self._write(s, p, active, stmt)
        self._write(l, l.data * alpha + p.sum(axis=2), active, stmt)
        self._write(o, o.data * alpha[:, :, None], active, stmt)
        self._write(m, m_new, active, stmt)
        cnt = self.n_active(active)
        r, c = s.shape
        self.counter.vector += (3.0 * r * c + 4.0 * r + r * o.shape[1]) * cnt
        self.counter.sfu += (r * c + r) * cnt

    def _assign(self, stmt: ast.ComputeAssign, active: np.ndarray | None) -> None:
        buf = self.buffer(stmt.target, stmt)
        if buf.level is ast.Level.global_:
            raise self.error(stmt, f"'{stmt.target}' is in global memory; Compute works on shared or register tiles")
        rank = len(buf.shape)
        rows, cols = buf.rows, buf.cols
        for name in ast.expr_names(stmt.expr):
            other = self.locals.get(name)
            if other is None:
                continue
            if rows is None and other.rows is not None and other.shape[0] == buf.shape[0]:
                rows = other.rows
            if cols is None and rank == 2 and len(other.shape) == 2 and other.cols is not None \
                    and other.shape[1] == buf.shape[1]:
                cols = other.cols
        self.charge(float(self.G) * math.prod(buf.shape) * sum(1 for _ in ast.walk_expr(stmt.expr)), stmt)
        with np.errstate(all="ignore"):
            value = self.eval(stmt.expr, rank, stmt, (rows, cols))
        value = np.asarray(value, dtype=np.float64)
        if value.ndim > rank + 1:
            raise self.error(stmt, f"the value has more dims than '{stmt.target}' {list(buf.shape)}")
        self._write(buf, value if value.ndim == 0 else value.reshape(value.shape), active, stmt)
        buf.rows, buf.cols = rows, cols
        cnt = self.n_active(active)
        elems = math.prod(buf.shape)
        ops = sfu = 0.0
        for node in ast.walk_expr(stmt.expr):
            if isinstance(node, (ast.Binary, ast.Unary)):
                ops += 1
            elif isinstance(node, ast.Call):
                if node.func in ast.SFU_FUNCTIONS:
                    # a call on the key position and block constants alone (cos(k_idx)) is one value a column of
                    # the tile: the least work computes it once a column, as the translators do (ScoreMod.key_terms)
                    sfu += 1.0 / buf.shape[0] if rank == 2 and self._key_only(node) else 1.0
                else:
                    ops += 1
        self.counter.vector += ops * elems * cnt
        self.counter.sfu += sfu * elems * cnt

    def _key_only(self, call: ast.Call) -> bool:
        """Whether a call reads k_idx and nothing that varies along a tile's rows: no q_idx, no tile, no tensor."""
        names = {n.id for n in ast.walk_expr(call) if isinstance(n, ast.Name)}
        return "k_idx" in names and not names & ({"q_idx"} | set(self.locals)) and not ast.tensors_read(call)

    def _reshape(self, stmt: ast.Reshape, active: np.ndarray | None) -> None:
        src, dst = self.buffer(stmt.src, stmt), self.buffer(stmt.dst, stmt)
        if src.level is not ast.Level.register or dst.level is not ast.Level.register:
            raise self.error(stmt, "Reshape works on register tiles")
        if src.shape != dst.shape:
            raise self.error(stmt, f"Reshape of {list(src.shape)} into {list(dst.shape)}")
        self._write(dst, src.data, active, stmt)
        dst.rows, dst.cols, dst.is_accumulator = src.rows, src.cols, False


# what each operator and elementwise function does to tiles: flashgen.operators' numpy column
BINARY_OPS = {op.symbol: op.array for op in operators.BINARY.values()}
UNARY_OPS = {op.symbol: op.array for op in operators.UNARY.values()}
FUNCTIONS = {f.name: f.array for f in operators.FUNCTIONS.values() if f.array is not None}


def _runnable(program: ast.Program) -> None:
    if program.target is None or program.variant is None:
        raise UsageError(f"{program.filename}: a sketch cannot run; it needs the Target, Variant and Params header, "
                         f"allocations and indexed copies (full TL)")
    if not program.kernels:
        raise UsageError(f"{program.filename}: the program has no Kernel")


def interpret(program: ast.Program, shape: Shape, seed: int = 0, inputs: dict[str, np.ndarray] | None = None,
              scale: float | None = None) -> InterpretResult:
    """Run a full TL program on random (seeded) or given inputs Q, K, V; returns O (and LSE where declared).
    `inputs` may also hold the call-time tensors by name (each `Tensor` line's; else filled by its rule from `seed`)
    and, for an ALiBi program, `alibi_slopes` (H) or (B, H) (else the standard slopes); the result's `inputs` has
    every value the run read."""
    _runnable(program)
    assert program.target is not None
    if deep := ast.nesting_problem(program):
        raise TLRuntimeError(f"{_where(deep[0], program)}: {deep[1]}")
    if shape.D != program.target.head_dim:
        raise UsageError(f"{program.filename}: the program is written for head_dim {program.target.head_dim}, "
                         f"the shape has D={shape.D}")
    if shape.dv != program.target.dv:
        raise UsageError(f"{program.filename}: the program is written for V head dim {program.target.dv}"
                         f"{'' if program.target.head_dim_v is not None else ' (its head_dim: no head_dim_v)'}, the "
                         f"shape has {'DV' if shape.DV is not None else 'D'}={shape.dv}")
    inputs = dict(inputs or {})
    if not all(name in inputs for name in INPUT_NAMES):
        q, k, v = random_inputs(shape, seed)
        inputs = {"Q": q, "K": k, "V": v, **inputs}
    scale = default_scale(shape.D) if scale is None else scale
    run = _Run(program, shape, inputs, scale, seed)
    with np.errstate(all="ignore"):
        for kernel in program.kernels:
            run.run_kernel(kernel)
    c = run.counter
    counts = OpCounts(mma_flops=c.mma, vector_flops=c.vector, sfu_ops=c.sfu,
                      bytes={**c.bytes, **c.compulsory_dram_bytes(run.globals)})
    outputs = {name: run.globals[name].data for name in OUTPUT_NAMES if name in run.globals}
    return InterpretResult(outputs=outputs, counts=counts, inputs={**inputs, **run.tensors}, scale=scale)


def _errors(out: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """(max abs error, squared error sum, squared reference sum); -inf in ref must be matched exactly."""
    out = np.asarray(out, dtype=np.float64)
    ref_inf = np.isinf(ref)
    if np.any(ref_inf & (out != ref)) or np.any(~ref_inf & ~np.isfinite(out)):
        return math.inf, math.inf, float(np.sum(ref[~ref_inf] ** 2))
    diff = out[~ref_inf] - ref[~ref_inf]
    return (float(np.max(np.abs(diff))) if diff.size else 0.0, float(np.sum(diff ** 2)),
            float(np.sum(ref[~ref_inf] ** 2)))


def compare(program: ast.Program, shape: Shape, seed: int = 0, alibi_slopes: np.ndarray | None = None) -> CompareResult:
    """Run `program` and compare O (and LSE) with the fp64 reference of its declared variant; an ALiBi program with
    the caller's `alibi_slopes` ((H) or (B, H); None: the standard slopes)."""
    result = interpret(program, shape, seed, inputs=None if alibi_slopes is None else {ast.ALIBI_SLOPES: alibi_slopes})
    assert program.variant is not None
    q, k, v = (result.inputs[n] for n in INPUT_NAMES)
    ref_o, ref_lse = attention(q, k, v, program.variant, result.scale, alibi_slopes=alibi_slopes)
    if "O" not in result.outputs:
        raise UsageError(f"{program.filename}: the program declares no global output O")
    pairs = [(result.outputs["O"], ref_o)]
    if program.variant.return_lse:
        if "LSE" not in result.outputs:
            raise UsageError(f"{program.filename}: the variant returns LSE but the program declares no global LSE")
        pairs.append((result.outputs["LSE"], ref_lse))
    max_abs, err_sq, ref_sq = 0.0, 0.0, 0.0
    for out, ref in pairs:
        a, e, r = _errors(out, ref)
        max_abs, err_sq, ref_sq = max(max_abs, a), err_sq + e, ref_sq + r
    rel = math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else (0.0 if err_sq == 0 else math.inf)
    return CompareResult(variant=program.variant.name, shape=shape, seed=seed, max_abs_err=max_abs, rel_err=rel,
                         counts=result.counts)
