"""The GPUs a library job can run its GPU stages on: one worker per visible GPU (CUDA_VISIBLE_DEVICES is respected:
CUDA numbers the visible devices 0..n-1, and `visible_id` keeps the id the variable gave), each matched to a target
of the table by name, compute capability and SM count (an H100 PCIe is not the h100 SXM target). Read through cupy;
without cupy, or without a device, there are none and every entry is compiled and estimated."""

from __future__ import annotations

import os
import re
import socket

from pydantic import BaseModel

# Ray's rule for an NVIDIA device name's accelerator type (ray/_private/accelerators/nvidia_gpu.py,
# NVIDIA_GPU_NAME_PATTERN, Ray 2.60): the first all-caps/digits model token after the vendor word, spaces -> dashes;
# else the name without "NVIDIA " (GeForce parts). ray.util.accelerators names: NVIDIA_TESLA_T4 = "T4",
# NVIDIA_A100 = "A100", NVIDIA_L4 = "L4", NVIDIA_H100 = "H100", NVIDIA_H200 = "H200".
_RAY_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
RAY_ACCELERATOR_TYPES = {
    "t4": "T4",  # ray.util.accelerators.NVIDIA_TESLA_T4 ("Tesla T4")
    "rtx8000": "RTX-8000",  # no constant; Ray's rule on "Quadro RTX 8000"
    "a100": "A100",  # NVIDIA_A100
    "a10": "A10",  # no constant (NVIDIA_TESLA_A10G = "A10G" is AWS's A10G, another part); Ray's rule on "NVIDIA A10"
    "rtx3090": "GeForce-RTX-3090",  # Ray's rule on "NVIDIA GeForce RTX 3090"
    "l4": "L4",  # NVIDIA_L4
    "rtx4090": "GeForce-RTX-4090",
    "h100": "H100",  # NVIDIA_H100
    "h200": "H200",  # NVIDIA_H200
}


def ray_type_of_name(device_name: str) -> str | None:
    """What Ray labels a node with this NVIDIA device (its accelerator_type resource is `accelerator_type:<this>`)."""
    m = _RAY_NAME.match(device_name)
    found = m.group(1).replace(" ", "-") if m else None
    if found and len(found) > 1:
        return found
    cleaned = re.sub(r"^NVIDIA\s+", "", device_name).strip()
    return cleaned.replace(" ", "-") or None


def ray_accelerator_type(target) -> str:
    """The Ray accelerator type a target's GPU tasks ask for (a user's target: Ray's rule on its marketing name)."""
    return RAY_ACCELERATOR_TYPES.get(target.name) or ray_type_of_name(target.marketing_name) or target.name.upper()


class LocalGpu(BaseModel):
    index: int  # the CUDA device number in this process
    name: str
    target: str | None = None  # the table's target it is, or None
    visible_id: str = ""  # its id in CUDA_VISIBLE_DEVICES (or the index when the variable is not set)
    host: str = ""

    def describe(self) -> dict:
        return {"device": self.index, "name": self.name, "visible_id": self.visible_id, "host": self.host}


def match_target(name: str, compute_capability: tuple[int, int] | None = None, sm_count: int | None = None) -> str | None:
    """The target a device is: by name (aliases, then Ray's model token: 'NVIDIA H100 80GB HBM3' -> h100), and only
    when its compute capability and SM count agree with the table's."""
    from flashgen.errors import UsageError
    from flashgen.targets import get_target

    for label in (name, ray_type_of_name(name) or ""):
        try:
            target = get_target(label)
        except UsageError:
            continue
        if compute_capability is not None and tuple(target.compute_capability) != tuple(compute_capability):
            return None
        if sm_count is not None and target.sm_count != sm_count:
            return None
        return target.name
    return None


def local_gpus() -> list[LocalGpu]:
    """The visible GPUs (cupy), each with the target it is; [] without cupy or a device."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: no GPU stages
        return []
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    host = socket.gethostname()
    gpus = []
    for index in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gpus.append(LocalGpu(index=index, name=name, host=host,
                             target=match_target(name, (props["major"], props["minor"]), props["multiProcessorCount"]),
                             visible_id=visible[index] if index < len(visible) else str(index)))
    return gpus


def parse_gpu_list(text: str, found: list[LocalGpu]) -> list[LocalGpu]:
    """`--gpus 0,1` (CUDA device numbers of this process) or `--gpus none`."""
    from flashgen.errors import UsageError

    if text.strip().lower() == "none":
        return []
    by_index = {g.index: g for g in found}
    chosen = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) not in by_index:
            raise UsageError(f"--gpus {text}: {part.strip()!r} is not a visible GPU (visible: "
                             f"{', '.join(str(i) for i in by_index) or 'none'})")
        chosen.append(by_index[int(part)])
    return chosen
