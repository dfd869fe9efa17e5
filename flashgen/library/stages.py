"""The library job's stages, as plain functions on picklable tasks, so that any engine runs them: a process pool
(flashgen.library.engines.LocalEngine), a GPU worker thread, or a Ray task (flashgen.library.engines.RayEngine).
None of them raises for what an entry does: a failure comes back as a result carrying its error.

- `build_entry(BuildTask) -> BuildResult` (CPU): the generate loop (flashgen.api.generate: TL, checks on the CPU,
  translation, static check, nvcc into the content-addressed compile cache) without a GPU, in a scratch folder and a
  scratch record; the files come back to the driver, which alone writes the library and the store.
- `gpu_entry(GpuTask, worker, gpu) -> GpuResult` (GPU): verify the built kernel on the worker's GPU (the harness's
  full default case set), then time it at the roofline shape beside the baselines; the meta and report updated.

With `tuned = "search"`, before the build, for an entry whose target has a GPU here (the parameter search of
flashgen.harness.tune, in its two halves):
- `candidates_entry(CandidatesTask) -> CandidatesResult` (CPU): screen the parameter space, compile the likeliest
  `max_candidates` (dropping spills) and build their sources (`prepare_candidates`);
- `tune_entry(TuneTask, worker, gpu) -> TuneResult` (GPU): verify and time them on the worker's GPU
  (`time_candidates`) and pick the winner, which the build then takes (`BuildTask.chosen`: written as the scratch
  home's tuned file, which choose_params reads first).

Every task names its stage (`stage`, the Stages field that runs it) and where it runs (`on_gpu`), and makes its own
failed result (`failed`), so that an engine routes any of them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from flashgen.errors import FlashgenError
from flashgen.library.spec import EntrySpec, GpuSpec, ProviderSpec, SearchSpec
from flashgen.translators.search import CandidateRecord


def canonical_params(params: dict[str, Any]) -> dict[str, int]:
    """Tile parameters in the search's order (TILE_KEYS, then any other): the TL's Params line follows the dict's
    order, and a winner read back from library.json (whose keys are sorted) must write the same program."""
    from flashgen.translators.params import TILE_KEYS

    ordered = {k: params[k] for k in TILE_KEYS if k in params}
    return {**ordered, **{k: v for k, v in params.items() if k not in ordered}}


class Chosen(BaseModel):
    """The search's winner, as the build takes it (and the tuned file it becomes in the build's scratch home)."""

    params: dict[str, int]
    label: str
    geomean_ms: float
    times_ms: dict[str, float] = Field(default_factory=dict)
    candidates_timed: int = 0
    gpu: str = Field(default="", description="the name of the device it was timed on")


class BuildTask(BaseModel):
    stage: ClassVar[str] = "build"
    on_gpu: ClassVar[bool] = False
    entry: EntrySpec
    key: str
    target: dict[str, Any] = Field(description="the Target's model_dump: workers learn GPUs only the driver knew")
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    tuned: str = "user"
    chosen: Chosen | None = Field(default=None, description="tuned = search: the parameters the search chose")
    attempt: int = 1

    def failed(self, error: str) -> BuildResult:
        return BuildResult(path=self.entry.path, key=self.key, ok=False, error=error)


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
    stage: ClassVar[str] = "gpu"
    on_gpu: ClassVar[bool] = True
    path: str
    key: str
    target: str
    source: str
    manifest: str = Field(description="manifest.json text")
    meta: dict[str, Any]
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    tried: list[str] = Field(default_factory=list, description="workers (host:device) that lost it already")

    def failed(self, error: str) -> GpuResult:
        return GpuResult(path=self.path, key=self.key, ok=False, error=error)


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


class CandidatesTask(BaseModel):
    """The search's CPU half for one entry (its `key` is the search's key, flashgen.library.keys)."""

    stage: ClassVar[str] = "candidates"
    on_gpu: ClassVar[bool] = False
    entry: EntrySpec
    key: str
    target: dict[str, Any]
    search: SearchSpec = Field(default_factory=SearchSpec)
    fallback: dict[str, int] | None = Field(default=None, description="the parameters the entry would take without "
                                            "the search: always a candidate, so that the search can only beat them")
    jobs: int = Field(default=1, ge=1, description="nvcc processes at once for its candidates")
    attempt: int = 1

    def failed(self, error: str) -> CandidatesResult:
        return CandidatesResult(path=self.entry.path, key=self.key, ok=False, error=error)


class CandidatesResult(BaseModel):
    path: str
    key: str
    ok: bool
    error: str | None = None
    candidates: list[CandidateRecord] = Field(default_factory=list, description="those compiled (alive: with their "
                                              "source and manifest; or dropped with the reason)")
    screened: int = 0
    passed: int = Field(default=0, description="passed the CPU filters (TL checker, translator)")
    seconds: float = 0.0
    worker: str = ""


class TuneTask(BaseModel):
    """The search's GPU half for one entry: verify and time its candidates on a GPU of its target."""

    stage: ClassVar[str] = "tune"
    on_gpu: ClassVar[bool] = True
    path: str
    key: str
    target: str
    entry: EntrySpec
    candidates: list[CandidateRecord]
    screened: int = 0
    passed: int = 0
    fallback: dict[str, int] | None = None
    search: SearchSpec = Field(default_factory=SearchSpec)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    tried: list[str] = Field(default_factory=list, description="workers (host:device) that lost it already")

    def failed(self, error: str) -> TuneResult:
        return TuneResult(path=self.path, key=self.key, ok=False, error=error)


class TuneResult(BaseModel):
    path: str
    key: str
    ok: bool = Field(description="a verified candidate was timed on every shape: `chosen` is the fastest")
    error: str | None = None
    lost: bool = Field(default=False, description="the worker died on every job: another worker searches again")
    chosen: Chosen | None = None
    search: dict[str, Any] = Field(default_factory=dict, description="what the index records: the GPU, the shapes, "
                                   "every candidate tried with its times or why it was dropped, the winner")
    ran_on: dict[str, Any] | None = None
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
            if task.chosen is not None:
                _write_chosen(task.chosen, target, variant, entry)
            out = Path(scratch) / "kernel"
            with Store(Path(scratch) / "store", notice=lambda _m: None) as store:
                kernel = generate(gpu=target.name, dtype=entry.dtype, head_dim=entry.head_dim,
                                  head_dim_v=entry.head_dim_v, **variant_kwargs(variant), provider=p.name,
                                  model=p.model, base_url=p.base_url, goal_speedup=p.goal_speedup,
                                  out=out, store=store, env=_no_gpu_environment(), **budgets)
            files = {name: (out / name).read_text() for name in FILES if (out / name).is_file()}
        meta = kernel.meta
        if task.chosen is not None:
            built = meta.get("parameters") or {}  # the manifest's: a backend leaves out what it ignores (Q_IN_REGS)
            if not built or any(k in built and built[k] != v for k, v in task.chosen.params.items()):
                source = meta.get("parameters_source") or {}
                raise _NotTaken(f"the build did not take the search's parameters ({task.chosen.label}): it built "
                                f"{' '.join(f'{k}={v}' for k, v in sorted(built.items()))} from "
                                f"{source.get('source')} ({source.get('detail')})")
            meta, files = _searched_outputs(meta, files)
        return BuildResult(path=entry.path, key=task.key, ok=True, files=files, meta=meta, worker=worker,
                           seconds=round(time.monotonic() - started, 3))
    except KeyboardInterrupt:  # the driver decides what an interrupt stops
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded with the entry; the batch goes on (SystemExit too)
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not _is_user_error(exc):
            text = f"{type(exc).__name__}: {text} ({_where(exc)})"
        return BuildResult(path=entry.path, key=task.key, ok=False, error=text[:2000], worker=worker,
                           seconds=round(time.monotonic() - started, 3))


class _NotTaken(FlashgenError):
    """The build's parameters are not the search's (choose_params passed over the tuned file)."""


SEARCH_SOURCE = {"source": "search", "detail": "chosen by the library job's parameter search on a GPU of the target "
                                              "(library.json: the entry's tuning names the GPU, the candidates tried "
                                              "and their times)"}


def _write_chosen(chosen: Chosen, target, variant, entry: EntrySpec) -> None:
    """The search's winner as the tuned file of the (scratch) user folder, which choose_params reads first: the expert
    writes it as its first program, as after `flashgen tune --write`."""
    from flashgen.translators.params import TunedEntry, TunedFile, save_tuned, tuned_key
    from flashgen.variant import DType

    tuned = TunedEntry(params=dict(chosen.params), arch=target.arch, geomean_ms=chosen.geomean_ms,
                       times_ms=dict(chosen.times_ms), candidates_timed=chosen.candidates_timed, date="library job",
                       gpu=chosen.gpu or None, timer="gpu-worker")
    save_tuned(TunedFile(gpu=target.name, entries={tuned_key(DType(entry.dtype), variant, entry.head_dim): tuned}))


def _searched_outputs(meta: dict[str, Any], files: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """meta.json and report.md saying the parameters came from the search (not the scratch tuned file's path): the
    files follow the entry's key, which holds the parameters and their source, not the search's timings."""
    import json

    from flashgen.agent.outputs import render_report

    meta = {**meta, "parameters_source": dict(SEARCH_SOURCE)}
    files = {**files, "meta.json": json.dumps(meta, indent=2, sort_keys=True) + "\n",
             "report.md": render_report(meta, _shim(meta))}
    return meta, files


# ------------------------------------------------------------------------------------------------ the search


def candidates_entry(task: CandidatesTask) -> CandidatesResult:
    """The search's CPU half (flashgen.harness.tune.prepare_candidates): the candidates that pass the CPU filters,
    the likeliest `max_candidates` of them compiled; those come back (the live ones with their source)."""
    started = time.monotonic()
    entry = task.entry
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from flashgen.harness.tune import prepare_candidates
        from flashgen.library.spec import parse_variant_name
        from flashgen.target_files import target_from_dict

        target = target_from_dict(task.target)
        records = prepare_candidates(parse_variant_name(entry.variant), target, entry.dtype, entry.head_dim,
                                     max_candidates=task.search.max_candidates, jobs=task.jobs,
                                     include=[task.fallback] if task.fallback else [])
        screened_out = ("check:", "render:", "budget: beyond max_candidates")
        tried = [r for r in records if not (r.dropped or "").startswith(screened_out)]
        passed = sum(not (r.dropped or "").startswith(("check:", "render:")) for r in records)
        return CandidatesResult(path=entry.path, key=task.key, ok=True, candidates=tried, screened=len(records),
                                passed=passed, worker=worker, seconds=round(time.monotonic() - started, 3))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded with the entry (which then falls back)
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not _is_user_error(exc):
            text = f"{type(exc).__name__}: {text} ({_where(exc)})"
        return CandidatesResult(path=entry.path, key=task.key, ok=False, error=text[:2000], worker=worker,
                                seconds=round(time.monotonic() - started, 3))


class _Jobs:
    """What GpuTimer drives (verify, bench, call) over any worker with `run(job, timeout_s)` (a GpuWorker, a test's
    fake), each job under the spec's timeout; counts the jobs the worker died on."""

    def __init__(self, worker, timeout_s: float):
        self.worker, self.timeout_s = worker, timeout_s
        self.done = self.fatal = 0

    def run(self, job, timeout_s: float | None = None):
        result = self.worker.run(job, timeout_s or self.timeout_s)
        self.fatal += bool(result.fatal)
        self.done += not result.fatal
        return result

    def verify(self, kernel, cases: list | None = None, seed: int | None = None, timeout_s: float | None = None):
        from flashgen.harness.verify import VerifyReport
        from flashgen.harness.worker import VerifyJob

        result = self.run(VerifyJob(kernel=kernel, cases=cases, seed=seed), timeout_s)
        return result.value if result.ok else VerifyReport.failed(kernel.label, result.error or "unknown error",
                                                                  seed=seed)

    def bench(self, kernels, shapes, baselines: bool = True, timeout_s: float | None = None, min_time_s: float = 0.2):
        from flashgen.harness.worker import BenchJob

        return self.run(BenchJob(kernels=kernels, shapes=shapes, baselines=baselines, min_time_s=min_time_s), timeout_s)

    def call(self, target: str, timeout_s: float | None = None, **kwargs):
        from flashgen.harness.worker import CallJob

        return self.run(CallJob(target=target, kwargs=kwargs), timeout_s)

    def close(self) -> None:  # the engine owns the worker
        pass


def _candidate_record(record: CandidateRecord, fallback: dict[str, int] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"label": record.label, "params": dict(record.params),
                           "status": record.dropped or "timed"}
    if fallback and all(record.params.get(k) == v for k, v in fallback.items()):
        row["fallback"] = True  # what the entry takes without the search (the packaged or default choice)
    if record.times_ms:
        row["times_ms"] = dict(record.times_ms)
    if record.geomean_ms is not None:
        row["geomean_ms"] = record.geomean_ms
    registers = [u.get("registers") for u in record.resources.values() if u.get("registers") is not None]
    if registers:
        row["registers"] = max(registers)
    return row


def tune_entry(task: TuneTask, worker, gpu) -> TuneResult:
    """The search's GPU half (flashgen.harness.tune.time_candidates with its GpuTimer on `worker`): each candidate
    verified (the tails, N > M and large-magnitude cases), the verified ones timed over the [search] lengths; the
    fastest by geomean is `chosen`."""
    started = time.monotonic()
    ran_on = gpu.describe()

    def done(**fields) -> TuneResult:
        return TuneResult(path=task.path, key=task.key, ran_on=ran_on, seconds=round(time.monotonic() - started, 3),
                          **fields)

    try:
        from flashgen.harness.bench import shape_text
        from flashgen.harness.tune import GpuTimer, default_shapes, pick_winner, time_candidates
        from flashgen.library.spec import parse_variant_name

        variant = parse_variant_name(task.entry.variant)
        shapes = default_shapes(variant, task.entry.head_dim, task.search.lengths)
        jobs = _Jobs(worker, task.gpu.timeout_s)
        timer = GpuTimer(min_time_s=task.search.min_time_s, worker=jobs)
        records = [r.model_copy() for r in task.candidates]  # the task stays as it came (a retry searches afresh)
        time_candidates(records, shapes, timer=timer, budget_s=task.search.budget_s)
        best = pick_winner(records)
        search = {"on": ran_on, "shapes": [shape_text(s) for s in shapes], "budget_s": task.search.budget_s,
                  "min_time_s": task.search.min_time_s, "max_candidates": task.search.max_candidates,
                  "screened": task.screened, "passed_cpu_filters": task.passed,
                  "candidates": [_candidate_record(r, task.fallback) for r in records]}
        if best is None:
            reasons = sorted({(r.dropped or "").split(":")[0] for r in records}) or ["no candidate compiled"]
            return done(ok=False, lost=jobs.fatal > 0 and jobs.done == 0, search=search,
                        error=f"the search on {gpu.name} timed no verified candidate of {len(records)} "
                              f"({', '.join(reasons)})")
        timed = sum(r.geomean_ms is not None and r.alive for r in records)
        chosen = Chosen(params=canonical_params(best.params), label=best.label, geomean_ms=best.geomean_ms,
                        times_ms=dict(best.times_ms), candidates_timed=timed, gpu=gpu.name)
        search.update(winner=dict(best.params), winner_label=best.label, winner_geomean_ms=best.geomean_ms)
        return done(ok=True, chosen=chosen, search=search)
    except Exception as exc:  # noqa: BLE001 - recorded with the entry (which then falls back)
        return done(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]} ({_where(exc)})")


def _is_user_error(exc: BaseException) -> bool:
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
    return Shape(B=big.B, H=big.H, KVH=big.H // manifest.variant.kv_group, N=big.N, M=big.M, D=manifest.head_dim,
                 DV=manifest.head_dim_v)


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
