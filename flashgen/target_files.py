"""GPUs the table in flashgen/targets.py lacks: target files (TOML), `flashgen targets add FILE.toml`,
`--targets FILE.toml` on any command, and `flashgen targets detect` (the GPU present, read through cupy or
cuda-python, written as such a file).

A target file (its model: flashgen.targets.TargetFile) names the GPU and gives what the arch cannot: SMs, clock, L2 size, memory bandwidth. The rest follows
from its compute capability: the [CC] facts of flashgen.targets.ARCH_FACTS (shared memory, threads and blocks per
SM, mma shapes, cp.async, TMA) and the peaks from the arch's per-SM rates (flashgen.targets.SM_RATES) times SMs
times clock, unless the file gives them. The translator backend follows from the arch (sm_75, sm_80, sm_86, sm_89,
sm_90); a capability flashgen has no backend for is refused in one line.

    name = "rtx6000ada"
    marketing_name = "NVIDIA RTX 6000 Ada Generation"
    compute_capability = [8, 9]
    sm_count = 142
    boost_clock_mhz = 2505
    l2_mb = 96
    mem_bandwidth_gbs = 960

`targets add` validates the file and copies it to the user's config folder (`<config>/targets/NAME.toml`,
flashgen.paths.config_dir), where every later command finds it; `--targets FILE` registers it for one command only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from flashgen.errors import UsageError
from flashgen.targets import (
    ARCH_FACTS,
    Target,
    TargetFile,
    parse_target_file,
    read_target_file,
    register_target,
    user_targets_dir,
)

__all__ = ["TargetFile", "add_target_file", "detected_toml", "parse_target_file", "read_device", "read_target_file",
           "register_target_file", "short_name", "target_from_dict"]


def register_target_file(path: str | Path) -> Target:
    """Register a target file for this process (`--targets FILE.toml`)."""
    return register_target(read_target_file(path).to_target())


def add_target_file(path: str | Path) -> tuple[Target, Path]:
    """`flashgen targets add FILE.toml`: validate, register, and copy into the user's config folder."""
    parsed = read_target_file(path)
    target = register_target(parsed.to_target())
    folder = user_targets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{parsed.name}.toml"
    tmp = dest.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(Path(path).read_text())
    os.replace(tmp, dest)
    return target, dest


def target_from_dict(data: dict[str, Any]) -> Target:
    """A Target from its model_dump (what the library job hands its workers for a GPU only the driver knew);
    registered in this process when the table lacks it."""
    from flashgen.targets import TARGETS

    target = Target.model_validate(data)
    if TARGETS.get(target.name) != target:
        register_target(target)
    return target


# ------------------------------------------------------------------------------------------ `targets detect`

FILL_IN = "FILL IN"


def read_device(device: int = 0) -> dict[str, Any]:
    """What the CUDA runtime says of a device: cupy when it imports, else cuda-python. Raises UsageError (one line)
    when neither sees a GPU. Values it cannot read are absent."""
    errors = []
    try:
        return _read_with_cupy(device)
    except ImportError as exc:
        errors.append(f"cupy: {exc}")
    except Exception as exc:  # noqa: BLE001 - no driver, no device: cupy raises its own CUDARuntimeError
        errors.append(f"cupy: {type(exc).__name__}: {exc}")
    try:
        return _read_with_cuda_python(device)
    except ImportError as exc:
        errors.append(f"cuda-python: {exc}")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"cuda-python: {type(exc).__name__}: {exc}")
    raise UsageError("no GPU here to detect (" + "; ".join(e.splitlines()[0] for e in errors) + ")")


_ATTRIBUTES = {"clock_khz": 13, "memory_clock_khz": 36, "memory_bus_bits": 37}  # cudaDeviceAttr values


def _read_with_cupy(device: int) -> dict[str, Any]:
    import cupy

    runtime = cupy.cuda.runtime
    if runtime.getDeviceCount() <= device:
        raise RuntimeError(f"no CUDA device {device} (found {runtime.getDeviceCount()})")
    props = runtime.getDeviceProperties(device)
    name = props["name"]
    out: dict[str, Any] = {"name": name.decode() if isinstance(name, bytes) else str(name),
                           "major": props["major"], "minor": props["minor"]}
    for key, prop in (("sm_count", "multiProcessorCount"), ("smem_per_sm_bytes", "sharedMemPerMultiprocessor"),
                      ("smem_per_block_bytes", "sharedMemPerBlockOptin"), ("l2_bytes", "l2CacheSize"),
                      ("regs_per_sm", "regsPerMultiprocessor"), ("max_threads_per_sm", "maxThreadsPerMultiProcessor"),
                      ("max_blocks_per_sm", "maxBlocksPerMultiProcessor"), ("clock_khz", "clockRate"),
                      ("memory_clock_khz", "memoryClockRate"), ("memory_bus_bits", "memoryBusWidth")):
        if props.get(prop):
            out[key] = int(props[prop])
    for key, attribute in _ATTRIBUTES.items():  # CUDA 13 dropped the clocks from cudaDeviceProp
        if key not in out:
            try:
                value = int(runtime.deviceGetAttribute(attribute, device))
            except Exception:  # noqa: BLE001 - not readable here: marked for the user
                continue
            if value > 0:
                out[key] = value
    return out


def _read_with_cuda_python(device: int) -> dict[str, Any]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart  # older cuda-python

    def call(result):
        err, *values = result
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {int(err)}")
        return values[0] if len(values) == 1 else values

    count = call(cudart.cudaGetDeviceCount())
    if count <= device:
        raise RuntimeError(f"no CUDA device {device} (found {count})")
    props = call(cudart.cudaGetDeviceProperties(device))
    name = props.name
    out: dict[str, Any] = {"name": (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00"),
                           "major": props.major, "minor": props.minor}
    for key, prop in (("sm_count", "multiProcessorCount"), ("smem_per_sm_bytes", "sharedMemPerMultiprocessor"),
                      ("smem_per_block_bytes", "sharedMemPerBlockOptin"), ("l2_bytes", "l2CacheSize"),
                      ("regs_per_sm", "regsPerMultiprocessor"), ("max_threads_per_sm", "maxThreadsPerMultiProcessor"),
                      ("max_blocks_per_sm", "maxBlocksPerMultiProcessor"), ("memory_bus_bits", "memoryBusWidth")):
        if getattr(props, prop, 0):
            out[key] = int(getattr(props, prop))
    for key, attribute in _ATTRIBUTES.items():
        if key not in out:
            try:
                value = int(call(cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr(attribute), device)))
            except Exception:  # noqa: BLE001
                continue
            if value > 0:
                out[key] = value
    return out


def short_name(marketing_name: str) -> str:
    """A target key from a device name: 'NVIDIA RTX 6000 Ada Generation' -> 'rtx6000adageneration'."""
    key = re.sub(r"[^a-z0-9]", "", marketing_name.lower()).removeprefix("nvidia")
    return (key or "gpu")[:40]


def detected_toml(device: dict[str, Any]) -> tuple[str, list[str]]:
    """A target file for what read_device found, and the keys it could not read (written commented out, marked
    FILL IN, so that `targets add` refuses the file until the user gives them)."""
    name = device.get("name", "")
    cc = (int(device["major"]), int(device["minor"]))
    missing: list[str] = []
    lines = [f"# written by `flashgen targets detect` from {name} (compute capability {cc[0]}.{cc[1]})",
             "# peaks follow from the arch's per-SM rates (flashgen/targets.py SM_RATES) x SMs x boost_clock_mhz;",
             "# give peak_tflops = { fp16 = ..., bf16 = ... } to use a datasheet's instead",
             f'name = "{short_name(name)}"', f'marketing_name = "{name}"',
             f"compute_capability = [{cc[0]}, {cc[1]}]"]
    try:
        from flashgen.targets import get_target

        known = get_target(name)
    except UsageError:
        known = None
    if known is not None and known.sm_count == device.get("sm_count"):
        lines.append(f"# NOTE: this GPU is the table's target {known.name!r} already; give name and marketing_name "
                     "new values to add it as another")
    if cc not in ARCH_FACTS:
        lines.append(f"# NOTE: flashgen has no translator backend for sm_{cc[0]}{cc[1]}: `targets add` refuses this "
                     "file until one exists")

    def put(key: str, value: Any, comment: str) -> None:
        if value is None:
            missing.append(key)
            lines.append(f"# {key} =   # {FILL_IN}: {comment}")
        else:
            lines.append(f"{key} = {value}  # {comment}")

    put("sm_count", device.get("sm_count"), "multiProcessorCount")
    clock = device.get("clock_khz")
    put("boost_clock_mhz", None if clock is None else round(clock / 1000),
        "cudaDevAttrClockRate (the maximum clock; a datasheet's peaks may use a lower one)" if clock
        else "the boost clock in MHz (not readable here)")
    l2 = device.get("l2_bytes")
    put("l2_bytes", l2, "l2CacheSize")
    mem_clock, bus = device.get("memory_clock_khz"), device.get("memory_bus_bits")
    bandwidth = round(2 * mem_clock * 1e3 * bus / 8 / 1e9) if mem_clock and bus else None
    put("mem_bandwidth_gbs", bandwidth,
        f"2 x memory clock {mem_clock / 1000:g} MHz x {bus}-bit bus / 8" if bandwidth else
        "DRAM GB/s from the datasheet (memory clock or bus width not readable here)")
    facts = ARCH_FACTS.get(cc, {})
    for key in ("smem_per_sm_bytes", "smem_per_block_bytes", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm"):
        value = device.get(key)
        if value is not None and value != facts.get(key, 65536 if key == "regs_per_sm" else None):
            lines.append(f"{key} = {value}  # read from the device (differs from the compute capability's)")
    if "geforce" in name.lower():
        lines.append("fp32_accumulate_half_rate = true  # a GeForce part (from its name): check its datasheet")
    return "\n".join(lines) + "\n", missing
