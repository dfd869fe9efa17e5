"""GPU proof of the Turing (sm_75) code path for fp16, bf16 and fp32 inputs (docs/turing-dtypes.md).

The kernels are rendered for sm_75 (FG_ARCH 75: m16n8k8 MMAs, register-staged loads, bf16/fp32 tiles scaled
to fp16) and built by the harness for the GPU present: `runnable_arch` builds an sm_75 manifest for the
device's arch (sm_90 on an H200), and the source itself fixes the code path, so a newer GPU runs exactly the
Turing instructions. Verified by the official harness (`GpuWorker.verify`, default cases), plus adversarial
inputs beyond fp16's range through `check_custom_inputs` (run inside the worker).
The selected tests' kernels are built and compiled once, in parallel, before any test runs (`gpu_kernels`,
tests/gpu_kernels.py), so the tests only load cubins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# The worker (spawned) imports this module by name for check_custom_inputs; spawn children inherit sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashgen.variant import DType, Norm, Shape, Variant

VARIANTS = {
    "plain": Variant(), "causal": Variant(causal=True), "window": Variant(causal=True, window=48),
    "alibi": Variant(alibi=True), "softcap": Variant(softcap=5.0), "gqa": Variant(kv_group=2),
    "mqa": Variant(kv_group=4), "relu": Variant(norm=Norm.relu), "sigmoid": Variant(norm=Norm.sigmoid),
    "lse": Variant(return_lse=True), "causal_alibi_lse": Variant(causal=True, alibi=True, return_lse=True),
    "splitkv": Variant(split_kv=True, return_lse=True),
}
HEAD_DIMS = (64, 96, 128, 256)


def turing_kernel(variant: Variant, dtype: DType, head_dim: int):
    """The T4 kernel exactly as `flashgen generate --gpu t4` builds it (library TL -> check -> translate)."""
    from flashgen.harness.suite import build_expert_kernel

    source, manifest, _tl = build_expert_kernel("t4", dtype.value, variant, head_dim)
    return _turing_input(source, manifest)


def _turing_input(source: str, manifest):
    from flashgen.harness.worker import KernelInput

    assert manifest.arch == "sm_75" and "#define FG_ARCH 75" in source
    return KernelInput(manifest=manifest, source=source)


# Adversarial inputs (bf16 beyond fp16's range, fp32 too): (name, variant, dtype, head_dim, q/k scale,
# v scale, per-key-block V decimal exponents or None). Each is meaningful against the fp64 reference:
# - qk_huge_*: |q|, |k| ~ 1e5..1e15 (scores 1e10..1e30, far past fp16); bf16 inputs convert to fp16 exactly
#   after the per-tile shift, so even the near one-hot softmax must pick the reference's keys. fp32 (10-bit
#   rounding of q, k) would flip near-ties at scores ~1e10, so fp32 gets the softcapped form only. Both the
#   raw-score softmax (no score mods: its huge-row branch) and the score-mod path (ALiBi) are covered.
# - softcap_huge_*: the same magnitudes under softcap 5: scores saturate, O must be the plain mean pattern.
# - v_huge / v_tiny: |v| ~ 1e30 / 1e-30 with moderate scores (native fp16 would give inf / 0).
# - v_ramp_*: V's magnitude changes by up to 1e36 between key tiles, both directions (O's unit moves up;
#   smaller tiles get P scaled down).
ADVERSARIAL = [
    ("qk_huge_1e5", Variant(alibi=True), DType.bf16, 64, 1e5, 1.0, None),
    ("qk_huge_raw_scores", Variant(), DType.bf16, 64, 1e5, 1.0, None),
    ("qk_huge_1e15", Variant(causal=True, alibi=True), DType.bf16, 128, 1e15, 1.0, None),
    ("softcap_huge_bf16", Variant(softcap=5.0), DType.bf16, 64, 1e12, 1.0, None),
    ("softcap_huge_fp32", Variant(softcap=5.0), DType.fp32, 128, 1e12, 1.0, None),
    ("v_huge_bf16", Variant(return_lse=True), DType.bf16, 64, 1.0, 1e30, None),
    ("v_huge_fp32", Variant(causal=True), DType.fp32, 256, 1.0, 1e30, None),
    ("v_tiny_bf16", Variant(), DType.bf16, 96, 1.0, 1e-30, None),
    ("v_ramp_up", Variant(), DType.bf16, 64, 1.0, 1.0, [-18, -12, -6, 0, 6, 12, 18]),
    ("v_ramp_down", Variant(split_kv=True, return_lse=True), DType.bf16, 128, 1.0, 1.0, [18, 9, 0, -9, -18]),
    ("v_ramp_fp32", Variant(causal=True, window=100), DType.fp32, 64, 1.0, 1.0, [3, -3, 9, -9, 0]),
    ("all_huge", Variant(softcap=5.0, return_lse=True), DType.bf16, 256, 1e10, 1e20, None),
]
ADVERSARIAL_SHAPE = dict(B=1, H=2, N=150, M=333)


def check_custom_inputs(kernel_json: str, shape: dict, qk_scale: float, v_scale: float,
                        v_block_exponents: list[float] | None, seed: int) -> dict:
    """(Runs in the worker.) One launch on inputs the harness's random_inputs cannot make (V scaled, per-key
    V magnitudes), checked by the harness's own compare_outputs against the fp64 reference of the rounded
    inputs, with the harness's tolerance for this dtype and q/k magnitude. Returns RunCheck as a dict."""
    from flashgen.harness.device import (
        KernelInput,
        _cupy,
        ensure_compiled,
        launch,
        load_kernel,
        runnable_arch,
    )
    from flashgen.harness.verify import (
        CheckCase,
        _DeviceCase,
        compare_outputs,
        from_dtype_bits,
        reference_outputs,
        to_dtype_bits,
    )
    from flashgen.reference import random_inputs

    cp = _cupy()
    kernel = KernelInput.model_validate_json(kernel_json)
    manifest = kernel.manifest
    variant, dtype = manifest.variant, manifest.dtype
    _, cubin = ensure_compiled(kernel, runnable_arch(manifest))
    loaded = load_kernel(cubin, manifest)
    case = CheckCase(name="custom", shape=Shape(**shape, D=manifest.head_dim,
                                                KVH=(shape["H"] // variant.kv_group if variant.kv_group > 1 else None)))
    q64, k64, v64 = random_inputs(case.shape, seed, scale_mag=qk_scale)
    v64 = v64 * v_scale
    if v_block_exponents:
        blocks = np.arange(case.shape.M) // 37 % len(v_block_exponents)  # 37: tiles of any BLOCK_N see changes
        v64 = v64 * (10.0 ** np.asarray(v_block_exponents, dtype=np.float64)[blocks])[None, None, :, None]
    bits = [to_dtype_bits(x, dtype) for x in (q64, k64, v64)]
    with_lse = variant.return_lse or (variant.norm is Norm.softmax and variant.split_kv)
    dev = _DeviceCase(cp, case, dtype, with_lse)
    sent = dev.upload(*bits)
    dev.poison()
    launch(manifest, loaded, dev.q, dev.k, dev.v, dev.o, lse=dev.lse)
    cp.cuda.runtime.deviceSynchronize()
    o, o_unw, lse, lse_unw = dev.outputs()
    o_ref, lse_ref = reference_outputs(manifest, *(from_dtype_bits(x, dtype) for x in bits))
    check = compare_outputs(o, o_ref, dtype, variant, case.shape.M, o_unwritten=o_unw,
                            lse=lse if variant.return_lse else None, lse_ref=lse_ref if variant.return_lse else None,
                            lse_unwritten=lse_unw if variant.return_lse else None,
                            inputs_modified=dev.modified_inputs(sent), seed=seed, magnitude=qk_scale)
    out = check.model_dump()
    out["ref_max_abs"] = float(np.abs(o_ref).max())
    return out


def gpu_kernels(items, arch):
    """The kernels the selected tests of this module run (built and compiled once, before the tests: `-k` on a
    few cases does not build all of them): (name, dtype, head_dim) for the harness tests, ("adversarial", name)
    for the range tests."""
    from flashgen.harness.suite import build_expert_kernel
    from tests.gpu_kernels import Build

    builds = {}
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if "name" in params:
            key = (params["name"], params["dtype"], params["head_dim"])
            variant, dtype, head_dim = VARIANTS[params["name"]], params["dtype"], params["head_dim"]
        elif "case" in params:
            key, (variant, dtype, head_dim) = ("adversarial", params["case"][0]), params["case"][1:4]
        else:
            continue
        builds[key] = Build(build_expert_kernel, ("t4", dtype.value, variant, head_dim))
    return builds


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    """The harness tests' verifications, on several GPU workers at once (tests/gpu_kernels.verify_many)."""
    from tests.gpu_kernels import verify_many

    return verify_many({key: _turing_input(source, manifest) for key, (source, manifest)
                        in prebuilt_kernels.ready().items() if key[0] != "adversarial"})


@pytest.fixture(scope="module")
def worker():
    from flashgen.harness.worker import GpuWorker

    with GpuWorker(device=0) as w:
        yield w


@pytest.mark.gpu
def test_sm75_manifest_builds_for_this_gpu_with_the_turing_code_path():
    from flashgen.harness.worker import device_arch, runnable_arch

    kernel = turing_kernel(Variant(), DType.bf16, 64)
    arch = runnable_arch(kernel.manifest)
    assert arch == device_arch()  # sm_75 code is built for the device present (mma.sync m16n8k8 runs there)
    assert "scaled_tile_loader" in kernel.source and "m16n8k8" in kernel.source


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.value)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_turing_path_passes_the_harness(prebuilt_kernels, reports, name, dtype, head_dim):
    _turing_input(*prebuilt_kernels[(name, dtype, head_dim)])  # fails here with the build or compiler error
    report = reports[(name, dtype, head_dim)]
    assert report.ok, report.summary
    worst = max(r.rel_err for c in report.cases for r in c.runs)
    print(f"TURING {name} {dtype.value} d{head_dim}: worst rel err {worst:.3g}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ADVERSARIAL, ids=lambda c: c[0])
def test_turing_path_keeps_range_beyond_fp16(prebuilt_kernels, worker, case):
    name, variant, dtype, head_dim, qk_scale, v_scale, v_exps = case
    kernel = _turing_input(*prebuilt_kernels[("adversarial", name)])
    for seed in (1, 2):
        result = worker.call("test_turing_gpu:check_custom_inputs", kernel_json=kernel.model_dump_json(),
                             shape=ADVERSARIAL_SHAPE, qk_scale=qk_scale, v_scale=v_scale, v_block_exponents=v_exps,
                             seed=seed)
        assert result.ok, result.error
        check = result.value
        print(f"TURING-ADV {name} seed {seed}: rel {check['rel_err']:.3g} max|ref| {check['ref_max_abs']:.3g} "
              f"lse {check['lse_max_err']:.3g}")
        assert check["ok"], f"{name} seed {seed}: {check['detail']}"
        assert check["nonfinite_o"] == 0

