"""Deliberately broken programs: each is rejected by the checker or caught by the interpreter."""

import pytest

from flashgen.errors import FlashgenError
from flashgen.tl_spec import check, compare, library, parse
from flashgen.tl_spec.diagnostics import errors_only
from flashgen.variant import Shape, Variant

SHAPE = Shape(B=1, H=2, N=150, M=333, D=64)


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def _errors(text: str, target=None) -> list[str]:
    return [str(d) for d in errors_only(check(parse(text, "broken.tl"), target))]


def _rel_err(text: str, shape: Shape = SHAPE) -> float:
    program = parse(text, "broken.tl")
    assert _errors(text) == [], "expected the checker to accept it (the interpreter must catch it)"
    return compare(program, shape, seed=3).rel_err


def test_missing_rescale_is_caught_by_the_interpreter():
    text = library.render(Variant(return_lse=True), explicit_softmax=True)
    assert _rel_err(text) < 1e-9
    assert _rel_err(_edit(text, "          Compute O_r = O_r * alpha\n", "")) > 1e-2


def test_wrong_causal_mask_is_caught():
    text = library.load("causal")
    # one key short per row: every row changes a little, the rows that see a single key become empty
    assert _rel_err(_edit(text, "k_idx <= q_idx + M - N", "k_idx < q_idx + M - N")) > 1e-4
    assert _rel_err(_edit(text, "k_idx <= q_idx + M - N", "k_idx < q_idx + M - N"), Shape(B=1, H=2, N=90, M=70, D=64)) \
        > 1e-2
    # not aligned bottom-right (top-left instead): differs when N != M
    assert _rel_err(_edit(text, "k_idx <= q_idx + M - N", "k_idx <= q_idx")) > 1e-2


def test_missing_key_bound_mask_is_caught():
    text = library.load("plain")
    # the zero-filled keys past M (score 0) leak into the softmax
    assert _rel_err(_edit(text, "where(k_idx < M, S_r, -inf)", "where(k_idx < M + BLOCK_N, S_r, -inf)")) > 1e-3


def test_off_by_one_causal_tile_loop_is_caught():
    text = library.load("causal")
    bound = "cdiv(q0 + BLOCK_M + M - N, BLOCK_N))"
    assert _rel_err(_edit(text, bound, "cdiv(q0 + BLOCK_M + M - N, BLOCK_N) - 1)")) > 1e-2  # a tile short
    assert _rel_err(_edit(text, "for n_blk in range(n_end)", "for n_blk in range(1, n_end)")) > 1e-2


def test_off_by_one_window_start_is_caught():
    text = library.load("window")
    assert _rel_err(_edit(text, "(q0 + M - N - window + 1) // BLOCK_N", "(q0 + M - N - window + 1) // BLOCK_N + 1")) \
        > 1e-2


def test_gemm_on_global_memory_is_rejected():
    errors = _errors(_edit(library.load("plain"), "Compute GEMM Q_r, K_s^T and get S_r",
                           "Compute GEMM Q_r, K^T and get S_r"))
    assert any("global memory" in e and "GEMM" in e for e in errors), errors


def test_missing_reshape_is_rejected():
    text = _edit(library.load("plain"), "          Reshape S_r into P_r\n", "")
    errors = _errors(_edit(text, "Compute GEMM P_r, V_s and accumulate O_r", "Compute GEMM S_r, V_s and accumulate O_r"))
    assert any("missing Reshape" in e for e in errors), errors


def test_copy_the_wrong_way_is_rejected():
    errors = _errors(_edit(library.load("plain"), "Copy Q_s from shared to register Q_r",
                           "Copy Q_s from register to shared Q_r"))
    assert any("lives in shared memory" in e for e in errors), errors
    errors = _errors(_edit(library.load("plain"), "Copy O_r from register to global O[", "Copy O_r from register to global Q["))
    assert any("input" in e for e in errors), errors


def test_undefined_and_reused_names_are_rejected():
    errors = _errors(_edit(library.load("plain"), "Compute S_r = S_r * (scale * log2e)", "Compute S_r = S_r * (scal * log2e)"))
    assert any("undefined name 'scal'" in e for e in errors), errors
    errors = _errors(_edit(library.load("plain"), "Let k0 = n_blk * BLOCK_N", "Let q0 = n_blk * BLOCK_N"))
    assert any("'q0' is already defined" in e for e in errors), errors


def test_read_before_write_is_rejected():
    errors = _errors(_edit(library.load("plain"), "        Compute l_i = 0\n", ""))
    assert any("'l_i' is read before anything writes it" in e for e in errors), errors


def test_shape_mismatch_and_bad_slice_are_rejected():
    errors = _errors(_edit(library.load("plain"), "K[b, h, k0 : k0 + BLOCK_N, 0 : D]", "K[b, h, k0 : k0 + BLOCK_M + 1, 0 : D]"))
    assert any("spans 65 elements" in e for e in errors), errors
    d128 = library.render(Variant(), head_dim=128)  # BLOCK_N != D, so a missing ^T shows in the shapes
    errors = _errors(_edit(d128, "Compute GEMM Q_r, K_s^T and get S_r", "Compute GEMM Q_r, K_s and get S_r"))
    assert any("GEMM shapes do not match" in e for e in errors), errors


def test_params_that_do_not_divide_are_rejected():
    errors = _errors(_edit(library.load("plain"), "WARPS = 4", "WARPS = 3"))
    assert any("16 * WARPS" in e for e in errors), errors
    errors = _errors(library.render(Variant(), head_dim=68))
    assert any("head dim 68 is not supported: head dims are multiples of 8" in e for e in errors), errors
    assert not _errors(library.render(Variant(), head_dim=72))  # short of the k-step (16): the kernel pads it


def test_budgets_against_the_target():
    big = library.render(Variant(), params={"BLOCK_M": 128, "BLOCK_N": 256, "WARPS": 4, "STAGES": 3}, head_dim=128)
    errors = _errors(big, "t4")
    assert any("bytes of shared memory; t4 allows 65536" in e for e in errors), errors
    assert any("registers per thread" in e for e in errors), errors
    assert not any("shared memory" in e for e in _errors(library.load("plain"), "a100"))


def test_interpreter_catches_missing_init_even_without_check():
    text = _edit(library.load("plain"), "        Compute O_r = 0\n", "")
    assert compare(parse(text), SHAPE, 0).rel_err == float("inf")  # NaN poison reaches the output


@pytest.mark.parametrize("name", library.list_programs())
def test_removing_any_compute_line_breaks_the_program(name):
    lines = library.load(name).splitlines(keepends=True)
    shape = {"gqa": Shape(B=1, H=2, KVH=1, N=70, M=150, D=64), "mqa": Shape(B=1, H=4, KVH=1, N=70, M=150, D=64),
             "decode_splitkv": Shape(B=1, H=1, N=2, M=150, D=64)}.get(name, Shape(B=1, H=2, N=70, M=150, D=64))
    if name == "window":
        shape = Shape(B=1, H=1, N=150, M=300, D=64)  # rows whose window starts past the first tile
    compute_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("Compute")]
    assert len(compute_lines) >= 5
    for i in compute_lines:
        text = "".join(lines[:i] + lines[i + 1:])
        program = parse(text, f"{name}-without-line-{i + 1}")
        if errors_only(check(program)):
            continue
        try:
            rel = compare(program, shape, seed=5).rel_err
        except FlashgenError:
            continue
        assert rel > 1e-3, f"{name}: removing line {i + 1} ({lines[i].strip()}) still passes (rel_err {rel:.1e})"
