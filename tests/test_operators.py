"""flashgen.operators, the one table of what each TL operator and function means: the grammar, the AST, the
checker's scalar values, the interpreter's numpy values and the ABI's size evaluator all agree with it."""

import itertools
import math
import typing

import numpy as np
import pytest

from flashgen import operators
from flashgen.abi import eval_size
from flashgen.tl_spec import ast
from flashgen.tl_spec.interpreter import BINARY_OPS, FUNCTIONS, UNARY_OPS
from flashgen.tl_spec.parser import parse
from flashgen.tl_spec.printer import format_expr
from flashgen.translators.cexpr import SUPPORTED_FUNCTIONS, SUPPORTED_OPERATORS, evaluate


def _expr(text: str):
    return parse(f"Compute X = {text}").body[0].expr


def test_the_ast_and_the_derived_tables_name_the_same_operators():
    assert set(typing.get_args(ast.Binary.model_fields["op"].annotation)) == set(operators.BINARY)
    assert set(typing.get_args(ast.Unary.model_fields["op"].annotation)) == set(operators.UNARY)
    assert ast.FUNCTIONS == {name: f.arity for name, f in operators.FUNCTIONS.items()}
    assert set(BINARY_OPS) == set(operators.BINARY) and set(UNARY_OPS) == set(operators.UNARY)
    assert set(FUNCTIONS) == set(ast.FUNCTIONS) - ast.REDUCTIONS
    assert set(SUPPORTED_FUNCTIONS) == set(FUNCTIONS) and set(SUPPORTED_OPERATORS) == set(BINARY_OPS) | {"not"}


def test_the_grammar_binds_as_the_table_says():
    """`a P b Q c` groups as (a P b) Q c when P binds at least as tightly as Q, else a P (b Q c); the printer
    puts back only the parentheses the table needs."""
    compare = operators.BINARY["<"].precedence
    for outer, inner in itertools.product(operators.BINARY, repeat=2):
        if operators.BINARY[outer].precedence == operators.BINARY[inner].precedence == compare:
            continue  # comparisons do not chain
        tree = _expr(f"a {outer} b {inner} c")
        tight_first = operators.BINARY[outer].precedence >= operators.BINARY[inner].precedence
        assert tree.op == (inner if tight_first else outer), (outer, inner)
        assert format_expr(tree) == f"a {outer} b {inner} c"
        grouped = f"a {outer} (b {inner} c)" if tight_first else f"(a {outer} b) {inner} c"
        assert format_expr(_expr(grouped)) == grouped
    for symbol, op in operators.UNARY.items():  # -a binds tighter than every binary operator, not a looser
        assert _expr(f"{symbol} a * b").op == ("*" if op.precedence > operators.BINARY["*"].precedence else symbol)


SAMPLES = [(7, 3), (-7, 3), (2.5, -0.5), (0.0, 4.0), (True, False)]


@pytest.mark.parametrize("symbol", list(operators.BINARY))
def test_scalar_and_array_meanings_agree(symbol):
    op = operators.BINARY[symbol]
    for a, b in SAMPLES:
        if isinstance(a, bool) and symbol not in ("and", "or", "==", "!="):
            continue
        want = op.scalar(a, b)
        got = op.array(np.asarray(a), np.asarray(b))
        assert bool(want) == bool(got) if symbol in ("and", "or") else np.isclose(float(got), float(want))
        assert evaluate(ast.Binary(op=symbol, left=ast.Num(value=a), right=ast.Num(value=b)), {}) == got


@pytest.mark.parametrize("name", [n for n, f in operators.FUNCTIONS.items() if not f.reduction])
def test_scalar_and_array_functions_agree(name):
    f = operators.FUNCTIONS[name]
    for args in ([0.75, 2.0, -1.5], [3, 2, 5], [-7, 4, 1]):
        args = args[:f.arity]
        if name in ("log", "log2", "sqrt") and args[0] <= 0:
            continue
        want, got = f.scalar(*args), f.array(*(np.asarray(a) for a in args))
        assert math.isclose(float(got), float(want), rel_tol=1e-12), (name, args)


def test_size_expressions_mean_what_the_tl_integer_operators_mean():
    sizes = {"B": 3, "H": 5, "N": 77, "M": 1}
    for text in ("cdiv(N, 16) * H", "B * H + N % 7 - M", "N / 4 / 2", "-N / 4", "max(N, 100) - min(B, H)",
                 "(B + H) * (N - 1) % 9"):
        tl = _expr(text.replace(" / ", " // "))
        assert eval_size(text, sizes) == evaluate(tl, sizes), text
    assert set(operators.SIZE_BINARY) == {"+", "-", "*", "/", "%"}
    assert operators.SIZE_BINARY["/"] is operators.BINARY["//"]
