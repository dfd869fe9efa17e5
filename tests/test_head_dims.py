"""Issue 15 item 3 on the CPU: every head dim from 8 to 256 in steps of 8 on every code path (sm75, sm80, sm90),
padded inside the kernel where the tensor cores' k-step needs it, and the `headdims` bench suite that measures what
that costs. The GPU half (every dim through the harness's verification) is tests/test_head_dims_gpu.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from flashgen.errors import UsageError
from flashgen.translators.backends import get_backend
from flashgen.translators.backends.base import tile_bytes, tiles_bytes
from flashgen.translators.params import choose_params, choose_params_with_source
from flashgen.translators.plan import NATIVE_HEAD_DIMS, KernelPlan, native_head_dim, padded_head_dim
from flashgen.translators.render import render, smem_bytes, smem_limit
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import SUPPORTED_HEAD_DIMS, DType, Shape, Variant, check_head_dim, head_dim_problem

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

RULE = ("head dims are multiples of 8 from 8 to 256 (rows move in 16-byte chunks, 8 elements of 16 bits; pad the "
        "tensors' last axis to the next multiple yourself)")
# FlashAttention-2's test grid has d = 59 and 111, which it pads by copying the tensors; flashgen refuses them
BAD_HEAD_DIMS = (7, 12, 0, 264, 59, 111, -8)
# the GPUs whose code paths the dims run on: t4 (sm75), a100 (sm80), h200 (sm90 for fp16/bf16, sm80 for fp32)
TARGETS = ("t4", "a100", "h200")


# ------------------------------------------------------------------------------------------------ the contract

def test_supported_head_dims_are_every_multiple_of_8_to_256():
    assert SUPPORTED_HEAD_DIMS == (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152,
                                   160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256)
    assert all(check_head_dim(d) == d and head_dim_problem(d) is None for d in SUPPORTED_HEAD_DIMS)
    assert all(get_backend(name).head_dims == SUPPORTED_HEAD_DIMS for name in ("sm75", "sm80", "sm90"))


@pytest.mark.parametrize("head_dim", BAD_HEAD_DIMS)
def test_a_bad_head_dim_is_one_line_saying_what_is_supported_and_why(head_dim):
    with pytest.raises(UsageError) as caught:
        check_head_dim(head_dim)
    assert str(caught.value) == f"head dim {head_dim} is not supported: {RULE}"
    with pytest.raises(UsageError) as caught:
        check_head_dim(head_dim, "--head-dim")
    assert str(caught.value) == f"--head-dim {head_dim}: {RULE}"


@pytest.mark.parametrize("head_dim", (7, 12, 0, 264))
def test_every_entry_point_refuses_a_bad_head_dim_with_the_contract(head_dim, tmp_path):
    from flashgen.api import generate
    from flashgen.library.spec import parse_spec
    from flashgen.tl_spec import check, library, parse
    from flashgen.translators import UnsupportedConstruct, translate

    problem = f"head dim {head_dim} is not supported: {RULE}"
    with pytest.raises(UsageError, match=re.escape(problem)):
        plan_for_variant(Variant(), "sm_80", DType.fp16, head_dim)
    good = plan_for_variant(Variant(), "sm_80", DType.fp16, 64)
    with pytest.raises(ValueError, match=re.escape(problem)):
        KernelPlan(**{**good.model_dump(), "target": good.target, "head_dim": head_dim})
    with pytest.raises(UsageError, match=re.escape(problem)):
        generate(gpu="a100", head_dim=head_dim, out=tmp_path / "never")
    with pytest.raises(UsageError, match=re.escape(f"spec: head_dims: {problem}")):
        parse_spec({"gpus": ["h200"], "dtypes": ["fp16"], "variants": ["plain"], "head_dims": [64, head_dim]})
    if head_dim > 0:  # the TL's head_dim is a positive number by its grammar
        program = parse(library.render(Variant(), dtype=DType.fp16, arch="sm_80", head_dim=head_dim))
        assert [d.message for d in check(program) if "head" in d.message] == [problem]  # said once, not per GEMM
        with pytest.raises(UnsupportedConstruct, match=re.escape(problem)):
            translate(program, "a100")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("command", [("generate", "--gpu", "a100"),
                                     ("tune", "--gpu", "a100", "--dtype", "bf16")])
def test_the_cli_refuses_a_bad_head_dim_in_one_line(command, tmp_path):
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "flashgen", *command, "--head-dim", "12"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"error: --head-dim 12: {RULE}"]


# ------------------------------------------------------------------------------------------------ the padding rule

def test_tiles_pad_to_the_k_step_and_tables_borrow_from_the_native_dim_at_or_above():
    # 16-bit tiles to 16 columns (m16n8k16, wgmma k16; Turing's two m16n8k8), fp32 (tf32 m16n8k8) to 8: none
    assert [padded_head_dim(d, 2) for d in (8, 16, 24, 40, 48, 248, 256)] == [16, 16, 32, 48, 48, 256, 256]
    assert [padded_head_dim(d, 4) for d in (8, 24, 40, 248)] == [8, 24, 40, 248]
    assert NATIVE_HEAD_DIMS == (64, 96, 128, 256)
    assert [native_head_dim(d) for d in (8, 64, 72, 96, 104, 128, 136, 248, 256)] == [64, 64, 96, 96, 128, 128, 256,
                                                                                       256, 256]
    # st_layout: 48 columns of fp16 are 6 chunks, padded to 7 a row (an odd stride); 64 are 8, XOR-swizzled
    assert tile_bytes(128, 48, 2) == 128 * 56 * 2 and tile_bytes(128, 64, 2) == 128 * 64 * 2
    assert tiles_bytes(128, 64, 40, 2, stages=2) == tiles_bytes(128, 64, 48, 2, stages=2) == 128 * 56 * 2 + 4 * 64 * 56 * 2


def test_a_padded_plan_counts_its_padded_tiles_against_shared_memory():
    plan = plan_for_variant(Variant(), "a100", DType.fp16, 40)
    assert (plan.block_m, plan.block_n, plan.stages) == (128, 64, 2)  # d64's entry
    # Q 128 x 48 columns (7 chunks a row with the padding chunk), K and V 64 x 48 twice each
    assert smem_bytes(plan) == 128 * 56 * 2 + 2 * 2 * 64 * 56 * 2 == 43008
    assert render(plan)[1].launches[0].smem_bytes == 43008
    for target in (*TARGETS, "a10"):
        for dtype in DType:
            for d in SUPPORTED_HEAD_DIMS:
                plan = plan_for_variant(Variant(causal=True), target, dtype, d)
                assert smem_bytes(plan) <= smem_limit(target), (target, dtype, d)


def test_an_in_between_dim_takes_the_tile_parameters_of_the_native_dim_at_or_above():
    from flashgen.targets import get_target
    from flashgen.translators.backends import backend_for

    variant = Variant(causal=True)
    borrowed = 0
    for target in TARGETS:
        for dtype in DType:
            tables = backend_for(get_target(target), variant, dtype).defaults
            for d in (d for d in SUPPORTED_HEAD_DIMS if d not in NATIVE_HEAD_DIMS):
                choice = choose_params_with_source(variant, target, dtype, d, tuned=False)
                assert choice.source in ("measured", "defaults"), (target, dtype, d, choice)
                if (dtype.value, d) in tables:  # an entry of its own: the native one spilled there
                    assert "takes the nearest" not in choice.detail, (target, dtype, d)
                    continue
                native = choose_params_with_source(variant, target, dtype, native_head_dim(d), tuned=False)
                assert choice.params == native.params, (target, dtype, d)
                assert choice.detail == f"{native.detail} (d{d} takes the nearest native head dim at or above it)"
                borrowed += 1
    assert borrowed == 3 * 3 * 28 - 2 * 10  # every in-between dim but fp32's own entries on the sm80 path
    assert "MEASURED[sm_90, bf16, 128, causal] (d112 takes" in choose_params_with_source(
        variant, "h200", DType.bf16, 112, tuned=False).detail
    # fp32 between the native dims spilled with the native entry (ptxas): its own, 8 warps of 16 rows
    for d in (104, 120, 200, 248):
        assert choose_params(Variant(), "a100", DType.fp32, d, tuned=False)["WARPS"] == 8
    assert choose_params(Variant(), "a100", DType.fp32, 136, tuned=False) == \
        choose_params(Variant(), "a100", DType.fp32, 256, tuned=False)


def test_the_sources_pad_q_and_k_and_write_only_d_columns():
    def source(target, dtype, d):
        return render(plan_for_variant(Variant(), target, dtype, d))[0]

    sm80 = source("a100", DType.fp16, 40)
    assert "constexpr int D = 40;" in sm80 and "constexpr int D_PAD = 48;" in sm80
    assert "using QLayout = fg::st_layout<BLOCK_M, D_PAD, sizeof(T)>;" in sm80
    assert "fg::block::tile_loader<BLOCK_N, D, D_PAD, T, THREADS> k_loader;" in sm80
    assert "fg::warp::attn_mma16<T, MT, D, D_PAD, BLOCK_N," in sm80 and "float acc_o[MT][D / 8][4];" in sm80
    assert "constexpr int O_CHUNKS = D / QLayout::CHUNK_ELEMS;" in sm80  # O's own columns, not the padding
    assert "constexpr int D_PAD = 64;" in source("a100", DType.fp16, 64)
    assert "constexpr int D_PAD = 40;" in source("a100", DType.fp32, 40)  # tf32's k-step is 8
    turing = source("t4", DType.bf16, 40)
    assert "constexpr int D_PAD = 48;" in turing and "scaled_tile_loader<BLOCK_N, D, D_PAD, T, THREADS," in turing
    hopper = source("h200", DType.bf16, 40)
    assert "constexpr int D_PAD = 48;" in hopper and "for (int kk = 0; kk < D_PAD / 16; ++kk)" in hopper
    assert "rs_m64n40k16_bf16(acc, a, b)" in hopper  # P V with N = D: wgmma takes any multiple of 8
    assert "constexpr int CHUNKS = 1;" in hopper  # one 64-column TMA box: columns 40..63 arrive as zeros


# ------------------------------------------------------------------------------------------------ compiled

COMPILE_DIMS = (8, 24, 40, 48, 80, 112, 160, 192, 224, 256)
ARCHS = {"t4": "sm_75", "a100": "sm_80", "h200": "sm_90a"}


def _compile_group(arch: str, plans: list[KernelPlan]) -> dict:
    from flashgen.harness.compile import compile_cuda

    result = compile_cuda("\n".join(render(p)[0] for p in plans), arch, filename=f"head_dims_{arch}.cu")
    assert result.ok, result.feedback_text(3000)
    return result.kernels


@needs_nvcc
def test_padded_dims_compile_without_spills_where_their_native_dims_have_none():
    """Every path and 16-bit dtype, plain and causal, at padded dims and beside the native dims they borrow their
    tiles from (fp32 too where its entries differ); a Hopper kernel is a translation unit of its own."""
    dims = sorted(set(COMPILE_DIMS) | {native_head_dim(d) for d in COMPILE_DIMS})
    jobs = [(target, dtype, d) for target in ARCHS for dtype in (DType.fp16, DType.bf16) for d in dims]
    jobs += [("a100", DType.fp32, d) for d in (40, 64, 104, 120, 128, 200, 248, 256)]
    plans = [plan_for_variant(Variant(causal=causal), target, dtype, d,
                              name=f"k_{target}_{dtype.value}_d{d}_{'causal' if causal else 'plain'}")
             for target, dtype, d in jobs for causal in (False, True)]
    groups: list[tuple[str, list[KernelPlan]]] = []
    for target, arch in ARCHS.items():
        mine = [p for p in plans if p.name.startswith(f"k_{target}_")]
        size = 1 if arch == "sm_90a" else 8  # Hopper kernels each define their own wgmma wrappers
        groups += [(arch, mine[i:i + size]) for i in range(0, len(mine), size)]
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        usage = {}
        for kernels in pool.map(lambda group: _compile_group(*group), groups):
            usage.update(kernels)
    spills = {p.name: usage[p.name].spill_store_bytes + usage[p.name].spill_load_bytes for p in plans}
    assert len(spills) == len(plans) == 2 * len(jobs)
    for p in plans:
        native = spills[p.name.replace(f"_d{p.head_dim}_", f"_d{native_head_dim(p.head_dim)}_")]
        if native == 0:
            assert spills[p.name] == 0, (p.name, spills[p.name])
        else:  # where the native kernel keeps a few bytes in local memory, no more than it
            assert spills[p.name] <= native, (p.name, spills[p.name], native)


# ------------------------------------------------------------------------------------------------ TL, expert, CLI

@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_the_checker_and_the_interpreter_take_a_padded_dim(arch):
    from flashgen.tl_spec import check, compare, library, parse

    target = {"sm_75": "t4", "sm_80": "a100", "sm_90": "h200"}[arch]
    variant = Variant(causal=True)
    params = choose_params(variant, target, DType.bf16, 40)
    program = parse(library.render(variant, dtype=DType.bf16, arch=arch, params=params, head_dim=40))
    assert check(program) == []
    result = compare(program, Shape(B=1, H=2, N=70, M=90, D=40), seed=1)
    assert result.rel_err < 1e-12, result


def test_generate_writes_a_padded_kernel(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "flashgen", "generate", "--gpu", "a100", "--dtype", "fp16",
                           "--head-dim", "40", "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["head_dim"] == 40 and manifest["launches"][0]["smem_bytes"] == 43008
    cuda = (out / "kernel.cu").read_text()
    assert "constexpr int D = 40;" in cuda and "constexpr int D_PAD = 48;" in cuda
    assert "head_dim 40" in (out / "kernel.tl").read_text()
    if shutil.which("nvcc"):
        resources = json.loads((out / "meta.json").read_text())["resources"]
        assert resources and all(u["registers"] > 0 and u["spill_store_bytes"] == 0 for u in resources.values())


# ------------------------------------------------------------------------------------------------ the bench suite

def test_the_headdims_suite_times_padded_dims_beside_their_native_dims():
    from flashgen.harness.bench import PADDED_SUITE_DIMS, SUITE_GRIDS
    from flashgen.harness.suite import suite_rows

    rows = SUITE_GRIDS["headdims"]()
    dims = [s.D for _, _, s in rows]
    assert dims == [40, 64, 80, 96, 112, 128, 160, 192, 224, 256]
    assert set(PADDED_SUITE_DIMS) == set(dims) - set(NATIVE_HEAD_DIMS)
    assert all(dtype is DType.bf16 and variant == Variant() for dtype, variant, _ in rows)
    assert all(s.N == s.M == 4096 and s.B * s.N == 16384 and abs(s.H * s.D - 2048) <= s.D / 2 for _, _, s in rows)
    assert {s.D: s.H for _, _, s in rows} == {40: 51, 64: 32, 80: 26, 96: 21, 112: 18, 128: 16, 160: 13, 192: 11,
                                              224: 9, 256: 8}
    assert [s.D for _, _, s in suite_rows("headdims", "d112")] == [112]


def _timed_row(d: int, tflops: float, n: int = 4096, status: str = "timed"):
    from flashgen.harness.bench import BenchEntry
    from flashgen.harness.suite import SuiteRow

    shape = Shape(B=16384 // n, H=round(2048 / d), N=n, M=n, D=d)
    ours = BenchEntry(name=f"fg_d{d}", kind="kernel", dtype="bf16", variant="plain", shape=shape, ok=True,
                      tflops=tflops)
    return SuiteRow(dtype="bf16", variant="plain", causal=False, shape=shape, status=status, ours=ours)


def test_padding_costs_compare_each_dims_tflops_with_its_native_dims():
    from flashgen.harness.suite import SuiteResult, padding_costs, render_markdown, summary_lines

    rows = [_timed_row(40, 300.0), _timed_row(64, 400.0), _timed_row(80, 330.0), _timed_row(96, 440.0),
            _timed_row(112, 500.0), _timed_row(128, 400.0, status="bench failed: x"),
            _timed_row(160, 450.0, n=2048), _timed_row(256, 500.0)]
    costs = padding_costs(rows)
    # d112's native row was not timed and d160's is at another length: neither has a partner
    assert [(c.head_dim, c.native_head_dim, c.ratio) for c in costs] == [(40, 64, 0.75), (80, 96, 0.75)]
    result = SuiteResult(suite="headdims", gpu="h200", arch_path="sm_90", translation_target="h200", rows=rows)
    text = render_markdown([result])
    assert "### Head dims beside their native dims" in text
    assert "| bf16 | plain | 4096 | 40 | 64 | 300.0 | 400.0 | 0.75 |" in text
    assert "  d80 beside d96 (bf16 plain N=4096): 330.0 / 440.0 TF/s = 0.75" in summary_lines(result)
    plain = SuiteResult(suite="fa2", gpu="h200", arch_path="sm_90", translation_target="h200", rows=rows[1:2])
    assert "beside their native" not in render_markdown([plain])
