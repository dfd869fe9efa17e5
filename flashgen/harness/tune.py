"""The GPU half of the tile-parameter search (the CPU half, candidate generation and screening, is
flashgen.translators.search):

    records = screen_candidates(variant, "h200", DType.bf16, 128)   # CPU (translators.search)
    compile_filter(records, "h200")                                  # nvcc: drops the ones that fail or spill
    result = search(variant, "h200", DType.bf16, 128, shapes, timer=GpuTimer(), budget_s=600)   # GPU
    record_winner(result)                                   # -> the user's <config>/tuned/h200.json

`search` is its two halves in turn: `prepare_candidates` (CPU: screen, compile, build the sources) and
`time_candidates` (GPU: verify, then time); the library job (flashgen.library, `tuned = "search"`) runs the first in
its CPU pool and the second in the entry's GPU worker, then builds the `pick_winner`.

A search screens the candidates on the CPU, compiles them (dropping spills), verifies each on the GPU
before timing it (a wrong kernel is never a winner) and times the verified ones in batches, one bench
call per batch, until the candidates or the time budget run out. The winner has the lowest
geometric-mean time over the shapes.

The timer and the verifier are parameters so that the CPU tests drive the search with fakes; `GpuTimer`
is the real one (one GpuWorker for both).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from flashgen.errors import UsageError
from flashgen.harness.bench import geomean, shape_text
from flashgen.tl_spec.ast import SizeParams
from flashgen.translators.params import TunedEntry, load_tuned, save_tuned, tuned_key
from flashgen.translators.search import CandidateRecord, build_sources, resolve_target, screen_candidates
from flashgen.variant import DType, Shape, Variant

# bytes a candidate may keep in local memory on the target's arch: a few loop-invariant values (a 255-register
# kernel such as 128x64 w4 q0 at d128 holds 32-40 B, reloaded 3-5 times per key tile from L1); a real spill of
# the loop's working set (accumulators, fragments) is far larger
SPILL_TOLERANCE_BYTES = 64


class SearchResult(BaseModel):
    target: str
    arch: str
    dtype: str
    variant: str
    variant_fields: dict[str, Any]
    head_dim: int
    shapes: list[str]
    candidates: list[CandidateRecord]
    winner: dict[str, int] | None = None
    winner_label: str | None = None
    winner_geomean_ms: float | None = None
    winner_by_size: list[SizeParams] = Field(default_factory=list, description="tiles that beat the winner at the "
                                             "shortest or longest sequence lengths timed (`Params when` lines)")
    timer: str = Field(description="'gpu-worker' for real GPU timings, else the fake's name")
    environment: dict[str, Any] | None = Field(default=None, description="GPU name, driver, CUDA, torch, nvcc "
                                               "versions when the timer ran on a GPU")
    budget_s: float
    seconds: float = 0.0
    created: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    @property
    def timed(self) -> list[CandidateRecord]:
        return [c for c in self.candidates if c.geomean_ms is not None]


def compile_filter(records: Sequence[CandidateRecord], target, *, jobs: int | None = None,
                   max_compiles: int | None = None) -> list[CandidateRecord]:
    """Compile the live records (from screen_candidates) for the target's arch with nvcc, in parallel; a
    record that fails or spills more than SPILL_TOLERANCE_BYTES is marked dropped. Only the first `max_compiles`
    live records are compiled
    (the rest are dropped as 'compile: not compiled (compile budget)'). Returns the records still alive."""
    from flashgen.harness.compile import compile_many

    target = resolve_target(target)
    live = [r for r in records if r.alive]
    todo = live if max_compiles is None else live[:max_compiles]
    for record in live[len(todo):]:
        record.dropped = "compile: not compiled (compile budget)"
    build_sources(todo, target)
    todo = [r for r in todo if r.alive]
    results = compile_many([r.source for r in todo], target.arch, jobs=jobs)
    for record, result in zip(todo, results, strict=True):
        if not result.ok:
            record.dropped = "compile: " + " ".join(result.feedback_text(400).split())
            continue
        record.resources = {name: usage.model_dump(include={"registers", "shared_static_bytes", "spill_store_bytes",
                                                            "spill_load_bytes", "stack_frame_bytes"})
                            for name, usage in sorted(result.kernels.items())}
        spills = {name: max(u["spill_store_bytes"], u["spill_load_bytes"]) for name, u in record.resources.items()}
        if max(spills.values(), default=0) > SPILL_TOLERANCE_BYTES:
            worst = max(spills, key=spills.__getitem__)
            record.dropped = (f"compile: {worst} spills ({record.resources[worst]['spill_store_bytes']} B stored, "
                              f"{record.resources[worst]['spill_load_bytes']} B loaded) on {target.arch}")
    return [r for r in records if r.alive]


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

class Verdict(BaseModel):
    ok: bool
    summary: str = ""


class Timer(Protocol):
    """(kernels, shapes) -> per kernel, per shape: the median ms, or None where it did not run."""

    def __call__(self, kernels: list[CandidateRecord], shapes: list[Shape]) -> list[list[float | None]]: ...


Verifier = Callable[[CandidateRecord], Verdict]


class GpuTimer:
    """The real timer and verifier: one GpuWorker process; one bench call per batch of kernels, no
    baselines. Run on the H200 once (benchmarks/results/2026-11-30-h200-tune-bf16-plain-d128-857e8f5.json); the
    CPU tests drive the search with fakes."""

    name = "gpu-worker"

    def __init__(self, *, min_time_s: float = 0.1, job_timeout_s: float = 300.0, worker=None):
        from flashgen.harness.worker import GpuWorker, have_gpu

        if worker is None and not have_gpu():
            raise UsageError("no CUDA GPU here: timing the candidates needs one (`flashgen tune` without a GPU "
                             "lists the candidates that pass the CPU filters)")
        self.worker = worker or GpuWorker(job_timeout_s=job_timeout_s)
        self.min_time_s = min_time_s

    def environment(self) -> dict[str, Any]:
        from flashgen.harness.suite import toolchain_info

        info = dict(toolchain_info())
        found = self.worker.call("flashgen.harness.device:environment_info")
        if found.ok:
            info.update(found.value)
        return info

    def verify(self, record: CandidateRecord) -> Verdict:
        from flashgen.harness.verify import quick_cases
        from flashgen.harness.worker import KernelInput

        cases = quick_cases(record.manifest)  # the few cases a benchmark verifies before timing
        report = self.worker.verify(KernelInput(manifest=record.manifest, source=record.source), cases=cases)
        return Verdict(ok=bool(report.ok), summary=(report.summary or report.error or "")[:600])

    def __call__(self, kernels: list[CandidateRecord], shapes: list[Shape]) -> list[list[float | None]]:
        from flashgen.harness.worker import KernelInput

        result = self.worker.bench([KernelInput(manifest=k.manifest, source=k.source) for k in kernels], shapes,
                                   baselines=False, min_time_s=self.min_time_s)
        found: dict[tuple[str, str], float] = {}
        if result.ok:
            for entry in result.value.entries:
                if entry.kind == "kernel" and entry.ok and entry.stats is not None:
                    found[(entry.name, shape_text(entry.shape))] = entry.stats.median_ms
        return [[found.get((k.kernel_name, shape_text(s))) for s in shapes] for k in kernels]

    def close(self) -> None:
        self.worker.close()


def default_shapes(variant: Variant, head_dim: int, lengths: Sequence[int] = (1024, 4096, 16384)) -> list[Shape]:
    """FlashAttention-2's benchmark family (what `flashgen tune` and the library job's search time by default): B*N =
    16k tokens at each N = M of `lengths`, H*D about 2048 (H a multiple of the kv group)."""
    group = variant.kv_group
    heads = max(group, (2048 // head_dim) // group * group)
    return [Shape(B=max(1, 16384 // n), H=heads, KVH=heads // group, N=n, M=n, D=head_dim) for n in lengths]


def prepare_candidates(variant: Variant, target, dtype: DType, head_dim: int, *, max_candidates: int | None = None,
                       include: Sequence[dict[str, int]] = (), compile: bool = True, jobs: int | None = None,
                       progress: Callable[[str], None] = lambda _msg: None) -> list[CandidateRecord]:
    """The search's CPU half: screen the space (translators.search), drop the live ones past `max_candidates` (but
    not the first whose parameters are those of an `include`: e.g. today's choice, so that the search can only beat
    it), compile the rest (dropping spills) and build their sources. Every record comes back, the dropped ones with
    their reason; the live ones hold their CUDA source and manifest, ready for `time_candidates` on a GPU."""
    target = resolve_target(target)
    dtype = DType(getattr(dtype, "value", dtype))
    records = screen_candidates(variant, target, dtype, head_dim)
    live = [r for r in records if r.alive]
    kept = live[:max_candidates] if max_candidates is not None else live
    for want in include:
        found = next((r for r in live if all(r.params.get(k) == v for k, v in want.items())), None)
        if found is not None and not any(found is r for r in kept):
            kept.append(found)
    for record in live:
        if not any(record is r for r in kept):
            record.dropped = "budget: beyond max_candidates"
    progress(f"{sum(r.alive for r in records)} of {len(records)} candidates pass the CPU filters")
    if compile:
        compile_filter(records, target, jobs=jobs)
        progress(f"{sum(r.alive for r in records)} compile without spills for {target.arch}")
    build_sources(records, target)
    return records


def time_candidates(records: Sequence[CandidateRecord], shapes: Sequence[Shape], *, timer: Timer, budget_s: float,
                    verifier: Verifier | None = None, batch_size: int = 4, started: float | None = None,
                    progress: Callable[[str], None] = lambda _msg: None) -> None:
    """The search's GPU half, on the live records (built by `prepare_candidates`): verify each (a wrong kernel is
    dropped, never timed), time the verified ones in batches of `batch_size` (one timer call each) over `shapes`,
    until the records or `budget_s` (counted from `started`, default now) run out. Fills each record's
    verify_summary, times_ms and geomean_ms, or its `dropped` reason."""
    verifier = verifier or getattr(timer, "verify", None)
    if verifier is None:
        raise UsageError("search needs a verifier: an unverified kernel could win")
    started = time.monotonic() if started is None else started
    shapes = list(shapes)

    def out_of_time() -> bool:
        return time.monotonic() - started > budget_s

    queue = [r for r in records if r.alive]
    while queue:
        batch: list[CandidateRecord] = []
        while queue and len(batch) < batch_size:
            record = queue.pop(0)
            if out_of_time():
                record.dropped = "budget: the time budget ran out before it was verified"
                continue
            verdict = verifier(record)
            record.verify_summary = verdict.summary
            if not verdict.ok:
                record.dropped = f"verify: {verdict.summary or 'wrong results'}"
                progress(f"{record.label}: FAILS verification")
                continue
            batch.append(record)
        if not batch:
            continue
        if out_of_time():
            for record in batch:
                record.dropped = "budget: the time budget ran out before it was timed"
            continue
        times = timer(batch, shapes)
        for record, row in zip(batch, times, strict=True):
            record.times_ms = {shape_text(s): t for s, t in zip(shapes, row, strict=True) if t is not None}
            missing = [shape_text(s) for s, t in zip(shapes, row, strict=True) if t is None or not t > 0]
            if missing:
                record.dropped = f"time: no time at {', '.join(missing)}"
                continue
            record.geomean_ms = geomean(list(record.times_ms.values()))
            progress(f"{record.label}: {record.geomean_ms:.4g} ms geomean")


def pick_winner(records: Sequence[CandidateRecord]) -> CandidateRecord | None:
    """The live record with the lowest geomean time (the first, likeliest, of equal times), or None."""
    timed = [r for r in records if r.geomean_ms is not None and r.alive]
    return min(timed, key=lambda r: r.geomean_ms) if timed else None


#: how much faster than the winner another candidate must be at the ends of the lengths timed to get its own range
BY_SIZE_MIN_GAIN = 0.03


def pick_by_size(records: Sequence[CandidateRecord], winner: CandidateRecord, shapes: Sequence[Shape],
                 min_gain: float = BY_SIZE_MIN_GAIN) -> list[SizeParams]:
    """Tiles for ranges of sequence lengths over the winner's: at the shortest N timed (and the longer Ns that the
    same candidate wins), and at the longest, the live candidate fastest there (geomean over that N's shapes) where
    it beats the winner by more than `min_gain`, as `Params when N <= ...` / `Params when N > ...` lines (the
    params where it differs from the winner). The bound is the last N of the range timed: lengths between two
    timed ones take the shorter's tiles."""
    timed = [r for r in records if r.alive and r.geomean_ms is not None]
    lengths = sorted({s.N for s in shapes})
    if len(lengths) < 2:
        return []

    def at(record: CandidateRecord, n: int) -> float:
        return geomean([record.times_ms[shape_text(s)] for s in shapes if s.N == n])

    def fastest(n: int) -> CandidateRecord:
        return min(timed, key=lambda r: at(r, n))

    def gains(record: CandidateRecord, n: int) -> bool:
        return record is not winner and at(record, n) < (1 - min_gain) * at(winner, n)

    def line(record: CandidateRecord, op: str, bound: int) -> SizeParams:
        return SizeParams.over("N", op, bound, record.params, winner.params)

    lines, low, high = [], 0, len(lengths)
    short = fastest(lengths[0])
    while low < len(lengths) - 1 and gains(short, lengths[low]):
        low += 1
    if low:
        lines.append(line(short, "<=", lengths[low - 1]))
    long = fastest(lengths[-1])
    while high - 1 > low and gains(long, lengths[high - 1]):
        high -= 1
    if high < len(lengths):
        lines.append(line(long, ">", lengths[high - 1]))
    return [one for one in lines if one.params]


def search(variant: Variant, target, dtype: DType, head_dim: int, shapes: Sequence[Shape], *, timer: Timer,
           budget_s: float, verifier: Verifier | None = None, batch_size: int = 4, max_candidates: int | None = None,
           compile: bool = True, jobs: int | None = None,
           progress: Callable[[str], None] = lambda _msg: None) -> SearchResult:
    """Screen, compile, verify and time the candidates (`prepare_candidates`, then `time_candidates`); the winner has
    the lowest geomean time over `shapes` among the verified ones timed on every shape. `verifier` defaults to
    `timer.verify`; a search never times an unverified kernel. `budget_s` bounds the whole search (checked between
    steps)."""
    if not shapes:
        raise UsageError("search needs at least one shape")
    if budget_s <= 0:
        raise UsageError(f"the search budget must be positive, got {budget_s}")
    verifier = verifier or getattr(timer, "verify", None)
    if verifier is None:
        raise UsageError("search needs a verifier: an unverified kernel could win")
    started = time.monotonic()
    target = resolve_target(target)
    dtype = DType(getattr(dtype, "value", dtype))
    shapes = list(shapes)
    records = prepare_candidates(variant, target, dtype, head_dim, max_candidates=max_candidates, compile=compile,
                                 jobs=jobs, progress=progress)
    time_candidates(records, shapes, timer=timer, budget_s=budget_s, verifier=verifier, batch_size=batch_size,
                    started=started, progress=progress)
    result = SearchResult(target=target.name, arch=target.arch, dtype=dtype.value, variant=variant.name,
                          variant_fields=variant.model_dump(mode="json"), head_dim=head_dim,
                          shapes=[shape_text(s) for s in shapes], candidates=records,
                          timer=getattr(timer, "name", type(timer).__name__), budget_s=budget_s)
    env = getattr(timer, "environment", None)
    result.environment = env() if callable(env) else None
    best = pick_winner(records)
    if best is not None:
        result.winner, result.winner_label, result.winner_geomean_ms = dict(best.params), best.label, best.geomean_ms
        result.winner_by_size = pick_by_size(records, best, shapes)
    result.seconds = round(time.monotonic() - started, 3)
    return result


def record_winner(result: SearchResult, directory: Path | None = None) -> Path:
    """Store the winner in the GPU's tuned file, in `directory` or the user's folder (params.user_tuned_dir():
    FLASHGEN_HOME/config/tuned, else XDG_CONFIG_HOME/flashgen/tuned; never the installed package), which
    flashgen.translators.params.choose_params reads before the packaged table."""
    if result.winner is None:
        raise UsageError(f"the search for {result.dtype} {result.variant} d{result.head_dim} on {result.target} "
                         "timed no verified candidate: nothing to record")
    best = next(r for r in result.candidates if r.alive and r.params == result.winner)
    env = result.environment or {}
    versions = {k: env[k] for k in ("driver", "nvidia_driver", "cuda_runtime", "torch", "torch_cuda", "cupy", "nvcc",
                                    "git_commit") if env.get(k) is not None}
    entry = TunedEntry(params=dict(result.winner), arch=result.arch, geomean_ms=best.geomean_ms,
                       times_ms=dict(best.times_ms), candidates_timed=len(result.timed), date=result.created[:10],
                       gpu=env.get("gpu"), versions=versions, timer=result.timer, by_size=result.winner_by_size)
    tuned = load_tuned(result.target, directory)
    tuned.entries[tuned_key(DType(result.dtype), Variant.model_validate(result.variant_fields), result.head_dim)] = entry
    return save_tuned(tuned, directory)
