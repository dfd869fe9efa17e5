"""What each operator and builtin function of LLM-TL means: the one table, read wherever an expression is
given a meaning.

- flashgen.tl_spec.ast: which functions exist and their arity, which count as SFU ops, which reduce rows;
- the TL checker: `scalar`, the Python value of an expression under its probe sizes;
- the TL printer: `precedence` (the parser's grammar has the same ladder);
- the TL interpreter: `array`, numpy over tiles;
- the C-expression compiler (flashgen.translators.cexpr): `c`, `c_precedence` and `c_float`, the C spelling,
  and `array` again for constant folding, so that a folded constant is the interpreter's value;
- the ABI's size evaluator (flashgen.abi.eval_size): `SIZE_BINARY` and `SIZE_FUNCTIONS`, the integer subset
  a manifest's launch sizes use, where `/` is TL's `//` (C's `/` on the non-negative sizes);
- `read_clamped`: what reading a call-time tensor `T[i, j]` means (each index clamped into its dim), for the
  interpreter and the lowering's sample evaluations; the C-expression compiler clamps the same way.

Semantics (docs/llm-tl.md): `/` is true division, `//` floor division and `%` floor modulo (as Python);
comparisons and `and`/`or`/`not` give conditions; `where(c, a, b)` picks elementwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# C binding strength, higher binds tighter (what the C-expression compiler parenthesises by)
C_TERNARY, C_OR, C_AND, C_EQ, C_REL, C_ADD, C_MUL, C_UNARY, C_ATOM = range(1, 10)


@dataclass(frozen=True)
class Operator:
    symbol: str
    arity: int  # 1: prefix unary, 2: binary (left-associative; comparisons do not chain)
    precedence: int  # TL binding strength, higher binds tighter
    scalar: Callable[..., Any]  # on Python numbers (ZeroDivisionError, OverflowError as Python raises them)
    array: Callable[..., Any]  # on numpy values, elementwise (numpy's warnings are the caller's)
    c: str | None = None  # the C operator; None where C's differs (C's / and % truncate): compiled by its own rule
    c_precedence: int = C_ATOM


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    scalar: Callable[..., Any] | None  # None: no value on scalars (a row reduction)
    array: Callable[..., Any] | None  # None: a row reduction, applied by the caller over its axis
    sfu: bool = False  # counts as a special-function-unit (transcendental) op
    reduction: bool = False  # reduces a [rows, cols] tile over its columns -> [rows]
    c_float: tuple[str, str] | None = None  # (accurate, fast-math) C function on a float; None: its own rule


def _safe_div(a: Any, b: Any) -> Any:
    with np.errstate(all="ignore"):
        return np.true_divide(a, b)


def _sigmoid(x: Any) -> Any:
    with np.errstate(all="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


BINARY: dict[str, Operator] = {op.symbol: op for op in (
    Operator("+", 2, 5, lambda a, b: a + b, lambda a, b: a + b, "+", C_ADD),
    Operator("-", 2, 5, lambda a, b: a - b, lambda a, b: a - b, "-", C_ADD),
    Operator("*", 2, 6, lambda a, b: a * b, lambda a, b: a * b, "*", C_MUL),
    Operator("/", 2, 6, lambda a, b: a / b, _safe_div, "/", C_MUL),  # C: on floats only (the compiler casts)
    Operator("//", 2, 6, lambda a, b: a // b, lambda a, b: np.floor_divide(a, b)),
    Operator("%", 2, 6, lambda a, b: a % b, lambda a, b: np.mod(a, b)),
    Operator("<", 2, 4, lambda a, b: a < b, np.less, "<", C_REL),
    Operator("<=", 2, 4, lambda a, b: a <= b, np.less_equal, "<=", C_REL),
    Operator(">", 2, 4, lambda a, b: a > b, np.greater, ">", C_REL),
    Operator(">=", 2, 4, lambda a, b: a >= b, np.greater_equal, ">=", C_REL),
    Operator("==", 2, 4, lambda a, b: a == b, np.equal, "==", C_EQ),
    Operator("!=", 2, 4, lambda a, b: a != b, np.not_equal, "!=", C_EQ),
    Operator("and", 2, 2, lambda a, b: a and b, np.logical_and, "&&", C_AND),
    Operator("or", 2, 1, lambda a, b: a or b, np.logical_or, "||", C_OR),
)}

#: the comparisons, with what `not (a OP b)` is (NEGATED), what `b OP a` is as `a OP' b` (MIRRORED) and the short name
#: generated names spell each with (NAMES: the interval functions fg::iv::lt..., kernels' size-range suffixes)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
NAMES = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}

UNARY: dict[str, Operator] = {op.symbol: op for op in (
    Operator("-", 1, 7, lambda a: -a, lambda a: -a, "-", C_UNARY),
    Operator("not", 1, 3, lambda a: not a, np.logical_not, "!", C_UNARY),
)}

FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("where", 3, lambda c, a, b: a if c else b, lambda c, a, b: np.where(c, a, b)),  # where(cond, a, b)
    Function("max", 2, max, np.maximum),
    Function("min", 2, min, np.minimum),
    Function("exp", 1, math.exp, np.exp, sfu=True, c_float=("expf", "__expf")),
    Function("exp2", 1, lambda x: 2.0 ** x, np.exp2, sfu=True, c_float=("exp2f", "exp2f")),
    Function("log", 1, math.log, np.log, sfu=True, c_float=("logf", "__logf")),
    Function("log2", 1, math.log2, np.log2, sfu=True, c_float=("log2f", "log2f")),
    # fg::tanh_fast (flashgen/common.cuh): the SFU's tanh.approx.f32, relative error ~1.1e-5; tanhf's polynomial
    # made softcap kernels run at half the plain kernel's speed, EX2 + RCP at 0.53x (NOTES.md, sessions 5 and 6)
    Function("tanh", 1, math.tanh, np.tanh, sfu=True, c_float=("fg::tanh_fast", "fg::tanh_fast")),
    # fg::cos_approx, fg::sin_approx (common.cuh says why and how accurate): branch-free, where cosf's was not
    Function("cos", 1, math.cos, np.cos, sfu=True, c_float=("fg::cos_approx", "__cosf")),
    Function("sin", 1, math.sin, np.sin, sfu=True, c_float=("fg::sin_approx", "__sinf")),
    Function("abs", 1, abs, np.abs),
    Function("relu", 1, lambda x: max(x, 0.0), lambda x: np.maximum(x, 0.0)),
    Function("sigmoid", 1, lambda x: 1.0 / (1.0 + math.exp(-x)), _sigmoid, sfu=True),
    Function("sqrt", 1, math.sqrt, np.sqrt, sfu=True, c_float=("sqrtf", "sqrtf")),
    Function("rowmax", 1, None, None, reduction=True),
    Function("rowsum", 1, None, None, reduction=True),
    Function("cdiv", 2, _cdiv, _cdiv),  # ceil(a / b) on integers (index arithmetic)
)}


def read_clamped(data: Any, indices: list[Any]) -> Any:
    """`T[i, j, ...]`, the read of a call-time tensor (a TL `Tensor` line, the ALiBi slopes): one integer index per
    dim, each clamped into [0, dim - 1] (so no index reads outside the tensor: the kernel's C clamps the same way);
    indices broadcast as numpy's (a position tile reads a tile). Raises IndexError for a wrong number of indices."""
    data = np.asarray(data)
    if len(indices) != data.ndim:
        raise IndexError(f"{len(indices)} indices for a tensor of {data.ndim} dims")
    clamped = tuple(np.clip(np.asarray(i, dtype=np.int64), 0, n - 1) for i, n in zip(indices, data.shape))
    return data[clamped]


# A manifest's size expressions (grid, workspace, splits): integers over the runtime sizes
SIZE_BINARY: dict[str, Operator] = {"+": BINARY["+"], "-": BINARY["-"], "*": BINARY["*"], "/": BINARY["//"],
                                    "%": BINARY["%"]}
SIZE_FUNCTIONS: dict[str, Function] = {name: FUNCTIONS[name] for name in ("cdiv", "max", "min")}
