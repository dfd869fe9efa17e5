import os

# Small matmuls in the fp64 reference are ~100x slower with OpenBLAS threads fighting on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import functools
import shutil
import sys
from pathlib import Path

import pytest

# The GPU modules' helpers (tests.gpu_kernels, tests.test_harness_gpu, ...) are imported by name, here and in
# the spawned build and GPU worker processes (they inherit sys.path): the repo root must be on it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import gpu_kernels  # noqa: E402

# (module name, key) -> gpu_kernels.Built, filled by the pre-compile pass (pytest_collection_finish)
_PREBUILT: dict = {}


@functools.cache
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


def _selected_gpu_modules(items) -> dict:
    """{module: its selected items} of the modules that define gpu_kernels.HOOK."""
    modules: dict = {}
    for item in items:
        module = getattr(item, "module", None)
        if "gpu" in item.keywords and module is not None and hasattr(module, gpu_kernels.HOOK):
            modules.setdefault(module, []).append(item)
    return modules


def pytest_collection_finish(session):
    """The session's one pre-compile pass (on a GPU, not for --collect-only): every kernel the selected GPU tests
    need, built and compiled in parallel over all usable CPUs into the compile cache (tests/gpu_kernels.py).
    Prints the kernel count and the wall time. A failure here fails only the tests of the kernels concerned."""
    if session.config.option.collectonly or not _has_gpu():
        return
    modules = _selected_gpu_modules(session.items)
    if not modules:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    try:
        from flashgen.harness.worker import device_arch, runnable_arch

        arch = device_arch()
        builds = {(module.__name__, key): build for module, items in modules.items()
                  for key, build in getattr(module, gpu_kernels.HOOK)(items, arch).items()}
        say(f"[gpu pre-compile] {len(builds)} kernels of {len(modules)} modules for {arch}, "
            f"{gpu_kernels.usable_cpus()} CPUs ...")
        kernels, stats = gpu_kernels.build_and_compile(builds, arch, arch_for=runnable_arch)
    except Exception as exc:  # the module fixtures build what is missing themselves and fail where it fails
        say(f"[gpu pre-compile] failed ({type(exc).__name__}: {exc}); each module builds its own kernels")
        return
    _PREBUILT.update(kernels)
    say(stats.line())
    for key, built in kernels.items():
        if built.error is not None:
            say(f"[gpu pre-compile] {key}: {built.error.splitlines()[0][:300]}")


@pytest.fixture(scope="module")
def prebuilt_kernels(request) -> gpu_kernels.Kernels:
    """{key: (source, manifest)} of this module's selected tests (its gpu_kernels hook), from the pre-compile
    pass; what that pass did not cover is built and compiled here the same way. A kernel that failed to build
    or compile fails the tests that index it, with the error."""
    from flashgen.harness.worker import device_arch, runnable_arch

    module = request.module
    items = [item for item in request.session.items if getattr(item, "module", None) is module]
    wanted = getattr(module, gpu_kernels.HOOK)(items, device_arch())
    missing = {(module.__name__, key): build for key, build in wanted.items()
               if (module.__name__, key) not in _PREBUILT}
    if missing:
        _PREBUILT.update(gpu_kernels.build_and_compile(missing, device_arch(), arch_for=runnable_arch)[0])
    return gpu_kernels.Kernels({key: _PREBUILT[(module.__name__, key)] for key in wanted})


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    """{key: VerificationReport}: every kernel of the module's prebuilt_kernels through the harness's whole
    verification (every default case, two seeds each), on several GPU workers at once."""
    from flashgen.harness.worker import KernelInput
    from tests.gpu_kernels import verify_many

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items()})


@pytest.fixture(scope="module")
def gpu_worker():
    """One GPU worker process for a module's verifications."""
    from flashgen.harness.worker import GpuWorker

    with GpuWorker(job_timeout_s=240) as w:
        yield w
