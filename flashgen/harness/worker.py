"""The isolated per-GPU worker process (`GpuWorker`) and the jobs it runs.

A kernel that faults (illegal address, abort) or hangs must not take the caller with it: jobs run in
a child process started with multiprocessing's *spawn* context, one per GPU. A job that kills its
worker, or runs past its timeout, comes back as a failed `JobResult` carrying the error, and the
next job gets a fresh worker. CUDA errors after a launch are sticky (the context is lost), so a
worker that saw one reports it and exits rather than run more jobs on a broken context.

Each job knows how to run itself (`run`), so the worker needs no table of kinds: it sits above what its
jobs call (flashgen.harness.verify, flashgen.harness.bench), which build on flashgen.harness.device. The
device names (`launch`, `KernelInput`, `device_arch`, `have_gpu`, ...) are handed on from here, the
harness's one door for running kernels.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Literal

from pydantic import BaseModel, Field

from flashgen.errors import FlashgenError
from flashgen.harness.device import (
    CompileFailed,
    CompileInfo,
    KernelInput,
    KernelRunError,
    LoadedKernel,
    NoGpuError,
    TensorView,
    build_params,
    compile_kernel,
    compile_rdc_cubin,
    device_arch,
    ensure_compiled,
    environment_info,
    have_gpu,
    is_sticky_cuda_error,
    launch,
    launch_sizes,
    load_kernel,
    prepare_launch,
    runnable_arch,
    tensor_view,
)
from flashgen.variant import Shape

__all__ = [  # the worker's own names, then the device names it hands on
    "BenchJob", "CallJob", "GpuWorker", "Job", "JobResult", "VerifyJob", "run_job",
    "CompileFailed", "CompileInfo", "KernelInput", "KernelRunError", "LoadedKernel", "NoGpuError", "TensorView",
    "build_params", "compile_kernel", "compile_rdc_cubin", "device_arch", "ensure_compiled", "environment_info",
    "have_gpu", "is_sticky_cuda_error", "launch", "launch_sizes", "load_kernel", "prepare_launch", "runnable_arch",
    "tensor_view",
]
# ---------------------------------------------------------------------------------------------
# Jobs and results (pickled across the process boundary); each job runs itself in the worker
# ---------------------------------------------------------------------------------------------

class VerifyJob(BaseModel):
    kind: Literal["verify"] = "verify"
    kernel: KernelInput
    cases: list[Any] | None = Field(default=None, description="verify.CheckCase list; None = the default set")
    seed: int | None = None
    scale: float | None = Field(default=None, description="the softmax scale; None: 1/sqrt(D)")

    def run(self) -> Any:
        from flashgen.harness.verify import verify_kernel

        return verify_kernel(self.kernel, cases=self.cases, seed=self.seed, scale=self.scale)

    def describe(self) -> str:
        return f"verify of kernel {self.kernel.label}"


class BenchJob(BaseModel):
    kind: Literal["bench"] = "bench"
    kernels: list[KernelInput]
    shapes: list[Shape]
    baselines: bool = True
    min_time_s: float = 0.2
    scale: float | None = Field(default=None, description="the softmax scale; None: 1/sqrt(D)")
    rounds: int = Field(default=1, ge=1, description="rounds of ours and the baselines (bench.time_in_rounds)")

    def run(self) -> Any:
        from flashgen.harness.bench import bench_kernels

        return bench_kernels(self.kernels, self.shapes, baselines=self.baselines, min_time_s=self.min_time_s,
                             scale=self.scale, rounds=self.rounds)

    def describe(self) -> str:
        return f"bench of {', '.join(k.label for k in self.kernels) or 'baselines'}"


class CallJob(BaseModel):
    """Run `module:function(**kwargs)` in the worker (tests, diagnostics). The value must pickle."""

    kind: Literal["call"] = "call"
    target: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    def run(self) -> Any:
        module_name, _, func_name = self.target.partition(":")
        return getattr(importlib.import_module(module_name), func_name)(**self.kwargs)

    def describe(self) -> str:
        return f"call {self.target}"


Job = VerifyJob | BenchJob | CallJob


class JobResult(BaseModel):
    ok: bool
    kind: str
    value: Any = None
    error: str | None = None
    fatal: bool = Field(default=False, description="the worker died or was killed running this job")
    seconds: float = 0.0
    worker_pid: int | None = None


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------

def run_job(job: Job) -> Any:
    """Run one job in this process (what the worker does; also usable in-process)."""
    return job.run()


def _worker_main(conn, device: int) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        import cupy

        cupy.cuda.Device(device).use()
    except Exception:
        pass  # jobs report the missing GPU themselves
    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        started = time.monotonic()
        try:
            value = run_job(job)
            result = JobResult(ok=True, kind=job.kind, value=value)
        except BaseException as exc:  # everything, a KeyboardInterrupt in the job too, goes back to the caller
            text = str(exc) if isinstance(exc, (FlashgenError, KernelRunError)) else \
                f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc)[-3:])}"
            result = JobResult(ok=False, kind=job.kind, error=text, fatal=is_sticky_cuda_error(exc))
        result.seconds = round(time.monotonic() - started, 3)
        result.worker_pid = os.getpid()
        try:
            conn.send(result)
        except Exception as exc:  # an unpicklable value
            conn.send(JobResult(ok=False, kind=job.kind, error=f"result could not be sent back: {exc}"))
        if result.fatal:
            os._exit(3)  # the CUDA context is unusable after a sticky error


class GpuWorker:
    """One isolated worker process bound to one GPU. Thread-unsafe; one per GPU.

        with GpuWorker(device=0) as worker:
            report = worker.verify(KernelInput(source=..., manifest=...))
    """

    def __init__(self, device: int = 0, job_timeout_s: float = 300.0):
        self.device = device
        self.job_timeout_s = job_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self.device), daemon=True,
                                       name=f"flashgen-gpu{self.device}")
        self._proc.start()
        child.close()
        self._conn = parent

    def _stop(self, kill: bool) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return
        if not kill and proc.is_alive():
            try:
                conn.send(None)
            except Exception:
                pass
            proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        if conn is not None:
            conn.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def run(self, job: Job, timeout_s: float | None = None) -> JobResult:
        """Run a job; never raises for what the job does. A dead or hung worker is replaced."""
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
                self._stop(kill=True)
            self._start()
        timeout = timeout_s or self.job_timeout_s
        started = time.monotonic()
        what = job.describe()
        try:
            self._conn.send(job)
            if self._conn.poll(timeout):
                result = self._conn.recv()
            else:
                pid = self.pid
                self._stop(kill=True)
                self.restarts += 1
                return JobResult(ok=False, kind=job.kind, fatal=True, worker_pid=pid,
                                 seconds=round(time.monotonic() - started, 3),
                                 error=f"timed out after {timeout:g} s during {what} (a kernel that never returns?); "
                                       "the worker was killed and restarts for the next job")
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            pid = self.pid
            code = self._proc.exitcode if self._proc is not None else None
            if self._proc is not None:
                self._proc.join(5)
                code = self._proc.exitcode
            self._stop(kill=True)
            self.restarts += 1
            return JobResult(ok=False, kind=job.kind, fatal=True, worker_pid=pid,
                             seconds=round(time.monotonic() - started, 3),
                             error=f"the worker process died (exit code {code}) during {what}; it restarts for the next job")
        if result.fatal:
            self._stop(kill=True)  # it exits by itself; reap it so the next job starts a fresh one
            self.restarts += 1
        return result

    def verify(self, kernel: KernelInput, cases: list | None = None, seed: int | None = None,
               timeout_s: float | None = None, scale: float | None = None):
        """VerifyReport; a crash or hang becomes a failed report carrying the error. `scale`: the softmax scale
        (None: 1/sqrt(D))."""
        from flashgen.harness.verify import VerifyReport

        result = self.run(VerifyJob(kernel=kernel, cases=cases, seed=seed, scale=scale), timeout_s)
        if result.ok:
            return result.value
        return VerifyReport.failed(kernel.label, result.error or "unknown error", seed=seed)

    def bench(self, kernels: list[KernelInput], shapes: list[Shape], baselines: bool = True,
              timeout_s: float | None = None, min_time_s: float = 0.2, scale: float | None = None) -> JobResult:
        return self.run(BenchJob(kernels=kernels, shapes=shapes, baselines=baselines, min_time_s=min_time_s,
                                 scale=scale), timeout_s)

    def call(self, target: str, timeout_s: float | None = None, **kwargs) -> JobResult:
        return self.run(CallJob(target=target, kwargs=kwargs), timeout_s)

    def close(self) -> None:
        self._stop(kill=False)

    def __enter__(self) -> GpuWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
