"""The library job's stages, as plain functions on picklable tasks, so that any engine runs them: a process pool
(flashgen.library.engines.LocalEngine), a GPU worker thread, or a Ray task (flashgen.library.engines.RayEngine).
None of them raises for what an entry does: a failure comes back as a result carrying its error.

- `build_entry(BuildTask) -> BuildResult` (CPU): the generate loop (flashgen.api.generate: TL, checks on the CPU,
  translation, static check, nvcc into the content-addressed compile cache) without a GPU, in a scratch folder and a
  scratch record; the files come back to the driver, which alone writes the library and the store.
- `gpu_entry(GpuTask, worker, gpu) -> GpuResult` (GPU): verify the built kernel on the worker's GPU (the harness's
  full default case set), then time it at the roofline shape beside the baselines; the meta and report updated.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flashgen.library.spec import EntrySpec, GpuSpec, ProviderSpec


class BuildTask(BaseModel):
    entry: EntrySpec
    key: str
    target: dict[str, Any] = Field(description="the Target's model_dump: workers learn GPUs only the driver knew")
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    tuned: str = "user"
    attempt: int = 1


class BuildResult(BaseModel):
    path: str
    key: str
    ok: bool
    error: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0
    worker: str = ""


class GpuTask(BaseModel):
    path: str
    key: str
    target: str
    source: str
    manifest: str = Field(description="manifest.json text")
    meta: dict[str, Any]
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    tried: list[str] = Field(default_factory=list, description="workers (host:device) that lost it already")


class GpuResult(BaseModel):
    path: str
    key: str
    ok: bool
    error: str | None = None
    lost: bool = Field(default=False, description="the worker died or was killed with it: another worker redoes it")
    verification: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    ran_on: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    report: str | None = None
    seconds: float = 0.0


def variant_kwargs(variant) -> dict[str, Any]:
    """flashgen.api.generate's keyword arguments for a Variant."""
    if variant.split_kv:
        from flashgen.errors import UsageError

        raise UsageError(f"{variant.name}: flashgen generate does not build split-KV decode kernels")
    return {"causal": variant.causal, "window": variant.window, "alibi": variant.alibi, "softcap": variant.softcap,
            "kv_group": variant.kv_group, "norm": variant.norm.value, "lse": variant.return_lse}


def _no_gpu_environment():
    from flashgen.harness.environment import Environment

    class CpuEnvironment(Environment):
        """The real layers with the GPU stages left to the library job's GPU workers."""

        def gpu_available(self) -> bool:
            return False

    return CpuEnvironment()


def build_entry(task: BuildTask) -> BuildResult:
    started = time.monotonic()
    entry = task.entry
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from flashgen.agent.outputs import FILES
        from flashgen.api import generate
        from flashgen.harness.store import Store
        from flashgen.library.keys import tuned_mode
        from flashgen.library.spec import parse_variant_name
        from flashgen.target_files import target_from_dict

        target = target_from_dict(task.target)
        variant = parse_variant_name(entry.variant)
        p = task.provider
        budgets = {k: getattr(p, k) for k in ("max_iters", "max_tokens", "max_cost_usd", "max_wall_s")
                   if getattr(p, k) is not None}
        with tempfile.TemporaryDirectory(prefix="flashgen-entry-") as scratch, tuned_mode(task.tuned):
            out = Path(scratch) / "kernel"
            with Store(Path(scratch) / "store", notice=lambda _m: None) as store:
                kernel = generate(gpu=target.name, dtype=entry.dtype, head_dim=entry.head_dim, **variant_kwargs(variant),
                                  provider=p.name, model=p.model, base_url=p.base_url, goal_speedup=p.goal_speedup,
                                  out=out, store=store, env=_no_gpu_environment(), **budgets)
            files = {name: (out / name).read_text() for name in FILES if (out / name).is_file()}
        return BuildResult(path=entry.path, key=task.key, ok=True, files=files, meta=kernel.meta, worker=worker,
                           seconds=round(time.monotonic() - started, 3))
    except KeyboardInterrupt:  # the driver decides what an interrupt stops
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded with the entry; the batch goes on (SystemExit too)
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not _is_user_error(exc):
            text = f"{type(exc).__name__}: {text} ({_where(exc)})"
        return BuildResult(path=entry.path, key=task.key, ok=False, error=text[:2000], worker=worker,
                           seconds=round(time.monotonic() - started, 3))


def _is_user_error(exc: BaseException) -> bool:
    from flashgen.errors import FlashgenError

    return isinstance(exc, FlashgenError)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _shim(meta: dict[str, Any]):
    class Result:
        best = True if meta.get("kernel") else None

    return Result()


def bench_shape(manifest):
    from flashgen.harness.environment import ROOFLINE_SHAPE
    from flashgen.variant import Shape

    big = ROOFLINE_SHAPE
    return Shape(B=big.B, H=big.H, KVH=big.H // manifest.variant.kv_group, N=big.N, M=big.M, D=manifest.head_dim)


def gpu_entry(task: GpuTask, worker, gpu) -> GpuResult:
    """Verify and time one built kernel on `worker` (a harness GpuWorker, or anything with its `run(job, timeout_s)`)
    bound to `gpu` (flashgen.library.gpus.LocalGpu)."""
    started = time.monotonic()
    ran_on = gpu.describe()

    def done(**fields) -> GpuResult:
        return GpuResult(path=task.path, key=task.key, ran_on=ran_on, seconds=round(time.monotonic() - started, 3),
                         **fields)

    try:
        from flashgen.abi import KernelManifest
        from flashgen.agent.outputs import render_report
        from flashgen.harness.environment import Timing, Verification, _shape_text, _timing_from
        from flashgen.harness.worker import BenchJob, KernelInput, VerifyJob

        manifest = KernelManifest.model_validate_json(task.manifest)
        kernel = KernelInput(manifest=manifest, source=task.source)
        verification = Verification(ran=False, summary="verification not asked for (spec: gpu.verify = false)")
        if task.gpu.verify:
            result = worker.run(VerifyJob(kernel=kernel), task.gpu.timeout_s)
            if not result.ok:
                return done(ok=False, lost=bool(result.fatal), error=f"verify: {result.error}")
            report = result.value
            verification = Verification(ran=True, ok=bool(report.ok), summary=report.summary or report.error or "")
            if not report.ok:
                return done(ok=False, error=f"verification failed: {verification.summary[:500]}",
                            verification=verification.model_dump())
        shape = bench_shape(manifest)
        timing = Timing(ran=False, shape=_shape_text(shape))
        if task.gpu.bench and (verification.ok or not task.gpu.verify):
            result = worker.run(BenchJob(kernels=[kernel], shapes=[shape], baselines=task.gpu.baselines,
                                         min_time_s=task.gpu.min_time_s), task.gpu.timeout_s)
            if not result.ok:
                return done(ok=False, lost=bool(result.fatal), error=f"bench: {result.error}",
                            verification=verification.model_dump())
            timing = _timing_from(result.value, shape, manifest)
        meta = dict(task.meta)
        meta["verification"] = verification.model_dump()
        meta["timings"] = timing.model_dump() if timing.ran else None
        meta["generation"] = {**meta.get("generation", {}), "reason": (
            f"compiled on the CPU; {'verified' if verification.ran else 'not verified'}"
            f"{' and timed' if timing.ran else ''} on an {gpu.name} by the library job (library.json names the device)")}
        return done(ok=True, verification=meta["verification"], timings=meta["timings"], meta=meta,
                    report=render_report(meta, _shim(meta)))
    except Exception as exc:  # noqa: BLE001 - recorded with the entry
        return done(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]} ({_where(exc)})")
