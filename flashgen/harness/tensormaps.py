"""TMA tensor maps for Hopper kernels: the host half of `cp.async.bulk.tensor`.

A manifest's `tensor_maps` (flashgen.abi.TensorMapSpec) name the tensors a kernel loads or stores through the
copy engine and the box it moves. Here each is encoded with the driver's `cuTensorMapEncodeTiled` (through
cuda-python's `cuda.bindings.driver`, imported only when a kernel needs it) over the tensor's own layout: four
axes (head dim, rows, heads, batch), the tensor's strides in bytes, zero fill for rows past the end. The result is
the 512-byte `FlashgenTensorMaps` argument (flashgen_abi.cuh) that the kernel takes by value.

The copy engine's rules, checked before encoding so that a tensor it cannot describe is one clear line: the base
address 16-byte aligned, every stride but the innermost a multiple of 16 bytes and below 2^40.
"""

from __future__ import annotations

import ctypes

from flashgen.abi import TENSOR_MAP_BYTES, KernelManifest, TensorMapSpec
from flashgen.errors import FlashgenError

_ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


class FlashgenTensorMap(ctypes.Structure):
    # The driver copies kernel arguments from host memory byte for byte: no host alignment is needed.
    _fields_ = [("opaque", ctypes.c_ubyte * TENSOR_MAP_BYTES)]


class FlashgenTensorMaps(ctypes.Structure):
    """Host mirror of the C struct: four maps in the order q, k, v, o (512 bytes)."""

    _fields_ = [(name, FlashgenTensorMap) for name in ("q", "k", "v", "o")]


class TensorMapError(FlashgenError):
    """A tensor the copy engine cannot describe, or a driver refusal, in one line."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 spelled it so
        except ImportError:
            raise TensorMapError("this kernel loads through TMA tensor maps, which need cuda-python "
                                 "(pip install cuda-python)") from None
    driver.cuInit(0)  # idempotent; the encoder needs an initialised driver, not a context
    return driver


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise TensorMapError(message)


def encode(spec: TensorMapSpec, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> bytes:
    """The 128 bytes of one CUtensorMap for a (B, H, rows, D) tensor with the given element strides."""
    driver = _driver()
    itemsize = _ITEMSIZE[dtype]
    b, h, rows, d = shape
    # An axis of size 1 is never stepped over: give it a stride the engine accepts (its value is never used).
    sb, sh, sr = (s if n > 1 else rows * d for s, n in zip(strides[:3], (b, h, rows)))
    _check(strides[3] == 1 or d == 1, f"{spec.tensor}: the head-dim axis must be contiguous for TMA")
    _check(ptr % 16 == 0, f"{spec.tensor}: base address {ptr:#x} is not 16-byte aligned, which TMA needs")
    for axis, s in (("rows", sr), ("heads", sh), ("batch", sb)):
        _check((s * itemsize) % 16 == 0 and 0 < s * itemsize < (1 << 40),
               f"{spec.tensor}: stride along {axis} is {s * itemsize} bytes; TMA needs a positive multiple of 16")
    _check(spec.box_cols * itemsize <= spec.swizzle_bytes,
           f"{spec.tensor}: a box row of {spec.box_cols * itemsize} bytes exceeds the {spec.swizzle_bytes}-byte swizzle")
    dtypes = driver.CUtensorMapDataType
    data_type = {"fp16": dtypes.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "bf16": dtypes.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                 "fp32": dtypes.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[dtype]
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        data_type, 4, ptr,
        [u64(d), u64(rows), u64(h), u64(b)],
        [u64(sr * itemsize), u64(sh * itemsize), u64(sb * itemsize)],
        [u32(spec.box_cols), u32(spec.box_rows), u32(1), u32(1)],
        [u32(1), u32(1), u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if int(err) != 0:
        raise TensorMapError(f"{spec.tensor}: cuTensorMapEncodeTiled refused the map ({err}) for shape {shape}, "
                             f"strides {strides}, box {spec.box_rows}x{spec.box_cols}")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


def build_tensor_maps(manifest: KernelManifest, views: dict,
                      specs: list[TensorMapSpec] | None = None) -> FlashgenTensorMaps:
    """The kernel's second argument: each map of `specs` (default: the manifest's; a launch's own:
    KernelManifest.maps_of), encoded over the tensor in `views` ({"q": TensorView, ...}); the others stay zero."""
    maps = FlashgenTensorMaps()
    for spec in manifest.tensor_maps if specs is None else specs:
        view = views[spec.tensor]
        raw = encode(spec, view.ptr, tuple(view.shape), tuple(view.strides), manifest.dtype.value)
        ctypes.memmove(ctypes.addressof(getattr(maps, spec.tensor)), raw, TENSOR_MAP_BYTES)
    return maps
