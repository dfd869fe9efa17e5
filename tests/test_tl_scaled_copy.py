"""`Copy ... from global to shared X_s as scaled fp16`: the converting load of bf16/fp32 tiles on tensor cores
that take fp16 only (sm_75). Syntax, checker rules, budgets at the declared dtype, fp64 semantics, library."""

import pytest

from flashgen.targets import tensor_cores_take
from flashgen.tl_spec import TLSyntaxError, ast, check, compare, format_program, library, parse
from flashgen.variant import DType, Shape, Variant

LOAD_K = "Copy K[b, h, k0 : k0 + BLOCK_N, 0 : D] from global to shared K_s"
LOCAL_Q = "Copy Q_s from shared to register Q_r"


def _sm75(dtype: str, **kwargs) -> str:
    return library.render(Variant(causal=True, return_lse=True), dtype=dtype, arch="sm_75", **kwargs)


def _edit(text: str, replace: dict[str, str]) -> str:
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def _errors(text: str, target: str = "t4") -> list[str]:
    return [str(d) for d in check(parse(text), target) if d.severity == "error"]


def test_converting_copy_round_trips_in_full_and_sketch_form():
    text = _sm75("bf16")
    assert f"{LOAD_K} as scaled fp16\n" in text
    program = parse(text)
    loads = [s for s in program.statements() if isinstance(s, ast.Copy) and s.dst_level is ast.Level.shared]
    assert [(c.src.name, c.scaled_to) for c in loads] == [("Q", DType.fp16), ("K", DType.fp16), ("V", DType.fp16)]
    assert format_program(program) == text and parse(format_program(program)) == program
    sketch = parse("Copy K from global to shared as scaled fp16\n")
    assert sketch.body[0].scaled_to is DType.fp16 and sketch.body[0].dst is None
    assert format_program(sketch) == "Copy K from global to shared as scaled fp16\n"
    plain = parse(f"{LOAD_K}\n").body[0]
    assert plain.scaled_to is None and parse(format_program(parse(f"{LOAD_K}\n"))).body[0] == plain


@pytest.mark.parametrize("line, needle, hint", [
    (f"{LOAD_K} as fp16", "expected 'scaled'", "[as scaled fp16]"),
    (f"{LOAD_K} as scaled fp8", "unknown dtype 'fp8'", "fp16, bf16 or fp32"),
    (f"{LOAD_K} as scaled", "line ends too early", "[as scaled fp16]"),
])
def test_malformed_conversion_is_a_syntax_error(line, needle, hint):
    with pytest.raises(TLSyntaxError) as info:
        parse(line + "\n")
    message = str(info.value)
    assert needle in message and hint in message.partition("(hint: ")[2]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_library_converts_only_where_the_tensor_cores_lack_the_dtype(dtype):
    assert not tensor_cores_take("sm_75", dtype) and tensor_cores_take("sm_75", "fp16")
    assert all(tensor_cores_take(arch, dtype) for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"))
    text = _sm75(dtype)
    assert "Allocate K_s in shared shape [BLOCK_N, D] dtype fp16" in text
    assert _errors(text) == []
    assert "as scaled" not in _sm75("fp16")
    for arch in ("sm_80", "sm_90"):
        native = library.render(Variant(causal=True), dtype=dtype, arch=arch)
        assert "as scaled" not in native and f"Allocate K_s in shared shape [BLOCK_N, D] dtype {dtype}" in native
    assert "as scaled fp16" in library.render(Variant(), dtype=dtype, arch="sm_75", form="sketch")


@pytest.mark.parametrize("dtype, replace, needle", [
    ("bf16", {LOCAL_Q: f"{LOCAL_Q} as scaled fp16"}, "converts a load from global into shared memory"),
    ("fp32", {"Allocate K_s in shared shape [BLOCK_N, D] dtype fp16": "Allocate K_s in shared shape [BLOCK_N, D] "
              "dtype fp32"}, "into 'K_s' of dtype fp32; the converted tile is fp16"),
    ("bf16", {f"{LOAD_K} as scaled fp16": f"{LOAD_K} as scaled bf16"}, "a load converts only to fp16"),
    ("fp16", {LOAD_K: f"{LOAD_K} as scaled fp16"}, "in an fp16 program: there is nothing to convert"),
    ("bf16", {f"{LOAD_K} as scaled fp16": LOAD_K}, "into fp16 shared tile 'K_s' without a conversion"),
])
def test_checker_rejects_the_conversion_where_it_does_not_apply(dtype, replace, needle):
    errors = _errors(_edit(_sm75(dtype), replace))
    assert len(errors) == 1 and needle in errors[0], errors


def test_checker_warns_where_the_tensor_cores_take_the_dtype():
    text = _edit(_sm75("bf16"), {"Target sm_75": "Target sm_80"})
    diags = check(parse(text), "a100")
    assert not [d for d in diags if d.severity == "error"]
    warned = [d for d in diags if "tensor cores of a100 take bf16" in d.message]
    assert len(warned) == 3  # Q, K and V loads


def test_budget_counts_shared_tiles_at_their_declared_dtype():
    # d256, BLOCK_M 64, BLOCK_N 32, STAGES 2: Q 64*256 + (K + V) 2 * 32*256 * 2 stages = 49152 elements
    params = {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 4, "STAGES": 2}
    converted = _sm75("fp32", params=params, head_dim=256)
    assert any("needs 98304 bytes of shared memory" in e for e in _errors(converted))  # 2 bytes an element
    unconverted = _edit(converted, {" as scaled fp16": "", "dtype fp16": "dtype fp32"})
    assert any("needs 196608 bytes of shared memory" in e for e in _errors(unconverted))  # fp32: 4, no special case
    fits = _sm75("fp32", params={**params, "BLOCK_N": 16, "STAGES": 1}, head_dim=256)  # 49152 bytes as fp16
    assert _errors(fits) == []
    assert any("needs 98304 bytes" in e for e in _errors(_edit(fits, {" as scaled fp16": "", "dtype fp16": "dtype fp32"})))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_interpreter_runs_the_converting_load_exactly(dtype):
    result = compare(parse(_sm75(dtype)), Shape(B=1, H=2, N=37, M=53, D=64), seed=3)
    assert result.rel_err < 1e-12


def test_interpreter_refuses_a_conversion_that_is_not_a_shared_load():
    from flashgen.tl_spec import TLRuntimeError

    text = _edit(_sm75("bf16"), {LOCAL_Q: f"{LOCAL_Q} as scaled fp16"})
    with pytest.raises(TLRuntimeError, match="converts only a load from global to shared"):
        compare(parse(text), Shape(B=1, H=1, N=16, M=16, D=64))
