"""Tile tests from a mask's expression: interval arithmetic over one tile's rows and keys.

A mask condition (a TL expression over `q_idx`, `k_idx` and block-invariant names) is analysed once, by the
translator, into a tree whose every integer node is an interval [lo, hi] holding the node's values over the tile's
valid (row, key) pairs, and whose every condition is three-valued: whether it may hold somewhere in the tile (`t`) and
whether it may fail somewhere (`f`). The tree is written as C over flashgen/interval.cuh (include/flashgen, the
`fg::iv` functions, one per rule below; the kernel evaluates it per tile) and evaluated in numpy by the same rules
(`evaluate`: flashgen.mods.tile_report's counts, and the tests, which check both against every element).

- `!t` (`Cond.never_c`): no (row, key) of the tile can satisfy the condition, so no key of it is visible: the
  kernel skips the tile (KernelPlan.skip_tile).
- `f` (`Cond.may_fail_c`): some (row, key) may fail it: the tile takes the per-element mask (KernelPlan.mask_tile,
  for conditions the linear box test of the lowering does not take).

The tile is rows m_block * BLOCK_M .. min((m_block + 1) * BLOCK_M, seqlen_q) - 1 and keys n_block * BLOCK_N ..
min((n_block + 1) * BLOCK_N, seqlen_k) - 1: rows past N are never stored and keys past M always masked.

Analysed (exact integer meaning, the TL's: `//` and `%` floor, as the interpreter and the kernel's C compute them):
integers from q_idx, k_idx, integer literals and block-invariant integer leaves (`Leaf`: the sizes, the batch and
head index, params, per-block constants such as a call-time tensor read at block-invariant indices, `LEN[b]`) under
`+ - *`, unary `-`, `//`, `%` and `cdiv` by a divisor known to be positive (a positive literal or size), `min`,
`max`, `abs`, `relu`, `where`; comparisons of two such integers; `and`, `or`, `not` and `==`/`!=` of
conditions. Anything else is unknown (t = f = true: never a reason to skip a tile, always one to mask it): the
score, floats (true division, float literals and tensors), tensor reads at indices that move with q_idx or k_idx
(`DOC[q_idx]`: the caller's values are not bounded by the tile's positions), other functions, and a node whose
bounds could pass 2^62 (so the C's 64-bit arithmetic never overflows; leaves are below 2^31).

Interval arithmetic is conservative: every rule over-approximates (`q_idx - q_idx` is [q0 - q1, q1 - q0], not 0), so
a tile is skipped only where the mask is provably false on all of it, and may be computed though empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen import operators
from flashgen.tl_spec import ast
from flashgen.translators.plan import INTERVAL_NS

#: the bound on a leaf's magnitude (positions, sizes, indices, int32 tensor values, 32-bit params)
LEAF_BOUND = 1 << 31
#: the bound an interval's endpoints must stay within (the C is 64-bit: a sum or floor of two such never overflows)
LIMIT = 1 << 62
#: the C of each tile axis: (tile index, tile size, sequence length), as fg::iv::tile takes them
AXES = {"q": ("m_block", "BLOCK_M", "seqlen_q"), "k": ("n_block", "BLOCK_N", "seqlen_k")}
_POSITIONS = {"q_idx": "q", "k_idx": "k"}
_COMPARISONS = operators.NAMES  # comparison -> the fg::iv function's name (lt, le, ...)
_LOGIC = {"and": "and_", "or": "or_"}


@dataclass(frozen=True)
class Leaf:
    """A block-invariant integer the analysis reads as one point: its C (an int) and its TL expression (numpy)."""

    c: str
    expr: Any
    positive: bool = False
    nonneg: bool = False


def _fn(name: str, *args: str) -> str:
    return f"{INTERVAL_NS}{name}({', '.join(args)})"


def _floor(a, d):
    return np.floor_divide(a, d)


@dataclass(frozen=True)
class Int:
    """An integer expression as an interval. op: const, leaf, tile (axis q or k), add, sub, neg, mul, floor_div
    (floor_div_nonneg where the dividend is known >= 0: two divisions), ceil_div, floor_mod, min_, max_, abs_, where
    (args[0] a Cond)."""

    op: str
    args: tuple = ()
    value: int | None = None
    leaf: Leaf | None = None
    axis: str | None = None
    mag: int = 0  # a bound on |lo| and |hi| whatever the sizes
    positive: bool = False  # known >= 1 whatever the sizes (a divisor)
    nonneg: bool = False  # known >= 0 whatever the sizes

    def c(self) -> str:
        if self.op == "const":
            return _fn("pt", f"{self.value}LL" if abs(self.value) >= 2 ** 31 else str(self.value))
        if self.op == "leaf":
            return _fn("pt", self.leaf.c)
        if self.op == "tile":
            return _fn("tile", *AXES[self.axis])
        return _fn(self.op, *(a.c() for a in self.args))

    def bounds(self, env: dict[str, Any]) -> tuple[Any, Any]:
        """(lo, hi) in numpy (int64, broadcast over env's tiles): env has "q" and "k", each (lo, hi) of the tiles,
        and "values", what the leaves' TL expressions read."""
        if self.op == "const":
            return np.int64(self.value), np.int64(self.value)
        if self.op == "leaf":
            from flashgen.translators.cexpr import evaluate

            v = np.asarray(evaluate(self.leaf.expr, env["values"]), dtype=np.int64)
            return v, v
        if self.op == "tile":
            return env[self.axis]
        if self.op == "where":
            t, f = self.args[0].evaluate(env)
            (xl, xh), (yl, yh) = self.args[1].bounds(env), self.args[2].bounds(env)
            return (np.where(~f, xl, np.where(~t, yl, np.minimum(xl, yl))),
                    np.where(~f, xh, np.where(~t, yh, np.maximum(xh, yh))))
        parts = [a.bounds(env) for a in self.args]
        if self.op == "neg":
            (lo, hi), = parts
            return -hi, -lo
        (al, ah), (bl, bh) = parts if len(parts) == 2 else (parts[0], (None, None))
        if self.op == "add":
            return al + bl, ah + bh
        if self.op == "sub":
            return al - bh, ah - bl
        if self.op == "mul":
            return _hull(al * bl, al * bh, ah * bl, ah * bh)
        if self.op == "floor_div":
            return _hull(_floor(al, bl), _floor(al, bh), _floor(ah, bl), _floor(ah, bh))
        if self.op == "floor_div_nonneg":
            return _floor(al, bh), _floor(ah, bl)
        if self.op == "ceil_div":
            lo, hi = _hull(_floor(-ah, bl), _floor(-ah, bh), _floor(-al, bl), _floor(-al, bh))
            return -hi, -lo
        if self.op == "floor_mod":
            below = (al >= 0) & (ah < bl)
            one = (bl == bh) & (_floor(al, bl) == _floor(ah, bl))
            r = al - _floor(al, bl) * bl
            return (np.where(below, al, np.where(one, r, 0)),
                    np.where(below, ah, np.where(one, r + (ah - al), bh - 1)))
        if self.op == "min_":
            return np.minimum(al, bl), np.minimum(ah, bh)
        if self.op == "max_":
            return np.maximum(al, bl), np.maximum(ah, bh)
        if self.op == "abs_":
            return (np.where(al >= 0, al, np.where(ah <= 0, -ah, 0)),
                    np.where(al >= 0, ah, np.where(ah <= 0, -al, np.maximum(-al, ah))))
        raise AssertionError(self.op)


def _hull(*xs):
    return np.minimum.reduce(np.broadcast_arrays(*xs)), np.maximum.reduce(np.broadcast_arrays(*xs))


@dataclass(frozen=True)
class Cond:
    """A condition over the tile, three-valued: op cmp (name: lt le gt ge eq ne; two Ints), and_, or_, not_, known
    (value), unknown, eqb / neb (== and != of two Conds). t_always / f_always: whether it may hold / may fail in every
    tile whatever the sizes (then its test is no test)."""

    op: str
    args: tuple = ()
    name: str | None = None
    value: bool | None = None
    t_always: bool = False
    f_always: bool = False

    def c(self) -> str:
        if self.op == "known":
            return _fn("known", "true" if self.value else "false")
        if self.op == "unknown":
            return _fn("unknown")
        if self.op == "cmp":
            return _fn(self.name, *(a.c() for a in self.args))
        if self.op in ("eqb", "neb"):
            return _fn("eq" if self.op == "eqb" else "ne", *(a.c() for a in self.args))
        return _fn(self.op, *(a.c() for a in self.args))

    def never_c(self) -> str | None:
        """C bool: the condition holds nowhere in tile (m_block, n_block); None when that is never provable."""
        return None if self.t_always else f"!{self.c()}.t"

    def may_fail_c(self) -> str | None:
        """C bool: the condition may fail somewhere in the tile; None when it always may (no test)."""
        return None if self.f_always else f"{self.c()}.f"

    def evaluate(self, env: dict[str, Any]) -> tuple[Any, Any]:
        """(t, f) in numpy over env's tiles (see Int.bounds)."""
        if self.op == "known":
            return np.bool_(self.value), np.bool_(not self.value)
        if self.op == "unknown":
            return np.bool_(True), np.bool_(True)
        if self.op == "cmp":
            (al, ah), (bl, bh) = (a.bounds(env) for a in self.args)
            out = {"lt": (al < bh, ah >= bl), "le": (al <= bh, ah > bl), "gt": (bl < ah, bh >= al),
                   "ge": (bl <= ah, bh > al)}
            if self.name in out:
                return out[self.name]
            t = (al <= bh) & (bl <= ah)
            f = ~((al == ah) & (bl == bh) & (al == bl))
            return (t, f) if self.name == "eq" else (f, t)
        parts = [a.evaluate(env) for a in self.args]
        if self.op == "not_":
            (t, f), = parts
            return f, t
        if self.op == "and_":
            (at, af), (bt, bf) = parts
            return at & bt, af | bf
        if self.op == "or_":
            (at, af), (bt, bf) = parts
            return at | bt, af & bf
        if self.op in ("eqb", "neb"):
            (at, af), (bt, bf) = parts
            t, f = (at & bt) | (af & bf), (at & bf) | (af & bt)
            return (t, f) if self.op == "eqb" else (f, t)
        raise AssertionError(self.op)


UNKNOWN = Cond("unknown", t_always=True, f_always=True)


def _known(v: bool) -> Cond:
    return Cond("known", value=bool(v), t_always=bool(v), f_always=not v)


def _const(v: int) -> Int:
    return Int("const", value=v, mag=abs(v), positive=v > 0, nonneg=v >= 0)


def _int(op: str, *args: Int, mag: int, positive: bool = False, nonneg: bool = False) -> Int | None:
    """A node of `args`, folded when they are all constants, None when its bounds could pass LIMIT."""
    if mag > LIMIT:
        return None
    if all(a.op == "const" for a in args) and op != "where":
        lo, hi = Int(op, args).bounds({})
        assert int(lo) == int(hi)
        return _const(int(lo))
    return Int(op, args, mag=mag, positive=positive, nonneg=nonneg or positive)


def _cond(op: str, *args: Any, name: str | None = None) -> Cond:
    """A condition node of `args`, folded where they decide it, with its static flags."""
    if op == "cmp":
        a, b = args
        if a.op == b.op == "const":
            return _known(bool(operators.BINARY[{v: k for k, v in _COMPARISONS.items()}[name]].scalar(a.value,
                                                                                                        b.value)))
        return Cond("cmp", args, name=name)
    if op == "not_":
        (a,) = args
        if a.op in ("known", "unknown"):
            return a if a.op == "unknown" else _known(not a.value)
        return Cond("not_", args, t_always=a.f_always, f_always=a.t_always)
    if op in ("and_", "or_"):
        a, b = args
        if op == "and_":
            if a.op == "known":
                return b if a.value else a
            if b.op == "known":
                return a if b.value else b
            return Cond(op, args, t_always=a.t_always and b.t_always, f_always=a.f_always or b.f_always)
        if a.op == "known":
            return a if a.value else b
        if b.op == "known":
            return b if b.value else a
        return Cond(op, args, t_always=a.t_always or b.t_always, f_always=a.f_always and b.f_always)
    if op in ("eqb", "neb"):
        a, b = args
        if a.op == "unknown" or b.op == "unknown":
            return UNKNOWN
        return Cond(op, args)
    raise AssertionError(op)


def analyse(cond: Any, leaf: Callable[[Any], Leaf | None]) -> Cond:
    """The three-valued tile test of a TL condition. `leaf(e)` reads a name (other than q_idx and k_idx) or a tensor
    read as a block-invariant integer (Leaf), or says None: not one (a float, a position-dependent read, a name the
    tile does not have), which makes what reads it unknown."""
    return _Analysis(leaf).cond(cond)


@dataclass
class _Analysis:
    leaf: Callable[[Any], Leaf | None]

    def int(self, e: Any) -> Int | None:
        if isinstance(e, ast.Num):
            if isinstance(e.value, bool) or not isinstance(e.value, int) or abs(e.value) > LIMIT:
                return None
            return _const(e.value)
        if isinstance(e, ast.Name) and e.id in _POSITIONS:
            return Int("tile", axis=_POSITIONS[e.id], mag=LEAF_BOUND, nonneg=True)
        if isinstance(e, (ast.Name, ast.Subscript)):
            found = self.leaf(e)
            return None if found is None else Int("leaf", leaf=found, mag=LEAF_BOUND, positive=found.positive,
                                                  nonneg=found.nonneg or found.positive)
        if isinstance(e, ast.Unary) and e.op == "-":
            a = self.int(e.operand)
            return None if a is None else _int("neg", a, mag=a.mag)
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "//", "%"):
            a, b = self.int(e.left), self.int(e.right)
            if a is None or b is None:
                return None
            both = a.nonneg and b.nonneg
            if e.op == "+":
                return _int("add", a, b, mag=a.mag + b.mag, positive=both and (a.positive or b.positive),
                            nonneg=both)
            if e.op == "-":
                return _int("sub", a, b, mag=a.mag + b.mag)
            if e.op == "*":
                return _int("mul", a, b, mag=a.mag * b.mag, positive=a.positive and b.positive, nonneg=both)
            if not b.positive:
                return None  # the translator's C takes only divisors known to be positive
            if e.op == "%":
                return _int("floor_mod", a, b, mag=b.mag, nonneg=True)
            return _int("floor_div_nonneg" if a.nonneg else "floor_div", a, b, mag=a.mag, nonneg=a.nonneg)
        if isinstance(e, ast.Call):
            return self.call(e)
        return None

    def call(self, e: ast.Call) -> Int | None:
        if e.func == "where" and len(e.args) == 3:
            x, y = self.int(e.args[1]), self.int(e.args[2])
            if x is None or y is None:
                return None
            c = self.cond(e.args[0])
            if c.op == "known":
                return x if c.value else y
            return Int("where", (c, x, y), mag=max(x.mag, y.mag), positive=x.positive and y.positive,
                       nonneg=x.nonneg and y.nonneg)
        args = [self.int(a) for a in e.args]
        if any(a is None for a in args):
            return None
        if e.func in ("min", "max") and len(args) == 2:
            a, b = args
            low = min if e.func == "min" else max
            return _int(f"{e.func}_", a, b, mag=max(a.mag, b.mag), positive=low(a.positive, b.positive),
                        nonneg=low(a.nonneg, b.nonneg))
        if e.func == "abs" and len(args) == 1:
            return _int("abs_", args[0], mag=args[0].mag, positive=args[0].positive, nonneg=True)
        if e.func == "relu" and len(args) == 1:
            return _int("max_", args[0], _const(0), mag=args[0].mag, positive=args[0].positive, nonneg=True)
        if e.func == "cdiv" and len(args) == 2 and args[1].positive:
            return _int("ceil_div", *args, mag=args[0].mag, positive=args[0].positive, nonneg=args[0].nonneg)
        return None

    def cond(self, e: Any) -> Cond:
        if isinstance(e, ast.Num) and isinstance(e.value, (int, bool)):  # a folded condition (cexpr.to_poly)
            return _known(bool(e.value))
        if isinstance(e, ast.Unary) and e.op == "not":
            return _cond("not_", self.cond(e.operand))
        if isinstance(e, ast.Binary) and e.op in _LOGIC:
            return _cond(_LOGIC[e.op], self.cond(e.left), self.cond(e.right))
        if isinstance(e, ast.Binary) and e.op in _COMPARISONS:
            if _is_condition(e.left) or _is_condition(e.right):  # == / != of two conditions
                if e.op not in ("==", "!="):
                    return UNKNOWN
                return _cond("eqb" if e.op == "==" else "neb", self.cond(e.left), self.cond(e.right))
            a, b = self.int(e.left), self.int(e.right)
            if a is None or b is None:
                return UNKNOWN
            return _cond("cmp", a, b, name=_COMPARISONS[e.op])
        return UNKNOWN


def _is_condition(e: Any) -> bool:
    """Whether an expression is a condition by its form (a comparison, logic or `not`: where() takes numbers)."""
    if isinstance(e, ast.Binary):
        return e.op in _COMPARISONS or e.op in _LOGIC
    return isinstance(e, ast.Unary) and e.op == "not"


def tile_env(m_blocks: Any, n_blocks: Any, block_m: int, block_n: int, n: int, m: int,
             values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The numpy environment of `Int.bounds` / `Cond.evaluate` for tiles (m_blocks, n_blocks) (arrays, broadcast) at
    N = n, M = m, as fg::iv::tile bounds them; `values`: what the leaves' expressions read (sizes, b, h, params)."""
    mb, nb = np.asarray(m_blocks, dtype=np.int64), np.asarray(n_blocks, dtype=np.int64)
    return {"q": (mb * block_m, np.minimum((mb + 1) * block_m, n) - 1),
            "k": (nb * block_n, np.minimum((nb + 1) * block_n, m) - 1), "values": dict(values or {})}
