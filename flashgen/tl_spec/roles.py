"""The checker's rules for the Hopper dataflow (docs/llm-tl.md, "Hopper dataflow"): Role blocks, staged shared
buffers, asynchronous copies and the Acquire / Wait / Release handshakes.

The rules are static and per iteration: the body of the innermost sequential loop a statement sits in (or the role's
own body) is one *step*. In the producer, every async copy into a stage follows an `Acquire` of that stage in the same
step; in the consumer, every read of an asynchronously loaded buffer follows its `Wait` (in the same step for a
staged buffer, anywhere before for one loaded once), no read follows the `Release`, and every `Wait` of a staged
buffer has its `Release` later in the same step. Both roles walk the same stages of each staged buffer: the same
loop bounds and the same stage expression. What the arch implements (stages, the producer's warps) comes from
flashgen.targets.role_dataflow, the one place those facts live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from flashgen.targets import ROLE_DATAFLOW, role_dataflow
from flashgen.tl_spec import ast
from flashgen.tl_spec.printer import format_expr
from flashgen.tl_spec.symbols import Ctx, Sym


class CheckerHost(Protocol):
    """What the rules use of the checker that runs them (flashgen.tl_spec.checker)."""

    p: ast.Program
    target: Any

    def err(self, node: Any, message: str, hint: str | None = None, severity: str = "error") -> None: ...
    def probe(self, expr: Any, which: int, node: Any, index_names: bool = False) -> Any: ...
    def names_in(self, expr: Any, node: Any, allow_index: bool = False, allow_tensors: bool = True) -> None: ...
    def tensor(self, name: str, node: Any) -> Sym | None: ...

_RENAMED = "__step"


def _renamed(expr: Any, var: str | None) -> str:
    """The expression's text with the loop variable `var` written as one common name (to compare two roles' stages)."""
    if expr is None:
        return ""
    return format_expr(expr if var is None else ast.substitute(expr, {var: ast.Name(id=_RENAMED)}))


def _text(expr: Any) -> str:
    return format_expr(expr) if expr is not None else ""


@dataclass
class _WaitRec:
    node: ast.Wait
    stage: str
    released: ast.Release | None = None


@dataclass
class _Step:
    """One iteration's handshakes: the body of a sequential loop inside a role, or the role's own body."""

    loop: ast.ForLoop | None
    acquired: list[list[Any]] = field(default_factory=list)  # [buffer, stage text, node, used]
    waits: dict[str, _WaitRec] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)


@dataclass
class _Walk:
    """Where a role touches a staged buffer: the loops around the statement (innermost last) and its stage."""

    node: Any
    loops: list[ast.ForLoop]
    stage: Any


class RoleRules:
    def __init__(self, checker: CheckerHost):
        self.c = checker
        p = checker.p
        self.program_has_roles = ast.role_program(p)
        self.arch = p.target.arch if p.target else ""
        self.flow = role_dataflow(self.arch)
        self.async_targets = {s.dst.name for s in p.statements() if isinstance(s, ast.Copy) and s.is_async and s.dst}
        self.role: ast.Role | None = None
        self.steps: list[_Step] = []
        self.loops: list[ast.ForLoop] = []  # sequential loops inside the current role
        self.warps: dict[str, int] = {}
        self.fills: dict[str, list[_Walk]] = {}  # staged buffer -> the producer's copies into it
        self.consumer_waits: dict[str, list[_Walk]] = {}
        self.loop_probes: dict[int, tuple[Any, ...]] = {}
        self.reported_arch = False
        self.stages: dict[str, int] = {}
        self.threads_checked = False
        self.unwaited_reads: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def err(self, node: Any, message: str, hint: str | None = None) -> None:
        self.c.err(node, message, hint)

    def need_arch(self, node: Any) -> None:
        """Roles, stages, async copies and handshakes exist only where the arch has a Hopper dataflow."""
        if self.flow is None and not self.reported_arch:
            self.reported_arch = True
            self.err(node, f"the Hopper dataflow (Role blocks, staged buffers, async copies, Acquire/Wait/Release) "
                           f"needs Target {' or '.join(ROLE_DATAFLOW)}; this program is for {self.arch}",
                     "write the plain form: synchronous Copy lines, no Role blocks, no stages")

    def static_int(self, expr: Any, node: Any, what: str) -> int | None:
        self.c.names_in(expr, node, allow_tensors=False)
        a, b = self.c.probe(expr, 0, node), self.c.probe(expr, 1, node)
        if a is None or a != b or float(a) != int(a):
            self.err(expr, f"{what} '{format_expr(expr)}' is not a constant (use params and numbers)")
            return None
        return int(a)

    # ------------------------------------------------------------------ allocations
    def allocate(self, stmt: ast.Allocate, sym: Sym) -> None:
        if stmt.stages is None:
            return
        self.need_arch(stmt)
        if stmt.level is not ast.Level.shared:
            self.err(stmt.stages, f"'{stmt.name}' is a {stmt.level.value} tensor; only shared buffers have stages",
                     "Allocate K_s in shared shape [BLOCK_N, D] dtype bf16 stages STAGES")
            return
        n = self.static_int(stmt.stages, stmt, "the stage count")
        if n is None:
            return
        if n < 1:
            self.err(stmt.stages, f"'{stmt.name}' has {n} stages; a ring has at least 1")
        elif self.flow is not None and n > self.flow.max_stages:
            self.err(stmt.stages, f"'{stmt.name}' has {n} stages; the {self.arch} warp-specialized kernel implements at "
                                  f"most {self.flow.max_stages}", "lower STAGES")
        sym.stages = n
        self.stages[stmt.name] = n

    # ------------------------------------------------------------------ structure
    def block_structure(self, stmts: list[Any], ctx: Ctx) -> None:
        """A statement list holding Role blocks: exactly one producer and one consumer, at the innermost parallel
        level, after only Let and shared Allocate lines, with nothing after them."""
        roles = [s for s in stmts if isinstance(s, ast.Role)]
        if not roles:
            return
        if self.role is not None or ctx.seq_depth > 0:
            self.err(roles[0], "a Role block inside a loop or another role",
                     "the two roles sit side by side inside the innermost parallel loop")
            return
        for kind in ("producer", "consumer"):
            same = [r for r in roles if r.role == kind]
            if len(same) > 1:
                self.err(same[1], f"a second {kind} role", "a block has one producer and one consumer role")
            if not same:
                other = roles[0]
                self.err(other, f"a {other.role} role without a {kind} role",
                         "the producer loads the tiles and the consumer computes on them: write both")
        first = stmts.index(roles[0])
        last = max(stmts.index(r) for r in roles)
        for s in stmts[:first]:
            if isinstance(s, ast.Allocate) and s.level is ast.Level.register:
                self.err(s, f"register tensor '{s.name}' outside the roles: registers belong to the role whose warps "
                            f"hold them", "allocate it inside the Role that uses it")
            elif not isinstance(s, (ast.Comment, ast.Let, ast.Allocate)):
                self.err(s, "before the Role blocks only Let and shared Allocate lines: the work runs in a role",
                         "move it into the producer (loads) or the consumer (everything else)")
        for s in stmts[first:last + 1]:
            if not isinstance(s, (ast.Comment, ast.Role)):
                self.err(s, "a statement between the Role blocks", "move it into one of the roles")
        for s in stmts[last + 1:]:
            if not isinstance(s, ast.Comment):
                self.err(s, "a statement after the Role blocks: the block's work runs in its roles",
                         "move it into the consumer role (the epilogue and the stores are the consumer's)")
                break

    def enter_role(self, role: ast.Role) -> None:
        self.need_arch(role)
        self.role = role
        self.steps = [_Step(loop=None)]
        self.loops = []
        if role.warps is None:
            self.err(role, f"Role {role.role} needs its warps in a full program",
                     "Role producer warps 4  /  Role consumer warps WARPS")
            return
        warps = self.static_int(role.warps, role, "the role's warps")
        if warps is None:
            return
        if warps < 1 or warps % 4:
            self.err(role.warps, f"Role {role.role} warps {warps}: a role runs whole warpgroups (a multiple of 4 warps)",
                     "Role producer warps 4; Role consumer warps BLOCK_M / 16 (4 per 64 query rows)")
        elif role.role == "producer" and self.flow is not None and warps != self.flow.producer_warps:
            self.err(role.warps, f"Role producer warps {warps}: the {self.arch} producer is one warpgroup "
                                 f"({self.flow.producer_warps} warps; one thread issues the copies)",
                     f"Role producer warps {self.flow.producer_warps}")
        self.warps[role.role] = warps

    def exit_role(self, role: ast.Role) -> None:
        self.close_step(self.steps.pop() if self.steps else _Step(loop=None))
        self.role = None
        self.steps = []
        self.loops = []
        if len(self.warps) == 2 and not self.threads_checked:
            self.threads_checked = True
            target = self.c.target
            threads = 32 * sum(self.warps.values())
            if target is not None and threads > target.max_threads_per_block:
                self.err(role, f"the roles' {sum(self.warps.values())} warps are {threads} threads; {target.name} "
                               f"allows {target.max_threads_per_block} per block")

    def consumer_warps(self) -> int | None:
        return self.warps.get("consumer")

    # ------------------------------------------------------------------ loops: one step per iteration
    def enter_loop(self, loop: ast.ForLoop) -> None:
        if self.role is None or loop.parallel:
            return
        self.loops.append(loop)
        self.steps.append(_Step(loop=loop))

    def exit_loop(self, loop: ast.ForLoop) -> None:
        if self.role is None or loop.parallel or not self.loops or self.loops[-1] is not loop:
            return
        self.loops.pop()
        self.close_step(self.steps.pop())

    def remember_bounds(self, loop: ast.ForLoop, values: tuple[Any, ...]) -> None:
        self.loop_probes[id(loop)] = values

    def close_step(self, step: _Step) -> None:
        for buffer, stage, node, used in step.acquired:
            if not used:
                self.err(node, f"Acquire {buffer} stage {stage} is not followed by a copy into that stage in this "
                               f"step: the consumer would wait forever for it",
                         f"Copy ... from global to shared {buffer} stage {stage} async")
        for buffer, rec in step.waits.items():
            if self.stages.get(buffer) and rec.released is None:
                self.err(rec.node, f"Wait {buffer} stage {rec.stage} has no Release {buffer} stage {rec.stage} after "
                                   f"it in this step: the producer would wait forever to refill that stage",
                         f"Release {buffer} stage {rec.stage} after the last read of {buffer}")

    # ------------------------------------------------------------------ statements
    def sync(self, stmt: Any, ctx: Ctx) -> None:
        self.need_arch(stmt)
        kind = type(stmt).__name__
        if self.role is None:
            self.err(stmt, f"{kind} outside a Role block", "Acquire belongs to the producer, Wait and Release to the "
                                                          "consumer")
            return
        sym = self.c.tensor(stmt.buffer, stmt)
        if sym is None:
            return
        if stmt.stage is not None:
            self.c.names_in(stmt.stage, stmt, allow_tensors=False)
        stages = getattr(sym, "stages", None)
        text = _text(stmt.stage)
        if isinstance(stmt, ast.Acquire):
            if self.role.role != "producer":
                self.err(stmt, f"Acquire {stmt.buffer} in the consumer: the producer acquires a stage before it "
                               f"loads it", f"the consumer waits for the stage (Wait {stmt.buffer} ...) and releases it")
                return
            if not stages:
                self.err(stmt, f"Acquire of '{stmt.buffer}', which has no stages",
                         f"Allocate {stmt.buffer} ... stages STAGES, or load it once without Acquire")
                return
            if stmt.stage is None:
                self.err(stmt, f"Acquire {stmt.buffer} without a stage", f"Acquire {stmt.buffer} stage n_blk")
                return
            self.steps[-1].acquired.append([stmt.buffer, text, stmt, False])
            return
        if self.role.role != "consumer":
            self.err(stmt, f"{kind} {stmt.buffer} in the producer: the consumer waits for a stage and releases it",
                     f"the producer acquires stages (Acquire {stmt.buffer} stage ...) before loading them")
            return
        if stmt.buffer not in self.async_targets:
            self.err(stmt, f"{kind} {stmt.buffer}: no async copy fills '{stmt.buffer}'",
                     "the producer fills it: Copy ... from global to shared " + stmt.buffer + " ... async")
            return
        if stages and stmt.stage is None:
            self.err(stmt, f"{kind} {stmt.buffer} without a stage: '{stmt.buffer}' has {stages} stages",
                     f"{kind} {stmt.buffer} stage n_blk")
            return
        if not stages and stmt.stage is not None:
            self.err(stmt.stage, f"'{stmt.buffer}' has no stages; it is loaded once",
                     f"{kind} {stmt.buffer}" if isinstance(stmt, ast.Wait) else "drop the Release")
            return
        step = self.steps[-1]
        if isinstance(stmt, ast.Wait):
            old = step.waits.get(stmt.buffer)
            if old is not None and old.released is None:
                self.err(stmt, f"a second Wait {stmt.buffer} in one step (line {old.node.loc.line if old.node.loc else '?'}"
                               f" waited already)", f"Release {stmt.buffer} stage {old.stage} first")
                return
            step.waits[stmt.buffer] = _WaitRec(node=stmt, stage=text)
            sym.written = True  # the consumer sees the landed tile from here
            if stages:
                self.consumer_waits.setdefault(stmt.buffer, []).append(_Walk(stmt, list(self.loops), stmt.stage))
            return
        if not stages:
            self.err(stmt, f"Release of '{stmt.buffer}', which has no stages: it is loaded once and kept",
                     "drop the Release")
            return
        rec = step.waits.get(stmt.buffer)
        if rec is None and f"unwaited:{stmt.buffer}" in step.reported:
            return  # the read before its Wait is the error
        if rec is None or rec.released is not None:
            self.err(stmt, f"Release {stmt.buffer} stage {text} without a Wait {stmt.buffer} stage {text} before it in "
                           f"this step", f"Wait {stmt.buffer} stage {text} before the first read, Release after the last")
            return
        if rec.stage != text:
            self.err(stmt, f"Release {stmt.buffer} stage {text} after Wait {stmt.buffer} stage {rec.stage}: a step "
                           f"releases the stage it waited for", f"Release {stmt.buffer} stage {rec.stage}")
        rec.released = stmt

    def statement_allowed(self, stmt: Any) -> bool:
        """Whether `stmt` may appear in the current role (reports it otherwise)."""
        if self.role is None:
            return True
        if self.role.role == "producer":
            if isinstance(stmt, (ast.Comment, ast.Let, ast.ForLoop, ast.Acquire, ast.Copy)):
                return True
            if isinstance(stmt, (ast.Wait, ast.Release)):
                return True  # sync() explains
            what = {ast.Allocate: "an Allocate"}.get(type(stmt), f"`{type(stmt).__name__}`")
            if isinstance(stmt, (ast.ComputeGemm, ast.ComputeAssign, ast.ComputeOnlineSoftmax, ast.Reshape)):
                what = "a Compute" if not isinstance(stmt, ast.Reshape) else "a Reshape"
            self.err(stmt, f"{what} in the producer role: the producer only loads tiles (Acquire, then Copy ... "
                           f"async)", "compute in the consumer role; shared buffers are allocated before the roles")
            return False
        return True

    def copy(self, stmt: ast.Copy, src: Sym, dst: Sym, ctx: Ctx) -> None:
        """Async copies, stages and who may fill a staged or asynchronously loaded buffer."""
        stages = getattr(dst, "stages", None)
        if stmt.is_async or stmt.stage is not None:
            self.need_arch(stmt)
        producer = self.role is not None and self.role.role == "producer"
        if self.role is not None and self.role.role == "producer" and not stmt.is_async:
            self.err(stmt, "a copy in the producer role is asynchronous (a TMA load)", "end the line with `async`")
        if stmt.is_async and not producer:
            self.err(stmt, "an async copy outside the producer role",
                     "the producer loads (Acquire, Copy ... async); the consumer waits for the tile and reads it")
            return
        if not stmt.is_async and (stages or dst.name in self.async_targets) and not producer:
            self.err(stmt, f"copies into {'staged ' if stages else ''}buffer '{dst.name}' outside the producer role",
                     "the producer fills it (Copy ... async); the consumer only reads it after Wait")
            return
        if not stmt.is_async:
            if stmt.stage is not None:
                self.err(stmt.stage, "`stage` names the stage an async copy fills", "end the line with `async`")
            return
        if src.level is not ast.Level.global_ or dst.level is not ast.Level.shared:
            self.err(stmt, "an async copy loads a tile from global into shared memory",
                     "Copy K[...] from global to shared K_s stage n_blk async")
            return
        if stmt.scaled_to is not None:
            self.err(stmt, "an async copy does not convert (`as scaled fp16` is for sm_75)", "drop `as scaled ...`")
        if stmt.stage is not None:
            self.c.names_in(stmt.stage, stmt, allow_tensors=False)
        if stages:
            if stmt.stage is None:
                self.err(stmt, f"'{dst.name}' has {stages} stages: the copy names the one it fills",
                         f"Copy ... to shared {dst.name} stage n_blk async")
                return
            text = _text(stmt.stage)
            step = self.steps[-1] if self.steps else None
            grant = next((a for a in (step.acquired if step else []) if a[0] == dst.name and a[1] == text and not a[3]),
                         None)
            if grant is None:
                self.err(stmt, f"overwrites {dst.name} stage {text} before it is released: no Acquire {dst.name} "
                               f"stage {text} before this copy in this step",
                         f"Acquire {dst.name} stage {text}, then the copy")
            else:
                grant[3] = True
            self.fills.setdefault(dst.name, []).append(_Walk(stmt, list(self.loops), stmt.stage))
            return
        if stmt.stage is not None:
            self.err(stmt.stage, f"'{dst.name}' has no stages", f"Allocate {dst.name} ... stages STAGES, or drop "
                                                                f"`stage ...`")
        elif self.loops:
            self.err(stmt, f"'{dst.name}' is loaded inside a loop but has no stages: a later copy would overwrite the "
                           f"tile the consumer is reading", f"Allocate {dst.name} ... stages STAGES and Acquire each "
                                                            f"stage")

    # ------------------------------------------------------------------ reads and writes
    def read(self, sym: Sym, node: Any) -> None:
        if sym.kind != "tensor" or sym.name not in self.async_targets or self.role is None:
            return
        if self.role.role != "consumer":
            return
        staged = bool(getattr(sym, "stages", None))
        for depth in range(len(self.steps) - 1, -1, -1):
            rec = self.steps[depth].waits.get(sym.name)
            if rec is None:
                if staged:
                    break  # a staged buffer is awaited in the step that reads it
                continue
            if rec.released is not None:
                key = f"released:{sym.name}"
                if key not in self.steps[-1].reported:
                    self.steps[-1].reported.add(key)
                    line = rec.released.loc.line if rec.released.loc else "?"
                    self.err(node, f"reads {sym.name} after Release {sym.name} stage {rec.stage} (line {line}): the "
                                   f"producer may already be refilling that stage",
                             f"move Release {sym.name} stage {rec.stage} after the last read")
            return
        key = f"unwaited:{sym.name}"
        if key in self.steps[-1].reported:
            return
        self.steps[-1].reported.add(key)
        self.unwaited_reads.add(sym.name)
        stage = self.expected_stage(sym.name)
        self.err(node, f"reads {sym.name}{f' stage {stage}' if stage else ''} before its copy is awaited",
                 f"Wait {sym.name}{f' stage {stage}' if stage else ''} before the first read"
                 + (" in the same step" if staged else ""))

    def expected_stage(self, buffer: str) -> str:
        """The stage a consumer step would wait for: the producer's stage expression, in the consumer's loop var."""
        fills = self.fills.get(buffer)
        if not fills or fills[0].stage is None:
            return ""
        var = fills[0].loops[-1].var if fills[0].loops else None
        text = _renamed(fills[0].stage, var)
        return text.replace(_RENAMED, self.loops[-1].var if self.loops else (var or _RENAMED))

    # ------------------------------------------------------------------ both roles
    def finish(self) -> None:
        """Both roles walk the same stages of each staged buffer."""
        for buffer in self.stages:
            fills, waits = self.fills.get(buffer, []), self.consumer_waits.get(buffer, [])
            if fills and not waits:
                if buffer in self.unwaited_reads:
                    continue  # the read before its Wait is the error
                self.err(fills[0].node, f"the consumer never waits for {buffer} (nor releases its stages): the "
                                        f"producer would wait forever for a free stage",
                         f"Wait {buffer} stage ... before reading it in the consumer, Release after")
                continue
            if waits and not fills:
                self.err(waits[0].node, f"no async copy of the producer fills {buffer}",
                         f"Copy ... from global to shared {buffer} stage ... async, after Acquire {buffer} stage ...")
                continue
            if not fills:
                continue
            if len(fills) > 1 or len(waits) > 1:
                extra = fills[1] if len(fills) > 1 else waits[1]
                self.err(extra.node, f"{buffer} is filled or awaited at two places: each role touches a staged buffer "
                                     f"once per step of its key loop")
                continue
            self.same_walk(buffer, fills[0], waits[0])

    def same_walk(self, buffer: str, fill: _Walk, wait: _Walk) -> None:
        def describe(walk: _Walk, role: str) -> str:
            loop = walk.loops[-1] if walk.loops else None
            where = f"for {loop.var} in range({_text(loop.start)}, {_text(loop.stop)})" if loop else "outside a loop"
            line = walk.node.loc.line if walk.node.loc else "?"
            return f"the {role} {'fills' if role == 'producer' else 'waits for'} stage {_text(walk.stage)} {where} " \
                   f"(line {line})"

        same = len(fill.loops) == len(wait.loops)
        if same:
            for a, b in zip(fill.loops, wait.loops, strict=True):
                pa, pb = self.loop_probes.get(id(a)), self.loop_probes.get(id(b))
                if pa is None or pb is None or None in pa or None in pb:
                    same = same and _text(a.start) == _text(b.start) and _text(a.stop) == _text(b.stop)
                else:
                    same = same and pa == pb
            var_a = fill.loops[-1].var if fill.loops else None
            var_b = wait.loops[-1].var if wait.loops else None
            same = same and _renamed(fill.stage, var_a) == _renamed(wait.stage, var_b)
        if not same:
            self.err(wait.node, f"the producer and the consumer walk different stages of {buffer}: "
                                f"{describe(fill, 'producer')}, {describe(wait, 'consumer')}",
                     "both roles run the same key loop and name the same stage")
