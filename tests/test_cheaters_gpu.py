"""Each planted cheating kernel is caught, for the right reason."""

import sys
from pathlib import Path

import pytest

from flashgen.harness import testkernels
from flashgen.harness.worker import GpuWorker, KernelInput
from flashgen.variant import Variant

# The spawned worker imports helpers from this file by module path: it needs the repo root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def worker():
    with GpuWorker(job_timeout_s=240) as w:
        yield w


# The test kernels (name, build arguments) each test below builds: compiled in the session's pre-compile pass
# (tests/gpu_kernels.py), so the worker finds them in the cache (one missing here it compiles itself).
TEST_KERNELS = {
    "test_writes_nothing": [("cheat_writes_nothing", {})],
    "test_writes_zeros": [("cheat_writes_zeros", dict(variant=Variant(return_lse=True)))],
    "test_writes_only_the_first_tile": [("cheat_first_tile", {})],
    "test_mutates_inputs": [("cheat_mutates_inputs", {})],
    "test_cached_by_pointer": [("cheat_cached_by_pointer", {})],
    "test_grid_that_skips_the_tails": [("cheat_skips_tails", {})],
    "test_other_stream_is_not_undertimed_when_the_static_check_is_bypassed": [
        ("simple_attention", dict(dtype="fp16", head_dim=64))],  # the honest kernel beside the -rdc cheat
}


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build

    wanted = []
    for item in items:
        if item.originalname == "test_lower_precision_than_asked":
            wanted.append(("cheat_low_precision", dict(dtype=item.callspec.params["dtype"])))
        wanted += TEST_KERNELS.get(item.originalname, [])
    return {(name, repr(kw)): Build(testkernels.build, (name,), dict(kw, arch=arch)) for name, kw in wanted}


def _kernel(name, **kw):
    from flashgen.harness.worker import device_arch

    source, manifest = testkernels.build(name, arch=device_arch(), **kw)
    return KernelInput(source=source, manifest=manifest)


def _failing_runs(report):
    return [r for c in report.cases for r in c.runs if not r.ok]


def test_writes_nothing(worker):
    report = worker.verify(_kernel("cheat_writes_nothing"))
    assert not report.ok and report.error is None
    run = _failing_runs(report)[0]
    assert run.unwritten_o > 0 and "never written" in report.summary


def test_writes_zeros(worker):
    report = worker.verify(_kernel("cheat_writes_zeros", variant=Variant(return_lse=True)))
    assert not report.ok
    run = _failing_runs(report)[0]
    assert run.unwritten_o == 0 and run.bad_elements > 0 and run.bad_lse > 0


def test_writes_only_the_first_tile(worker):
    report = worker.verify(_kernel("cheat_first_tile"))
    assert not report.ok
    run = _failing_runs(report)[0]
    assert run.unwritten_o > 0 and "row tiles 1-" in run.detail  # tile 0 is right, from tile 1 on unwritten


def test_mutates_inputs(worker):
    report = worker.verify(_kernel("cheat_mutates_inputs"))
    assert not report.ok
    run = _failing_runs(report)[0]
    assert run.inputs_modified.get("q", 0) > 0 and run.bad_elements == 0


def test_cached_by_pointer(worker):
    report = worker.verify(_kernel("cheat_cached_by_pointer"))
    assert not report.ok
    first_case = report.cases[0]
    assert first_case.runs[0].ok and not first_case.runs[1].ok  # right on fresh data, stale on reused buffers
    assert "same buffers" in first_case.runs[1].detail


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_lower_precision_than_asked(worker, dtype):
    report = worker.verify(_kernel("cheat_low_precision", dtype=dtype))
    assert not report.ok
    failing = _failing_runs(report)
    assert all(r.unwritten_o == 0 for r in failing)
    assert any(r.rel_err > r.tol.rel for r in failing) and "relative error" in report.summary


def test_grid_that_skips_the_tails(worker):
    report = worker.verify(_kernel("cheat_skips_tails"))
    assert not report.ok
    run = _failing_runs(report)[0]
    assert run.unwritten_o == 2 * 2 * 5 * 64  # B=2, H=2, 5 tail rows, D=64
    assert "rows 192-196" in run.detail and "N % BLOCK_M = 5" in run.detail  # tails case: N = 197


def test_other_stream_is_rejected_statically():
    from flashgen.harness.static_check import static_check

    source, manifest = testkernels.build("cheat_other_stream")
    assert any(issue.rule == "launch" for issue in static_check(source, manifest))


def _bench_hidden_launch(arch: str) -> dict:
    """Bypass the static check: build the device-side-launch cheat with -rdc and time it."""
    from flashgen.harness.bench import bench_kernels
    from flashgen.harness.worker import compile_rdc_cubin
    from flashgen.variant import Shape

    source, manifest = testkernels.build("cheat_other_stream", dtype="fp16", head_dim=64, arch=arch)
    cubin = compile_rdc_cubin(source, arch)
    honest_src, honest_man = testkernels.build("simple_attention", dtype="fp16", head_dim=64, arch=arch)
    shape = Shape(B=4, H=8, N=1024, M=1024, D=64)
    report = bench_kernels([(cubin, manifest), (honest_src, honest_man)], [shape], baselines=False, min_time_s=0.05)
    cheat, honest = (e for e in report.entries if e.kind == "kernel")
    return {"cheat": cheat.stats.model_dump(), "honest": honest.stats.model_dump()}


def test_other_stream_is_not_undertimed_when_the_static_check_is_bypassed(worker):
    from flashgen.harness.worker import device_arch

    result = worker.call("tests.test_cheaters_gpu:_bench_hidden_launch", arch=device_arch())
    assert result.ok, result.error
    cheat, honest = result.value["cheat"], result.value["honest"]
    # Either the events include the hidden work (CUDA joins child grids into the parent's completion)
    # or the host-clock cross-check flags it; never a fast time that goes unnoticed.
    assert cheat["undertimed"] or cheat["median_ms"] >= 0.5 * honest["median_ms"], result.value
