"""The kernel called on each kind of CUDA array (cupy, torch, pycuda GPUArray), outputs of the same kind, checked
against the fp64 reference. pycuda is built from source (docs/harness.md, benchmarks/build_pycuda.sh); its test is
skipped where it is not installed."""

import numpy as np
import pytest

from flashgen.api import Kernel
from flashgen.harness import testkernels
from flashgen.reference import attention
from flashgen.variant import Variant

pytestmark = pytest.mark.gpu

VARIANT = Variant(causal=True, return_lse=True)
B, H, N, M, D = 2, 3, 37, 53, 64


def _kernel(dtype: str = "fp16") -> Kernel:
    from flashgen.harness.device import device_arch

    source, manifest = testkernels.build("simple_attention", dtype=dtype, head_dim=D, variant=VARIANT,
                                         arch=device_arch())
    return Kernel(tl="", sketch="", source=source, manifest=manifest, report="", meta={})


def _host_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float16)
                 for shape in ((B, H, N, D), (B, H, M, D), (B, H, M, D)))


def _check(o: np.ndarray, lse: np.ndarray, q, k, v) -> None:
    o_ref, lse_ref = attention(*(x.astype(np.float64) for x in (q, k, v)), VARIANT)
    o = o.astype(np.float64)
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 2e-3
    finite = np.isfinite(lse_ref)
    assert np.allclose(lse[finite], lse_ref[finite], atol=1e-3) and np.all(np.isneginf(lse[~finite]))


def test_cupy_arrays_in_cupy_arrays_out():
    cp = pytest.importorskip("cupy")
    q, k, v = _host_inputs()
    o, lse = _kernel()(cp.asarray(q), cp.asarray(k), cp.asarray(v))
    assert isinstance(o, cp.ndarray) and isinstance(lse, cp.ndarray) and o.dtype == np.float16
    _check(cp.asnumpy(o), cp.asnumpy(lse), q, k, v)


def test_torch_tensors_in_torch_tensors_out_with_strides():
    torch = pytest.importorskip("torch")
    q, k, v = _host_inputs(1)
    # q as a (B, H, N, D) view of (B, N, H, D) memory: strided, head dim contiguous
    tq = torch.from_numpy(q).cuda().transpose(1, 2).contiguous().transpose(1, 2)
    o, lse = _kernel()(tq, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
    assert isinstance(o, torch.Tensor) and o.is_cuda and o.dtype == torch.float16 and lse.dtype == torch.float32
    torch.cuda.synchronize()
    _check(o.cpu().numpy(), lse.cpu().numpy(), q, k, v)


def test_torch_bf16_tensors():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x).float().cuda().to(torch.bfloat16) for x in _host_inputs(2))
    o, lse = _kernel("bf16")(q, k, v)
    assert o.dtype == torch.bfloat16
    torch.cuda.synchronize()
    o_ref, _ = attention(*(x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)), VARIANT)
    assert np.linalg.norm(o.float().cpu().numpy() - o_ref) / np.linalg.norm(o_ref) < 1e-2


def test_pycuda_gpuarrays_in_gpuarrays_out():
    pytest.importorskip("pycuda")
    import pycuda.autoprimaryctx  # noqa: F401  the primary context: the one cupy launches in
    import pycuda.gpuarray as gpuarray

    q, k, v = _host_inputs(3)
    o, lse = _kernel()(gpuarray.to_gpu(q), gpuarray.to_gpu(k), gpuarray.to_gpu(v))
    assert isinstance(o, gpuarray.GPUArray) and isinstance(lse, gpuarray.GPUArray)
    import pycuda.driver

    pycuda.driver.Context.synchronize()
    _check(o.get(), lse.get(), q, k, v)


def test_mixed_kinds_are_refused_on_the_gpu_too():
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    from flashgen.harness.device import ArrayError

    q, k, v = _host_inputs()
    with pytest.raises(ArrayError, match="one kind"):
        _kernel()(cp.asarray(q), torch.from_numpy(k).cuda(), cp.asarray(v))
