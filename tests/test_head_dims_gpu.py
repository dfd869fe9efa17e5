"""Issue 15 item 3 on the GPU: every head dim from 8 to 256 in steps of 8 through the harness's whole verification
(fresh random inputs, poisoned outputs, every default case: ragged tails, N < M and N > M, both layouts, large
magnitudes), on the sm90 path and the sm80 path in bf16 (an H200 runs both: the A100's sm80 kernels are compiled for
the GPU present), and a subset in fp16 and on the sm75 path (the T4's kernels, Turing instructions compiled for the
GPU present: tests/test_turing_gpu.py), plain and causal. Then the padding itself: Q, K and V handed over as views
of wider buffers whose extra columns are NaN (a kernel reading past column D - 1 turns O to NaN) and O as a view of
one whose extra columns hold a pattern that must survive (a kernel writing past column D - 1 changes it).
The kernels are built and compiled once, in parallel, before any test runs (tests/gpu_kernels.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# The worker (spawned) imports this module by name for check_guard_columns; spawn children inherit sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashgen.variant import SUPPORTED_HEAD_DIMS, DType, Variant

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
GUARD_COLS = 16  # wider than any padding (8 columns) and a whole number of 16-byte chunks for every dtype
GUARD_SHAPE = dict(B=2, H=3, N=197, M=133)  # ragged tiles, N > M: causal rows that see no key
NAN_BITS = {DType.fp16: 0x7E00, DType.bf16: 0x7FC0, DType.fp32: 0x7FC00000}
SENTINEL_BITS = {DType.fp16: 0x1234, DType.bf16: 0x1234, DType.fp32: 0x12345678}


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


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    """Every selected kernel through the harness's whole verification, on several GPU workers at once."""
    from flashgen.harness.worker import KernelInput
    from tests.gpu_kernels import verify_many

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items()})


@pytest.fixture(scope="module")
def worker():
    from flashgen.harness.worker import GpuWorker

    with GpuWorker(job_timeout_s=240) as w:
        yield w


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("path,dtype,head_dim", MATRIX, ids=[f"{p}-{t.value}-d{d}" for p, t, d in MATRIX])
def test_every_head_dim_passes_the_harness(prebuilt_kernels, reports, path, dtype, head_dim, name):
    _, manifest = prebuilt_kernels[(path, dtype, name, head_dim)]  # fails here with a build or compiler error
    assert manifest.head_dim == head_dim and manifest.arch.startswith(f"sm_{path[2:]}")
    report = reports[(path, dtype, name, head_dim)]
    assert report.ok, report.summary


def check_guard_columns(kernel_json: str, shape: dict, seed: int) -> dict:
    """(Runs in the worker.) One launch with Q, K, V and O as the first D columns of buffers GUARD_COLS wider: the
    inputs' extra columns NaN, O's a sentinel pattern (its own columns poisoned, as the harness does). Returns the
    harness's comparison with the fp64 reference (compare_outputs) and how many guard elements of O changed."""
    from flashgen.harness.device import KernelInput, _cupy, ensure_compiled, launch, load_kernel, runnable_arch
    from flashgen.harness.verify import (
        POISON_BITS,
        compare_outputs,
        from_dtype_bits,
        reference_outputs,
        to_dtype_bits,
    )
    from flashgen.reference import random_inputs
    from flashgen.variant import Shape

    cp = _cupy()
    kernel = KernelInput.model_validate_json(kernel_json)
    manifest = kernel.manifest
    dtype, d = manifest.dtype, manifest.head_dim
    _, cubin = ensure_compiled(kernel, runnable_arch(manifest))
    loaded = load_kernel(cubin, manifest)
    s = Shape(**shape, D=d)
    bits = [to_dtype_bits(x, dtype) for x in random_inputs(s, seed)]
    word = cp.uint32 if dtype is DType.fp32 else cp.uint16
    as_kernel_dtype = {DType.fp16: cp.float16, DType.bf16: cp.uint16, DType.fp32: cp.float32}[dtype]

    def wide(data: np.ndarray | None, guard_bits: int):
        buffer = cp.full((*(data.shape[:3] if data is not None else (s.B, s.H, s.N)), d + GUARD_COLS), guard_bits,
                         dtype=word)
        if data is not None:
            buffer[..., :d] = cp.asarray(np.ascontiguousarray(data).view(np.uint32 if dtype is DType.fp32 else
                                                                         np.uint16))
        else:
            buffer[..., :d] = int(POISON_BITS[dtype])
        return buffer, buffer.view(as_kernel_dtype)[..., :d]

    (_, q), (_, k), (_, v) = (wide(x, NAN_BITS[dtype]) for x in bits)
    o_buffer, o = wide(None, SENTINEL_BITS[dtype])
    launch(manifest, loaded, q, k, v, o)
    cp.cuda.runtime.deviceSynchronize()
    host = cp.asnumpy(o_buffer)
    o_bits = host[..., :d]
    o_bits = o_bits.view(np.float32) if dtype is DType.fp32 else o_bits.view(np.float16) if dtype is DType.fp16 \
        else o_bits
    o_ref, _ = reference_outputs(manifest, *(from_dtype_bits(x, dtype) for x in bits))
    check = compare_outputs(from_dtype_bits(o_bits, dtype), o_ref, dtype, manifest.variant, s.M,
                            o_unwritten=host[..., :d] == POISON_BITS[dtype], seed=seed)
    out = check.model_dump()
    out["guard_changed"] = int((host[..., d:] != SENTINEL_BITS[dtype]).sum())
    return out


@pytest.mark.parametrize("case", GUARDED, ids=[f"{p}-{t.value}-d{d}" for p, t, d in GUARDED])
def test_padding_reads_nothing_past_d_and_writes_nothing_past_d(prebuilt_kernels, worker, case):
    from flashgen.harness.worker import KernelInput

    path, dtype, d = case
    source, manifest = prebuilt_kernels[(path, dtype, "causal", d)]
    kernel = KernelInput(manifest=manifest, source=source)
    for seed in (1, 2):
        result = worker.call("test_head_dims_gpu:check_guard_columns", kernel_json=kernel.model_dump_json(),
                             shape=GUARD_SHAPE, seed=seed)
        assert result.ok, result.error
        check = result.value
        assert check["guard_changed"] == 0, f"{case} seed {seed}: O written past column {d - 1}"
        assert check["ok"] and check["nonfinite_o"] == 0, f"{case} seed {seed}: {check['detail']}"
