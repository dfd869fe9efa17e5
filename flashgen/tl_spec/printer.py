"""Canonical LLM-TL text of an AST: `parse(format_program(p)) == p` for every parsed program."""

from __future__ import annotations

from typing import Any

from flashgen import operators
from flashgen.tl_spec import ast
from flashgen.variant import Norm, Variant

INDENT = "  "

# binding strength (flashgen.operators): higher binds tighter; "neg" is unary minus
_PREC = {**{op.symbol: op.precedence for op in operators.BINARY.values()}, "not": operators.UNARY["not"].precedence,
         "neg": operators.UNARY["-"].precedence}
_ATOM = 8


def _num(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


def format_expr(expr: Any, parent: int = 0) -> str:
    """Expression text with the fewest parentheses that keep the same tree."""
    if isinstance(expr, ast.Num):
        text, prec = _num(expr.value), _ATOM
    elif isinstance(expr, ast.Name):
        text, prec = expr.id, _ATOM
    elif isinstance(expr, ast.Call):
        text, prec = f"{expr.func}({', '.join(format_expr(a) for a in expr.args)})", _ATOM
    elif isinstance(expr, ast.Subscript):
        text, prec = f"{expr.tensor}[{', '.join(format_expr(a) for a in expr.indices)}]", _ATOM
    elif isinstance(expr, ast.Unary):
        prec = _PREC["neg"] if expr.op == "-" else _PREC["not"]
        inner = format_expr(expr.operand, prec)
        text = f"-{inner}" if expr.op == "-" else f"not {inner}"
    else:
        prec = _PREC[expr.op]
        # left-associative: the right operand needs parentheses at equal strength; comparisons do not chain
        left = format_expr(expr.left, prec + (1 if prec == 4 else 0))
        right = format_expr(expr.right, prec + 1)
        text = f"{left} {expr.op} {right}"
    return f"({text})" if prec < parent or (prec == parent and parent == _PREC["neg"] and text.startswith("-")) \
        else text


def format_ref(ref: ast.Ref) -> str:
    text = ref.name
    if ref.index is not None:
        items = [format_expr(i.index) if isinstance(i, ast.Point) else f"{format_expr(i.start)} : {format_expr(i.stop)}"
                 for i in ref.index]
        text += f"[{', '.join(items)}]"
    return text + ("^T" if ref.transposed else "")


def format_variant(variant: Variant) -> str:
    words = [variant.norm.value if variant.norm is not Norm.softmax else "softmax"]
    if variant.causal:
        words.append("causal")
    if variant.window is not None:
        words.append(f"window={variant.window}")
    if variant.window_left is not None:
        words.append(f"window_left={variant.window_left}")
    if variant.window_right is not None:
        words.append(f"window_right={variant.window_right}")
    if variant.alibi:
        words.append("alibi")
    if variant.softcap is not None:
        words.append(f"softcap={_num(float(variant.softcap))}")
    if variant.kv_group != 1:
        words.append(f"kv_group={variant.kv_group}")
    if variant.return_lse:
        words.append("return_lse")
    if variant.split_kv:
        words.append("split_kv")
    return "Variant " + " ".join(words)


def format_statement(stmt: Any, depth: int = 0) -> list[str]:
    pad = INDENT * depth
    if isinstance(stmt, ast.Comment):
        return [f"{pad}# {stmt.text}".rstrip()]
    if isinstance(stmt, ast.Kernel):
        return [f"{pad}Kernel {stmt.name}", *_body(stmt.body, depth + 1), f"{pad}end"]
    if isinstance(stmt, ast.ForLoop):
        par = "parallel " if stmt.parallel else ""
        if stmt.text is not None:
            head = f"for {stmt.var} in {par}{stmt.text}"
        elif isinstance(stmt.start, ast.Num) and stmt.start.value == 0 and isinstance(stmt.start.value, int):
            head = f"for {stmt.var} in {par}range({format_expr(stmt.stop)})"
        else:
            head = f"for {stmt.var} in {par}range({format_expr(stmt.start)}, {format_expr(stmt.stop)})"
        return [pad + head, *_body(stmt.body, depth + 1), f"{pad}end"]
    if isinstance(stmt, ast.Allocate):
        text = f"Allocate {stmt.name} in {stmt.level.value}"
        if stmt.shape is not None:
            text += f" shape [{', '.join(format_expr(e) for e in stmt.shape)}]"
        if stmt.dtype is not None:
            text += f" dtype {stmt.dtype.value}"
        if stmt.stages is not None:
            text += f" stages {format_expr(stmt.stages)}"
        if stmt.offset is not None:
            text += f" offset {format_expr(stmt.offset)}"
        return [pad + text]
    if isinstance(stmt, ast.Copy):
        text = f"Copy {format_ref(stmt.src)} from {stmt.src_level.value} to {stmt.dst_level.value}"
        if stmt.dst is not None:
            text += f" {format_ref(stmt.dst)}"
        if stmt.stage is not None:
            text += f" stage {format_expr(stmt.stage)}"
        if stmt.is_async:
            text += " async"
        if stmt.scaled_to is not None:
            text += f" as scaled {stmt.scaled_to.value}"
        return [pad + text]
    if isinstance(stmt, ast.ComputeGemm):
        mode = "accumulate" if stmt.accumulate else "get"
        return [f"{pad}Compute GEMM {format_ref(stmt.a)}, {format_ref(stmt.b)} and {mode} {stmt.out}"]
    if isinstance(stmt, ast.ComputeOnlineSoftmax):
        text = f"{pad}Compute OnlineSoftmax {stmt.scores} with max {stmt.max}, sum {stmt.sum}"
        return [text + (f" and rescale {stmt.rescale}" if stmt.rescale else "")]
    if isinstance(stmt, ast.ComputeAssign):
        return [f"{pad}Compute {stmt.target} = {format_expr(stmt.expr)}"]
    if isinstance(stmt, ast.ComputeText):
        return [f"{pad}Compute {stmt.text}"]
    if isinstance(stmt, ast.Reshape):
        return [f"{pad}Reshape {stmt.src} into {stmt.dst}"]
    if isinstance(stmt, ast.Let):
        return [f"{pad}Let {stmt.name} = {format_expr(stmt.value)}"]
    if isinstance(stmt, ast.Role):
        head = f"{pad}Role {stmt.role}" + (f" warps {format_expr(stmt.warps)}" if stmt.warps is not None else "")
        return [head, *_body(stmt.body, depth + 1), f"{pad}end"]
    if isinstance(stmt, ast.TensorDecl):
        return [f"{pad}Tensor {stmt.name} shape [{', '.join(format_expr(e) for e in stmt.shape)}] dtype {stmt.dtype} "
                f"fill {format_expr(stmt.low)} to {format_expr(stmt.high)}" + (" sorted" if stmt.sorted else "")]
    if isinstance(stmt, ast.SYNC_TYPES):
        stage = f" stage {format_expr(stmt.stage)}" if stmt.stage is not None else ""
        return [f"{pad}{type(stmt).__name__} {stmt.buffer}{stage}"]
    raise TypeError(f"not a TL statement: {type(stmt).__name__}")


def _body(stmts: list[Any], depth: int) -> list[str]:
    return [line for s in stmts for line in format_statement(s, depth)]


def format_program(program: ast.Program) -> str:
    """The canonical text of a program (two-space indentation, one statement per line)."""
    if deep := ast.nesting_problem(program):  # the parser refuses these; a program built otherwise stops here
        from flashgen.tl_spec.diagnostics import Diagnostic, TLSyntaxError

        loc = deep[0].loc or ast.Loc()
        raise TLSyntaxError([Diagnostic(file=program.filename, line=loc.line, col=loc.col, message=deep[1])])
    lines: list[str] = []
    if program.target is not None:
        t = program.target
        lines.append(f"Target {t.arch} dtype {t.dtype.value} accum {t.accum.value} head_dim {t.head_dim}"
                     + (f" head_dim_v {t.head_dim_v}" if t.head_dim_v is not None else ""))
    if program.variant is not None:
        lines.append(format_variant(program.variant))
    if program.params:
        lines.append("Params " + ", ".join(f"{k} = {v}" for k, v in program.params.items()))
    for line in program.size_params:
        lines.append(f"Params when {line.condition}: " + ", ".join(f"{k} = {v}" for k, v in line.params.items()))
    body = program.body
    # header comments that came first in the source stay first
    while body and isinstance(body[0], ast.Comment) and lines and body[0].loc and \
            program.target is not None and program.target.loc and body[0].loc.line < program.target.loc.line:
        lines.insert(0, format_statement(body[0])[0])
        body = body[1:]
    if lines and body:
        lines.append("")
    prev_kernel = False
    for stmt in body:
        if isinstance(stmt, ast.Kernel) and lines and lines[-1] != "" and not prev_kernel:
            lines.append("")
        lines.extend(format_statement(stmt))
        prev_kernel = isinstance(stmt, ast.Kernel)
        if prev_kernel:
            lines.append("")
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"
