"""Issue 15 item 3 on the GPU: every head dim from 8 to 256 in steps of 8 through the harness's whole verification
(fresh random inputs, poisoned outputs, every default case: ragged tails, N < M and N > M, both layouts, large
magnitudes), on the sm90 path and the sm80 path in bf16 (an H200 runs both: the A100's sm80 kernels are compiled for
the GPU present), and a subset in fp16 and on the sm75 path (the T4's kernels, Turing instructions compiled for the
GPU present: tests/test_turing_gpu.py), plain and causal. Then the padding itself: Q, K and V handed over as views
of wider buffers whose extra columns are NaN (a kernel reading past column D - 1 turns O to NaN) and O as a view of
one whose extra columns hold a pattern that must survive (a kernel writing past column D - 1 changes it).
The kernels are built and compiled once, in parallel, before any test runs (tests/gpu_kernels.py)."""

from __future__ import annotations

import pytest

from flashgen.variant import SUPPORTED_HEAD_DIMS, DType, Variant
from tests.gpu_kernels import guard_column_checks  # noqa: E402

pytestmark = pytest.mark.gpu

# code path -> the target whose kernels take it (`flashgen generate --gpu NAME` builds exactly these)
PATHS = {"sm90": "h200", "sm80": "a100", "sm75": "t4"}
VARIANTS = {"plain": Variant(), "causal": Variant(causal=True)}
SUBSET = (8, 40, 80, 160, 192, 224)  # padded on the sm75/sm80 paths (8, 40) or between the native dims
MATRIX = ([(path, DType.bf16, d) for path in ("sm90", "sm80") for d in SUPPORTED_HEAD_DIMS]
          + [(path, DType.fp16, d) for path in ("sm90", "sm80") for d in SUBSET]
          + [("sm75", dtype, d) for dtype in (DType.fp16, DType.bf16) for d in SUBSET])
# the guard-column runs: padded dims (D % 16 == 8: a padding chunk in the 16-bit tiles) and one between native
# dims, on each path and tile kind (Turing's bf16 and fp32 through the scaled fp16 tiles; the sm80 path's fp32
# through tf32, unpadded, d248 with a tile entry of its own)
GUARDED = [("sm90", DType.bf16, 8), ("sm90", DType.bf16, 40), ("sm90", DType.fp16, 200),
           ("sm80", DType.bf16, 8), ("sm80", DType.fp16, 40), ("sm80", DType.bf16, 200), ("sm80", DType.fp32, 40),
           ("sm80", DType.fp32, 248), ("sm75", DType.fp16, 40), ("sm75", DType.bf16, 40), ("sm75", DType.bf16, 200),
           ("sm75", DType.fp32, 40)]


def _build(path: str, dtype: DType, variant_name: str, head_dim: int):
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    return Build(build_expert_kernel, (PATHS[path], dtype.value, VARIANTS[variant_name], head_dim))


def gpu_kernels(items, arch):
    """The selected tests' kernels: (path, dtype, variant, head dim)."""
    keys = set()
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if "case" in params:
            path, dtype, d = params["case"]
            keys.add((path, dtype, "causal", d))
        elif "head_dim" in params:
            keys.add((params["path"], params["dtype"], params["name"], params["head_dim"]))
    return {key: _build(*key) for key in keys}


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("path,dtype,head_dim", MATRIX, ids=[f"{p}-{t.value}-d{d}" for p, t, d in MATRIX])
def test_every_head_dim_passes_the_harness(prebuilt_kernels, reports, path, dtype, head_dim, name):
    _, manifest = prebuilt_kernels[(path, dtype, name, head_dim)]  # fails here with a build or compiler error
    assert manifest.head_dim == head_dim and manifest.arch.startswith(f"sm_{path[2:]}")
    report = reports[(path, dtype, name, head_dim)]
    assert report.ok, report.summary


@pytest.mark.parametrize("case", GUARDED, ids=[f"{p}-{t.value}-d{d}" for p, t, d in GUARDED])
def test_padding_reads_nothing_past_d_and_writes_nothing_past_d(prebuilt_kernels, gpu_worker, case):
    path, dtype, d = case
    source, manifest = prebuilt_kernels[(path, dtype, "causal", d)]
    for seed, check in guard_column_checks(gpu_worker, source, manifest):
        assert check["guard_changed"] == 0, f"{case} seed {seed}: O written past column {d - 1}"
        assert check["ok"] and check["nonfinite_o"] == 0, f"{case} seed {seed}: {check['detail']}"
