"""TL expressions -> C expressions, plus the small algebra the lowering needs.

Three pieces, all over `flashgen.tl_spec.ast` expressions:

- `compile_expr(expr, env)`: C text of a TL expression. Types are inferred (int for positions and
  sizes, float for scores, bool for conditions): `/` is true division in float, `//` and `%` are
  floor division/modulo on ints (plain C `/` `%` only where both operands are provably >= 0),
  `where` becomes a ternary, `-inf` becomes `-INFINITY`, constant subtrees are folded (float64, then
  one rounding to an fp32 literal). Names map to C through `env` (a `CEnv`).
- `evaluate(expr, values)`: numpy evaluation with the interpreter's own operator table (flashgen.operators,
  which also gives the C spellings below), so that the interpreter, the algebra below and the compiled C can
  be compared (tests do).
- `Poly`: a sum of monomials (numeric coefficient times a product of atoms with integer exponents).
  The lowering uses it to substitute the unscaled score, cancel `scale`, divide out the log2(e) units of
  the online softmax, and hoist block-invariant factors; `to_poly`/`from_poly` convert both ways.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from flashgen import operators
from flashgen.errors import FlashgenError
from flashgen.tl_spec import ast

CType = Literal["int", "float", "bool"]


class UnsupportedConstruct(FlashgenError):
    """A TL construct the translator cannot turn into CUDA: one line naming the construct and its line."""


class CExprError(Exception):
    """Raised while compiling one expression; the lowering turns it into UnsupportedConstruct with a line."""

    def __init__(self, message: str, node: Any = None):
        super().__init__(message)
        self.message = message
        self.node = node

    @property
    def line(self) -> int | None:
        loc = getattr(self.node, "loc", None)
        return loc.line if loc is not None else None


@dataclass(frozen=True)
class NameInfo:
    """How a TL name reads in C."""

    c: str | None = None  # C text; None when only `value` is known (then the literal is emitted)
    ctype: CType = "int"
    value: int | float | None = None  # known at translation time: folded
    nonneg: bool = False
    positive: bool = False
    below: str | None = None  # the C of a size it is known to be below (the batch index: `batch`), for tensor reads


@dataclass(frozen=True)
class TensorInfo:
    """How a call-time tensor `T[i, ...]` reads in C: its element type, the C of each dim's size, and the read of the
    element at C indices already clamped into the dims."""

    ctype: CType
    dims: tuple[str, ...]
    read: Callable[[list[str]], str]


@dataclass
class CEnv:
    names: dict[str, NameInfo] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    fast_math: bool = False  # __expf/__logf instead of expf/logf
    translator: str = "CUDA"  # for messages: "the sm_80 translator"
    undefined_hint: Callable[[str], str] | None = None  # extra words for an unknown name


# --------------------------------------------------------------------------- evaluation (numpy)

def evaluate(expr: Any, values: dict[str, Any]) -> Any:
    """Evaluate a TL expression with numpy over `values` (arrays broadcast), each operator as
    flashgen.operators (the interpreter's) defines it. rowmax/rowsum reduce the last axis keeping it (so a
    (rows, 1) result broadcasts against (rows, cols) tiles)."""
    if isinstance(expr, ast.Num):
        return expr.value
    if isinstance(expr, ast.Name):
        if expr.id in values:
            return values[expr.id]
        if expr.id in ast.CONSTANTS:
            return ast.CONSTANTS[expr.id]
        raise KeyError(expr.id)
    if isinstance(expr, ast.Unary):
        return operators.UNARY[expr.op].array(evaluate(expr.operand, values))
    if isinstance(expr, ast.Binary):
        with np.errstate(all="ignore"):
            return operators.BINARY[expr.op].array(evaluate(expr.left, values), evaluate(expr.right, values))
    if isinstance(expr, ast.Subscript):
        if expr.tensor not in values:
            raise KeyError(expr.tensor)
        return operators.read_clamped(values[expr.tensor], [evaluate(a, values) for a in expr.indices])
    if isinstance(expr, ast.Call):
        args = [evaluate(a, values) for a in expr.args]
        with np.errstate(all="ignore"):
            if expr.func == "rowmax":
                return np.max(args[0], axis=-1, keepdims=True)
            if expr.func == "rowsum":
                return np.sum(args[0], axis=-1, keepdims=True)
            return operators.FUNCTIONS[expr.func].array(*args)
    raise TypeError(f"not an expression: {type(expr).__name__}")


# --------------------------------------------------------------------------- C emission

# C binding strength (higher binds tighter) and spellings: flashgen.operators
_P_TERNARY, _P_OR, _P_AND, _P_EQ, _P_REL, _P_ADD, _P_MUL, _P_UNARY, _P_ATOM = (
    operators.C_TERNARY, operators.C_OR, operators.C_AND, operators.C_EQ, operators.C_REL, operators.C_ADD,
    operators.C_MUL, operators.C_UNARY, operators.C_ATOM)
# the operators whose C operator means the same (`/` on floats only); // and % have their own rule
_C_BINARY = {op.symbol: (op.c, op.c_precedence) for op in operators.BINARY.values() if op.c is not None}
_C_UNARY = {op.symbol: op.c for op in operators.UNARY.values()}
_FLOAT_FUNCS = {f.name: f.c_float for f in operators.FUNCTIONS.values() if f.c_float is not None}
# every function but the row reductions (those only inside the recognised softmax normalization)
SUPPORTED_FUNCTIONS = tuple(f.name for f in operators.FUNCTIONS.values() if not f.reduction)
SUPPORTED_OPERATORS = (*operators.BINARY, *(s for s in operators.UNARY if s not in operators.BINARY))


@dataclass
class _C:
    text: str
    prec: int
    ctype: CType
    value: int | float | bool | None = None  # a folded constant
    nonneg: bool = False
    positive: bool = False
    below: str | None = None  # NameInfo.below of a plain name

    def at(self, prec: int) -> str:
        return self.text if self.prec >= prec else f"({self.text})"

    def as_float(self, prec: int) -> str:
        if self.value is not None and not isinstance(self.value, bool):
            return float_literal(float(self.value))
        if self.ctype == "float":
            return self.at(prec)
        return f"(float){self.at(_P_UNARY)}"


def float_literal(x: float) -> str:
    """Shortest fp32 literal of x; infinities as INFINITY."""
    if math.isnan(x):
        raise CExprError("the expression evaluates to NaN")
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    f32 = np.float32(x)
    if f32 == 0:
        return "0.0f"
    exp10 = math.floor(math.log10(abs(float(f32))))
    if -4 <= exp10 < 8:
        text = np.format_float_positional(f32, unique=True, trim="0")
    else:
        text = np.format_float_scientific(f32, unique=True, trim="0")
        text = text.replace("e+", "e")
        if "." not in text.split("e")[0]:
            text = text.replace("e", ".0e", 1)
    return text + "f"


def _literal(value: float | bool, ctype: CType) -> _C:
    if ctype == "bool":
        return _C("true" if value else "false", _P_ATOM, "bool", bool(value))
    if ctype == "int":
        iv = int(value)
        if not -(2 ** 31) <= iv < 2 ** 31:
            raise CExprError(f"integer constant {iv} does not fit in 32 bits")
        return _C(str(iv) if iv >= 0 else f"-{-iv}", _P_ATOM if iv >= 0 else _P_UNARY, "int", iv, iv >= 0, iv > 0)
    text = float_literal(float(value))
    return _C(text, _P_ATOM if not text.startswith("-") else _P_UNARY, "float", float(value),
              float(value) >= 0, float(value) > 0)


class _Compiler:
    def __init__(self, env: CEnv):
        self.env = env

    def unsupported(self, node: Any, what: str, supported: tuple[str, ...]) -> CExprError:
        return CExprError(f"{what} is not supported by the {self.env.translator} translator "
                          f"(supported: {', '.join(supported)})", node)

    def compile(self, e: Any) -> _C:
        if isinstance(e, ast.Num):
            if isinstance(e.value, bool):
                return _literal(e.value, "bool")
            return _literal(e.value, "int" if isinstance(e.value, int) else "float")
        if isinstance(e, ast.Name):
            return self.name(e)
        if isinstance(e, ast.Unary):
            return self.unary(e)
        if isinstance(e, ast.Binary):
            return self.binary(e)
        if isinstance(e, ast.Call):
            return self.call(e)
        if isinstance(e, ast.Subscript):
            return self.subscript(e)
        raise CExprError(f"not an expression: {type(e).__name__}", e)

    def subscript(self, e: ast.Subscript) -> _C:
        """`T[i, ...]`: each index clamped into [0, dim - 1] (flashgen.operators.read_clamped), unless it is known to
        be inside (a non-negative constant below a numeric dim, the batch index for a dim of B, ...)."""
        info = self.env.tensors.get(e.tensor)
        if info is None:
            raise CExprError(f"tensor '{e.tensor}' cannot be read in this expression by the {self.env.translator} "
                             "translator (a call-time tensor: a Tensor line, or alibi_slopes of an ALiBi program)", e)
        if len(e.indices) != len(info.dims):
            raise CExprError(f"'{e.tensor}' has {len(info.dims)} dims; the index gives {len(e.indices)}", e)
        texts = []
        for item, dim in zip(e.indices, info.dims):
            i = self.compile(item)
            if i.ctype != "int":
                raise CExprError(f"an index of '{e.tensor}' is {'a condition' if i.ctype == 'bool' else 'a float'}: "
                                 "indices are integers (use // for integer division)", item)
            texts.append(self.clamp(i, dim))
        return _C(info.read(texts), _P_ATOM, info.ctype)

    @staticmethod
    def clamp(i: _C, dim: str) -> str:
        fixed = int(dim) if dim.isdigit() else None
        if i.value is not None:
            v = int(i.value)
            if fixed is not None:
                return str(min(max(v, 0), fixed - 1))
            return "0" if v <= 0 else f"min({v}, {dim} - 1)"
        if fixed == 1:
            return "0"
        if i.below == dim and i.nonneg:
            return i.at(_P_ATOM)
        top = str(fixed - 1) if fixed is not None else f"{dim} - 1"
        low = i.text if i.nonneg else f"max({i.text}, 0)"
        return f"min({low}, {top})"

    def name(self, e: ast.Name) -> _C:
        info = self.env.names.get(e.id)
        if info is None:
            if e.id in ast.CONSTANTS:
                return _literal(ast.CONSTANTS[e.id], "float")
            hint = self.env.undefined_hint(e.id) if self.env.undefined_hint else ""
            raise CExprError(f"name '{e.id}' cannot be used in this expression by the {self.env.translator} "
                             f"translator{(': ' + hint) if hint else ''}", e)
        if info.value is not None:
            return _literal(info.value, info.ctype)
        assert info.c is not None
        return _C(info.c, _P_ATOM, info.ctype, None, info.nonneg or info.positive, info.positive, info.below)

    def unary(self, e: ast.Unary) -> _C:
        a = self.compile(e.operand)
        if e.op == "not":
            if a.value is not None:
                return _literal(not a.value, "bool")
            return _C(f"{_C_UNARY['not']}{a.at(_P_UNARY)}", _P_UNARY, "bool")
        if a.ctype == "bool":
            raise CExprError("negating a condition: use `not`", e)
        if a.value is not None:
            return _literal(-a.value, a.ctype)
        return _C(f"{_C_UNARY['-']}{a.at(_P_UNARY)}", _P_UNARY, a.ctype)

    def fold(self, e: Any, parts: list[_C]) -> _C | None:
        if any(p.value is None for p in parts):
            return None
        names = {f"_a{i}": p.value for i, p in enumerate(parts)}
        if isinstance(e, ast.Binary):
            probe = ast.Binary(op=e.op, left=ast.Name(id="_a0"), right=ast.Name(id="_a1"))
        elif isinstance(e, ast.Call):
            probe = ast.Call(func=e.func, args=[ast.Name(id=f"_a{i}") for i in range(len(parts))])
        else:
            return None
        value = evaluate(probe, names)
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(value, (bool, np.bool_)):
            return _literal(bool(value), "bool")
        ctype = "int" if all(p.ctype == "int" for p in parts) and isinstance(value, int) else "float"
        if isinstance(e, ast.Call) and e.func == "where":
            ctype = "int" if parts[1].ctype == parts[2].ctype == "int" else "float"
        return _literal(value, ctype)

    def binary(self, e: ast.Binary) -> _C:
        a, b = self.compile(e.left), self.compile(e.right)
        folded = self.fold(e, [a, b])
        if folded is not None and not (isinstance(folded.value, float) and math.isnan(folded.value)):
            return folded
        op = e.op
        if op in ("and", "or"):
            sym, prec = _C_BINARY[op]
            return _C(f"{a.at(prec)} {sym} {b.at(prec + 1)}", prec, "bool")
        if a.ctype == "bool" or b.ctype == "bool":
            if op in ("==", "!=") and a.ctype == b.ctype == "bool":
                sym, prec = _C_BINARY[op]
                return _C(f"{a.at(prec + 1)} {sym} {b.at(prec + 1)}", prec, "bool")
            raise CExprError(f"a condition used as a number in `{op}`: use where(cond, a, b)", e)
        if op in ("//", "%"):
            return self.int_division(e, a, b)
        if op == "/":
            sym, prec = _C_BINARY[op]
            return _C(f"{a.as_float(prec)} {sym} {b.as_float(_P_UNARY)}", prec, "float")
        sym, prec = _C_BINARY[op]
        both_int = a.ctype == b.ctype == "int"
        rhs_prec = prec + 1  # left-associative: an equal-strength right operand needs parentheses
        cmp = prec in (_P_REL, _P_EQ)
        if both_int:
            text = f"{a.at(prec + (1 if cmp else 0))} {sym} {b.at(rhs_prec)}"
        else:
            text = f"{a.as_float(prec + (1 if cmp else 0))} {sym} {b.as_float(rhs_prec)}"
        if cmp:
            return _C(text, prec, "bool")
        nonneg = both_int and a.nonneg and b.nonneg and op in ("+", "*")
        positive = both_int and op in ("+", "*") and ((a.positive and b.positive) if op == "*" else
                                                      (a.nonneg and b.nonneg and (a.positive or b.positive)))
        return _C(text, prec, "int" if both_int else "float", None, nonneg, positive)

    def int_division(self, e: Any, a: _C, b: _C, ceil: bool = False) -> _C:
        what = "cdiv" if ceil else f"`{e.op}`"
        if a.ctype != "int" or b.ctype != "int":
            raise CExprError(f"{what} on a float operand: the translator supports integer {what} only "
                             "(use / for true division)", e)
        if not b.positive:
            raise CExprError(f"{what} by a divisor not known to be positive ({b.text})", e)
        if not ceil and getattr(e, "op", None) == "%":
            if a.nonneg:
                return _C(f"{a.at(_P_MUL)} % {b.at(_P_UNARY)}", _P_MUL, "int", None, True, False)
            # floor modulo (Python's, the interpreter's) for a negative dividend
            return _C(f"(({a.at(_P_MUL)} % {b.at(_P_UNARY)}) + {b.at(_P_ADD)}) % {b.at(_P_UNARY)}", _P_MUL, "int",
                      None, True, False)
        bt = b.at(_P_UNARY)
        if ceil:
            if a.nonneg:
                return _C(f"({a.at(_P_ADD)} + {b.at(_P_ADD)} - 1) / {bt}", _P_MUL, "int", None, True, a.positive)
            # ceil(a / b) for b > 0: positive a rounds up, otherwise C's truncation is the ceiling
            return _C(f"({a.at(_P_REL)} > 0 ? ({a.at(_P_ADD)} + {b.at(_P_ADD)} - 1) / {bt} : {a.at(_P_MUL)} / {bt})",
                      _P_ATOM, "int")
        if a.nonneg:
            return _C(f"{a.at(_P_MUL)} / {bt}", _P_MUL, "int", None, True, False)
        # floor(a / b) for b > 0: C truncates toward zero, so a negative a needs the adjusted form
        return _C(f"({a.at(_P_REL)} >= 0 ? {a.at(_P_MUL)} / {bt} : -((-{a.at(_P_UNARY)} + {b.at(_P_ADD)} - 1) / {bt}))",
                  _P_ATOM, "int")

    def call(self, e: ast.Call) -> _C:
        f = e.func
        if f in ("rowmax", "rowsum"):
            raise CExprError(f"'{f}' (a row reduction) is supported only as part of the softmax normalization", e)
        if f not in ast.FUNCTIONS or f not in SUPPORTED_FUNCTIONS:
            raise self.unsupported(e, f"Compute with '{f}'", SUPPORTED_FUNCTIONS)
        if len(e.args) != ast.FUNCTIONS[f]:
            raise CExprError(f"{f} takes {ast.FUNCTIONS[f]} argument(s), got {len(e.args)}", e)
        args = [self.compile(a) for a in e.args]
        folded = self.fold(e, args)
        if folded is not None and not (isinstance(folded.value, float) and math.isnan(folded.value)):
            return folded
        if f == "where":
            c, x, y = args
            if c.ctype != "bool":
                c = _C(f"{c.at(_P_EQ + 1)} != 0", _P_EQ, "bool")
            if x.ctype == y.ctype == "int":
                return _C(f"{c.at(_P_OR)} ? {x.at(_P_TERNARY)} : {y.at(_P_TERNARY)}", _P_TERNARY, "int", None,
                          x.nonneg and y.nonneg, x.positive and y.positive)
            if "bool" in (x.ctype, y.ctype):
                raise CExprError("where() with a condition as a value", e)
            return _C(f"{c.at(_P_OR)} ? {x.as_float(_P_TERNARY)} : {y.as_float(_P_TERNARY)}", _P_TERNARY, "float")
        if any(a.ctype == "bool" for a in args):
            raise CExprError(f"{f}() of a condition: use where(cond, a, b)", e)
        if f == "cdiv":
            return self.int_division(e, args[0], args[1], ceil=True)
        if f in ("max", "min"):
            x, y = args
            if x.ctype == y.ctype == "int":
                nonneg = (x.nonneg or y.nonneg) if f == "max" else (x.nonneg and y.nonneg)
                positive = (x.positive or y.positive) if f == "max" else (x.positive and y.positive)
                return _C(f"{f}({x.text}, {y.text})", _P_ATOM, "int", None, nonneg, positive)
            return _C(f"f{f}f({x.as_float(0)}, {y.as_float(0)})", _P_ATOM, "float")
        (x,) = args
        if f == "abs":
            if x.ctype == "int":
                return _C(f"abs({x.text})", _P_ATOM, "int", None, True)
            return _C(f"fabsf({x.text})", _P_ATOM, "float", None, True)
        if f == "relu":
            if x.ctype == "int":
                return _C(f"max({x.text}, 0)", _P_ATOM, "int", None, True)
            # a select, not fmaxf: the same value (NaN and -0 give 0 either way), but on the sm90 path an fmaxf of
            # each score left ptxas short of registers for the wgmma pipeline, which it then serialized (relu at
            # every tile; NOTES.md, session 20)
            operand = x.at(_P_REL + 1)
            return _C(f"{operand} > 0.0f ? {operand} : 0.0f", _P_TERNARY, "float", None, True)
        if f == "sigmoid":
            exp = "__expf" if self.env.fast_math else "expf"
            neg = _C(f"-{x.at(_P_UNARY)}", _P_UNARY, "float") if x.ctype == "float" else _C(
                f"-(float){x.at(_P_UNARY)}", _P_UNARY, "float")
            return _C(f"1.0f / (1.0f + {exp}({neg.text}))", _P_MUL, "float", None, True)
        accurate, fast = _FLOAT_FUNCS[f]
        return _C(f"{fast if self.env.fast_math else accurate}({x.as_float(0)})", _P_ATOM, "float")


def compile_expr(expr: Any, env: CEnv) -> str:
    """C text of a TL expression (raises CExprError naming the unsupported piece)."""
    return _Compiler(env).compile(expr).text


def infer_ctype(expr: Any, env: CEnv) -> CType:
    return _Compiler(env).compile(expr).ctype


# --------------------------------------------------------------------------- algebra

def substitute(expr: Any, mapping: dict[str, Any]) -> Any:
    """Replace names by expressions (Let inlining); returns a new tree, locations kept."""
    if isinstance(expr, ast.Name):
        return mapping.get(expr.id, expr)
    if isinstance(expr, ast.Unary):
        return ast.Unary(op=expr.op, operand=substitute(expr.operand, mapping), loc=expr.loc)
    if isinstance(expr, ast.Binary):
        return ast.Binary(op=expr.op, left=substitute(expr.left, mapping), right=substitute(expr.right, mapping),
                          loc=expr.loc)
    if isinstance(expr, ast.Call):
        return ast.Call(func=expr.func, args=[substitute(a, mapping) for a in expr.args], loc=expr.loc)
    if isinstance(expr, ast.Subscript):
        return ast.Subscript(tensor=expr.tensor, indices=[substitute(a, mapping) for a in expr.indices], loc=expr.loc)
    return expr


def _key(expr: Any) -> str:
    from flashgen.tl_spec.printer import format_expr

    return format_expr(expr)


Factors = tuple[tuple[str, int], ...]


def _snap(c: float) -> int | float:
    """Round away the last-bit noise of constant arithmetic (log2e * (1 / log2e) -> 1.0)."""
    if isinstance(c, float) and math.isfinite(c):
        r = round(c)
        if r != 0 and abs(c - r) <= 1e-12 * abs(c):
            return float(r)
    return c


@dataclass
class Poly:
    """sum(coef * prod(atom ** exp)); atoms are TL expressions that are not + - * / (names, calls, ...)."""

    terms: dict[Factors, int | float] = field(default_factory=dict)
    atoms: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def const(c: float) -> Poly:
        return Poly({(): c} if c != 0 else {}, {})

    @staticmethod
    def atom(expr: Any, exp: int = 1) -> Poly:
        k = _key(expr)
        return Poly({((k, exp),): 1}, {k: expr})

    def copy(self) -> Poly:
        return Poly(dict(self.terms), dict(self.atoms))

    def is_const(self) -> bool:
        return all(not f for f in self.terms)

    def const_value(self) -> int | float:
        return self.terms.get((), 0)

    def add(self, other: Poly, sign: int = 1) -> Poly:
        out = self.copy()
        out.atoms.update(other.atoms)
        for f, c in other.terms.items():
            v = _snap(out.terms.get(f, 0) + sign * c)
            if v == 0:
                out.terms.pop(f, None)
            else:
                out.terms[f] = v
        return out

    def scale_by(self, c: float) -> Poly:
        return Poly({f: _snap(v * c) for f, v in self.terms.items() if v * c != 0}, dict(self.atoms))

    def mul(self, other: Poly) -> Poly:
        if len(self.terms) > 1 and len(other.terms) > 1:
            # a product of two sums stays a product of two atoms (no expansion)
            return Poly.atom(from_poly(self)).mul(Poly.atom(from_poly(other)))
        out = Poly({}, {**self.atoms, **other.atoms})
        for fa, ca in self.terms.items():
            for fb, cb in other.terms.items():
                exps: dict[str, int] = dict(fa)
                for k, e in fb:
                    exps[k] = exps.get(k, 0) + e
                f = tuple((k, e) for k, e in exps.items() if e != 0)
                out = out.add(Poly({f: _snap(ca * cb)}, out.atoms))
        return out

    def inverse(self) -> Poly | None:
        if len(self.terms) != 1:
            return None
        (f, c), = self.terms.items()
        if c == 0:
            return None
        inv_c: int | float = c if isinstance(c, int) and abs(c) == 1 else 1.0 / c
        return Poly({tuple((k, -e) for k, e in f): _snap(inv_c)}, dict(self.atoms))

    def exponent_of(self, key: str) -> set[int]:
        """The exponents `key` appears with across the terms (0 where absent)."""
        return {dict(f).get(key, 0) for f in self.terms} or {0}

    def drop(self, key: str) -> Poly:
        return Poly({tuple((k, e) for k, e in f if k != key): c for f, c in self.terms.items()}, dict(self.atoms))


def to_poly(expr: Any, subst: dict[str, Poly] | None = None, hook: Callable[[Poly], Poly] | None = None) -> Poly:
    """Normal form of an expression. Names in `subst` are replaced by their polys; arguments of atoms
    (calls, comparisons, //, %, logic) are normalized recursively; constant atoms are folded."""
    subst = subst or {}

    def go(e: Any) -> Poly:
        p = _go(e)
        return hook(p) if hook else p

    def _go(e: Any) -> Poly:
        if isinstance(e, ast.Num):
            return Poly.const(e.value)
        if isinstance(e, ast.Name):
            if e.id in subst:
                return subst[e.id].copy()
            if e.id in ("log2e", "ln2"):
                return Poly.const(ast.CONSTANTS[e.id])
            return Poly.atom(e)
        if isinstance(e, ast.Unary) and e.op == "-":
            return go(e.operand).scale_by(-1)
        if isinstance(e, ast.Binary) and e.op in ("+", "-"):
            return go(e.left).add(go(e.right), 1 if e.op == "+" else -1)
        if isinstance(e, ast.Binary) and e.op == "*":
            return go(e.left).mul(go(e.right))
        if isinstance(e, ast.Binary) and e.op == "/":
            num, den = go(e.left), go(e.right)
            inv = den.inverse()
            if inv is not None:
                out = num.mul(inv)
                # true division of integer constants stays float
                return Poly({f: (float(c) if isinstance(c, int) else c) for f, c in out.terms.items()}, out.atoms) \
                    if den.is_const() else out
            return num.mul(Poly.atom(from_poly(den), -1))
        # an atom: normalize its parts, fold when constant
        if isinstance(e, ast.Unary):
            rebuilt: Any = ast.Unary(op=e.op, operand=from_poly(go(e.operand)), loc=e.loc)
        elif isinstance(e, ast.Binary):
            rebuilt = ast.Binary(op=e.op, left=from_poly(go(e.left)), right=from_poly(go(e.right)), loc=e.loc)
        elif isinstance(e, ast.Call):
            rebuilt = ast.Call(func=e.func, args=[from_poly(go(a)) for a in e.args], loc=e.loc)
        elif isinstance(e, ast.Subscript):  # a tensor read: an atom, never folded (its value comes at call time)
            return Poly.atom(ast.Subscript(tensor=e.tensor, indices=[from_poly(go(a)) for a in e.indices], loc=e.loc))
        else:
            raise TypeError(type(e).__name__)
        if not any(isinstance(n, ast.Name) and n.id not in ast.CONSTANTS for n in ast.walk_expr(rebuilt)):
            try:
                value = evaluate(rebuilt, {})
            except (KeyError, TypeError, ValueError, ArithmeticError):
                value = None
            if isinstance(value, (np.bool_, bool)):
                return Poly.atom(ast.Num(value=int(bool(value))))  # kept as an atom: a condition
            if value is not None:
                v = value.item() if isinstance(value, np.generic) else value
                if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
                    if isinstance(v, float) and math.isinf(v):
                        return Poly.atom(ast.Name(id="inf")).scale_by(1 if v > 0 else -1)
                    return Poly.const(v)
        return Poly.atom(rebuilt)

    return go(expr)


def from_poly(p: Poly, is_float: Callable[[Any], bool] | None = None) -> Any:
    """Expression of a normal form: terms in order, the constant last, `-` for negative coefficients.
    A float coefficient of +-1 is dropped only where the term is float anyway (`is_float` of a factor,
    or a division), so that an int expression never turns float or the reverse."""
    if not p.terms:
        return ast.Num(value=0)
    terms = sorted(p.terms.items(), key=lambda fc: not fc[0])  # constant term last (stable otherwise)
    out: Any = None
    for f, c in terms:
        num = [p.atoms[k] for k, e in f if e > 0 for _ in range(e)]
        den = [p.atoms[k] for k, e in f if e < 0 for _ in range(-e)]
        mag = abs(c)
        floaty = bool(den) or any(is_float(a) for a in num) if is_float else bool(den)
        keep_coef = not num or not (mag == 1 and (isinstance(mag, int) or floaty))
        factors: list[Any] = ([ast.Num(value=mag)] if keep_coef else []) + num
        term: Any = factors[0] if factors else ast.Num(value=1.0 if isinstance(mag, float) else 1)
        for a in factors[1:]:
            term = ast.Binary(op="*", left=term, right=a)
        if den and not factors:
            term = ast.Num(value=1.0)
        for a in den:
            term = ast.Binary(op="/", left=term, right=a)
        if out is None:
            out = ast.Unary(op="-", operand=term) if c < 0 else term
        else:
            out = ast.Binary(op="-" if c < 0 else "+", left=out, right=term)
    return out


def simplify(expr: Any, hook: Callable[[Poly], Poly] | None = None,
             is_float: Callable[[Any], bool] | None = None) -> Any:
    return from_poly(to_poly(expr, hook=hook), is_float)
