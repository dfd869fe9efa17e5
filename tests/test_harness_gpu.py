"""GPU tests of the run / verify / bench layers with the plain test kernel and planted faults."""

import sys
from pathlib import Path

import pytest

from flashgen.harness import testkernels
from flashgen.harness.worker import GpuWorker, KernelInput
from flashgen.variant import Variant

# The spawned worker imports helpers from this file by module path: it needs the repo root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu


def _arch():
    from flashgen.harness.worker import device_arch

    return device_arch()


def _kernel(name, **kw):
    source, manifest = testkernels.build(name, arch=_arch(), **kw)
    return KernelInput(source=source, manifest=manifest)


PLAIN_CASES = [
    ("fp16", 64, Variant()),
    ("bf16", 128, Variant(causal=True, return_lse=True)),
    ("fp32", 64, Variant(causal=True, return_lse=True, kv_group=2)),
    ("fp16", 128, Variant(causal=True, window=48, return_lse=True)),
    ("bf16", 64, Variant(softcap=20.0, alibi=True, kv_group=3)),
]
# The test kernels (name, build arguments) the other tests below build, by test: compiled in the session's
# pre-compile pass (tests/gpu_kernels.py), so the worker finds them in the cache (one missing here it compiles).
TEST_KERNELS = {
    "test_launch_accepts_torch_tensors_with_strides": [
        ("simple_attention", dict(dtype="bf16", head_dim=64, variant=Variant(causal=True, return_lse=True)))],
    "test_illegal_access_and_hang_do_not_kill_the_caller": [
        ("fault_illegal_address", {}), ("fault_hang", {}), ("simple_attention", {})],
    "test_bench_ours_beside_baselines": [
        ("simple_attention", dict(dtype="fp16", head_dim=64, variant=Variant(causal=True)))],
}


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build

    wanted = []
    for item in items:
        if item.originalname == "test_plain_kernel_passes_verification":
            dtype, head_dim, variant = (item.callspec.params[k] for k in ("dtype", "head_dim", "variant"))
            wanted.append(("simple_attention", dict(dtype=dtype, head_dim=head_dim, variant=variant)))
        wanted += TEST_KERNELS.get(item.originalname, [])
    return {(name, repr(kw)): Build(testkernels.build, (name,), dict(kw, arch=arch)) for name, kw in wanted}


@pytest.fixture(scope="module")
def worker():
    with GpuWorker(job_timeout_s=240) as w:
        yield w


@pytest.mark.parametrize("dtype,head_dim,variant", PLAIN_CASES)
def test_plain_kernel_passes_verification(worker, dtype, head_dim, variant):
    report = worker.verify(_kernel("simple_attention", dtype=dtype, head_dim=head_dim, variant=variant))
    assert report.ok, report.summary
    assert len(report.cases) >= 6 and all(len(c.runs) == 2 for c in report.cases)
    assert len({r.seed for c in report.cases for r in c.runs}) == 2 * len(report.cases)


def test_launch_accepts_torch_tensors_with_strides():
    torch = pytest.importorskip("torch")
    import numpy as np

    from flashgen.harness.worker import compile_kernel, launch
    from flashgen.reference import attention

    kernel = _kernel("simple_attention", dtype="bf16", head_dim=64, variant=Variant(causal=True, return_lse=True))
    cubin = compile_kernel(kernel, _arch()).cubin_path
    B, H, N, M, D = 2, 3, 37, 53, 64
    q = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # (B,H,N,D) view, strided
    k = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, M, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    o = torch.empty(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    launch(kernel.manifest, cubin, q, k, v, o, lse=lse)
    torch.cuda.synchronize()
    f64 = lambda t: t.float().cpu().numpy().astype(np.float64)
    o_ref, lse_ref = attention(f64(q), f64(k), f64(v), kernel.manifest.variant)
    assert np.linalg.norm(f64(o) - o_ref) / np.linalg.norm(o_ref) < 1e-2
    assert np.allclose(lse.cpu().numpy(), lse_ref, atol=1e-3)


def test_illegal_access_and_hang_do_not_kill_the_caller(worker, tmp_path):
    from flashgen.harness.store import Store

    store = Store(tmp_path)
    first_pid = worker.call("os:getpid").value
    run = store.new_run("attempt", {"kernel": "fault_illegal_address"})
    bad = worker.verify(_kernel("fault_illegal_address"))
    store.add_event(run, "verify", bad.model_dump(mode="json"))
    store.finish_run(run, "failed", {"error": bad.error})
    assert not bad.ok and "illegal" in bad.error.lower() and "fg_fault" in bad.error and "during verify" in bad.error
    assert "illegal" in store.events(run)[0].payload["error"].lower()

    hang = worker.verify(_kernel("fault_hang"), timeout_s=20)
    assert not hang.ok and "timed out after 20" in hang.error

    again = worker.verify(_kernel("simple_attention"))  # a fresh worker runs the next job
    assert again.ok, again.summary
    assert worker.call("os:getpid").value != first_pid and worker.restarts >= 2


def _hidden_work(ms: float = 30.0) -> dict:
    """Enqueue a long spin kernel on another stream and a trivial one on the timed stream: the events
    see microseconds, the device-synchronized host clock sees the spin."""
    import cupy as cp

    from flashgen.harness.bench import time_callable

    spin = cp.RawKernel(r'''
    extern "C" __global__ void spin(long long cycles) {
      long long start = clock64();
      while (clock64() - start < cycles) { }
    }''', "spin")
    clock_khz = cp.cuda.Device().attributes["ClockRate"]
    other = cp.cuda.Stream(non_blocking=True)
    timed = cp.cuda.Stream(non_blocking=True)
    tiny = cp.zeros(1, dtype=cp.float32)

    def fn():
        spin((1,), (1,), (cp.int64(int(ms * clock_khz)),), stream=other)
        with timed:
            tiny.fill(1.0)

    return time_callable(fn, stream=timed, min_reps=5, max_reps=10, host_reps=5).model_dump()


def test_timing_cross_check_flags_work_left_on_another_stream(worker):
    result = worker.call("tests.test_harness_gpu:_hidden_work", ms=30.0)
    assert result.ok, result.error
    stats = result.value
    assert stats["undertimed"] and stats["host_ms_per_call"] > 10 * stats["median_ms"], stats


def test_bench_ours_beside_baselines(worker):
    from flashgen.variant import Shape

    kernel = _kernel("simple_attention", dtype="fp16", head_dim=64, variant=Variant(causal=True))
    result = worker.bench([kernel], [Shape(B=2, H=8, N=512, M=512, D=64)], min_time_s=0.05)
    assert result.ok, result.error
    report = result.value
    ours = [e for e in report.entries if e.kind == "kernel"]
    assert ours and ours[0].ok and ours[0].tflops > 0 and not ours[0].stats.undertimed
    names = {e.name for e in report.entries if e.kind == "baseline"}
    assert {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex"} <= names
    assert all(e.ok or e.skipped or e.error for e in report.entries)
    assert report.env.get("gpu") and report.env.get("cupy")
