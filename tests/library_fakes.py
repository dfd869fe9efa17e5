"""Fake stages and GPU workers for the library job's CPU tests (tests/test_library*.py): builds that take no nvcc
and GPUs that are not there, so that a 24-entry job runs in seconds on a local process pool or a local Ray cluster.

Configured through the environment (spawned pool processes and Ray workers inherit it):
- FLASHGEN_FAKE_FAIL: entry paths (comma-separated) whose build fails on purpose;
- FLASHGEN_FAKE_KILL + FLASHGEN_FAKE_DIR: the entry whose build kills its own process on its first attempt (a marker
  file in the folder remembers the attempt), as a worker or node lost mid-task;
- FLASHGEN_FAKE_DIE: "DEVICE:N": the fake GPU worker of that device dies at its N-th job and stays dead (a GPU that
  fell off the bus): every later job of it is lost as well;
- FLASHGEN_FAKE_SLEEP: seconds each build and GPU job takes;
- the search (tuned = "search"): `fake_candidates` offers CANDIDATES (no screen, no nvcc); FLASHGEN_FAKE_WRONG: labels
  (comma-separated, or "all") of candidates that fail verification; FLASHGEN_FAKE_FASTEST: the label timed fastest
  (0.5 ms at every shape), the others' times following from their names.
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
from flashgen.library.stages import BuildResult, BuildTask, CandidatesResult, CandidatesTask
from flashgen.translators.search import CandidateRecord, kernel_name, params_label
from flashgen.variant import DType

# the fake search space (as translators.search would order it: likeliest first)
CANDIDATES = ({"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 1, "GROUP_HEADS": 1},
              {"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 1, "Q_IN_REGS": 1, "GROUP_HEADS": 1},
              {"BLOCK_M": 128, "BLOCK_N": 128, "WARPS": 8, "STAGES": 2, "Q_IN_REGS": 0, "GROUP_HEADS": 1},
              {"BLOCK_M": 64, "BLOCK_N": 128, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0, "GROUP_HEADS": 0})


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
    params = dict(task.chosen.params) if task.chosen is not None else {"BLOCK_M": 64}  # a search's winner, if any
    manifest = KernelManifest(name=name, arch=task.target["arch"], dtype=DType(entry.dtype), head_dim=entry.head_dim,
                              variant=variant, launches=[Launch(kernel=name, grid=("cdiv(N, 64)", "H", "B"), threads=128)],
                              params=params)
    meta = {"target": {"name": task.target["name"], "gpu": task.target["marketing_name"], "arch": task.target["arch"]},
            "dtype": entry.dtype, "head_dim": entry.head_dim, "variant": entry.variant,
            "variant_fields": variant.model_dump(mode="json"), "kernel": name,
            "generation": {"provider": "fake", "model": None, "status": "done", "reason": "fake", "model_calls": 0,
                           "tokens": 0, "cost_usd": 0.0},
            "parameters": params,
            "parameters_source": {"source": "search" if task.chosen else "fake", "detail": "fake"},
            "code_path": {"backend": "fake", "why": []}, "resources": {},
            "toolchain": "fake", "verification": {"ran": False, "ok": None, "summary": "no GPU"}, "timings": None,
            "roofline": {"shape": "B=4,H=16,N=4096,M=4096,D=128", "time_s": 1e-3 * (1 + _number(path)), "bound": "fake"}}
    files = {"sketch.tl": f"# sketch {path}\n", "kernel.tl": f"# full {path} {task.key} {sorted(params.items())}\n",
             "kernel.cu": f"// fake kernel {path}\n", "manifest.json": manifest.model_dump_json(indent=2) + "\n",
             "meta.json": json.dumps(meta, indent=2, sort_keys=True) + "\n", "report.md": f"# {path}\n"}
    return BuildResult(path=path, key=task.key, ok=True, files=files, meta=meta, worker=str(os.getpid()))


def fake_candidates(task: CandidatesTask) -> CandidatesResult:
    """The search's CPU half without the screen and nvcc: the first `max_candidates` of CANDIDATES, each with a fake
    source and a manifest of its own name (the bench tells candidates apart by name)."""
    time.sleep(float(os.environ.get("FLASHGEN_FAKE_SLEEP", "0.02")))
    entry = task.entry
    variant = parse_variant_name(entry.variant)
    dtype = DType(entry.dtype)
    records = []
    for params in CANDIDATES[:task.search.max_candidates]:
        name = kernel_name(variant, dtype, entry.head_dim, task.target["arch"], params)
        manifest = KernelManifest(name=name, arch=task.target["arch"], dtype=dtype, head_dim=entry.head_dim,
                                  variant=variant, params=params,
                                  launches=[Launch(kernel=name, grid=("cdiv(N, 64)", "H", "B"), threads=128)])
        records.append(CandidateRecord(params=dict(params), label=params_label(params), kernel_name=name,
                                       source=f"// fake candidate {name}\n", manifest=manifest,
                                       resources={name: {"registers": 128}}))
    return CandidatesResult(path=entry.path, key=task.key, ok=True, candidates=records, screened=40,
                            passed=len(CANDIDATES), worker=str(os.getpid()))


def fake_time_ms(manifest: KernelManifest, shape) -> float:
    label = params_label(manifest.params) if "WARPS" in manifest.params else ""
    if label and label == os.environ.get("FLASHGEN_FAKE_FASTEST"):
        return 0.5
    return 1.0 + _number(manifest.name + manifest.arch + (f"{shape.N}" if shape is not None else ""))


class FakeWorker:
    """Answers VerifyJob, BenchJob and CallJob as a GpuWorker would, deterministically; dies as FLASHGEN_FAKE_DIE
    says; fails the verification of the candidates FLASHGEN_FAKE_WRONG names."""

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
        if job.kind == "call":
            return JobResult(ok=True, kind="call", value={"gpu": self.gpu.name})
        if job.kind == "verify":
            wrong = os.environ.get("FLASHGEN_FAKE_WRONG", "").split(",")
            label = params_label(job.kernel.manifest.params) if job.kernel.manifest.params.get("WARPS") else ""
            if label and ("all" in wrong or label in wrong):
                return JobResult(ok=True, kind="verify", value=VerifyReport(ok=False, kernel=job.kernel.label,
                                                                            summary="fake: O differs at tails"))
            return JobResult(ok=True, kind="verify", value=VerifyReport(ok=True, kernel=job.kernel.label,
                                                                        summary="fake: every case passed"))
        stats = lambda ms: TimingStats(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, mean_ms=ms, reps=10)  # noqa: E731
        entries = []
        for shape in job.shapes:
            for kernel in job.kernels:
                # the library's own kernel keeps the time it always had (one shape); a search's candidates by shape
                ours = fake_time_ms(kernel.manifest, shape if len(job.kernels) > 1 or not job.baselines else None)
                entries.append(BenchEntry(name=kernel.manifest.name, kind="kernel", stats=stats(ours), ok=True,
                                          dtype=kernel.manifest.dtype.value, variant=kernel.manifest.variant.name,
                                          shape=shape))
            if job.baselines:
                kernel = job.kernels[0]
                entries.append(BenchEntry(name="sdpa_flash", kind="baseline", stats=stats(1.25), ok=True,
                                          dtype=kernel.manifest.dtype.value, variant=kernel.manifest.variant.name,
                                          shape=shape))
        return JobResult(ok=True, kind="bench", value=BenchReport(entries=entries))

    def close(self) -> None:
        self.closed = True


def make_worker(gpu, timeout_s: float) -> FakeWorker:
    return FakeWorker(gpu, timeout_s)
