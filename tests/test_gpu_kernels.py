"""The GPU suite's pre-compile pass and batched verification (tests/gpu_kernels.py), on the CPU."""

import shutil
import threading

import pytest

from tests import gpu_kernels
from tests.gpu_kernels import Build, Built, Kernels


def _broken_build():
    raise ValueError("no such variant")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_build_and_compile_builds_in_processes_and_compiles_each_source_once(tmp_path, monkeypatch):
    from flashgen.harness import testkernels

    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    builds = {"a": Build(testkernels.build, ("simple_attention",), {"arch": "sm_80"}),
              "same": Build(testkernels.build, ("simple_attention",), {"arch": "sm_80"}),
              "broken": Build(_broken_build)}
    kernels, stats = gpu_kernels.build_and_compile(builds, "sm_80", jobs=2)
    assert kernels["a"].error is None and kernels["a"].source == kernels["same"].source
    assert kernels["broken"].error == "build failed: ValueError: no such variant" and kernels["broken"].source is None
    assert (stats.kernels, stats.sources, stats.compiled, stats.cache_hits, stats.failed) == (3, 1, 1, 0, 1)
    assert "3 kernels (1 distinct sources)" in stats.line()
    again, stats = gpu_kernels.build_and_compile({"a": builds["a"]}, "sm_80", jobs=1,
                                                 arch_for=lambda manifest: "sm_80")
    assert again["a"].error is None and (stats.compiled, stats.cache_hits) == (0, 1)


def test_kernels_fail_only_the_tests_of_a_broken_kernel():
    kernels = Kernels({"ok": Built("src", "manifest", None), "bad": Built(None, None, "does not compile: x")})
    assert kernels["ok"] == ("src", "manifest") and kernels.ready() == {"ok": ("src", "manifest")}
    with pytest.raises(AssertionError, match="does not compile: x"):
        kernels["bad"]


def test_verify_many_spreads_the_kernels_over_workers(monkeypatch):
    import flashgen.harness.worker as worker

    started, lock = [], threading.Lock()

    class FakeWorker:
        def __init__(self, job_timeout_s):
            with lock:
                started.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def verify(self, kernel):
            return f"report of {kernel}"

    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    reports = gpu_kernels.verify_many({k: f"kernel {k}" for k in range(10)}, workers=3)
    assert reports == {k: f"report of kernel {k}" for k in range(10)} and len(started) == 3
    monkeypatch.setenv("FLASHGEN_TEST_VERIFY_WORKERS", "2")
    assert gpu_kernels.verify_workers() == 2


def test_verify_many_runs_extra_cases_after_the_default_ones(monkeypatch):
    import flashgen.harness.worker as worker
    from flashgen.abi import KernelManifest, Launch
    from flashgen.harness.verify import CheckCase, default_cases
    from flashgen.variant import DType, Shape, Variant

    class FakeWorker:
        def __init__(self, job_timeout_s):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def verify(self, kernel, cases):
            return [case.name for case in cases]

    class Kernel:
        manifest = KernelManifest(name="x", arch="sm_80", dtype=DType.fp16, head_dim=64, variant=Variant(),
                                  launches=[Launch(kernel="k", grid=("1", "1", "1"), threads=128)])

    extra = CheckCase(name="extra", shape=Shape(B=1, H=1, N=8, M=8, D=64))
    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    reports = gpu_kernels.verify_many({0: Kernel()}, workers=1, extra_cases=lambda manifest: [extra])
    assert reports[0] == [case.name for case in default_cases(Kernel.manifest)] + ["extra"]
