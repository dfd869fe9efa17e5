"""The Hopper dataflow of a TL program (docs/llm-tl.md, "Hopper dataflow") as the sm90 kernel implements it.

`read(program)` finds the attention kernel's two roles and returns
- the `HopperDataflow`: the producer's and the consumer's warps, the depth of the K/V rings (`stages` of the staged
  allocations) and the buffers Q, K and V land in;
- the same computation in the plain dataflow (`flat`): one statement list in which the producer's loads are
  synchronous copies at the places the consumer waits for them, the handshakes gone, the stages dropped. The
  lowering reads the score chain, the normalization, the key range and the epilogue from it, as for every program.

`check(flow, params, ...)` raises DataflowError where the sm90 kernel (kernel.py, templates/attention_fwd.cu.j2)
cannot implement the dataflow as written: one producer warpgroup issuing TMA loads (Q once, K and V per key tile,
each stage of one ring after its empty barrier), consumer warpgroups of 64 query rows (one warp per 16) that wait on
the stage's full barriers, compute S = Q K^T with both operands in shared memory and O += P V with P in registers,
and release the stage. The kernel walks the key tiles last to first (the causal diagonal first) and puts the it-th
tile of its walk in slot it % STAGES; the TL may walk them in either order and name its stages as it likes: the
online softmax combines the tiles in any order to the same result, and the checker and the interpreter have already
shown that the program's own ring is used correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashgen.targets import role_dataflow
from flashgen.tl_spec import ast
from flashgen.tl_spec.printer import format_expr


class DataflowError(Exception):
    """A role program the sm90 kernel cannot implement: the message and the TL node it is about."""

    def __init__(self, node: Any, message: str):
        super().__init__(message)
        self.node, self.message = node, message


@dataclass(frozen=True)
class HopperDataflow:
    producer: ast.Role
    consumer: ast.Role
    producer_warps: int | None
    consumer_warps: int | None
    stages: dict[str, int]  # staged buffer -> its ring's depth
    loads: dict[str, str]  # global tensor (Q, K, V) -> the shared buffer it is loaded into
    producer_loop: ast.ForLoop | None
    consumer_loop: ast.ForLoop | None
    waits: dict[str, ast.Wait]  # the consumer's Waits, by buffer
    releases: dict[str, ast.Release]


def _int(expr: Any, params: dict[str, int]) -> int | None:
    """A role's warps or a ring's stages: an integer over the Params."""
    if expr is None:
        return None
    if isinstance(expr, ast.Num) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, ast.Name) and expr.id in params:
        return params[expr.id]
    from flashgen import operators

    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*", "//"):
        a, b = _int(expr.left, params), _int(expr.right, params)
        if a is not None and b is not None and not (expr.op == "//" and b == 0):
            return int(operators.BINARY[expr.op].scalar(a, b))
    return None


def _block(kernel: ast.Kernel) -> list[Any]:
    """The statements of one block: the body of the innermost parallel loop."""
    level = kernel.body
    while True:
        loops = [s for s in level if isinstance(s, ast.ForLoop) and s.parallel]
        if not loops:
            return level
        level = loops[0].body


def _innermost(kernel: ast.Kernel) -> ast.ForLoop | None:
    level, last = kernel.body, None
    while True:
        loops = [s for s in level if isinstance(s, ast.ForLoop) and s.parallel]
        if not loops:
            return last
        last, level = loops[0], loops[0].body


def _statements(stmts: list[Any]):
    for s in stmts:
        yield s
        if isinstance(s, ast.BLOCK_TYPES):
            yield from _statements(s.body)


def _sync_copy(copy: ast.Copy, mapping: dict[str, Any]) -> ast.Copy:
    src = copy.src
    if src.index is not None and mapping:
        index = [ast.Point(index=ast.substitute(i.index, mapping), loc=i.loc) if isinstance(i, ast.Point) else
                 ast.Slice(start=ast.substitute(i.start, mapping), stop=ast.substitute(i.stop, mapping), loc=i.loc)
                 for i in src.index]
        src = ast.Ref(name=src.name, index=index, transposed=src.transposed, loc=src.loc)
    return ast.Copy(src=src, src_level=copy.src_level, dst_level=copy.dst_level, dst=copy.dst, scaled_to=copy.scaled_to,
                    loc=copy.loc)


def read(program: ast.Program, kernel: ast.Kernel) -> tuple[HopperDataflow, ast.Program]:
    """The kernel's roles and the equivalent plain program (the other kernels, if any, unchanged)."""
    block = _block(kernel)
    roles = [s for s in block if isinstance(s, ast.Role)]
    by_kind = {r.role: [x for x in roles if x.role == r.role] for r in roles}
    for kind in ("producer", "consumer"):
        found = by_kind.get(kind, [])
        if len(found) != 1:
            where = found[1] if len(found) > 1 else (roles[0] if roles else kernel)
            raise DataflowError(where, f"the Hopper dataflow has one producer and one consumer role in the block "
                                       f"(found {len(found)} {kind} role{'s' if len(found) != 1 else ''})")
    producer, consumer = by_kind["producer"][0], by_kind["consumer"][0]
    first = min(block.index(producer), block.index(consumer))
    pre = [s for s in block[:first]]
    for s in block[first:]:
        if not isinstance(s, (ast.Comment, ast.Role)):
            raise DataflowError(s, "a statement beside the Role blocks: the block's work runs in its roles")
    params = dict(program.params)
    stages = {s.name: _int(s.stages, params) for s in pre if isinstance(s, ast.Allocate) and s.stages is not None}
    for name, n in stages.items():
        if n is None:
            alloc = next(s for s in pre if isinstance(s, ast.Allocate) and s.name == name)
            raise DataflowError(alloc, f"the stages of {name} ({format_expr(alloc.stages)}) are not an integer over "
                                       "the Params")

    # the producer: async loads before its key loop (Q) and in it (K, V), each after its Acquire
    loads: dict[str, str] = {}
    producer_pre: list[ast.Copy] = []
    producer_loop: ast.ForLoop | None = None
    for s in producer.body:
        if isinstance(s, ast.Comment):
            continue
        if isinstance(s, ast.Copy) and s.is_async and s.dst is not None:
            producer_pre.append(s)
            loads[s.src.name] = s.dst.name
        elif isinstance(s, ast.ForLoop) and not s.parallel and producer_loop is None:
            producer_loop = s
        else:
            raise DataflowError(s, "the sm90 producer loads Q once and K, V per key tile (async copies, Acquire "
                                   "in its one key loop); it takes nothing else here")
    loop_lets: list[ast.Let] = []
    loop_copies: list[ast.Copy] = []
    if producer_loop is not None:
        for s in producer_loop.body:
            if isinstance(s, (ast.Comment, ast.Acquire)):
                continue
            if isinstance(s, ast.Let):
                loop_lets.append(s)
            elif isinstance(s, ast.Copy) and s.is_async and s.dst is not None:
                loop_copies.append(s)
                loads[s.src.name] = s.dst.name
            else:
                raise DataflowError(s, "the sm90 producer's key loop holds Let, Acquire and async copies only")

    # the consumer: its Waits and Releases (dropped in the flat form), its one key loop
    waits: dict[str, ast.Wait] = {}
    releases: dict[str, ast.Release] = {}
    consumer_loop = next((s for s in consumer.body if isinstance(s, ast.ForLoop) and not s.parallel), None)

    def strip(stmts: list[Any]) -> list[Any]:
        out = []
        for s in stmts:
            if isinstance(s, ast.Wait):
                waits.setdefault(s.buffer, s)
            elif isinstance(s, ast.Release):
                releases.setdefault(s.buffer, s)
            elif isinstance(s, ast.Acquire) or (isinstance(s, ast.Copy) and s.is_async):
                raise DataflowError(s, "the consumer does not load: Acquire and async copies are the producer's")
            else:
                out.append(s)
        return out

    # the producer's loop Lets, in the consumer's loop variable; renamed where the consumer has its own of that name
    mapping: dict[str, Any] = {}
    if producer_loop is not None and consumer_loop is not None and producer_loop.var != consumer_loop.var:
        mapping[producer_loop.var] = ast.Name(id=consumer_loop.var)
    consumer_lets = {s.name: format_expr(s.value) for s in _statements(consumer.body) if isinstance(s, ast.Let)}
    lets: list[ast.Let] = []
    for let in loop_lets:
        value = ast.substitute(let.value, mapping)
        if let.name in consumer_lets and consumer_lets[let.name] == format_expr(value):
            continue  # the consumer computes the same value itself
        name = let.name if let.name not in consumer_lets else f"{let.name}__producer"
        mapping[let.name] = ast.Name(id=name)
        lets.append(ast.Let(name=name, value=value, loc=let.loc))
    loads_in_loop = [*lets, *(_sync_copy(c, mapping) for c in loop_copies)]

    flat_block: list[Any] = []
    for s in pre:
        if isinstance(s, ast.Allocate) and s.stages is not None:
            s = s.model_copy(update={"stages": None})
        flat_block.append(s)
    body = strip(list(consumer.body))
    at = next((i for i, s in enumerate(body) if not isinstance(s, (ast.Allocate, ast.Comment))), len(body))
    body[at:at] = [_sync_copy(c, {}) for c in producer_pre]
    if consumer_loop is not None:
        i = body.index(consumer_loop)
        body[i] = consumer_loop.model_copy(update={"body": [*loads_in_loop, *strip(list(consumer_loop.body))]})
    flat_block.extend(body)

    innermost = _innermost(kernel)

    def rebuild(stmts: list[Any]) -> list[Any]:
        out = []
        for s in stmts:
            if s is innermost:
                out.append(s.model_copy(update={"body": flat_block}))
            elif isinstance(s, ast.ForLoop) and s.parallel:
                out.append(s.model_copy(update={"body": rebuild(s.body)}))
            else:
                out.append(s)
        return out

    flat_kernel = kernel.model_copy(update={"body": rebuild(kernel.body) if innermost is not None else flat_block})
    flat = program.model_copy(update={"body": [flat_kernel if s is kernel else s for s in program.body]})
    flow = HopperDataflow(producer=producer, consumer=consumer, producer_warps=_int(producer.warps, params),
                          consumer_warps=_int(consumer.warps, params), stages=stages, loads=loads,
                          producer_loop=producer_loop, consumer_loop=consumer_loop, waits=waits, releases=releases)
    return flow, flat


def check(flow: HopperDataflow, block_m: int, arch: str = "sm_90") -> int:
    """Raise DataflowError where the sm90 kernel cannot implement `flow` with BLOCK_M = block_m; returns the depth
    of its K/V ring (plan.stages)."""
    facts = role_dataflow(arch)
    assert facts is not None
    if flow.producer_warps != facts.producer_warps:
        raise DataflowError(flow.producer, f"Role producer warps {format_expr(flow.producer.warps) if flow.producer.warps else '?'}: "
                                           f"the sm90 kernel has one producer warpgroup (Role producer warps "
                                           f"{facts.producer_warps})")
    want = block_m // facts.rows_per_consumer_warp
    if flow.consumer_warps != want or block_m % facts.rows_per_consumer_warp:
        raise DataflowError(flow.consumer, f"Role consumer warps {flow.consumer_warps}: the sm90 kernel runs one "
                                           f"consumer warp per {facts.rows_per_consumer_warp} query rows (a warpgroup "
                                           f"per 64), so BLOCK_M = {block_m} needs Role consumer warps {want}")
    missing = [g for g in ("Q", "K", "V") if g not in flow.loads]
    if missing:
        raise DataflowError(flow.producer, f"the sm90 producer loads Q, K and V with async copies; it does not load "
                                           f"{', '.join(missing)}")
    q, k, v = (flow.loads[g] for g in ("Q", "K", "V"))
    if q in flow.stages:
        raise DataflowError(flow.producer, f"{q} (the Q tile) has stages: the sm90 kernel loads Q once, into one buffer")
    for buf in (k, v):
        if buf not in flow.stages:
            raise DataflowError(flow.producer, f"{buf} is loaded per key tile but has no stages: the sm90 kernel keeps "
                                               f"K and V in rings (Allocate {buf} ... stages STAGES)")
    if flow.stages[k] != flow.stages[v]:
        raise DataflowError(flow.producer, f"{k} has {flow.stages[k]} stages and {v} {flow.stages[v]}: the sm90 kernel "
                                           "keeps K and V in one ring (give them the same stages)")
    if not 1 <= flow.stages[k] <= facts.max_stages:
        raise DataflowError(flow.producer, f"{k} has {flow.stages[k]} stages: the sm90 kernel implements "
                                           f"1..{facts.max_stages}")
    if flow.producer_loop is None or flow.consumer_loop is None:
        raise DataflowError(flow.consumer if flow.consumer_loop is None else flow.producer,
                            "the sm90 kernel's roles each run one key loop over the same tiles")
    for bound in ("start", "stop"):
        a, b = getattr(flow.producer_loop, bound), getattr(flow.consumer_loop, bound)
        if (a is None) != (b is None) or (a is not None and format_expr(a) != format_expr(b)):
            raise DataflowError(flow.consumer_loop, f"the producer's key loop range({format_expr(flow.producer_loop.start)}, "
                                                    f"{format_expr(flow.producer_loop.stop)}) is not the consumer's "
                                                    f"range({format_expr(flow.consumer_loop.start)}, "
                                                    f"{format_expr(flow.consumer_loop.stop)}): both walk the same tiles")
    for buf in (q, k, v):
        if buf not in flow.waits:
            raise DataflowError(flow.consumer, f"the consumer never waits for {buf} (Wait {buf}"
                                               f"{' stage ...' if buf != q else ''})")
    for buf in (k, v):
        if buf not in flow.releases:
            raise DataflowError(flow.waits[buf], f"the consumer never releases {buf} (Release {buf} stage ... after its "
                                                 "last read)")
    return flow.stages[k]


def gemm_operands(flow: HopperDataflow, qk: ast.ComputeGemm, pv: ast.ComputeGemm, levels: dict[str, ast.Level]) -> None:
    """S = Q K^T with both operands in shared memory (wgmma SS), O += P V with P in registers (wgmma RS)."""
    q, k, v = (flow.loads[g] for g in ("Q", "K", "V"))
    if qk.a.name != q:
        raise DataflowError(qk, f"Compute GEMM {qk.a.name}, ...: the sm90 kernel reads Q from shared memory (both "
                                f"operands of S = Q K^T in shared memory): write Compute GEMM {q}, {k}^T and get "
                                f"{qk.out}")
    if qk.b.name != k:
        raise DataflowError(qk, f"the sm90 kernel's S = Q K^T reads K from its ring {k}")
    if levels.get(pv.a.name) is not ast.Level.register or pv.b.name != v:
        raise DataflowError(pv, f"the sm90 kernel's O += P V takes P from registers and V from its ring {v}")
