"""Parser and printer: round trips, locations and hints in syntax errors."""

import pytest

from flashgen.tl_spec import TLSyntaxError, ast, format_program, library, parse


@pytest.mark.parametrize("name", library.list_programs())
def test_round_trip_library(name):
    for form in ("full", "sketch"):
        program = parse(library.load(name, form))
        again = parse(format_program(program))
        assert again == program
        assert format_program(again) == format_program(program)


def test_round_trip_expressions_keep_their_trees():
    exprs = ["a - (b - c)", "-(-x)", "(a < b) == c", "not a < b and c or d", "a // b % c * -d",
             "where(k_idx <= q_idx + M - N and q_idx + M - N - k_idx < 7, S, -inf)", "-x * y",
             "1e-30 + 0.5 * exp2(-8.0 * (h + 1) / H)", "(a + b) * (c - d) / (e / f)"]
    for text in exprs:
        program = parse(f"Compute X = {text}\n")
        stmt = program.body[0]
        printed = format_program(program)
        assert parse(printed) == program, (text, printed)
        assert isinstance(stmt, ast.ComputeAssign)
    nested = parse("Compute X = a - (b - c)\n").body[0].expr
    assert nested.op == "-" and nested.right.op == "-"


def test_locations_and_equality_ignore_loc():
    text = library.load("plain")
    program = parse(text, "p.tl")
    gemm = next(s for s in program.statements() if isinstance(s, ast.ComputeGemm))
    line = text.splitlines()[gemm.loc.line - 1]
    assert line.lstrip().startswith("Compute GEMM") and gemm.loc.col == len(line) - len(line.lstrip()) + 1
    shifted = parse("\n\n" + text, "p.tl")
    assert shifted == program


def test_comments_survive_formatting():
    program = parse(library.load("window"))
    assert any(isinstance(s, ast.Comment) for s in program.statements())
    assert "# first key tile" in format_program(program)


@pytest.mark.parametrize("text, line, col, needle", [
    ("Target sm_80 dtype fp16 head_dim 64\nVariant softmax\nCopy K from globl to shared K_s\n", 3, 13,
     "unknown memory level 'globl'"),
    ("Target sm_80 dtype fp16 head_dim 64\nCopyy K\n", 2, 1, "unknown statement 'Copyy'"),
    ("Target sm_80 dtype fp16 head_dim 64\nVariant softmax causal=yes\n", 2, 17, "takes no value"),
    ("Target sm_80 dtype fp16 head_dim 64\nVariant relu return_lse\n", 2, 1, "log-sum-exp"),
    ("Target sm_80 dtype fp99 head_dim 64\n", 1, 20, "unknown dtype"),
    ("Kernel k\n  for i in range(3)\n", 2, 3, "no `end`"),
    ("end\n", 1, 1, "`end` without"),
    ("Target sm_80 dtype fp16 head_dim 64\nCompute X = a < b < c\n", 2, 19, "unexpected '<'"),
    ("Target sm_80 dtype fp16 head_dim 64\nParams BLOCK_M = 6.5\n", 2, 18, "non-negative integer"),
    ("Target sm_80 dtype fp16 head_dim 64\ncompute X = 1\n", 2, 1, "case-sensitive"),
])
def test_syntax_errors_have_locations_and_hints(text, line, col, needle):
    with pytest.raises(TLSyntaxError) as info:
        parse(text, "f.tl")
    diags = info.value.diagnostics
    assert any(needle in (d.message + str(d.hint)) for d in diags), [str(d) for d in diags]
    first = next(d for d in diags if needle in (d.message + str(d.hint)))
    assert (first.line, first.col) == (line, col), str(first)
    assert str(first).startswith(f"f.tl:{line}:{col}: ")
    assert "\n" not in str(info.value)


def test_every_bad_line_is_reported():
    with pytest.raises(TLSyntaxError) as info:
        parse("Target sm_80 dtype fp16 head_dim 64\nFoo\nBar\n", "f.tl")
    assert [d.line for d in info.value.diagnostics] == [2, 3]
    assert "(and 1 more)" in str(info.value)


def test_sketch_accepts_free_text():
    program = parse("for n in key tiles up to the diagonal\n  Compute softmax of S somehow\nend\n")
    loop = program.body[0]
    assert loop.text == "key tiles up to the diagonal" and isinstance(loop.body[0], ast.ComputeText)
    assert parse(format_program(program)) == program
