"""Fake stages and GPU workers for the library job's CPU tests (tests/test_library*.py): builds that take no nvcc
and GPUs that are not there, so that a 24-entry job runs in seconds on a local process pool or a local Ray cluster.

Configured through the environment (spawned pool processes and Ray workers inherit it):
- FLASHGEN_FAKE_FAIL: entry paths (comma-separated) whose build fails on purpose;
- FLASHGEN_FAKE_KILL + FLASHGEN_FAKE_DIR: the entry whose build kills its own process on its first attempt (a marker
  file in the folder remembers the attempt), as a worker or node lost mid-task;
- FLASHGEN_FAKE_DIE: "DEVICE:N": the fake GPU worker of that device dies at its N-th job and stays dead (a GPU that
  fell off the bus): every later job of it is lost as well;
- FLASHGEN_FAKE_SLEEP: seconds each build and GPU job takes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from flashgen.abi import KernelManifest, Launch
from flashgen.harness.bench import BenchEntry, BenchReport, TimingStats
from flashgen.harness.verify import VerifyReport
from flashgen.harness.worker import JobResult
from flashgen.library.spec import parse_variant_name
from flashgen.library.stages import BuildResult, BuildTask
from flashgen.variant import DType


def _number(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) / 0xFFFFFF


def fake_build(task: BuildTask) -> BuildResult:
    path = task.entry.path
    time.sleep(float(os.environ.get("FLASHGEN_FAKE_SLEEP", "0.02")))
    if path in os.environ.get("FLASHGEN_FAKE_FAIL", "").split(","):
        return BuildResult(path=path, key=task.key, ok=False, error=f"planted failure in {path}")
    if path == os.environ.get("FLASHGEN_FAKE_KILL"):
        marker = Path(os.environ["FLASHGEN_FAKE_DIR"]) / (path.replace("/", "_") + ".killed")
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(9)  # the task's process dies with it
    entry = task.entry
    variant = parse_variant_name(entry.variant)
    name = f"fg_fake_{entry.variant}_{entry.dtype}_d{entry.head_dim}"
    manifest = KernelManifest(name=name, arch=task.target["arch"], dtype=DType(entry.dtype), head_dim=entry.head_dim,
                              variant=variant, launches=[Launch(kernel=name, grid=("cdiv(N, 64)", "H", "B"), threads=128)],
                              params={"BLOCK_M": 64})
    meta = {"target": {"name": task.target["name"], "gpu": task.target["marketing_name"], "arch": task.target["arch"]},
            "dtype": entry.dtype, "head_dim": entry.head_dim, "variant": entry.variant,
            "variant_fields": variant.model_dump(mode="json"), "kernel": name,
            "generation": {"provider": "fake", "model": None, "status": "done", "reason": "fake", "model_calls": 0,
                           "tokens": 0, "cost_usd": 0.0},
            "parameters": {"BLOCK_M": 64}, "code_path": {"backend": "fake", "why": []}, "resources": {},
            "toolchain": "fake", "verification": {"ran": False, "ok": None, "summary": "no GPU"}, "timings": None,
            "roofline": {"shape": "B=4,H=16,N=4096,M=4096,D=128", "time_s": 1e-3 * (1 + _number(path)), "bound": "fake"}}
    files = {"sketch.tl": f"# sketch {path}\n", "kernel.tl": f"# full {path} {task.key}\n",
             "kernel.cu": f"// fake kernel {path}\n", "manifest.json": manifest.model_dump_json(indent=2) + "\n",
             "meta.json": json.dumps(meta, indent=2, sort_keys=True) + "\n", "report.md": f"# {path}\n"}
    return BuildResult(path=path, key=task.key, ok=True, files=files, meta=meta, worker=str(os.getpid()))


class FakeWorker:
    """Answers VerifyJob and BenchJob as a GpuWorker would, deterministically; dies as FLASHGEN_FAKE_DIE says."""

    def __init__(self, gpu, timeout_s: float = 300.0):
        self.gpu, self.jobs, self.dead = gpu, 0, False
        device, _, at = os.environ.get("FLASHGEN_FAKE_DIE", "").partition(":")
        self.die_at = int(at) if device and int(device) == gpu.index else None
        self.closed = False

    def run(self, job, timeout_s=None) -> JobResult:
        self.jobs += 1
        time.sleep(float(os.environ.get("FLASHGEN_FAKE_SLEEP", "0.02")))
        if self.dead or (self.die_at is not None and self.jobs >= self.die_at):
            self.dead = True
            return JobResult(ok=False, kind=job.kind, fatal=True,
                             error=f"the worker process died (exit code -9) during {job.describe()}; it restarts for "
                                   "the next job")
        if job.kind == "verify":
            return JobResult(ok=True, kind="verify", value=VerifyReport(ok=True, kernel=job.kernel.label,
                                                                        summary="fake: every case passed"))
        kernel = job.kernels[0]
        shape = job.shapes[0]
        ours = 1.0 + _number(kernel.manifest.name + kernel.manifest.arch)
        stats = lambda ms: TimingStats(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, mean_ms=ms, reps=10)  # noqa: E731
        common = {"dtype": kernel.manifest.dtype.value, "variant": kernel.manifest.variant.name, "shape": shape,
                  "ok": True}
        report = BenchReport(entries=[BenchEntry(name=kernel.manifest.name, kind="kernel", stats=stats(ours), **common),
                                      BenchEntry(name="sdpa_flash", kind="baseline", stats=stats(1.25), **common)])
        return JobResult(ok=True, kind="bench", value=report)

    def close(self) -> None:
        self.closed = True


def make_worker(gpu, timeout_s: float) -> FakeWorker:
    return FakeWorker(gpu, timeout_s)
