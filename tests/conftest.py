import os

# Small matmuls in the fp64 reference are ~100x slower with OpenBLAS threads fighting on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import shutil

import pytest


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
