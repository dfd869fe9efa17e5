"""LLM-TL parser: one lark (LALR) parse per line, block structure (`Kernel`/`for` ... `end`) by a stack.

Errors are collected for every line and raised together as `TLSyntaxError` (FILE:LINE:COL: message,
with a hint that shows the expected form of the statement the line starts with).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)
from pydantic import ValidationError

from flashgen import operators
from flashgen.abi import DEFAULT_FILL
from flashgen.tl_spec import ast
from flashgen.tl_spec.diagnostics import Diagnostic, TLSyntaxError
from flashgen.variant import DType, Norm, Variant

GRAMMAR = r"""
start: target | variant | params | kernel | end | for_loop | allocate | copy | gemm | osm | assign | reshape | let
     | role | acquire | wait | release | tensor_decl

target: "Target" NAME "dtype" NAME ["accum" NAME] "head_dim" NUMBER ["head_dim_v" NUMBER]
variant: "Variant" vitem*
vitem: NAME ["=" (NUMBER | NAME)]
params: "Params" [WHEN expr ":"] [param ("," param)*]
param: NAME "=" NUMBER
kernel: "Kernel" NAME
end: "end"
for_loop: "for" NAME "in" [PARALLEL] "range" "(" expr ["," expr] ")"
allocate: "Allocate" NAME "in" NAME ["shape" shape] ["dtype" NAME] ["stages" expr] ["offset" expr]
shape: "[" expr ("," expr)* "]"
copy: "Copy" ref "from" NAME "to" NAME [ref] ["stage" expr] [ASYNC] ["as" SCALED NAME]
ref: NAME [index] [TRANSPOSE]
index: "[" item ("," item)* "]"
item: expr             -> point
    | expr ":" expr    -> slice
gemm: "Compute" "GEMM" ref "," ref "and" (GET | ACCUMULATE) NAME
osm: "Compute" "OnlineSoftmax" NAME ["with" MAX NAME "," "sum" NAME ["and" "rescale" NAME]]
assign: "Compute" NAME "=" expr
reshape: "Reshape" NAME "into" NAME
let: "Let" NAME "=" expr
role: "Role" NAME ["warps" expr]
acquire: "Acquire" NAME ["stage" expr]
wait: "Wait" NAME ["stage" expr]
release: "Release" NAME ["stage" expr]
tensor_decl: "Tensor" NAME "shape" shape "dtype" NAME ["fill" expr "to" expr [SORTED]]

?expr: or_expr
?or_expr: and_expr | or_expr "or" and_expr         -> or_op
?and_expr: not_expr | and_expr "and" not_expr      -> and_op
?not_expr: cmp | "not" not_expr                    -> not_op
?cmp: sum
    | sum "<" sum                                  -> lt
    | sum "<=" sum                                 -> le
    | sum ">" sum                                  -> gt
    | sum ">=" sum                                 -> ge
    | sum "==" sum                                 -> eq
    | sum "!=" sum                                 -> ne
?sum: term | sum "+" term -> add | sum "-" term -> sub
?term: factor
     | term "*" factor                             -> mul
     | term "/" factor                             -> div
     | term "//" factor                            -> floordiv
     | term "%" factor                             -> mod
?factor: atom | "-" factor                         -> neg
       | "+" factor
?atom: NUMBER                                      -> number
     | NAME                                        -> name
     | (NAME | MAX) "(" [expr ("," expr)*] ")"     -> call
     | NAME "[" expr ("," expr)* "]"               -> subscript
     | "(" expr ")"

PARALLEL: "parallel"
WHEN: "when"
MAX: "max"
GET: "get"
SCALED: "scaled"
ASYNC: "async"
ACCUMULATE: "accumulate"
SORTED: "sorted"
TRANSPOSE: "^T"
NAME: /[A-Za-z_][A-Za-z0-9_]*/
NUMBER: /([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?/

%ignore /[ \t]+/
"""

#: the expected form of each statement, shown as the hint of a syntax error on a line starting with it
FORMS = {
    "Target": "Target sm_80 dtype fp16 accum fp32 head_dim 64 [head_dim_v 128: V's and O's own head dim]",
    "Variant": "Variant softmax causal window=256 alibi softcap=30 kv_group=2 return_lse split_kv (only what applies)",
    "Params": "Params BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, STAGES = 2 | Params when N <= 1024: BLOCK_M = 128, WARPS = 8",
    "Kernel": "Kernel NAME, closed by `end`",
    "end": "`end` closes the innermost open `for` or `Kernel`",
    "for": "for n_blk in range(0, cdiv(M, BLOCK_N))  or  for m_blk in parallel range(cdiv(N, BLOCK_M))",
    "Allocate": "Allocate S_r in register shape [BLOCK_M, BLOCK_N] dtype fp32",
    "Copy": "Copy K[b, h // KV_GROUP, k0 : k0 + BLOCK_N, 0 : D] from global to shared K_s [as scaled fp16]",
    "Compute": "Compute GEMM Q_r, K_s^T and get S_r | Compute OnlineSoftmax S_r with max m_i, sum l_i and rescale O_r"
               " | Compute S_r = S_r * scale * log2e",
    "Reshape": "Reshape S_r into P_r",
    "Let": "Let q0 = m_blk * BLOCK_M",
    "Role": "Role producer warps 4  or  Role consumer warps WARPS (sm_90), closed by `end`",
    "Acquire": "Acquire K_s stage n_blk (producer, before the async Copy into that stage)",
    "Wait": "Wait K_s stage n_blk  or  Wait Q_s (consumer, before the first read)",
    "Release": "Release K_s stage n_blk (consumer, after the last read)",
    "Tensor": "Tensor LEN shape [B] dtype int32 fill 0 to M  or  Tensor DOC shape [M] dtype int32 fill 0 to 3 sorted",
}
KEYWORDS = tuple(FORMS)

_TERMINAL_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "LSQB": "'['", "RSQB": "']'", "LPAR": "'('",
    "RPAR": "')'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "TRANSPOSE": "'^T'", "GET": "'get'",
    "ACCUMULATE": "'accumulate'", "SCALED": "'scaled'", "ASYNC": "'async'", "LESSTHAN": "'<'", "MORETHAN": "'>'", "STAR": "'*'", "SLASH": "'/'",
    "PERCENT": "'%'",
    "PARALLEL": "'parallel'", "MAX": "'max'", "$END": "end of line", "MINUS": "'-'", "PLUS": "'+'",
    "SORTED": "'sorted'",
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    # the basic lexer reads a whole word before deciding whether it is a keyword ("Copyy" is not "Copy" + "y")
    return Lark(GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True, maybe_placeholders=True)


@lru_cache(maxsize=8192)
def _parse_line(code: str) -> Tree:
    """The lark tree of one line; cached because programs are re-parsed often (agent loops, tests)."""
    return _lark().parse(code)


class _ToAst(Transformer):
    """Lark tree of one line -> AST node. Positions are 1-based line columns."""

    def __init__(self, line_no: int):
        super().__init__()
        self.line_no = line_no

    def _loc(self, item: Any) -> ast.Loc:
        col = getattr(item, "column", None)
        if col is None and isinstance(item, Tree) and item.meta and not item.meta.empty:
            col = item.meta.column
        return ast.Loc(line=self.line_no, col=col or 1)

    # ---- expressions
    @v_args(meta=True)
    def number(self, meta, items):
        text = str(items[0])
        value: int | float = int(text) if re.fullmatch(r"[0-9]+", text) else float(text)
        return ast.Num(value=value, loc=ast.Loc(line=self.line_no, col=meta.column))

    def name(self, items):
        return ast.Name(id=str(items[0]), loc=self._loc(items[0]))

    @v_args(meta=True)
    def call(self, meta, items):
        func, *args = items
        args = [a for a in args if a is not None]
        return ast.Call(func=str(func), args=args, loc=ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def subscript(self, meta, items):
        tensor, *indices = items
        return ast.Subscript(tensor=str(tensor), indices=list(indices), loc=ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def neg(self, meta, items):
        return ast.Unary(op="-", operand=items[0], loc=ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def not_op(self, meta, items):
        return ast.Unary(op="not", operand=items[0], loc=ast.Loc(line=self.line_no, col=meta.column))

    def _bin(self, meta, op, left, right):
        return ast.Binary(op=op, left=left, right=right, loc=ast.Loc(line=self.line_no, col=meta.column))


    @v_args(meta=True)
    def and_op(self, meta, items):
        return self._bin(meta, "and", items[0], items[1])

    @v_args(meta=True)
    def or_op(self, meta, items):
        return self._bin(meta, "or", items[0], items[1])

    # ---- references
    def point(self, items):
        return ast.Point(index=items[0], loc=items[0].loc)

    def slice(self, items):
        return ast.Slice(start=items[0], stop=items[1], loc=items[0].loc)

    def index(self, items):
        return list(items)

    def ref(self, items):
        name, index, transpose = items
        return ast.Ref(name=str(name), index=index, transposed=transpose is not None, loc=self._loc(name))

    def shape(self, items):
        return list(items)

    # ---- statements (each returns (kind, payload, loc) for the block builder)
    def start(self, items):
        return items[0]

    @v_args(meta=True)
    def target(self, meta, items):
        arch, dtype, accum, head_dim, head_dim_v = items
        return ("target", (arch, dtype, accum, head_dim, head_dim_v), self._loc(meta))

    @v_args(meta=True)
    def variant(self, meta, items):
        return ("variant", items, ast.Loc(line=self.line_no, col=meta.column))

    def vitem(self, items):
        return items[0], items[1]

    @v_args(meta=True)
    def params(self, meta, items):
        when, condition, *rest = items
        return ("params", (condition if when is not None else None, [i for i in rest if i is not None]),
                ast.Loc(line=self.line_no, col=meta.column))

    def param(self, items):
        return items[0], items[1]

    @v_args(meta=True)
    def kernel(self, meta, items):
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("open", ast.Kernel(name=str(items[0]), loc=loc), loc)

    @v_args(meta=True)
    def end(self, meta, items):
        return ("end", None, ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def for_loop(self, meta, items):
        var, parallel, first, second = items
        start, stop = (ast.Num(value=0, loc=first.loc), first) if second is None else (first, second)
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("open", ast.ForLoop(var=str(var), parallel=parallel is not None, start=start, stop=stop, loc=loc), loc)

    @v_args(meta=True)
    def allocate(self, meta, items):
        name, level, shape, dtype, stages, offset = items
        return ("stmt", ("allocate", name, level, shape, dtype, stages, offset),
                ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def copy(self, meta, items):
        src, src_level, dst_level, dst, stage, is_async, _scaled_keyword, scaled_to = items
        return ("stmt", ("copy", src, src_level, dst_level, dst, stage, is_async is not None, scaled_to),
                ast.Loc(line=self.line_no, col=meta.column))

    @v_args(meta=True)
    def role(self, meta, items):
        name, warps = items
        loc = ast.Loc(line=self.line_no, col=meta.column)
        if str(name) not in ("producer", "consumer"):
            raise _Diag(name.column, f"unknown role '{name}'", "a role is the producer (loads) or the consumer "
                                                                "(computes): " + FORMS["Role"])
        return ("open", ast.Role(role=str(name), warps=warps, loc=loc), loc)

    def _sync(self, meta, items, cls):
        name, stage = items
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("stmt", cls(buffer=str(name), stage=stage, loc=loc), loc)

    @v_args(meta=True)
    def acquire(self, meta, items):
        return self._sync(meta, items, ast.Acquire)

    @v_args(meta=True)
    def wait(self, meta, items):
        return self._sync(meta, items, ast.Wait)

    @v_args(meta=True)
    def release(self, meta, items):
        return self._sync(meta, items, ast.Release)

    @v_args(meta=True)
    def gemm(self, meta, items):
        a, b, mode, out = items
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("stmt", ast.ComputeGemm(a=a, b=b, out=str(out), accumulate=str(mode) == "accumulate", loc=loc), loc)

    @v_args(meta=True)
    def osm(self, meta, items):
        scores, _max_keyword, mx, sm, rescale = items
        loc = ast.Loc(line=self.line_no, col=meta.column)
        if mx is None:
            return ("osm_short", str(scores), loc)
        node = ast.ComputeOnlineSoftmax(scores=str(scores), max=str(mx), sum=str(sm),
                                        rescale=None if rescale is None else str(rescale), loc=loc)
        return ("stmt", node, loc)

    @v_args(meta=True)
    def assign(self, meta, items):
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("stmt", ast.ComputeAssign(target=str(items[0]), expr=items[1], loc=loc), loc)

    @v_args(meta=True)
    def reshape(self, meta, items):
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("stmt", ast.Reshape(src=str(items[0]), dst=str(items[1]), loc=loc), loc)

    @v_args(meta=True)
    def tensor_decl(self, meta, items):
        name, shape, dtype, low, high, is_sorted = items
        loc = ast.Loc(line=self.line_no, col=meta.column)
        if str(dtype) not in ast.TENSOR_DTYPES:
            raise _Diag(dtype.column, f"unknown tensor dtype '{dtype}'", "a call-time tensor is int32 or fp32")
        if low is None:  # no fill rule: the default one, written out (the canonical form always shows it)
            low, high = (_bound(text, loc) for text in DEFAULT_FILL[str(dtype)])
        node = ast.TensorDecl(name=str(name), shape=shape, dtype=str(dtype), low=low, high=high,
                              sorted=is_sorted is not None, loc=loc)
        return ("stmt", node, loc)

    @v_args(meta=True)
    def let(self, meta, items):
        loc = ast.Loc(line=self.line_no, col=meta.column)
        return ("stmt", ast.Let(name=str(items[0]), value=items[1], loc=loc), loc)


def _bound(text: str, loc: ast.Loc):
    """A default fill bound (flashgen.abi.DEFAULT_FILL: a number or a size name) as an expression."""
    return ast.Num(value=int(text), loc=loc) if text.isdigit() else ast.Name(id=text, loc=loc)


def _binary_rule(op: str):
    @v_args(meta=True)
    def rule(self, meta, items):
        return self._bin(meta, op, items[0], items[1])

    return rule


for _rule, _op in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "add": "+", "sub": "-",
                   "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}.items():
    setattr(_ToAst, _rule, _binary_rule(_op))


def _tree_depth(tree: Tree) -> int:
    """Depth of a lark tree, iteratively (the transformer that follows recurses once per level)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return deepest


class _Diag(Exception):
    def __init__(self, col: int, message: str, hint: str | None = None):
        super().__init__(message)
        self.col, self.message, self.hint = col, message, hint


def _level(token: Token) -> ast.Level:
    try:
        return ast.Level(str(token))
    except ValueError:
        raise _Diag(token.column, f"unknown memory level '{token}'", "global, shared or register") from None


def _dtype(token: Token | None, what: str = "dtype") -> DType | None:
    if token is None:
        return None
    try:
        return DType(str(token))
    except ValueError:
        raise _Diag(token.column, f"unknown {what} '{token}'", "fp16, bf16 or fp32") from None


def _size_params(condition: Any, params: dict[str, int], col: int) -> ast.SizeParams:
    """A `Params when` line's condition: one comparison of a size with an integer literal."""
    form = "`Params when N <= 1024: BLOCK_M = 128, WARPS = 8` (one comparison of B, H, KVH, N or M with an integer)"
    if not params:
        raise _Diag(col, "`Params when` sets no params", form)
    if not (isinstance(condition, ast.Binary) and condition.op in operators.COMPARISONS):
        raise _Diag(col, "a `Params when` condition is one comparison", form)
    left, right, op = condition.left, condition.right, condition.op
    if isinstance(left, ast.Num) and isinstance(right, ast.Name):  # 1024 >= N reads N <= 1024
        left, right, op = right, left, operators.MIRRORED[op]
    if not (isinstance(left, ast.Name) and left.id in ast.SIZE_CONDITION_NAMES and isinstance(right, ast.Num)
            and float(right.value).is_integer() and right.value >= 0):
        raise _Diag(col, "a `Params when` condition compares a size with a non-negative integer", form)
    return ast.SizeParams(size=left.id, op=op, bound=int(right.value), params=params,
                          loc=ast.Loc(line=condition.loc.line if condition.loc else 1, col=col))


def _positive_int(token: Token, what: str, allow_zero: bool = False) -> int:
    if not re.fullmatch(r"[0-9]+", str(token)) or int(str(token)) < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise _Diag(token.column, f"{what} = {token}: expected {kind} integer", None)
    return int(str(token))


def _variant(items: list[tuple[Token, Token | None]], col: int) -> Variant:
    fields: dict[str, Any] = {}
    for key, value in items:
        k = str(key)
        if value is None:
            if k in Norm.__members__:
                fields["norm"] = Norm(k)
            elif k in ("causal", "alibi", "return_lse", "split_kv"):
                fields[k] = True
            else:
                raise _Diag(key.column, f"unknown variant flag '{k}'",
                            "flags: softmax|relu|sigmoid, causal, alibi, return_lse, split_kv; "
                            "valued: window=INT, window_left=INT, window_right=INT, softcap=NUMBER, kv_group=INT")
        else:
            if k not in ("window", "window_left", "window_right", "softcap", "kv_group"):
                raise _Diag(key.column, f"'{k}' takes no value or is unknown",
                            "valued fields: window=INT, window_left=INT, window_right=INT, softcap=NUMBER, "
                            "kv_group=INT")
            text = str(value)
            try:
                fields[k] = float(text) if k == "softcap" else int(text)
            except ValueError:
                raise _Diag(value.column, f"{k}={text}: expected a number", None) from None
    try:
        return Variant(**fields)
    except ValidationError as exc:
        msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise _Diag(col, f"inconsistent variant: {msg}", FORMS["Variant"]) from None


def _unexpected_message(exc: UnexpectedInput, line: str) -> tuple[int, str]:
    if isinstance(exc, UnexpectedCharacters):
        return exc.column, f"unexpected character {line[exc.column - 1]!r}"
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        expected = sorted(_TERMINAL_WORDS.get(t, repr(t.strip('"').lower())) for t in getattr(exc, "expected", ()))
        tail = f", expected {', '.join(expected[:6])}" if expected else ""
        return len(line.rstrip()) + 1, f"line ends too early{tail}"
    assert isinstance(exc, UnexpectedToken)
    expected = sorted({_TERMINAL_WORDS.get(t, repr(t.strip('"').lower())) for t in exc.expected})
    tail = f"; expected {', '.join(expected[:8])}" if expected else ""
    return exc.column, f"unexpected '{exc.token}'{tail}"


_FREE_FOR = re.compile(r"^(\s*)for\s+([A-Za-z_]\w*)\s+in\s+(parallel\s+)?(\S.*?)\s*$")
_FREE_COMPUTE = re.compile(r"^(\s*)Compute\s+(\S.*?)\s*$")


def parse(text: str, filename: str = "<tl>") -> ast.Program:
    """Parse LLM-TL text (full or sketch). Raises TLSyntaxError listing every problem found."""
    diags: list[Diagnostic] = []
    program = ast.Program(filename=filename)
    stack: list[Any] = []  # open Kernel / ForLoop nodes
    seen_header: set[str] = set()
    sketch: bool | None = None  # decided by the first non-comment line: a Target line makes it full

    def diag(line_no: int, col: int, message: str, hint: str | None = None) -> None:
        diags.append(Diagnostic(file=filename, line=line_no, col=col, message=message, hint=hint))

    def emit(node: Any) -> None:
        (stack[-1].body if stack else program.body).append(node)

    for line_no, raw in enumerate(text.splitlines(), start=1):
        code, _, comment = raw.partition("#")
        if comment.strip() or (not code.strip() and "#" in raw):
            emit(ast.Comment(text=comment.strip(), loc=ast.Loc(line=line_no, col=raw.index("#") + 1)))
        if not code.strip():
            continue
        first_word = code.split()[0]
        if sketch is None:
            sketch = first_word != "Target"
        try:
            try:
                tree = _parse_line(code)
                if _tree_depth(tree) > ast.MAX_EXPR_DEPTH:
                    raise _Diag(len(code) - len(code.lstrip()) + 1,
                                f"expression nested too deeply (more than {ast.MAX_EXPR_DEPTH} levels)",
                                "split it over several Compute or Let lines")
                kind, payload, loc = _ToAst(line_no).transform(tree)
            except UnexpectedInput as exc:
                if sketch and (m := _FREE_FOR.match(code)):
                    node = ast.ForLoop(var=m.group(2), parallel=bool(m.group(3)), text=m.group(4),
                                       loc=ast.Loc(line=line_no, col=len(m.group(1)) + 1))
                    kind, payload, loc = "open", node, node.loc
                elif sketch and (m := _FREE_COMPUTE.match(code)):
                    loc = ast.Loc(line=line_no, col=len(m.group(1)) + 1)
                    kind, payload = "stmt", ast.ComputeText(text=m.group(2), loc=loc)
                else:
                    col, message = _unexpected_message(exc, code)
                    if first_word in FORMS:
                        hint = FORMS[first_word]
                    elif first_word.capitalize() in FORMS or first_word.lower() in FORMS:
                        hint = f"keywords are case-sensitive: {', '.join(KEYWORDS)}"
                    else:
                        message = f"unknown statement '{first_word}'" if col == len(code) - len(code.lstrip()) + 1 else message
                        hint = f"a line starts with one of: {', '.join(KEYWORDS)}"
                    raise _Diag(col, message, hint) from None
            except VisitError as exc:  # a _Diag raised inside the transformer
                if isinstance(exc.orig_exc, RecursionError):
                    raise _Diag(1, "expression nested too deeply", "split it over several Compute lines") from None
                raise exc.orig_exc from None
            except RecursionError:
                raise _Diag(1, "expression nested too deeply", "split it over several Compute lines") from None
            if kind in ("target", "variant", "params"):
                condition = payload[0] if kind == "params" else None
                if kind in seen_header and condition is None:
                    raise _Diag(loc.col, f"second {kind.capitalize()} line", "a program has one header of each kind")
                if program.body and any(not isinstance(s, ast.Comment) for s in program.body):
                    raise _Diag(loc.col, f"{kind.capitalize()} after the first statement",
                                "the header (Target, Variant, Params) comes first")
                if condition is None:
                    seen_header.add(kind)
                if kind == "target":
                    arch, dtype, accum, head_dim, head_dim_v = payload
                    if not re.fullmatch(r"sm_\d+a?", str(arch)):
                        raise _Diag(arch.column, f"unknown arch '{arch}'", "sm_75, sm_80, sm_86, sm_89 or sm_90")
                    program.target = ast.TargetDecl(arch=str(arch), dtype=_dtype(dtype),
                                                    accum=_dtype(accum, "accumulator dtype") or DType.fp32,
                                                    head_dim=_positive_int(head_dim, "head_dim"),
                                                    head_dim_v=None if head_dim_v is None
                                                    else _positive_int(head_dim_v, "head_dim_v"), loc=loc)
                elif kind == "variant":
                    program.variant = _variant(payload, loc.col)
                else:
                    params: dict[str, int] = {}
                    for name, value in payload[1]:
                        if str(name) in params:
                            raise _Diag(name.column, f"param {name} given twice", None)
                        if condition is not None and str(name) not in ast.TILE_PARAMS:
                            raise _Diag(name.column, f"param {name} cannot change with the sizes",
                                        f"a `Params when` line sets tile params only: {', '.join(ast.TILE_PARAMS)}")
                        params[str(name)] = _positive_int(value, f"param {name}", allow_zero=True)
                    if condition is None:
                        program.params = params
                    else:
                        program.size_params.append(_size_params(condition, params, loc.col))
            elif kind == "open":
                emit(payload)
                stack.append(payload)
                if len(stack) == ast.MAX_BLOCK_DEPTH + 1:  # reported once; the block still pairs with its `end`
                    raise _Diag(loc.col, f"blocks nested too deeply (more than {ast.MAX_BLOCK_DEPTH} levels of "
                                         f"for/Kernel)", "a kernel needs a few grid loops and one key loop")
            elif kind == "end":
                if not stack:
                    raise _Diag(loc.col, "`end` without an open `for` or `Kernel`", FORMS["end"])
                stack.pop()
            elif kind == "osm_short":
                if not sketch:
                    raise _Diag(loc.col, "OnlineSoftmax needs its running max, sum and accumulator in full TL",
                                FORMS["Compute"].split(" | ")[1])
                emit(ast.ComputeOnlineSoftmax(scores=payload, max="m", sum="l", rescale=None, loc=loc))
            else:
                if isinstance(payload, tuple) and payload[0] == "allocate":
                    _, name, level, shape, dtype, stages, offset = payload
                    payload = ast.Allocate(name=str(name), level=_level(level), shape=shape, dtype=_dtype(dtype),
                                           stages=stages, offset=offset, loc=loc)
                elif isinstance(payload, tuple) and payload[0] == "copy":
                    _, src, src_level, dst_level, dst, stage, is_async, scaled_to = payload
                    payload = ast.Copy(src=src, src_level=_level(src_level), dst_level=_level(dst_level), dst=dst,
                                       stage=stage, is_async=is_async, scaled_to=_dtype(scaled_to), loc=loc)
                emit(payload)
        except _Diag as d:
            diag(line_no, d.col, d.message, d.hint)
    for node in reversed(stack):
        what = f"Kernel {node.name}" if isinstance(node, ast.Kernel) else \
            f"Role {node.role}" if isinstance(node, ast.Role) else f"for {node.var}"
        line = node.loc.line if node.loc else 1
        diag(line, node.loc.col if node.loc else 1, f"`{what}` opened here has no `end` (truncated file?)",
             "close every for/Kernel block with `end`")
    if not diags and (deep := ast.nesting_problem(program)):
        node, message = deep
        diag(node.loc.line if node.loc else 1, node.loc.col if node.loc else 1, message,
             "split the expression over several lines; nest fewer blocks")
    if diags:
        raise TLSyntaxError(diags)
    return program
