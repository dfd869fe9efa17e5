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


@pytest.fixture(scope="session")
def compile_for_this_gpu():
    """compile({key: (source, manifest)}): every source compiled in parallel into the cache the GPU worker reads;
    a failure fails the calling fixture with each kernel's compiler feedback. Returns its argument."""
    def compile_all(built: dict) -> dict:
        from flashgen.harness.compile import compile_many
        from flashgen.harness.worker import device_arch

        results = compile_many([source for source, _ in built.values()], device_arch())
        failed = [f"{key}: {r.feedback_text(300)}" for key, r in zip(built, results) if not r.ok]
        assert not failed, "\n".join(failed)
        return built

    return compile_all


@pytest.fixture(scope="module")
def gpu_worker():
    """One GPU worker process for a module's verifications."""
    from flashgen.harness.worker import GpuWorker

    with GpuWorker(job_timeout_s=240) as w:
        yield w
