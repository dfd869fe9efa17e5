"""Issue 15 item 3, second half, on the GPU: V's head dim separate from Q's and K's (Dv; DeepSeek's prefill has D = 192,
Dv = 128), through the harness's whole verification (fresh random inputs, poisoned outputs, every default case: ragged
tails, N < M and N > M, both layouts, large magnitudes) on each code path: sm90 (the H200's kernels), sm80 (the A100's,
compiled for the GPU present) and sm75 (the T4's Turing instructions, compiled for the GPU present:
tests/test_turing_gpu.py), plain and causal, in bf16 and, on the sm80 path, fp16; split-KV decode over Dv on the sm80
path. Then the widths themselves: Q and K handed over as views of wider buffers whose columns past D are NaN, V as one
whose columns past Dv are NaN (a kernel reading past them turns O to NaN), O as one whose columns past Dv hold a pattern
that must survive; and a v or o of another head dim refused in one line on real arrays.
The CPU half (contract, TL, interpreter, compile, byte-identical kernels of one head dim) is tests/test_head_dim_v.py.
The kernels are built and compiled once, in parallel, before any test runs (tests/gpu_kernels.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The worker (spawned) imports this module by name for its checks; spawn children inherit sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashgen.variant import DType, Variant
from tests.gpu_kernels import guard_column_checks  # noqa: E402

pytestmark = pytest.mark.gpu

# code path -> the target whose kernels take it (`flashgen generate --gpu NAME --head-dim D --head-dim-v DV` builds them)
PATHS = {"sm90": "h200", "sm80": "a100", "sm75": "t4"}
VARIANTS = {"plain": Variant(), "causal": Variant(causal=True), "splitkv": Variant(split_kv=True, return_lse=True)}
#: (D, Dv): DeepSeek's prefill, V wider than Q and K, V narrower, and both padded on the 16-bit paths (40, 24)
PAIRS = ((192, 128), (64, 128), (128, 64), (40, 24))
MATRIX = ([(path, DType.bf16, d, dv) for path in PATHS for d, dv in PAIRS]
          + [("sm80", DType.fp16, d, dv) for d, dv in PAIRS])
SPLIT = [("sm80", DType.bf16, 192, 128), ("sm80", DType.bf16, 40, 24)]
# the width runs (causal): each path, padded pairs (D % 16 == 8 and Dv % 16 == 8: a padding chunk in the 16-bit tiles)
# and V wider than Q and K (O's staging tile past Q's on the sm80 path); Turing's bf16 through the scaled fp16 tiles
GUARDED = [("sm90", DType.bf16, 40, 24), ("sm90", DType.bf16, 64, 128), ("sm80", DType.bf16, 40, 24),
           ("sm80", DType.fp16, 64, 128), ("sm80", DType.fp16, 128, 64), ("sm75", DType.bf16, 40, 24),
           ("sm75", DType.bf16, 64, 128)]
REFUSALS = ("sm80", DType.fp16, "plain", 64, 128)  # the kernel the refusal test calls with a v and an o of D's width


def _ids(rows) -> list[str]:
    return [f"{p}-{t.value}-d{d}v{dv}" for p, t, d, dv in rows]


def _build(path: str, dtype: DType, name: str, d: int, dv: int):
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    return Build(build_expert_kernel, (PATHS[path], dtype.value, VARIANTS[name], d), {"head_dim_v": dv})


def gpu_kernels(items, arch):
    """The selected tests' kernels: (path, dtype, variant, D, Dv)."""
    keys = set()
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if "case" in params:
            path, dtype, d, dv = params["case"]
            keys.add((path, dtype, "causal", d, dv))
        elif "split" in params:
            path, dtype, d, dv = params["split"]
            keys.add((path, dtype, "splitkv", d, dv))
        elif "head_dim" in params:
            keys.add((params["path"], params["dtype"], params["name"], params["head_dim"], params["head_dim_v"]))
        elif item.originalname == "test_a_v_or_o_of_another_head_dim_is_one_line_on_real_arrays":
            keys.add(REFUSALS)
    return {key: _build(*key) for key in keys}


@pytest.mark.parametrize("name", ["plain", "causal"])
@pytest.mark.parametrize("path,dtype,head_dim,head_dim_v", MATRIX, ids=_ids(MATRIX))
def test_a_v_head_dim_of_its_own_passes_the_harness(prebuilt_kernels, reports, path, dtype, head_dim, head_dim_v,
                                                    name):
    key = (path, dtype, name, head_dim, head_dim_v)
    _, manifest = prebuilt_kernels[key]  # fails here with a build or compiler error
    assert (manifest.head_dim, manifest.head_dim_v) == (head_dim, head_dim_v)
    assert manifest.arch.startswith(f"sm_{path[2:]}")
    report = reports[key]
    assert report.ok, report.summary
    assert all(c.case.shape.DV == head_dim_v for c in report.cases)  # the cases ran with v and o over Dv


@pytest.mark.parametrize("split", SPLIT, ids=_ids(SPLIT))
def test_split_kv_decode_combines_partials_over_dv(prebuilt_kernels, reports, split):
    path, dtype, d, dv = split
    key = (path, dtype, "splitkv", d, dv)
    _, manifest = prebuilt_kernels[key]
    assert manifest.workspace_floats == f"B*H*SPLITS*N*({dv}+1)"
    report = reports[key]
    assert report.ok, report.summary


@pytest.mark.parametrize("case", GUARDED, ids=_ids(GUARDED))
def test_q_and_k_are_read_to_d_v_to_dv_and_o_written_to_dv_only(prebuilt_kernels, gpu_worker, case):
    path, dtype, d, dv = case
    source, manifest = prebuilt_kernels[(path, dtype, "causal", d, dv)]
    for seed, check in guard_column_checks(gpu_worker, source, manifest):
        assert check["o_shape"][-1] == dv
        assert check["guard_changed"] == 0, f"{case} seed {seed}: O written past column {dv - 1}"
        assert check["ok"] and check["nonfinite_o"] == 0, f"{case} seed {seed}: {check['detail']}"


def check_refusals(kernel_json: str) -> list[str]:
    """(Runs in the worker.) The one-line refusals of a v and of an o whose last axis is not Dv, on real arrays,
    through the harness's launch and through flashgen.api.Kernel (which allocates O (B, H, N, Dv) itself)."""
    from flashgen.api import Kernel
    from flashgen.harness.device import (
        ArrayError,
        KernelInput,
        _cupy,
        ensure_compiled,
        launch,
        load_kernel,
        runnable_arch,
    )

    cp = _cupy()
    kernel = KernelInput.model_validate_json(kernel_json)
    manifest = kernel.manifest
    loaded = load_kernel(ensure_compiled(kernel, runnable_arch(manifest))[1], manifest)
    d, dv, other = manifest.head_dim, manifest.dv, manifest.head_dim
    dt = cp.float16
    q, k = cp.zeros((1, 2, 16, d), dt), cp.zeros((1, 2, 32, d), dt)
    v, o = cp.zeros((1, 2, 32, dv), dt), cp.zeros((1, 2, 16, dv), dt)
    messages = []
    for args in ((q, k, cp.zeros((1, 2, 32, other), dt), o), (q, k, v, cp.zeros((1, 2, 16, other), dt))):
        try:
            launch(manifest, loaded, *args)
        except ArrayError as exc:
            messages.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            messages.append(f"not an ArrayError: {type(exc).__name__}: {exc}")
    called = Kernel(tl="", sketch="", source=kernel.source, manifest=manifest, report="", meta={})
    out = called(q, k, v)
    messages.append(f"o {tuple(out.shape)}")
    return messages


def test_a_v_or_o_of_another_head_dim_is_one_line_on_real_arrays(prebuilt_kernels, gpu_worker):
    from flashgen.harness.worker import KernelInput

    source, manifest = prebuilt_kernels[REFUSALS]
    result = gpu_worker.call("test_head_dim_v_gpu:check_refusals",
                         kernel_json=KernelInput(manifest=manifest, source=source).model_dump_json())
    assert result.ok, result.error
    v_line, o_line, returned = result.value
    built = "but the kernel was built for Dv=128 (v (B, KVH, M, 128), o (B, H, N, 128))"
    assert v_line == f"v has head dim 64 (shape (1, 2, 32, 64)) {built}"
    assert o_line == f"o has head dim 64 (shape (1, 2, 16, 64)) {built}"
    assert returned == "o (1, 2, 16, 128)"
