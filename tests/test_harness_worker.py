"""The worker process's isolation, without a GPU: a job that hangs or kills its process comes back
as a failed result, and the next job gets a fresh worker."""

import ctypes
import os
import sys
import time
from pathlib import Path

from flashgen.abi import FlashgenAttnParams, KernelManifest, Launch
from flashgen.harness.worker import GpuWorker, build_params, launch_sizes, tensor_view
from flashgen.variant import DType, Variant

# The spawned worker imports helpers from this file by module path: it needs the repo root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def _die(code: int) -> None:
    os._exit(code)


def test_hang_and_death_are_contained():
    with GpuWorker(job_timeout_s=30) as worker:
        first = worker.call("os:getpid")
        assert first.ok
        hung = worker.call("tests.test_harness_worker:_sleep", timeout_s=1.5, seconds=60)
        assert not hung.ok and hung.fatal and "timed out after 1.5 s" in hung.error
        died = worker.call("tests.test_harness_worker:_die", code=7)
        assert not died.ok and "exit code 7" in died.error
        after = worker.call("os:getpid")
        assert after.ok and after.value != first.value and worker.restarts == 2
        raised = worker.call("tests.test_harness_worker:_sleep", seconds="x")
        assert not raised.ok and not raised.fatal and "TypeError" in raised.error
        assert worker.call("os:getpid").value == after.value  # an ordinary exception keeps the worker


class _FakeArray:
    def __init__(self, shape, typestr, strides=None, ptr=4096):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides, "data": (ptr, False),
                                         "version": 3}


def test_params_from_strided_arrays():
    man = KernelManifest(name="k", arch="sm_80", dtype=DType.fp16, head_dim=64, variant=Variant(kv_group=2),
                         launches=[Launch(kernel="k", grid=("cdiv(N, 64)", "H", "B"), threads=128)])
    b, h, n, m, d = 2, 4, 100, 130, 64
    # q in (B, N, H, D) memory viewed as (B, H, N, D): byte strides of the transposed view
    q = tensor_view(_FakeArray((b, h, n, d), "<f2", (n * h * d * 2, d * 2, h * d * 2, 2), ptr=1 << 20))
    k = tensor_view(_FakeArray((b, 2, m, d), "<f2", ptr=2 << 20))
    v = tensor_view(_FakeArray((b, 2, m, d), "<f2", ptr=3 << 20))
    o = tensor_view(_FakeArray((b, h, n, d), "<f2", ptr=4 << 20))
    p = build_params(man, q, k, v, o, None, 0, 0.125, 1)
    assert (p.q_stride_b, p.q_stride_h, p.q_stride_n) == (n * h * d, d, h * d)
    assert (p.k_stride_b, p.k_stride_h, p.k_stride_m) == (2 * m * d, m * d, d)
    assert (p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_k) == (b, h, 2, n, m)
    assert p.q == 1 << 20 and p.lse is None and abs(p.scale - 0.125) < 1e-9
    assert ctypes.sizeof(p) == ctypes.sizeof(FlashgenAttnParams)
    assert launch_sizes(man, b, h, 2, n, m)["SPLITS"] == 1
    import pytest

    with pytest.raises(ValueError, match="dtype"):
        build_params(man, tensor_view(_FakeArray((b, h, n, d), "<f4")), k, v, o, None, 0, 1.0, 1)
    with pytest.raises(ValueError, match="contiguous"):
        build_params(man, tensor_view(_FakeArray((b, h, n, d), "<f2", (n * h * d * 2, d * 2, h * d * 2, 4))),
                     k, v, o, None, 0, 1.0, 1)
