"""The device side of running kernels: loading a cubin, launching it on tensors (`launch`), the GPU's facts
(`device_arch`, `environment_info`, `have_gpu`) and compiling a kernel for the GPU at hand (`ensure_compiled`).

What verify and bench build on; the isolated worker process that runs them (flashgen.harness.worker) sits
above all three. `launch` is also the Python API for calling a built kernel on user arrays, zero-copy: torch tensors
(via data_ptr/stride, bf16 included), anything with `__cuda_array_interface__` (cupy, pycuda GPUArray, numba, jax) or
DLPack (`__dlpack__`/`__dlpack_device__`), all of one kind per call. Launching goes through cupy's driver bindings
(the gpu extra); torch is optional. cupy is imported lazily: the CPU-only paths never need it.
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flashgen.abi import FlashgenAttnParams, KernelManifest, eval_size
from flashgen.errors import FlashgenError

# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES in cuda.h's CUfunction_attribute enum.
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_STICKY_CUDA_ERRORS = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
                       "illegal instruction", "invalid program counter", "hardware stack error",
                       "exception occurred on the device", "device-side assert", "launch timed out",
                       "an illegal", "LAUNCH_FAILED", "context is destroyed")


class NoGpuError(FlashgenError):
    """No CUDA device (or no cupy) where a kernel must run."""


class CompileFailed(FlashgenError):
    """A kernel that does not compile; the message is the compiler feedback."""


class KernelRunError(RuntimeError):
    """A CUDA error while running a kernel, with where it happened."""


# ---------------------------------------------------------------------------------------------
# What a kernel to run is (pickled across the worker's process boundary)
# ---------------------------------------------------------------------------------------------

class KernelInput(BaseModel):
    """A kernel to run: CUDA source (compiled in the worker for its GPU) or a ready cubin."""

    model_config = ConfigDict(extra="forbid")

    manifest: KernelManifest
    source: str | None = None
    cubin_path: str | None = None
    compile_options: list[str] = Field(default_factory=list)

    @property
    def label(self) -> str:
        return self.manifest.name


class CompileInfo(BaseModel):
    """What the worker's compile step produced (for the record)."""

    arch: str
    ok: bool
    cubin_path: str | None = None
    feedback: str = ""
    log: str = ""
    resources: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0



# ---------------------------------------------------------------------------------------------
# Device helpers (cupy imported lazily: the CPU-only paths never need it)
# ---------------------------------------------------------------------------------------------

def _cupy():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy built for another CUDA
        raise NoGpuError(f"cupy is not usable here ({type(exc).__name__}: {exc}); running kernels needs a CUDA GPU "
                         "and the gpu extra (pip install 'flashgen[gpu]')") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise NoGpuError("no CUDA device found")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise NoGpuError(f"no CUDA device usable: {exc}") from None
    return cupy


def device_arch(device: int | None = None) -> str:
    cp = _cupy()
    dev = cp.cuda.Device(device) if device is not None else cp.cuda.Device()
    return "sm_" + dev.compute_capability


def environment_info(device: int | None = None) -> dict[str, Any]:
    """GPU name, driver, CUDA runtime, torch and cupy versions: stored with every measurement."""
    info: dict[str, Any] = {}
    try:
        cp = _cupy()
        dev_id = cp.cuda.Device(device).id if device is not None else cp.cuda.Device().id
        props = cp.cuda.runtime.getDeviceProperties(dev_id)
        name = props["name"]
        info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        info["arch"] = device_arch(dev_id)
        info["l2_bytes"] = int(props.get("l2CacheSize", 0))
        info["driver"] = _cuda_version_text(cp.cuda.runtime.driverGetVersion())
        info["cuda_runtime"] = _cuda_version_text(cp.cuda.runtime.runtimeGetVersion())
        info["cupy"] = cp.__version__
    except FlashgenError as exc:
        info["gpu"] = None
        info["error"] = str(exc)
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except Exception:
        info["torch"] = None
    try:
        info["nvidia_driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        pass
    return info


def _cuda_version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


class LoadedKernel:
    """A cubin loaded into the current context, with its entry functions."""

    def __init__(self, cubin_path: str, manifest: KernelManifest):
        cp = _cupy()
        self.cubin_path = cubin_path
        self.manifest = manifest
        self.module = cp.RawModule(path=cubin_path)
        self.functions: dict[str, int] = {}  # entry symbol -> CUfunction handle
        self._driver_module = None
        for launch_spec in manifest.launches:
            if launch_spec.kernel in self.functions:
                continue
            try:
                fn = self.module.get_function(launch_spec.kernel)
                # cupy returns a RawKernel wrapping the driver Function (older versions: the Function itself)
                handle = getattr(fn, "ptr", None) or getattr(getattr(fn, "kernel", None), "ptr", None)
            except Exception as exc:
                raise KernelRunError(f"entry {launch_spec.kernel!r} named by the manifest is not in the cubin: {exc}") from None
            if not handle:  # fall back to the driver API directly (the context exists: RawModule made it)
                if self._driver_module is None:
                    cp.cuda.runtime.free(0)
                    self._driver_module = cp.cuda.driver.moduleLoad(cubin_path)
                handle = cp.cuda.driver.moduleGetFunction(self._driver_module, launch_spec.kernel)
            self.functions[launch_spec.kernel] = int(handle)
        # The 48 KB a block gets without opting in counts static and dynamic shared memory together, so a
        # kernel with a little static memory next to 48 KB of dynamic needs the opt-in too: always ask.
        for launch_spec in manifest.launches:
            if launch_spec.smem_bytes > 0:
                cp.cuda.driver.funcSetAttribute(self.functions[launch_spec.kernel],
                                                _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                launch_spec.smem_bytes)


_loaded: dict[tuple[str, float, str], LoadedKernel] = {}


def load_kernel(cubin_path: str, manifest: KernelManifest) -> LoadedKernel:
    key = (str(cubin_path), os.path.getmtime(cubin_path), manifest.model_dump_json())
    if key not in _loaded:
        _loaded[key] = LoadedKernel(str(cubin_path), manifest)
    return _loaded[key]


# ---------------------------------------------------------------------------------------------
# Arrays: torch tensors (data_ptr/stride), anything with __cuda_array_interface__ (cupy, pycuda GPUArray, numba,
# jax) or DLPack (__dlpack__ / __dlpack_device__), without importing any of them
# ---------------------------------------------------------------------------------------------

class ArrayError(FlashgenError, ValueError):
    """An array the kernel cannot take (wrong dtype, device, layout or kind): one line naming it."""


class TensorView(BaseModel):
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] = Field(description="in elements")
    dtype: str = Field(description="fp16 | bf16 | fp32 | int32 | other:<name>")
    stream: int | None = None
    kind: str = Field(default="array", description="the array's library and type, e.g. torch.Tensor, cupy.ndarray")
    device: int | None = Field(default=None, description="CUDA device ordinal where the array says (torch, DLPack)")
    readonly: bool = False


# __cuda_array_interface__ typestrs; bf16 travels as raw 16-bit words (cupy has no bf16) or as a 2-byte void
_TYPESTR = {"<f2": "fp16", "<f4": "fp32", "<u2": "bf16", "<V2": "bf16", "|V2": "bf16", "<i4": "int32"}
_TYPESTR_NAMES = {"<f8": "float64", "<f2": "float16", "<f4": "float32", "<i4": "int32", "<i8": "int64", "|u1": "uint8",
                  "|i1": "int8", "<i2": "int16", "|b1": "bool"}
# DLPack (code, bits) -> our name; uint16 words stand for bf16 as with __cuda_array_interface__
_DLPACK_DTYPES = {(2, 16): "fp16", (2, 32): "fp32", (4, 16): "bf16", (1, 16): "bf16", (0, 32): "int32"}
_DLPACK_CODES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool"}
# DLDeviceType: the ones a kernel can read (device memory, managed memory) and the names of the others
_DLPACK_CUDA = {2, 13}
_DLPACK_DEVICES = {1: "the CPU", 3: "pinned host memory", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm",
                   11: "ROCm host memory", 12: "an extension device", 14: "oneAPI"}


def array_kind(x: Any) -> str:
    """The array's library and type, e.g. 'torch.Tensor', 'cupy.ndarray', 'pycuda.GPUArray'."""
    cls = type(x)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(int(dim), 1)
    return tuple(reversed(strides))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLTensorVersioned(ctypes.Structure):  # DLManagedTensorVersioned (DLPack >= 1.0): version, ctx, deleter, flags
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_DLPACK_FLAG_READ_ONLY = 1
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _dlpack_view(x: Any, name: str, kind: str) -> TensorView:
    try:
        device_type, device_id = x.__dlpack_device__()
    except Exception as exc:
        raise ArrayError(f"{name} ({kind}): __dlpack_device__() failed: {exc}") from None
    if int(device_type) not in _DLPACK_CUDA:
        where = _DLPACK_DEVICES.get(int(device_type), f"DLPack device type {device_type}")
        raise ArrayError(f"{name} ({kind}) is on {where}; the kernel needs CUDA device memory")
    # the legacy capsule is what every producer gives; read, not consumed: its destructor frees the wrapper and
    # the array itself (kept alive by the caller) keeps the memory
    capsule = x.__dlpack__()
    label = _capsule_name(capsule)
    if label == b"dltensor":
        tensor = _DLTensor.from_address(_capsule_pointer(capsule, label))
        readonly = False
    elif label == b"dltensor_versioned":
        versioned = _DLTensorVersioned.from_address(_capsule_pointer(capsule, label))
        tensor, readonly = versioned.dl_tensor, bool(versioned.flags & _DLPACK_FLAG_READ_ONLY)
    else:
        raise ArrayError(f"{name} ({kind}): __dlpack__() gave a capsule named {label!r}, not a DLPack tensor")
    ndim = int(tensor.ndim)
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    strides = tuple(int(tensor.strides[i]) for i in range(ndim)) if tensor.strides else _contiguous(shape)
    code, bits, lanes = int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes)
    dtype = _DLPACK_DTYPES.get((code, bits)) if lanes == 1 else None
    dtype = dtype or f"other:{_DLPACK_CODES.get(code, f'code{code}')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
    return TensorView(ptr=int(tensor.data or 0) + int(tensor.byte_offset), shape=shape, strides=strides, dtype=dtype,
                      kind=kind, device=int(tensor.device.device_id), readonly=readonly)


def tensor_view(x: Any, name: str = "array") -> TensorView:
    """Pointer, shape, strides (elements), dtype and kind of a CUDA array, zero-copy: a torch tensor, anything with
    __cuda_array_interface__ (cupy, pycuda GPUArray, numba, jax) or DLPack (__dlpack__). Raises ArrayError (one line,
    naming `name`) for what is not CUDA device memory or not an array."""
    kind = array_kind(x)
    if hasattr(x, "data_ptr") and hasattr(x, "stride") and hasattr(x, "is_cuda"):  # torch, without importing it
        if not x.is_cuda:
            raise ArrayError(f"{name} ({kind}) is on the {getattr(x, 'device', 'CPU')}; the kernel needs CUDA device "
                             "memory (.cuda())")
        dtype = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.int32": "int32"}.get(
            str(x.dtype), f"other:{str(x.dtype).removeprefix('torch.')}")
        stream = None
        try:
            import torch

            stream = torch.cuda.current_stream(x.device).cuda_stream
        except Exception:
            pass
        index = getattr(getattr(x, "device", None), "index", None)
        return TensorView(ptr=x.data_ptr(), shape=tuple(x.shape), strides=tuple(x.stride()), dtype=dtype,
                          stream=stream, kind=kind, device=index)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("mask") is not None:
            raise ArrayError(f"{name} ({kind}) is a masked array; the kernel takes plain arrays")
        shape = tuple(int(d) for d in cai["shape"])
        typestr = str(cai["typestr"])
        try:
            itemsize = int(typestr[2:])
        except ValueError:
            raise ArrayError(f"{name} ({kind}): unreadable typestr {typestr!r}") from None
        if cai.get("strides") is None:
            strides = _contiguous(shape)
        else:
            if any(int(s) % itemsize for s in cai["strides"]):
                raise ArrayError(f"{name} ({kind}): strides {tuple(cai['strides'])} bytes are not a multiple of the "
                                 f"{itemsize}-byte element")
            strides = tuple(int(s) // itemsize for s in cai["strides"])
        data = cai["data"]
        dtype = _TYPESTR.get(typestr, f"other:{_TYPESTR_NAMES.get(typestr, typestr)}")
        return TensorView(ptr=int(data[0] or 0), shape=shape, strides=strides, dtype=dtype, stream=cai.get("stream"),
                          kind=kind, readonly=bool(data[1]) if len(data) > 1 else False)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _dlpack_view(x, name, kind)
    raise ArrayError(f"{name} ({kind}) is not a CUDA array: it has neither __cuda_array_interface__ nor __dlpack__ "
                     "(torch, cupy, pycuda, numba and jax arrays have one)")


def check_same_kind(views: dict[str, TensorView]) -> None:
    """One kind of array, on one device, for all the arguments the caller gave (one line otherwise)."""
    items = list(views.items())
    first_name, first = items[0]
    for other_name, other in items[1:]:
        if other.kind != first.kind:
            raise ArrayError(f"{first_name} is a {first.kind} but {other_name} is a {other.kind}: pass one kind of "
                             "array (convert with DLPack, e.g. torch.from_dlpack(x) or cupy.from_dlpack(x))")
        if first.device is not None and other.device is not None and other.device != first.device:
            raise ArrayError(f"{first_name} is on cuda:{first.device} but {other_name} on cuda:{other.device}; "
                             "put them on one GPU")


_DTYPE_WORDS = {"fp16": "float16", "bf16": "bfloat16 (or raw uint16 words)", "fp32": "float32", "int32": "int32"}


def _check_tensor(name: str, view: TensorView, dtype: str, shape: tuple[int, ...] | None = None) -> None:
    if view.dtype != dtype:
        got = view.dtype.removeprefix("other:")
        raise ArrayError(f"{name} has dtype {_DTYPE_WORDS.get(got, got)}, the kernel takes {_DTYPE_WORDS.get(dtype, dtype)}")
    if shape is not None and tuple(view.shape) != tuple(shape):
        raise ArrayError(f"{name} has shape {tuple(view.shape)}, expected {tuple(shape)}")
    if view.shape and view.shape[-1] > 1 and view.strides[-1] != 1:
        raise ArrayError(f"{name}: the last (head-dim) axis must be contiguous, stride is {view.strides[-1]} elements")


def empty_like(x: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """A new uninitialised CUDA array of `shape` and `dtype` (fp16/bf16/fp32) of the same kind as `x` where that kind
    can be made here (torch, cupy, pycuda GPUArray, numba device arrays), else a cupy array (jax arrays are
    immutable: wrap the result with jax.dlpack.from_dlpack)."""
    import numpy as np

    kind = array_kind(x)
    if kind.startswith("torch."):
        import torch

        torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        return torch.empty(shape, dtype=torch_dtype, device=x.device)
    # numpy-like dtypes: bf16 as the input's own dtype when the input is bf16 (raw words or ml_dtypes.bfloat16)
    same = getattr(x, "dtype", None)
    np_dtype = {"fp16": np.float16, "fp32": np.float32}.get(dtype) or (same if same is not None and
                                                                       np.dtype(same).itemsize == 2 else np.uint16)
    if kind.startswith("pycuda."):
        import pycuda.gpuarray

        return pycuda.gpuarray.empty(shape, dtype=np_dtype)
    if kind.startswith("numba."):
        from numba import cuda as numba_cuda

        return numba_cuda.device_array(shape, dtype=np_dtype)
    return _cupy().empty(shape, dtype=np_dtype)


def _alibi_fields(manifest: KernelManifest, view: TensorView | None, b: int, h: int) -> tuple[int | None, int]:
    """(pointer, batch stride) of the caller's ALiBi slopes, FlashAttention's fp32 (H) or (B, H); (None, 0) for none:
    the kernel then uses the standard slopes."""
    if view is None:
        return None, 0
    if not manifest.variant.alibi:
        raise ArrayError(f"alibi_slopes: {manifest.name} has no ALiBi bias (generate it with --alibi / alibi=True)")
    if view.dtype != "fp32":
        got = view.dtype.removeprefix("other:")
        raise ArrayError(f"alibi_slopes has dtype {_DTYPE_WORDS.get(got, got)}, the kernel takes float32")
    if tuple(view.shape) not in ((h,), (b, h)):
        raise ArrayError(f"alibi_slopes has shape {tuple(view.shape)}, expected ({h},) or ({b}, {h}): FlashAttention's "
                         "(nheads) or (batch, nheads)")
    if h > 1 and view.strides[-1] != 1:
        raise ArrayError(f"alibi_slopes: the head axis must be contiguous, stride is {view.strides[-1]} elements")
    return view.ptr, (view.strides[0] if len(view.shape) == 2 and b > 1 else 0)


def _mod_tensor_fields(manifest: KernelManifest, views: dict[str, TensorView],
                       sizes: dict[str, int]) -> list[tuple[int, tuple[int, ...]]]:
    """(pointer, element strides) of each call-time tensor the manifest declares (manifest.mod_tensors, in slot order),
    checked: one line for a missing, extra, wrongly typed or shaped one."""
    specs = manifest.call_tensors
    names = [spec.name for spec in specs]
    for name in views:
        if name not in names:
            reads = f"it reads {', '.join(names)}" if names else "it reads none"
            raise ArrayError(f"tensors: {name}: {manifest.name} has no call-time tensor of that name ({reads})")
    out = []
    for spec in specs:
        dims = spec.dims(sizes)
        declared = f"{spec.dtype} [{', '.join(map(str, spec.shape))}]"
        at = ", ".join(f"{d}={sizes[d]}" for d in dict.fromkeys(d for d in spec.shape if isinstance(d, str)))
        view = views.get(spec.name)
        if view is None:
            raise ArrayError(f"tensors: {spec.name} is missing: {manifest.name} reads {spec.name}, {declared} "
                             f"({dims} here); pass tensors={{{spec.name!r}: ...}}")
        label = f"tensors[{spec.name!r}]"
        if view.dtype != spec.dtype:
            got = view.dtype.removeprefix("other:")
            raise ArrayError(f"{label} has dtype {_DTYPE_WORDS.get(got, got)}, the kernel takes {spec.dtype}")
        if tuple(view.shape) != dims:
            raise ArrayError(f"{label} has shape {tuple(view.shape)}, expected {dims} ({declared}"
                             + (f" at {at})" if at else ")"))
        out.append((view.ptr, tuple(view.strides)))
    return out


def check_v_head_dim(manifest: KernelManifest, v: TensorView, o: TensorView | None = None) -> None:
    """V's (and O's) last axis against the kernel's V head dim (manifest.dv): one line (ArrayError) otherwise."""
    dv = manifest.dv
    own = manifest.head_dim_v is not None
    built = f"Dv={dv} (v (B, KVH, M, {dv}), o (B, H, N, {dv}))" if own else f"D={dv}, for q, k, v and o alike"
    for name, view in (("v", v), ("o", o)):
        if view is not None and len(view.shape) == 4 and view.shape[-1] != dv:
            raise ArrayError(f"{name} has head dim {view.shape[-1]} (shape {tuple(view.shape)}) but the kernel was "
                             f"built for {built}")


def check_call_time(manifest: KernelManifest, q: TensorView, k: TensorView, alibi_slopes: TensorView | None,
                    tensors: dict[str, TensorView]) -> None:
    """A call's ALiBi slopes and call-time tensors against the manifest at the sizes of q (B, H, N, D) and
    k (B, KVH, M, D): what build_params checks, without a GPU (ArrayError, one line)."""
    if len(q.shape) != 4 or len(k.shape) != 4:
        raise ArrayError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D)")
    b, h, n, d = q.shape
    _alibi_fields(manifest, alibi_slopes, b, h)
    _mod_tensor_fields(manifest, tensors, {"B": b, "H": h, "KVH": k.shape[1], "N": n, "M": k.shape[2], "D": d})


def build_params(manifest: KernelManifest, q: TensorView, k: TensorView, v: TensorView, o: TensorView,
                 lse: TensorView | None, workspace_ptr: int, scale: float, num_splits: int,
                 alibi_slopes: TensorView | None = None,
                 tensors: dict[str, TensorView] | None = None) -> FlashgenAttnParams:
    """The by-value kernel argument, checked against the manifest. `alibi_slopes`: the caller's ALiBi slopes (fp32 (H)
    or (B, H); None: the standard ones); `tensors`: the call-time tensors of its score and mask functions, by name."""
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise ArrayError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D)")
    b, h, n, d = q.shape
    kvh, m = k.shape[1], k.shape[2]
    if d != manifest.head_dim:
        raise ArrayError(f"head dim {d} but the kernel was built for D={manifest.head_dim}")
    dv = manifest.dv
    check_v_head_dim(manifest, v, o)
    if h % kvh:
        raise ArrayError(f"H={h} is not a multiple of KVH={kvh}")
    if h // kvh != manifest.variant.kv_group and manifest.variant.kv_group > 1:
        raise ArrayError(f"H/KVH = {h // kvh} but the kernel was built for kv_group={manifest.variant.kv_group}")
    dt = manifest.dtype.value
    _check_tensor("q", q, dt)
    _check_tensor("k", k, dt, (b, kvh, m, d))
    _check_tensor("v", v, dt, (b, kvh, m, dv))
    _check_tensor("o", o, dt, (b, h, n, dv))
    if lse is not None:
        _check_tensor("lse", lse, "fp32", (b, h, n))
        if lse.strides[2] != 1:
            raise ArrayError("lse rows must be contiguous (stride 1 along N)")
    p = FlashgenAttnParams()
    p.q, p.k, p.v, p.o = q.ptr, k.ptr, v.ptr, o.ptr
    p.lse = lse.ptr if lse is not None else None
    p.workspace = workspace_ptr or None
    p.q_stride_b, p.q_stride_h, p.q_stride_n = q.strides[:3]
    p.k_stride_b, p.k_stride_h, p.k_stride_m = k.strides[:3]
    p.v_stride_b, p.v_stride_h, p.v_stride_m = v.strides[:3]
    p.o_stride_b, p.o_stride_h, p.o_stride_n = o.strides[:3]
    if lse is not None:
        p.lse_stride_b, p.lse_stride_h = lse.strides[:2]
    p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_k = b, h, kvh, n, m
    p.num_splits = num_splits
    p.scale = scale
    p.alibi_slopes, p.alibi_stride_b = _alibi_fields(manifest, alibi_slopes, b, h)
    sizes = {"B": b, "H": h, "KVH": kvh, "N": n, "M": m, "D": d}
    for slot, (ptr, strides) in enumerate(_mod_tensor_fields(manifest, tensors or {}, sizes)):
        p.mod_tensors[slot] = ptr
        for axis, stride in enumerate(strides):
            p.mod_strides[slot][axis] = stride
    return p


def _sm_count(cp) -> int:
    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


def launch_sizes(manifest: KernelManifest, b: int, h: int, kvh: int, n: int, m: int, sms: int = 1) -> dict[str, int]:
    """The sizes a manifest's expressions see; `sms` is the running GPU's multiprocessor count."""
    sizes = {"B": b, "H": h, "KVH": kvh, "N": n, "M": m, "D": manifest.head_dim, "SPLITS": 1, "SMS": sms}
    sizes["SPLITS"] = max(1, eval_size(manifest.num_splits, sizes))
    return sizes


def call_time_views(alibi_slopes: Any = None, tensors: Any = None) -> tuple[TensorView | None, dict[str, TensorView]]:
    """The views of a call's ALiBi slopes and call-time tensors (`tensors`: a dict of name -> array), one line
    (ArrayError) for what is not that."""
    from collections.abc import Mapping

    slopes = tensor_view(alibi_slopes, "alibi_slopes") if alibi_slopes is not None else None
    if tensors is None:
        return slopes, {}
    if not isinstance(tensors, Mapping):
        raise ArrayError(f"tensors: expected a dict of name -> CUDA array, got {type(tensors).__name__}")
    views = {}
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise ArrayError(f"tensors: the names are strings (the kernel's tensor names), got {name!r}")
        views[name] = tensor_view(x, f"tensors[{name!r}]")
    return slopes, views


def prepare_launch(manifest: KernelManifest, kernel: LoadedKernel | str, q: Any, k: Any, v: Any, o: Any,
                   lse: Any = None, workspace: Any = None, scale: float | None = None, stream: Any = None,
                   step: str = "launch", alibi_slopes: Any = None, tensors: Any = None):
    """Check the tensors against the manifest once and return a zero-argument callable that only
    enqueues the launches (what the benchmark times). Arguments as for `launch`."""
    cp = _cupy()
    loaded = kernel if isinstance(kernel, LoadedKernel) else load_kernel(kernel, manifest)
    qv, kv, vv, ov = (tensor_view(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v"), (o, "o")))
    given = {"q": qv, "k": kv, "v": vv, "o": ov}
    if lse is not None:
        given["lse"] = tensor_view(lse, "lse")
    slopes_view, tensor_views = call_time_views(alibi_slopes, tensors)
    check_same_kind({**given, **({"alibi_slopes": slopes_view} if slopes_view is not None else {}),
                     **{f"tensors[{n!r}]": view for n, view in tensor_views.items()}})
    for name in ("o", "lse"):
        if name in given and given[name].readonly:
            raise ArrayError(f"{name} ({given[name].kind}) is read-only; the kernel writes it")
    if len(qv.shape) != 4 or len(kv.shape) != 4:
        raise ArrayError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D)")
    b, h, n, _ = qv.shape
    kvh, m = kv.shape[1], kv.shape[2]
    sizes = launch_sizes(manifest, b, h, kvh, n, m, _sm_count(cp))
    keep_alive = [q, k, v, o, lse, alibi_slopes, tensors]
    lse_view = given.get("lse")
    if lse_view is None and manifest.variant.return_lse:
        scratch = cp.empty((b, h, n), dtype=cp.float32)
        keep_alive.append(scratch)
        lse_view = tensor_view(scratch)
    ws_floats = eval_size(manifest.workspace_floats, sizes)
    ws_ptr = 0
    if ws_floats > 0:
        if workspace is None:
            workspace = cp.empty((ws_floats,), dtype=cp.float32)
        keep_alive.append(workspace)
        ws_ptr = tensor_view(workspace, "workspace").ptr
    params = build_params(manifest, qv, kv, vv, ov, lse_view, ws_ptr,
                          scale if scale is not None else 1.0 / math.sqrt(manifest.head_dim), sizes["SPLITS"],
                          alibi_slopes=slopes_view, tensors=tensor_views)
    stream_ptr = _stream_ptr(stream, qv, cp)
    views = {"q": qv, "k": kv, "v": vv, "o": ov}
    argument_lists: dict[tuple, int] = {}  # the launch's tensor maps -> the address of its argument pointers

    def arguments(maps_specs: list) -> int:
        key = tuple(maps_specs)
        if key not in argument_lists:
            args = [ctypes.addressof(params)]
            if maps_specs:  # Hopper TMA kernels: the maps are the second by-value argument
                from flashgen.harness.tensormaps import build_tensor_maps

                maps = build_tensor_maps(manifest, views, maps_specs)
                keep_alive.append(maps)
                args.append(ctypes.addressof(maps))
            arg_ptrs = (ctypes.c_void_p * len(args))(*args)
            keep_alive.append(arg_ptrs)
            argument_lists[key] = ctypes.addressof(arg_ptrs)
        return argument_lists[key]

    plan = []
    for spec in manifest.launches_at(sizes):  # a launch whose `when` fails at these sizes does not run
        grid = tuple(eval_size(g, sizes) for g in spec.grid)
        if any(g < 1 for g in grid):
            continue  # an empty grid writes nothing; verification reports that as unwritten output
        plan.append((loaded.functions[spec.kernel], grid, spec, arguments(manifest.maps_of(spec))))
    launch_kernel = cp.cuda.driver.launchKernel

    def run() -> None:
        _ = (params, keep_alive)  # the closure keeps the argument bytes and buffers alive
        for fptr, grid, spec, args_address in plan:
            try:
                launch_kernel(fptr, grid[0], grid[1], grid[2], spec.threads, 1, 1, spec.smem_bytes, stream_ptr,
                              args_address, 0)
            except Exception as exc:
                raise KernelRunError(f"CUDA error: {_cuda_message(exc)} launching kernel {spec.kernel} (grid {grid}, "
                                     f"{spec.threads} threads, {spec.smem_bytes} B smem) during {step}") from None

    run.stream_ptr = stream_ptr
    return run


def launch(manifest: KernelManifest, kernel: LoadedKernel | str, q: Any, k: Any, v: Any, o: Any, lse: Any = None,
           workspace: Any = None, scale: float | None = None, stream: Any = None, step: str = "launch",
           alibi_slopes: Any = None, tensors: Any = None) -> None:
    """Run the manifest's launches, in order, on `stream` (default: the tensors' current stream).

    q (B, H, N, D), k and v (B, KVH, M, D), o (B, H, N, D) in the kernel's dtype: torch tensors,
    __cuda_array_interface__ arrays (cupy, pycuda, numba, jax) or DLPack arrays, one kind for all (bf16 as
    torch.bfloat16, a 2-byte bfloat16 or raw uint16 words), any strides with a contiguous last axis; lse (B, H, N) fp32 or None (a scratch one is used when the variant writes
    it); workspace: fp32 device array, allocated here when the manifest needs one and none is given.
    alibi_slopes: an ALiBi kernel's slopes, FlashAttention's fp32 (H) or (B, H) (None: the standard 2^(-8 (h + 1) / H));
    tensors: {name: array} for each call-time tensor of its score and mask functions (manifest.mod_tensors: int32 or
    fp32 of the declared shape, any strides), every one the kernel declares and no other.
    `kernel` is a LoadedKernel or a cubin path. Raises ArrayError (a ValueError, one line) for mismatched inputs, KernelRunError
    on CUDA errors. Synchronizes only when it had to allocate scratch buffers."""
    cp = _cupy()
    run = prepare_launch(manifest, kernel, q, k, v, o, lse, workspace, scale, stream, step, alibi_slopes, tensors)
    run()
    needs_scratch = (lse is None and manifest.variant.return_lse) or (workspace is None and manifest.workspace_floats != "0")
    if needs_scratch:  # scratch buffers must outlive the launches
        cp.cuda.ExternalStream(run.stream_ptr).synchronize()


def _stream_ptr(stream: Any, qv: TensorView, cp) -> int:
    if stream is None:
        if qv.stream not in (None, 1, 2):
            return int(qv.stream)
        return cp.cuda.get_current_stream().ptr
    return int(getattr(stream, "ptr", getattr(stream, "cuda_stream", stream)))


def _cuda_message(exc: BaseException) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("CUDA_ERROR") and ": " in text else text


def is_sticky_cuda_error(exc: BaseException) -> bool:
    text = str(exc)
    return any(s.lower() in text.lower() for s in _STICKY_CUDA_ERRORS)


# ---------------------------------------------------------------------------------------------
# Compiling for the GPU at hand (inside the worker: for the worker's own GPU)
# ---------------------------------------------------------------------------------------------

def compile_kernel(kernel: KernelInput, arch: str) -> CompileInfo:
    """Compile kernel.source for `arch` through flashgen.harness.compile (cached); a cubin passes through."""
    if kernel.cubin_path:
        return CompileInfo(arch=arch, ok=True, cubin_path=kernel.cubin_path, feedback="prebuilt cubin")
    if not kernel.source:
        raise FlashgenError(f"kernel {kernel.label}: neither source nor cubin given")
    from flashgen.harness.compile import compile_cuda

    result = compile_cuda(kernel.source, arch, options=tuple(kernel.compile_options))
    return CompileInfo(arch=arch, ok=result.ok, cubin_path=result.cubin_path, feedback=result.feedback_text(),
                       log=result.log, resources={k: v.model_dump() for k, v in result.kernels.items()},
                       seconds=result.seconds)


def compile_rdc_cubin(source: str, arch: str, out_dir: str | Path | None = None) -> str:
    """Compile with relocatable device code and link cudadevrt into one cubin (device-side launches).
    Only the harness's own tests need this: generated kernels may not launch from the device."""
    from flashgen.harness.compile import find_nvcc, include_dirs

    nvcc = find_nvcc()
    work = Path(out_dir or tempfile.mkdtemp(prefix="flashgen-rdc-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "kernel.cu").write_text(source)
    includes = [a for d in include_dirs() for a in ("-I", str(d))]
    arch_flag = f"-arch={arch}"
    for cmd in ([nvcc, arch_flag, "-rdc=true", "-cubin", *includes, "kernel.cu", "-o", "kernel_rdc.cubin"],
                [nvcc, arch_flag, "-dlink", "-cubin", "kernel_rdc.cubin", "-lcudadevrt", "-o", "kernel.cubin"]):
        run = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
        if run.returncode:
            raise CompileFailed(f"{' '.join(cmd[1:4])}: {run.stderr.strip()[-1000:]}")
    return str(work / "kernel.cubin")


def ensure_compiled(kernel: KernelInput, arch: str) -> tuple[CompileInfo, str]:
    info = compile_kernel(kernel, arch)
    if not info.ok or not info.cubin_path:
        raise CompileFailed(f"kernel {kernel.label} does not compile for {arch}:\n{info.feedback}")
    return info, info.cubin_path


def runnable_arch(manifest: KernelManifest, device: int | None = None) -> str:
    """The arch to build for: the device's, unless the kernel needs a newer GPU than this one."""
    return arch_to_run(manifest, device_arch(device))


def arch_to_run(manifest: KernelManifest, gpu_arch: str) -> str:
    """runnable_arch on a GPU of `gpu_arch` (e.g. sm_90), without one: what a kernel is compiled for there (its
    arch-specific form, sm_90a, where it is written for that and the GPU is that). benchmarks/warm_cache.py fills
    the compile cache on a CPU machine with it."""
    want = manifest.arch.removeprefix("sm_").rstrip("a")
    if want.isdigit() and int(want) > int(gpu_arch.removeprefix("sm_")):
        raise FlashgenError(f"kernel {manifest.name} is written for {manifest.arch}; this GPU is {gpu_arch}")
    return gpu_arch + ("a" if manifest.arch.endswith("a") and manifest.arch.removesuffix("a") == gpu_arch else "")


def have_gpu() -> bool:
    """True when cupy imports and sees at least one CUDA device (cupy alone, without a driver, is not a GPU)."""
    try:
        cupy = _cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except FlashgenError:
        return False
    except Exception:  # no driver, no device: cupy raises its own CUDARuntimeError
        return False
