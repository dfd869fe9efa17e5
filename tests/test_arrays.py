"""The kernel's array handling on the CPU: __cuda_array_interface__ and DLPack parsed without any array library (fake
objects), and every refusal one line. The GPU half (cupy, torch, pycuda) is tests/test_arrays_gpu.py."""

import ctypes
import subprocess
import sys

import pytest

from flashgen.abi import KernelManifest, Launch
from flashgen.api import Kernel
from flashgen.harness.device import ArrayError, NoGpuError, check_same_kind, tensor_view
from flashgen.variant import DType, Variant


def _fake_class(module: str, name: str, base: type) -> type:
    return type(name, (base,), {"__module__": module})


class _CAI:
    def __init__(self, shape, typestr, strides=None, ptr=1 << 20, readonly=False, mask=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "strides": strides,
                                         "data": (ptr, readonly), "version": 3, "mask": mask, "stream": None}


FakeCupy = _fake_class("cupy._core.core", "ndarray", _CAI)
FakePycuda = _fake_class("pycuda.gpuarray", "GPUArray", _CAI)


class _DLManaged(ctypes.Structure):
    from flashgen.harness.device import _DLTensor

    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype, _PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _DLPack:
    """A DLPack producer: a real "dltensor" capsule over ctypes memory (no deleter: the object owns it)."""

    def __init__(self, shape, code=2, bits=16, strides=None, device=(2, 0), ptr=1 << 24, byte_offset=0, lanes=1):
        self.device = device
        n = len(shape)
        self._shape = (ctypes.c_int64 * n)(*shape)
        self._strides = (ctypes.c_int64 * n)(*strides) if strides is not None else None
        self._managed = _DLManaged()
        t = self._managed.dl_tensor
        t.data, t.ndim, t.byte_offset = ptr, n, byte_offset
        t.device.device_type, t.device.device_id = device
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = ctypes.cast(self._shape, type(t.shape))
        t.strides = ctypes.cast(self._strides, type(t.strides)) if self._strides is not None else None

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        return _PyCapsule_New(ctypes.addressof(self._managed), b"dltensor", None)


FakeJax = _fake_class("jaxlib.xla_extension", "ArrayImpl", _DLPack)


def test_cuda_array_interface_shapes_strides_and_dtypes():
    b, h, n, d = 2, 4, 100, 64
    view = tensor_view(FakeCupy((b, h, n, d), "<f2", (n * h * d * 2, d * 2, h * d * 2, 2), ptr=4096))
    assert view.ptr == 4096 and view.shape == (b, h, n, d) and view.strides == (n * h * d, d, h * d, 1)
    assert view.dtype == "fp16" and view.kind == "cupy.ndarray" and not view.readonly
    assert tensor_view(FakeCupy((2, 3), "<f4")).strides == (3, 1)  # None: C-contiguous
    assert tensor_view(FakeCupy((2, 3), "<u2")).dtype == "bf16"  # cupy has no bf16: raw words
    assert tensor_view(FakeCupy((2, 3), "<V2")).dtype == "bf16"  # a 2-byte void (ml_dtypes.bfloat16)
    assert tensor_view(FakePycuda((2, 3), "<f4", readonly=True)).readonly
    assert tensor_view(FakePycuda((2, 3), "<f4")).kind == "pycuda.GPUArray"
    assert tensor_view(FakeCupy((2, 3), "<f8")).dtype == "other:float64"


def test_dlpack_shapes_strides_and_dtypes():
    view = tensor_view(FakeJax((2, 3, 5, 8), code=2, bits=16, strides=(120, 8, 24, 1), device=(2, 1), ptr=8192,
                               byte_offset=64))
    assert view.ptr == 8192 + 64 and view.shape == (2, 3, 5, 8) and view.strides == (120, 8, 24, 1)
    assert view.dtype == "fp16" and view.device == 1 and view.kind == "jaxlib.ArrayImpl"
    assert tensor_view(FakeJax((4, 6), code=4, bits=16)).dtype == "bf16"
    assert tensor_view(FakeJax((4, 6), code=2, bits=32)).strides == (6, 1)  # NULL strides: C-contiguous
    assert tensor_view(FakeJax((4, 6), code=2, bits=64)).dtype == "other:float64"
    assert tensor_view(FakeJax((4, 6), device=(13, 0))).dtype == "fp16"  # managed memory is device-readable


def _manifest(dtype=DType.fp16, variant=Variant()) -> KernelManifest:
    return KernelManifest(name="k", arch="sm_80", dtype=dtype, head_dim=64, variant=variant,
                          launches=[Launch(kernel="k", grid=("cdiv(N, 64)", "H", "B"), threads=128)])


def _kernel(**kw) -> Kernel:
    return Kernel(tl="", sketch="", source="// not compiled on the CPU", manifest=_manifest(**kw), report="", meta={})


def _qkv(cls=FakeCupy, typestr="<f2", **kw):
    return cls((2, 4, 33, 64), typestr, **kw), cls((2, 4, 40, 64), typestr), cls((2, 4, 40, 64), typestr)


def _one_line_refusal(call, *match: str) -> str:
    with pytest.raises(ArrayError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and all(m in text for m in match), text
    assert isinstance(info.value, ValueError)  # what callers caught before
    return text


def test_refusals_are_one_line_each():
    kernel = _kernel()
    # wrong dtype
    _one_line_refusal(lambda: kernel(*_qkv(typestr="<f4")), "q has dtype float32", "the kernel takes float16")
    _one_line_refusal(lambda: kernel(*(FakeJax((2, 4, 33, 64), bits=32),) * 3), "dtype float32")
    # wrong device: DLPack on the CPU, in pinned host memory
    _one_line_refusal(lambda: kernel(*(FakeJax((2, 4, 33, 64), device=(1, 0)),) * 3), "q", "the CPU",
                      "CUDA device memory")
    _one_line_refusal(lambda: kernel(*(FakeJax((2, 4, 33, 64), device=(3, 0)),) * 3), "pinned host memory")
    # the head-dim axis must be contiguous
    q, k, v = _qkv()
    strided = FakeCupy((2, 4, 33, 64), "<f2", (4 * 33 * 128 * 2, 33 * 128 * 2, 128 * 2, 4))
    _one_line_refusal(lambda: kernel(strided, k, v), "q: the last (head-dim) axis must be contiguous", "stride is 2")
    # mixed kinds, and mixed devices
    _one_line_refusal(lambda: kernel(q, FakePycuda((2, 4, 40, 64), "<f2"), v), "q is a cupy.ndarray",
                      "k is a pycuda.GPUArray", "one kind")
    _one_line_refusal(lambda: check_same_kind({"q": tensor_view(FakeJax((1, 1, 1, 64), device=(2, 0))),
                                               "k": tensor_view(FakeJax((1, 1, 1, 64), device=(2, 1)))}),
                      "cuda:0", "cuda:1")
    # not an array at all; 3-D; a masked array
    _one_line_refusal(lambda: kernel([1, 2], k, v), "q (builtins.list) is not a CUDA array")
    _one_line_refusal(lambda: kernel(FakeCupy((4, 33, 64), "<f2"), k, v), "must be 4-D")
    _one_line_refusal(lambda: kernel(FakeCupy((2, 4, 33, 64), "<f2", mask=object()), k, v), "masked")


def test_real_cpu_arrays_are_refused_in_one_line():
    np = pytest.importorskip("numpy")
    kernel = _kernel()
    host = np.zeros((2, 4, 33, 64), dtype=np.float16)
    if hasattr(host, "__dlpack__"):
        _one_line_refusal(lambda: kernel(host, host, host), "q (numpy.ndarray) is on the CPU")
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 4, 33, 64, dtype=torch.float16)
    _one_line_refusal(lambda: kernel(t, t, t), "q (torch.Tensor) is on the cpu", ".cuda()")


def test_good_arrays_pass_the_checks_and_reach_the_gpu_step():
    # without a GPU the first thing past the checks is asking for the device (cupy): a NoGpuError, not an ArrayError
    for arrays in (_qkv(), _qkv(FakePycuda), (FakeJax((2, 4, 33, 64)), FakeJax((2, 4, 40, 64)), FakeJax((2, 4, 40, 64)))):
        try:
            _kernel()(*arrays)
        except NoGpuError:
            pass
    with pytest.raises(NoGpuError):
        _kernel(dtype=DType.bf16)(*_qkv(typestr="<u2"))


def test_torch_is_not_needed():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import flashgen, flashgen.api, flashgen.harness.device as d\n"
            "class A:\n"
            "    __cuda_array_interface__ = {'shape': (1, 1, 2, 64), 'typestr': '<f2', 'strides': None,"
            " 'data': (4096, False), 'version': 3}\n"
            "print(d.tensor_view(A()).dtype)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "fp16", done.stderr
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    core = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    assert "torch" not in core and "cupy" not in core
