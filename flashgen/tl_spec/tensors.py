"""Call-time tensors: the TL's `Tensor` lines (flashgen.abi.ModTensor in a manifest) and the values they are filled
with where no caller gives them (`tl run`, the CPU check, the harness's verification and timing).

A declaration `Tensor LEN shape [B] dtype int32 fill 0 to M` fills LEN with uniform random integers in [0, M], both
included, at the run's sizes; an fp32 one with uniform reals in [LO, HI); `sorted` sorts the values along the last
axis (document ids of packed sequences: `Tensor DOC shape [M] dtype int32 fill 0 to 3 sorted`). The bounds are
expressions over the sizes (B, H, KVH, N, M, D, KV_GROUP). One seed gives the same values everywhere: the harness
fills a case's tensors with `fill_all(specs, sizes, seed)` and the fp64 reference reads those.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashgen import operators
from flashgen.abi import ModTensor
from flashgen.tl_spec import ast
from flashgen.variant import Shape

_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def sizes_of(shape: Shape) -> dict[str, int]:
    """The names a tensor's dims and fill bounds may use, at `shape`."""
    return {"B": shape.B, "H": shape.H, "KVH": shape.kv_heads, "N": shape.N, "M": shape.M, "D": shape.D,
            "KV_GROUP": shape.H // shape.kv_heads}


def spec_of(decl: ast.TensorDecl) -> ModTensor:
    """The manifest's record of a `Tensor` line (its bounds as canonical TL text)."""
    from flashgen.tl_spec.printer import format_expr

    dims = tuple(d.value if isinstance(d, ast.Num) else d.id for d in decl.shape)  # the checker admits only these
    return ModTensor(name=decl.name, dtype=decl.dtype, shape=dims, low=format_expr(decl.low),
                     high=format_expr(decl.high), sorted=decl.sorted)


def bound_value(expr: Any, sizes: dict[str, int]) -> int | float:
    """A fill bound's value: a TL expression (or its text) over the sizes and numbers. ValueError for anything else."""
    if isinstance(expr, str):
        from flashgen.tl_spec.diagnostics import TLSyntaxError
        from flashgen.tl_spec.parser import parse

        try:
            stmts = [s for s in parse(f"Let bound = {expr}\n", "<fill bound>").body if isinstance(s, ast.Let)]
        except TLSyntaxError as exc:
            raise ValueError(f"fill bound {expr!r}: {exc.diagnostics[0].message}") from None
        expr = stmts[0].value
    return _scalar(expr, sizes)


def _scalar(e: Any, sizes: dict[str, int]) -> int | float:
    if isinstance(e, ast.Num):
        return e.value
    if isinstance(e, ast.Name):
        if e.id in sizes:
            return sizes[e.id]
        raise ValueError(f"fill bound: '{e.id}' is not a size (B, H, KVH, N, M, D, KV_GROUP)")
    try:
        if isinstance(e, ast.Unary) and e.op == "-":
            return operators.UNARY["-"].scalar(_scalar(e.operand, sizes))
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "//", "%"):
            return operators.BINARY[e.op].scalar(_scalar(e.left, sizes), _scalar(e.right, sizes))
        if isinstance(e, ast.Call) and e.func in ("min", "max", "cdiv"):
            return operators.FUNCTIONS[e.func].scalar(*(_scalar(a, sizes) for a in e.args))
    except (ZeroDivisionError, TypeError) as exc:
        raise ValueError(f"fill bound: {exc}") from None
    raise ValueError("fill bound: only numbers, sizes, + - * / // %, min, max and cdiv")


def fill(spec: ModTensor, sizes: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    """One tensor's values by its fill rule: int32 or float32 numpy, of its dims at `sizes`. ValueError (starting with
    the tensor's name) when the rule gives nothing there."""
    try:
        lo, hi = bound_value(spec.low, sizes), bound_value(spec.high, sizes)
    except ValueError as exc:
        raise ValueError(f"{spec.name}: {exc}") from None
    dims = spec.dims(sizes)
    where = ", ".join(f"{k}={sizes[k]}" for k in ("B", "H", "N", "M") if k in sizes)
    if spec.dtype == "int32":
        if float(lo) != int(lo) or float(hi) != int(hi):
            raise ValueError(f"{spec.name}: an int32 tensor's fill bounds are integers, got {lo} to {hi} at {where}")
        lo, hi = int(lo), int(hi)
        if hi < lo:
            raise ValueError(f"{spec.name}: fill {spec.low} to {spec.high} is empty at {where} ({lo} to {hi})")
        if lo < _INT32[0] or hi > _INT32[1]:
            raise ValueError(f"{spec.name}: fill {spec.low} to {spec.high} leaves int32 at {where}")
        values = rng.integers(lo, hi, size=dims, endpoint=True).astype(np.int32)
    else:
        if hi < lo:
            raise ValueError(f"{spec.name}: fill {spec.low} to {spec.high} is empty at {where} ({lo} to {hi})")
        values = rng.uniform(float(lo), float(hi), size=dims).astype(np.float32)
    return np.sort(values, axis=-1) if spec.sorted else values


def fill_all(specs: list[ModTensor], sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Every tensor of `specs` filled, from one generator of `seed` (its own stream: Q, K and V of the same seed are
    drawn from another), in declaration order."""
    rng = np.random.default_rng([int(seed) % (2 ** 32), 0x7E5])
    return {spec.name: fill(spec, sizes, rng) for spec in specs}

