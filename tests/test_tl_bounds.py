"""Bounds on TL input (issue 12): the interpreter's operation budget, loop counts the checker refuses,
a nesting limit, and a fuzz test of the parser and checker (every input: success or one-line error)."""

import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen.errors import FlashgenError
from flashgen.harness.environment import interpret_shapes
from flashgen.tl_spec import TLBudgetError, ast, check, format_program, interpret, library, parse
from flashgen.tl_spec import interpreter as interp
from flashgen.tl_spec.diagnostics import errors_only
from flashgen.variant import Shape

LIB = Path(library.LIBRARY_DIR)
KEY_LOOP = "for n_blk in range(cdiv(M, BLOCK_N))"


def run_cli(monkeypatch, capsys, *args):
    from flashgen import cli

    monkeypatch.setattr(sys, "argv", ["flashgen", "tl", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _plain(loop: str = KEY_LOOP) -> str:
    text = library.load("plain")
    assert KEY_LOOP in text
    return text.replace(KEY_LOOP, loop)


def _one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code != 0, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert "internal error" not in err and "Traceback" not in err + out


# ---------------------------------------------------------------------------- 1. operation budget

def test_interpreter_stops_a_runaway_loop_with_its_budget():
    program = parse(_plain("for n_blk in range(1000000000)"), "runaway.tl")
    start = time.monotonic()
    with pytest.raises(TLBudgetError, match=r"runaway.tl:\d+:\d+: the interpreter's operation budget .* 'for n_blk'"):
        interpret(program, Shape(B=1, H=1, N=64, M=64, D=64))
    assert time.monotonic() - start < 20


def test_interpreter_caps_a_giant_grid():
    program = parse(library.load("plain").replace("parallel range(B)", "parallel range(1000000000)"), "grid.tl")
    with pytest.raises(TLBudgetError, match="grid"):
        interpret(program, Shape(B=1, H=1, N=64, M=64, D=64))


def test_tl_run_reports_the_budget_in_one_line(tmp_path, monkeypatch, capsys):
    # M * M passes the checker (it is below B*H*N*M at any size) but is 64x the key tiles at M = 64
    path = tmp_path / "long.tl"
    path.write_text(_plain("for n_blk in range(M * M)"))
    code, out, err = run_cli(monkeypatch, capsys, "run", str(path), "--shape", "B=1,H=1,N=64,M=64,D=64")
    _one_line_error(code, out, err, "operation budget")


@pytest.mark.parametrize("name", list(library.PROGRAMS))
def test_library_fits_a_quarter_of_the_budget(name, monkeypatch):
    monkeypatch.setattr(interp, "BUDGET_FACTOR", interp.BUDGET_FACTOR / 4)
    variant = library.PROGRAMS[name]
    program = parse(library.load(name), f"{name}.tl")
    g = variant.kv_group
    cli_default = Shape(B=2, H=4 * g, KVH=4 if g > 1 else None, N=200, M=333, D=64)
    for shape in (cli_default, interpret_shapes(variant, 64)[0], Shape(B=1, H=g, KVH=1, N=1, M=1, D=64)):
        interpret(program, shape)


# ---------------------------------------------------------------------------- 2. loop counts in the checker

@pytest.mark.parametrize("loop, needle", [("for n_blk in range(1000000000)", "whatever the shape"),
                                          ("for n_blk in range(2, 2000000)", "whatever the shape"),
                                          ("for n_blk in range(N * N * N)", "more than B*H*N*M")])
def test_checker_refuses_loop_counts_beyond_any_shape(loop, needle):
    errors = [str(d) for d in errors_only(check(parse(_plain(loop), "long.tl")))]
    assert any("beyond any real shape" in e and needle in e for e in errors), errors


def test_tl_check_refuses_a_billion_iterations(tmp_path, monkeypatch, capsys):
    path = tmp_path / "billion.tl"
    path.write_text(_plain("for n_blk in range(1000000000)"))
    code, out, err = run_cli(monkeypatch, capsys, "check", str(path))
    _one_line_error(code, out, err, "beyond any real shape")


def test_checker_keeps_real_loop_counts():
    for loop in ("for n_blk in range(M)", "for n_blk in range(B * H * cdiv(N, BLOCK_M))", "for n_blk in range(4096)"):
        assert not [d for d in errors_only(check(parse(_plain(loop)))) if "beyond" in d.message], loop


# ---------------------------------------------------------------------------- 3. nesting

def _deep_blocks(depth: int) -> str:
    lines = library.load("plain").splitlines()
    i = next(k for k, line in enumerate(lines) if "Compute O_r = 0" in line)
    return "\n".join(lines[:i] + [f"for x{j} in range(1)" for j in range(depth)] + [lines[i]] + ["end"] * depth
                     + lines[i + 1:]) + "\n"


def _deep_expr(expr: str) -> str:
    return library.load("plain").replace("Compute O_r = 0", f"Compute O_r = {expr}")


@pytest.mark.parametrize("text", [_deep_blocks(900), _deep_expr("-" * 900 + "0"), _deep_expr("+".join(["0"] * 900)),
                                  _deep_expr("max(" * 900 + "0" + ", 0)" * 900), _deep_expr("not " * 900 + "0")])
@pytest.mark.parametrize("command", ["check", "fmt", "run"])
def test_deep_nesting_is_one_line(text, command, tmp_path, monkeypatch, capsys):
    path = tmp_path / "deep.tl"
    path.write_text(text)
    code, out, err = run_cli(monkeypatch, capsys, command, str(path))
    _one_line_error(code, out, err, "nested too deeply")


def test_deep_parentheses_are_harmless(tmp_path, monkeypatch, capsys):
    path = tmp_path / "parens.tl"
    path.write_text(_deep_expr("(" * 900 + "0" + ")" * 900))
    code, out, err = run_cli(monkeypatch, capsys, "check", str(path))
    assert code == 0 and "internal error" not in err


def test_deepest_accepted_program_runs_everywhere():
    # 32 blocks (Kernel, 3 grid loops, 28 more) and a 60-deep expression: parse, check, print, run
    text = _deep_blocks(28).replace("Compute O_r = 0", "Compute O_r = " + " + ".join(["0"] * 60))
    program = parse(text)
    assert not errors_only(check(program))
    assert parse(format_program(program)) == program
    interpret(program, Shape(B=1, H=1, N=40, M=40, D=64))
    with pytest.raises(FlashgenError, match="nested too deeply"):
        parse(_deep_blocks(29))


def test_deep_ast_built_without_the_parser_is_refused():
    program = parse(library.load("plain"), "built.tl")
    deep: object = ast.Num(value=0)
    for _ in range(900):
        deep = ast.Unary(op="-", operand=deep)
    node = next(s for s in program.statements() if isinstance(s, ast.ComputeAssign))
    node.expr = deep
    [diag] = check(program)
    assert "nested more than" in diag.message
    with pytest.raises(FlashgenError, match="nested more than"):
        format_program(program)
    with pytest.raises(FlashgenError, match="nested more than"):
        interpret(program, Shape(B=1, H=1, N=40, M=40, D=64))


# ---------------------------------------------------------------------------- 4. fuzz

_SOURCES = [library.load(name, form) for name in ("plain", "causal", "decode_splitkv", "window") for form in
            ("full", "sketch")]
_TOKENS = ["for", "in", "parallel", "range", "(", ")", "end", "Kernel", "Copy", "from", "to", "global", "shared",
           "register", "Compute", "GEMM", "and", "get", "accumulate", "OnlineSoftmax", "with", "max", "sum",
           "rescale", "Allocate", "shape", "dtype", "offset", "[", "]", ",", ":", "=", "Let", "Reshape", "into",
           "Target", "Variant", "Params", "^T", "-", "+", "*", "//", "%", "not", "<=", "==", "inf", "0", "1e308",
           "99999999999999999999", "-1", "B", "N", "M", "D", "q_idx", "k_idx", "as", "scaled", "fp16", "#", "\t"]


def _mutate(data: st.DataObject) -> str:
    lines = data.draw(st.sampled_from(_SOURCES)).splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["del_line", "dup_line", "swap_lines", "del_token", "dup_token",
                                          "swap_tokens", "insert_token", "bytes"]))
        i = data.draw(st.integers(0, len(lines) - 1)) if lines else 0
        if not lines:
            lines = [data.draw(st.text(max_size=40))]
        elif kind == "del_line":
            del lines[i]
        elif kind == "dup_line":
            lines[i:i] = [lines[i]] * data.draw(st.integers(1, 3))
        elif kind == "swap_lines":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "bytes":
            raw = bytearray(lines[i].encode())
            pos = data.draw(st.integers(0, len(raw)))
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=6))
            lines[i] = raw.decode("utf-8", "replace")
        else:
            tokens = lines[i].split(" ")
            k = data.draw(st.integers(0, len(tokens) - 1))
            if kind == "del_token":
                del tokens[k]
            elif kind == "dup_token":
                tokens.insert(k, tokens[k])
            elif kind == "swap_tokens":
                m = data.draw(st.integers(0, len(tokens) - 1))
                tokens[k], tokens[m] = tokens[m], tokens[k]
            else:
                tokens.insert(k, data.draw(st.sampled_from(_TOKENS)))
            lines[i] = " ".join(tokens)
    return "\n".join(lines) + "\n"


def _parse_and_check(text: str) -> None:
    try:
        program = parse(text, "fuzz.tl")
    except FlashgenError as exc:
        assert "\n" not in str(exc), str(exc)
        return
    for d in check(program):
        assert "\n" not in str(d), str(d)
    format_program(program)


_FUZZ = settings(max_examples=150, deadline=2000, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_FUZZ
@given(st.data())
def test_fuzz_mutated_library_programs(data):
    _parse_and_check(_mutate(data))


@_FUZZ
@given(st.lists(st.sampled_from(_TOKENS + [" ", " ", "\n", "\n", "x", "S_r", "_"]), max_size=120).map("".join)
       | st.lists(st.sampled_from(_TOKENS), max_size=60).map(" ".join) | st.text(max_size=200))
def test_fuzz_random_programs(text):
    _parse_and_check(text)
