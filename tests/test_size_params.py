"""Tiles per range of sizes: the TL's `Params when` lines, the manifest's conditional launches (Launch.when, a
launch's own tensor maps), their translation into one source, the checker, the interpreter, verification's cases at
each bound, and the expert's first choice (the sm90 table's causal d64 128x128 at N <= 1024)."""

from __future__ import annotations

import shutil

import pytest

from flashgen.abi import KernelManifest, Launch, TensorMapSpec, condition_parts, eval_condition
from flashgen.harness.environment import Environment
from flashgen.harness.static_check import static_check
from flashgen.harness.verify import default_cases
from flashgen.tl_spec import compare
from flashgen.tl_spec.checker import check
from flashgen.tl_spec.diagnostics import TLSyntaxError
from flashgen.tl_spec.parser import parse
from flashgen.tl_spec.printer import format_program
from flashgen.translators.lower import UnsupportedConstruct, translate
from flashgen.translators.params import choose_params_with_source, choose_size_params
from flashgen.variant import DType, Shape, Variant

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
SIZES = {"B": 2, "H": 4, "KVH": 4, "N": 1000, "M": 1000, "D": 64, "SPLITS": 1, "SMS": 132}


def _program(gpu: str = "h200", variant: Variant = Variant(causal=True), dtype: DType = DType.bf16, head_dim: int = 64,
             params: dict | None = None) -> str:
    env = Environment()
    target = env.target(gpu)
    params = params or env.choose_params(variant, target, dtype, head_dim)[0]
    return env.library_tl(variant, target, dtype, head_dim, form="full", params=params)


def _with_lines(text: str, *lines: str) -> str:
    head, sep, rest = text.partition("\nParams ")
    first, nl, body = rest.partition("\n")
    return head + sep + first + nl + "".join(line + "\n" for line in lines) + body


# ------------------------------------------------------------------------------ the language

def test_params_when_parses_prints_and_picks_by_size():
    text = _with_lines(_program(), "Params when N <= 1024: BLOCK_M = 128, WARPS = 8", "Params when 8192 < N: BLOCK_N = 64")
    program = parse(text)
    assert [(line.condition, line.params) for line in program.size_params] == [
        ("N <= 1024", {"BLOCK_M": 128, "WARPS": 8}), ("N > 8192", {"BLOCK_N": 64})]  # 8192 < N reads N > 8192
    printed = format_program(program)
    assert "Params when N <= 1024: BLOCK_M = 128, WARPS = 8\nParams when N > 8192: BLOCK_N = 64\n" in printed
    assert parse(printed) == program
    base = program.params
    assert program.params_at({"N": 1024}) == {**base, "BLOCK_M": 128, "WARPS": 8}
    assert program.params_at({"N": 4096}) == base
    assert program.params_at({"N": 8193})["BLOCK_N"] == 64 and program.params_at({"N": 8193})["BLOCK_M"] == base["BLOCK_M"]
    conditions = [when for when, _ in program.size_classes()]
    assert conditions == ["N <= 1024", "N > 8192 and N > 1024", "N > 1024 and N <= 8192"]
    for n in (1, 1024, 1025, 8192, 8193, 20000):  # the ranges cover every size once, with the params of params_at
        holding = [one for when, one in program.size_classes() if eval_condition(when, {"N": n})]
        assert len(holding) == 1 and holding[0].params == program.params_at({"N": n}) and not holding[0].size_params


@pytest.mark.parametrize("line, message", [
    ("Params when N <= 1024 and M > 3: BLOCK_M = 64", "one comparison"),
    ("Params when N: BLOCK_M = 64", "one comparison"),
    ("Params when D <= 64: BLOCK_M = 64", "compares a size with a non-negative integer"),
    ("Params when N <= 10.5: BLOCK_M = 64", "compares a size with a non-negative integer"),
    ("Params when N <= 1024: SPLITS = 2", "cannot change with the sizes"),
    ("Params when N <= 1024: BLOCK_M = 64, BLOCK_M = 128", "given twice"),
    ("Params when N <= 1024:", "sets no params"),
])
def test_a_bad_params_when_line_is_one_clear_error(line, message):
    with pytest.raises(TLSyntaxError, match=message):
        parse(_with_lines(_program(), line))


def test_the_checker_checks_every_range_and_names_the_line():
    ok = parse(_with_lines(_program(), "Params when N <= 1024: BLOCK_M = 128, WARPS = 8"))
    assert [d for d in check(ok) if d.severity == "error"] == []
    bad = parse(_with_lines(_program(), "Params when N <= 1024: BLOCK_M = 64, WARPS = 8"))
    errors = [d for d in check(bad) if d.severity == "error"]
    assert errors and all("(with `Params when N <= 1024`, line " in d.message for d in errors)


def test_the_interpreter_runs_each_range_with_its_tiles():
    # the fp64 meaning is the same at every size; each side of the bound interprets with its own tiles
    program = parse(_with_lines(_program("a100", params={"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2}),
                                "Params when N <= 40: BLOCK_M = 32, BLOCK_N = 32, WARPS = 2"))
    for n in (40, 41):
        assert compare(program, Shape(B=1, H=2, N=n, M=n + 7, D=64), seed=n).rel_err < 1e-9


# ------------------------------------------------------------------------------ the manifest

def test_launch_conditions_parse_evaluate_and_serialize_only_when_given():
    assert condition_parts("N <= 1024 and cdiv(M, 64) > 2") == [("N", "<=", "1024"), ("cdiv(M, 64)", ">", "2")]
    assert eval_condition("N <= 1024", {**SIZES, "N": 1024}) and not eval_condition("N <= 1024", {**SIZES, "N": 1025})
    assert eval_condition("N > 4 and M == 1000", SIZES)
    for bad in ("N", "N <= Q", "N <= 1 <= 2", "<= 3"):
        with pytest.raises(ValueError):
            condition_parts(bad)
    plain = Launch(kernel="k", grid=("1", "1", "1"), threads=128)
    assert "when" not in plain.model_dump_json() and "tensor_maps" not in plain.model_dump_json()
    assert plain.runs_at(SIZES)
    with pytest.raises(ValueError, match="not one comparison"):
        Launch(kernel="k", grid=("1", "1", "1"), threads=128, when="N = 3")


def test_the_manifest_picks_launches_and_maps_by_size_and_names_its_bounds():
    maps = [TensorMapSpec(tensor="q", box_rows=192)]
    own = [TensorMapSpec(tensor="q", box_rows=128)]
    manifest = KernelManifest(
        name="k", arch="sm_90a", dtype=DType.bf16, head_dim=64, variant=Variant(causal=True), tensor_maps=maps,
        launches=[Launch(kernel="small", grid=("1", "1", "1"), threads=384, when="N <= 1024", tensor_maps=own),
                  Launch(kernel="large", grid=("1", "1", "1"), threads=512, when="N > 1024")])
    assert [launch.kernel for launch in manifest.launches_at({**SIZES, "N": 512})] == ["small"]
    assert [launch.kernel for launch in manifest.launches_at({**SIZES, "N": 4096})] == ["large"]
    assert manifest.maps_of(manifest.launches[0]) == own and manifest.maps_of(manifest.launches[1]) == maps
    assert manifest.size_bounds == {"N": {1023, 1024, 1025}}
    bound_cases = {c.name: c.shape for c in default_cases(manifest) if c.name.startswith("bound_")}
    assert {s.N for s in bound_cases.values()} == {1023, 1024, 1025}
    assert KernelManifest.model_validate_json(manifest.model_dump_json()) == manifest


# ------------------------------------------------------------------------------ translation

def test_a_program_with_params_when_is_one_source_with_a_launch_per_range():
    text = _with_lines(_program(), "Params when N <= 1024: BLOCK_M = 128, WARPS = 8")
    t = translate(parse(text), "h200")
    small, large = t.manifest.launches
    assert (small.kernel, small.when) == ("fg_attn_fwd_causal_bf16_d64_sm_90_n_le_1024", "N <= 1024")
    assert (large.kernel, large.when) == ("fg_attn_fwd_causal_bf16_d64_sm_90", "N > 1024")
    assert small.grid[0] == "min(cdiv(N, 128) * H * B, SMS)" and large.grid[0] == "min(cdiv(N, 192) * H * B, SMS)"
    assert small.threads == 384 and large.threads == 512
    assert [m.box_rows for m in t.manifest.maps_of(small)][0] == 128  # Q's box is the range's BLOCK_M
    assert large.tensor_maps is None and t.manifest.tensor_maps[0].box_rows == 192
    assert t.manifest.params["BLOCK_M"] == 192  # the Params line's, for the record
    assert "tiles by size: N <= 1024: 128x128; else 192x128" in t.manifest.notes
    assert f"\n{small.kernel}(const FlashgenAttnParams" in t.source and f"\n{large.kernel}(const FlashgenAttnParams" in t.source
    assert static_check(t.source, t.manifest) == []


def test_a_range_that_changes_more_than_launches_is_refused():
    # split-KV's chunk count follows BLOCK_M: a range with another BLOCK_M would change the manifest's num_splits
    text = _program("a100", variant=Variant(split_kv=True, return_lse=True),
                    params={"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2, "SPLITS": 4})
    with pytest.raises(UnsupportedConstruct, match="num_splits"):
        translate(parse(_with_lines(text, "Params when N <= 16: BLOCK_M = 16, WARPS = 1")), "a100")


@needs_nvcc
@pytest.mark.parametrize("gpu, arch", [("h200", "sm_90a"), ("a100", "sm_80")])
def test_the_kernels_of_every_range_compile_into_one_cubin(gpu, arch, tmp_path):
    from flashgen.harness.compile import compile_cuda

    extra = "Params when N <= 1024: BLOCK_M = 128, WARPS = 8" if gpu == "h200" else \
        "Params when N <= 256: BLOCK_M = 64, BLOCK_N = 32, WARPS = 4"
    t = translate(parse(_with_lines(_program(gpu), extra)), gpu)
    result = compile_cuda(t.source, arch, cache_dir=tmp_path)
    assert result.ok, result.log[-2000:]
    assert {launch.kernel for launch in t.manifest.launches} <= set(result.kernels)


# ------------------------------------------------------------------------------ the choice

def test_the_sm90_table_gives_causal_d64_its_short_sequence_tiles():
    choice = choose_params_with_source(Variant(causal=True), "h200", DType.bf16, 64)
    assert choice.params["BLOCK_M"] == 192
    assert [(line.condition, line.params) for line in choice.by_size] == [("N <= 1024", {"BLOCK_M": 128, "WARPS": 8})]
    assert "measured_by_size" in choice.detail
    assert choose_size_params(Variant(), "h200", DType.bf16, 64) == []  # plain d64 keeps 192x128 at every N
    assert choose_size_params(Variant(causal=True), "a100", DType.bf16, 64) == []


def test_the_expert_writes_the_size_lines_with_its_first_choice_only():
    env = Environment()
    target = env.target("h200")
    source, manifest, tl = env.expert_kernel(Variant(causal=True), target, DType.bf16, 64)
    assert "Params when N <= 1024: BLOCK_M = 128, WARPS = 8" in tl
    assert [launch.when for launch in manifest.launches] == ["N <= 1024", "N > 1024"]
    later = env.choose_params(Variant(causal=True), target, DType.bf16, 64)[1]
    assert "Params when" not in env.library_tl(Variant(causal=True), target, DType.bf16, 64, form="full", params=later)
