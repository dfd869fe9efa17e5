"""The device side of running kernels: loading a cubin, launching it on tensors (`launch`), the GPU's facts
(`device_arch`, `environment_info`, `have_gpu`) and compiling a kernel for the GPU at hand (`ensure_compiled`).

What verify and bench build on; the isolated worker process that runs them (flashgen.harness.worker) sits
above all three. `launch` is also the Python API for calling a built kernel on user tensors: torch tensors
(via data_ptr/stride, zero-copy, bf16 included) or anything with `__cuda_array_interface__` (cupy).
cupy is imported lazily: the CPU-only paths never need it.
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
# Tensors: torch (data_ptr/stride) or __cuda_array_interface__
# ---------------------------------------------------------------------------------------------

class TensorView(BaseModel):
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] = Field(description="in elements")
    dtype: str = Field(description="fp16 | bf16 | fp32 | other:<typestr>")
    stream: int | None = None


_TYPESTR = {"<f2": "fp16", "<f4": "fp32", "<u2": "bf16", "<V2": "bf16"}  # bf16 travels as raw 16-bit words


def tensor_view(x: Any) -> TensorView:
    if hasattr(x, "data_ptr") and hasattr(x, "stride") and hasattr(x, "is_cuda"):  # torch, without importing it
        if not x.is_cuda:
            raise ValueError("tensor is on the CPU; the kernel needs CUDA tensors")
        name = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}.get(str(x.dtype),
                                                                                              f"other:{x.dtype}")
        stream = None
        try:
            import torch

            stream = torch.cuda.current_stream(x.device).cuda_stream
        except Exception:
            pass
        return TensorView(ptr=x.data_ptr(), shape=tuple(x.shape), strides=tuple(x.stride()), dtype=name,
                          stream=stream)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise ValueError(f"{type(x).__name__} is not a CUDA array (no __cuda_array_interface__ or torch tensor)")
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    if cai.get("strides") is None:
        strides, acc = [], 1
        for dim in reversed(shape):
            strides.append(acc)
            acc *= dim
        strides = tuple(reversed(strides))
    else:
        if any(s % itemsize for s in cai["strides"]):
            raise ValueError("strides are not a multiple of the element size")
        strides = tuple(s // itemsize for s in cai["strides"])
    return TensorView(ptr=int(cai["data"][0]), shape=shape, strides=strides,
                      dtype=_TYPESTR.get(typestr, f"other:{typestr}"), stream=cai.get("stream"))


def _check_tensor(name: str, view: TensorView, dtype: str, shape: tuple[int, ...] | None = None) -> None:
    if view.dtype != dtype:
        raise ValueError(f"{name} has dtype {view.dtype}, the kernel takes {dtype}")
    if shape is not None and tuple(view.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(view.shape)}, expected {tuple(shape)}")
    if view.shape and view.shape[-1] > 1 and view.strides[-1] != 1:
        raise ValueError(f"{name}: the last (head-dim) axis must be contiguous, stride is {view.strides[-1]}")


def build_params(manifest: KernelManifest, q: TensorView, k: TensorView, v: TensorView, o: TensorView,
                 lse: TensorView | None, workspace_ptr: int, scale: float, num_splits: int) -> FlashgenAttnParams:
    """The by-value kernel argument, checked against the manifest."""
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise ValueError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D)")
    b, h, n, d = q.shape
    kvh, m = k.shape[1], k.shape[2]
    if d != manifest.head_dim:
        raise ValueError(f"head dim {d} but the kernel was built for D={manifest.head_dim}")
    if h % kvh:
        raise ValueError(f"H={h} is not a multiple of KVH={kvh}")
    if h // kvh != manifest.variant.kv_group and manifest.variant.kv_group > 1:
        raise ValueError(f"H/KVH = {h // kvh} but the kernel was built for kv_group={manifest.variant.kv_group}")
    dt = manifest.dtype.value
    _check_tensor("q", q, dt)
    _check_tensor("k", k, dt, (b, kvh, m, d))
    _check_tensor("v", v, dt, (b, kvh, m, d))
    _check_tensor("o", o, dt, (b, h, n, d))
    if lse is not None:
        _check_tensor("lse", lse, "fp32", (b, h, n))
        if lse.strides[2] != 1:
            raise ValueError("lse rows must be contiguous (stride 1 along N)")
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
    return p


def launch_sizes(manifest: KernelManifest, b: int, h: int, kvh: int, n: int, m: int) -> dict[str, int]:
    sizes = {"B": b, "H": h, "KVH": kvh, "N": n, "M": m, "D": manifest.head_dim, "SPLITS": 1}
    sizes["SPLITS"] = max(1, eval_size(manifest.num_splits, sizes))
    return sizes


def prepare_launch(manifest: KernelManifest, kernel: LoadedKernel | str, q: Any, k: Any, v: Any, o: Any,
                   lse: Any = None, workspace: Any = None, scale: float | None = None, stream: Any = None,
                   step: str = "launch"):
    """Check the tensors against the manifest once and return a zero-argument callable that only
    enqueues the launches (what the benchmark times). Arguments as for `launch`."""
    cp = _cupy()
    loaded = kernel if isinstance(kernel, LoadedKernel) else load_kernel(kernel, manifest)
    qv, kv, vv, ov = (tensor_view(t) for t in (q, k, v, o))
    if len(qv.shape) != 4 or len(kv.shape) != 4:
        raise ValueError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D)")
    b, h, n, _ = qv.shape
    kvh, m = kv.shape[1], kv.shape[2]
    sizes = launch_sizes(manifest, b, h, kvh, n, m)
    keep_alive = [q, k, v, o, lse]
    lse_view = tensor_view(lse) if lse is not None else None
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
        ws_ptr = tensor_view(workspace).ptr
    params = build_params(manifest, qv, kv, vv, ov, lse_view, ws_ptr,
                          scale if scale is not None else 1.0 / math.sqrt(manifest.head_dim), sizes["SPLITS"])
    stream_ptr = _stream_ptr(stream, qv, cp)
    args = [ctypes.addressof(params)]
    if manifest.tensor_maps:  # Hopper TMA kernels: the maps are the second by-value argument
        from flashgen.harness.tensormaps import build_tensor_maps

        maps = build_tensor_maps(manifest, {"q": qv, "k": kv, "v": vv, "o": ov})
        keep_alive.append(maps)
        args.append(ctypes.addressof(maps))
    arg_ptrs = (ctypes.c_void_p * len(args))(*args)
    plan = []
    for spec in manifest.launches:
        grid = tuple(eval_size(g, sizes) for g in spec.grid)
        if any(g < 1 for g in grid):
            continue  # an empty grid writes nothing; verification reports that as unwritten output
        plan.append((loaded.functions[spec.kernel], grid, spec))
    launch_kernel = cp.cuda.driver.launchKernel
    args_address = ctypes.addressof(arg_ptrs)

    def run() -> None:
        _ = (params, arg_ptrs, keep_alive)  # the closure keeps the argument bytes and buffers alive
        for fptr, grid, spec in plan:
            try:
                launch_kernel(fptr, grid[0], grid[1], grid[2], spec.threads, 1, 1, spec.smem_bytes, stream_ptr,
                              args_address, 0)
            except Exception as exc:
                raise KernelRunError(f"CUDA error: {_cuda_message(exc)} launching kernel {spec.kernel} (grid {grid}, "
                                     f"{spec.threads} threads, {spec.smem_bytes} B smem) during {step}") from None

    run.stream_ptr = stream_ptr
    return run


def launch(manifest: KernelManifest, kernel: LoadedKernel | str, q: Any, k: Any, v: Any, o: Any, lse: Any = None,
           workspace: Any = None, scale: float | None = None, stream: Any = None, step: str = "launch") -> None:
    """Run the manifest's launches, in order, on `stream` (default: the tensors' current stream).

    q (B, H, N, D), k and v (B, KVH, M, D), o (B, H, N, D) in the kernel's dtype (torch tensors or
    __cuda_array_interface__ arrays; bf16 as torch.bfloat16 or raw uint16 words), any strides with a
    contiguous last axis; lse (B, H, N) fp32 or None (a scratch one is used when the variant writes
    it); workspace: fp32 device array, allocated here when the manifest needs one and none is given.
    `kernel` is a LoadedKernel or a cubin path. Raises ValueError for mismatched inputs, KernelRunError
    on CUDA errors. Synchronizes only when it had to allocate scratch buffers."""
    cp = _cupy()
    run = prepare_launch(manifest, kernel, q, k, v, o, lse, workspace, scale, stream, step)
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
    dev = device_arch(device)
    want = manifest.arch.removeprefix("sm_").rstrip("a")
    if want.isdigit() and int(want) > int(dev.removeprefix("sm_")):
        raise FlashgenError(f"kernel {manifest.name} is written for {manifest.arch}; this GPU is {dev}")
    return dev + ("a" if manifest.arch.endswith("a") and manifest.arch.removesuffix("a") == dev else "")


def have_gpu() -> bool:
    """True when cupy imports and sees at least one CUDA device (cupy alone, without a driver, is not a GPU)."""
    try:
        cupy = _cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except FlashgenError:
        return False
    except Exception:  # no driver, no device: cupy raises its own CUDARuntimeError
        return False
