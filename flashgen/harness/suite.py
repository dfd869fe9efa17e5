"""Performance suites: build our kernels for every (dtype, variant, head dim) a suite needs through the
expert pipeline (`flashgen generate --provider expert` writes the same TL and CUDA), compile them all in
parallel, verify each on a small case set, then time every shape beside every baseline in one run.

    result = run_suite("h200", arch_path=None)          # needs a GPU; the H200's own (sm_80) code path
    result = run_suite("h200", arch_path="sm_75")       # the Turing code path, compiled for the GPU present
    kernels = compile_suite("h200", arch_path="sm_75")  # no GPU needed: nvcc errors and spills only
    text = render_markdown([result, ...])               # docs/performance.md

Speedups are always baseline time / our time: > 1 means ours is faster.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flashgen.abi import KernelManifest
from flashgen.errors import FlashgenError, UsageError
from flashgen.harness.bench import (
    BASELINE_LABELS,
    BENCH_ROUNDS,
    BENCH_SEED,
    BENCH_SETTLE_EACH,
    BENCH_SETTLE_S,
    FLEX_MODES,
    SUITE_GRIDS,
    BenchEntry,
    FlexMode,
    attention_flops,
    geomean,
    shape_text,
    speedup,
)
from flashgen.mods import FUNCTION_GOAL
from flashgen.roofline import OpCounts
from flashgen.variant import DType, Shape, Variant, check_head_dim_v

SUITES = tuple(SUITE_GRIDS)
ARCH_PATHS = ("sm_90", "sm_80", "sm_75")
# Where the Turing code path is meant to run: its roofline there is recorded beside the H200 timing.
TURING_ROOFLINE_TARGETS = ("t4", "rtx8000")
# Display names of the baselines, in table order
SUMMARY_BASELINES = ("sdpa_flash", "sdpa_cudnn")


# ---------------------------------------------------------------------------------------------
# Building our kernels
# ---------------------------------------------------------------------------------------------

def code_path(arch: str) -> str:
    """The translator's code path for an arch, named by the first arch its backend serves (sm_75 and sm_90 have their
    own; sm_80..sm_89 share the sm_80 one): flashgen.translators.backends.backend_for decides."""
    from flashgen.targets import resolve_target
    from flashgen.translators.backends import backend_for

    return backend_for(resolve_target(arch)).archs[0]


def translation_target(gpu: str, arch_override: str | None = None):
    """The target a kernel for `gpu` is translated for: the GPU's own when `arch_override` is None or
    names the code path the GPU already takes (sm_80 on an H200: what `flashgen generate --gpu h200`
    builds), else the first known target of that arch (sm_75 -> t4), so that another code path can be
    built and then compiled for the GPU present."""
    from flashgen.targets import get_target, resolve_target

    own = get_target(gpu)
    if arch_override is None or arch_override in ARCH_PATHS and code_path(arch_override) == code_path(own.arch):
        return own
    try:
        return resolve_target(arch_override)
    except UsageError:
        raise UsageError(f"no known target has arch {arch_override!r}; known paths: {', '.join(ARCH_PATHS)}") from None


def build_expert_kernel(gpu: str, dtype: DType | str, variant: Variant, head_dim: int,
                        arch_override: str | None = None, env=None,
                        head_dim_v: int | None = None) -> tuple[str, KernelManifest, str]:
    """(CUDA source, manifest, full TL) of the expert's kernel: the library's full program with the
    first `choose_params` candidate, through the reference translator (what the expert provider answers
    on its first try). Raises FlashgenError (one line) for a combination the translator cannot build.
    The first candidate is flashgen.translators.params' choice, asked for alone: the CPU screen of the whole
    search space behind the other candidates takes seconds a kernel, and only the expert's later tries need it.
    `head_dim_v`: V's and O's own head dim (None, or head_dim: the kernel of one head dim)."""
    from flashgen.harness.environment import Environment

    env = env or Environment()
    dtype = DType(getattr(dtype, "value", dtype))
    return env.expert_kernel(variant, translation_target(gpu, arch_override), dtype, head_dim,
                             check_head_dim_v(head_dim_v, head_dim))


class SuiteKernel(BaseModel):
    """One of our kernels in a suite run: how it was built, compiled and verified."""

    dtype: str
    variant: str
    causal: bool
    head_dim: int
    name: str | None = None
    arch: str | None = Field(default=None, description="the code path the source is written for (manifest.arch)")
    params: dict[str, Any] = Field(default_factory=dict)
    source_sha256: str | None = None
    build_error: str | None = None
    compile: dict[str, Any] = Field(default_factory=dict, description="arch, ok, seconds, per entry: registers, "
                                    "smem, spills; the errors when it failed")
    verify: dict[str, Any] | None = None
    tl: str | None = None
    source: str | None = Field(default=None, exclude=True)
    manifest: KernelManifest | None = Field(default=None, exclude=True)
    program: Any = Field(default=None, exclude=True)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.dtype, self.variant, self.head_dim

    @property
    def compiled(self) -> bool:
        return bool(self.compile.get("ok"))


def suite_rows(suite: str = "fa2", select: str | None = None) -> list[tuple[DType, Variant, Shape]]:
    """The suite's (dtype, variant, shape) rows, optionally narrowed by `select` (see select_rows)."""
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return select_rows(SUITE_GRIDS[suite](), select)


def select_rows(rows: list[tuple[DType, Variant, Shape]], select: str | None) -> list[tuple[DType, Variant, Shape]]:
    """Keep the rows matching every comma-separated word of `select`: a dtype (fp16), a variant name
    (plain, causal), a head dim (d64) or a length (n1024)."""
    if not select:
        return rows
    words = [w.strip().lower() for w in select.split(",") if w.strip()]
    kept = [r for r in rows if all(w in _row_words(*r) for w in words)]
    if not kept:
        raise UsageError(f"--select {select!r} matches no row; words are a dtype (fp16, bf16), a variant (plain, "
                         "causal), a head dim (d64, d128) or a length (n512 ... n16384)")
    return kept


def _row_words(dtype: DType, variant: Variant, shape: Shape) -> set[str]:
    return {dtype.value, variant.name, f"d{shape.D}", f"n{shape.N}"}


def build_suite_kernels(gpu: str, rows: list[tuple[DType, Variant, Shape]], arch_path: str | None = None
                        ) -> list[SuiteKernel]:
    """One kernel per (dtype, variant, head dim) of the rows; a failed build is recorded, not raised."""
    from flashgen.harness.environment import Environment

    env = Environment()
    kernels: dict[tuple[str, str, int], SuiteKernel] = {}
    for dtype, variant, shape in rows:
        key = (dtype.value, variant.name, shape.D)
        if key in kernels:
            continue
        k = SuiteKernel(dtype=dtype.value, variant=variant.name, causal=variant.causal, head_dim=shape.D)
        try:
            source, manifest, tl = build_expert_kernel(gpu, dtype, variant, shape.D, arch_path, env=env)
        except FlashgenError as exc:
            k.build_error = str(exc)
        else:
            k.name, k.arch, k.tl, k.source, k.manifest = manifest.name, manifest.arch, tl, source, manifest
            k.source_sha256 = hashlib.sha256(source.encode()).hexdigest()
            k.program = env.parse(tl)
            k.params = dict(manifest.params) or dict(k.program.params)
        kernels[key] = k
    return list(kernels.values())


def compile_suite_kernels(kernels: list[SuiteKernel], arch: str, jobs: int | None = None) -> None:
    """nvcc every built kernel for `arch` in parallel; the cubins land in the compile cache, where the
    worker finds them."""
    from flashgen.harness.compile import compile_many

    todo = [k for k in kernels if k.source is not None]
    try:
        results = compile_many([k.source for k in todo], arch, jobs=jobs)
    except FlashgenError as exc:
        for k in todo:
            k.compile = {"arch": arch, "ok": False, "error": str(exc)}
        return
    for k, result in zip(todo, results):
        usage = {name: u.model_dump(include={"registers", "shared_static_bytes", "spill_store_bytes",
                                             "spill_load_bytes", "stack_frame_bytes"})
                 for name, u in sorted(result.kernels.items())}
        k.compile = {"arch": result.arch, "ok": result.ok, "seconds": round(result.seconds, 2), "cache_hit": result.cache_hit,
                     "resources": usage, "spills": any(u.spills for u in result.kernels.values())}
        if not result.ok:
            k.compile["error"] = result.feedback_text(600)


def compile_suite(gpu: str, suite: str = "fa2", arch_path: str | None = None, select: str | None = None,
                  jobs: int | None = None, arch: str | None = None) -> list[SuiteKernel]:
    """Build and compile every kernel of the suite for the GPU's arch (no GPU needed)."""
    from flashgen.targets import get_target

    kernels = build_suite_kernels(gpu, suite_rows(suite, select), arch_path)
    compile_suite_kernels(kernels, arch or _compile_arch(get_target(gpu).arch), jobs)
    return kernels


def _compile_arch(target_arch: str) -> str:
    # what the worker builds for on that GPU (worker.runnable_arch): the plain arch, not sm_90a
    return target_arch.rstrip("a")


# ---------------------------------------------------------------------------------------------
# Roofline of the Turing path from the interpreter's counts
# ---------------------------------------------------------------------------------------------

def interpreted_counts(program, variant: Variant, shape: Shape) -> OpCounts:
    """The interpreter's OpCounts of `program` at `shape` (N == M here). Every (batch, kv head) group
    runs the same program, so one group is counted and scaled (as the agent does). A group's counts
    are a quadratic in the length when the length is a multiple of the tiles (tiles per row block
    times row blocks; the causal staircase sums to a quadratic too), so they are interpreted at three
    small lengths, extrapolated, and the extrapolation is checked exactly at a fourth; a program whose
    counts are not quadratic is interpreted at the full length instead."""
    from flashgen.tl_spec.interpreter import interpret

    n = shape.N
    program = program.at_sizes(shape.sizes)  # tiles per range of sizes: `shape`'s, at every length the fit interprets
    group = lambda length: Shape(B=1, H=variant.kv_group, KVH=1, N=length, M=length, D=shape.D)
    factor = shape.B * shape.H / variant.kv_group
    bm, bn = int(program.params.get("BLOCK_M", 128)), int(program.params.get("BLOCK_N", 128))
    step = 2 * _lcm(bm, bn)
    if shape.N != shape.M or n % step or n <= 4 * step:
        return _scaled(interpret(program, group(n), seed=0).counts, factor)
    points = [(i * step, _flat(interpret(program, group(i * step), seed=0).counts)) for i in (1, 2, 3, 4)]
    keys = set().union(*(p.keys() for _, p in points))
    fitted, check = {}, {}
    for key in keys:
        xs, ys = [x for x, _ in points[:3]], [p.get(key, 0.0) for _, p in points[:3]]
        fitted[key] = _lagrange(xs, ys, n)
        check[key] = _lagrange(xs, ys, points[3][0])
    if any(abs(check[k] - points[3][1].get(k, 0.0)) > 1e-9 * max(1.0, abs(check[k])) for k in keys):
        return _scaled(interpret(program, group(n), seed=0).counts, factor)
    return _scaled(_unflat(fitted), factor)


def _lcm(a: int, b: int) -> int:
    import math

    return a * b // math.gcd(a, b)


def _lagrange(xs: list[float], ys: list[float], x: float) -> float:
    total = 0.0
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        term = yi
        for j, xj in enumerate(xs):
            if j != i:
                term *= (x - xj) / (xi - xj)
        total += term
    return total


def _flat(c: OpCounts) -> dict[str, float]:
    out = {"mma_flops": c.mma_flops, "vector_flops": c.vector_flops, "sfu_ops": c.sfu_ops}
    out.update({f"bytes:{k}": v for k, v in c.bytes.items()})
    return out


def _unflat(d: dict[str, float]) -> OpCounts:
    return OpCounts(mma_flops=d.get("mma_flops", 0.0), vector_flops=d.get("vector_flops", 0.0),
                    sfu_ops=d.get("sfu_ops", 0.0),
                    bytes={k.removeprefix("bytes:"): v for k, v in d.items() if k.startswith("bytes:")})


def _scaled(c: OpCounts, factor: float) -> OpCounts:
    return OpCounts(mma_flops=c.mma_flops * factor, vector_flops=c.vector_flops * factor, sfu_ops=c.sfu_ops * factor,
                    bytes={k: v * factor for k, v in c.bytes.items()})


def turing_rooflines(kernel: SuiteKernel, shape: Shape) -> dict[str, dict[str, Any]]:
    """Per Turing target: the roofline lower bound of this kernel's program at `shape` (interpreter counts)."""
    from flashgen.roofline import attention_flops, estimate
    from flashgen.targets import get_target

    if kernel.program is None:
        return {}
    variant = Variant(causal=kernel.causal)
    counts = interpreted_counts(kernel.program, variant, shape)
    out = {}
    for name in TURING_ROOFLINE_TARGETS:
        est = estimate(counts, get_target(name), kernel.dtype)
        out[name] = {"time_ms": est.time_s * 1e3, "bound": est.bound,
                     "tflops": est.tflops_at_bound(attention_flops(shape, variant)), "tensor_dtype": est.tensor_dtype}
    return out


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

class SuiteRow(BaseModel):
    dtype: str
    variant: str
    causal: bool
    shape: Shape
    kernel: str | None = None
    status: str = Field(default="not run", description="timed | not built | compile failed | verify failed | "
                        "bench failed: ... | not run")
    ours: BenchEntry | None = None
    baselines: dict[str, BenchEntry] = Field(default_factory=dict)
    speedup: dict[str, float] = Field(default_factory=dict, description="baseline median / ours (> 1: ours is faster)")
    roofline_other: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                      description="Turing path: the bound on T4 / RTX 8000")

    def fill_speedups(self) -> None:
        self.speedup = {}
        if self.ours is None or self.ours.stats is None:
            return
        for name, entry in self.baselines.items():
            if entry.stats is not None:
                self.speedup[name] = speedup(entry.stats.median_ms, self.ours.stats.median_ms)


class MinSpeedup(BaseModel):
    value: float
    shape: str


class SuiteSummary(BaseModel):
    rows: int = 0
    timed: int = 0
    geomean_speedup: dict[str, float] = Field(default_factory=dict, description="per baseline, over the rows "
                                              "where both were timed")
    min_speedup: dict[str, MinSpeedup] = Field(default_factory=dict)
    compared: dict[str, int] = Field(default_factory=dict, description="rows in each geomean")


class SuiteResult(BaseModel):
    suite: str = "fa2"
    gpu: str = Field(description="the GPU the suite is for (flashgen target name)")
    arch_path: str = Field(description="the code path timed (sm_80 or sm_75)")
    kernel_arch: str | None = Field(default=None, description="the arch the sources are written for (manifest.arch)")
    translation_target: str
    compile_arch: str | None = None
    created: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    env: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    kernels: list[SuiteKernel] = Field(default_factory=list)
    rows: list[SuiteRow] = Field(default_factory=list)
    summary: SuiteSummary = Field(default_factory=SuiteSummary)
    seconds: dict[str, float] = Field(default_factory=dict, description="wall time per stage")

    def summarize(self) -> SuiteSummary:
        self.summary = summarize(self.rows)
        return self.summary

    def __repr__(self) -> str:
        from flashgen.harness.display import benchmark_repr

        return benchmark_repr(self)

    __str__ = __repr__  # print() too: one line (the fields are in model_dump())

    def _repr_html_(self) -> str:  # Jupyter: TF/s against N per dtype, mask and head dim, with the ratios
        from flashgen.harness.display import benchmark_html

        return benchmark_html(self, BASELINE_LABELS)


def summarize(rows: list[SuiteRow]) -> SuiteSummary:
    s = SuiteSummary(rows=len(rows), timed=sum(r.status == "timed" for r in rows))
    names = sorted({n for r in rows for n in r.speedup}, key=lambda n: list(BASELINE_LABELS).index(n)
                   if n in BASELINE_LABELS else 99)
    for name in names:
        pairs = [(r.speedup[name], r) for r in rows if name in r.speedup]
        s.geomean_speedup[name] = geomean([v for v, _ in pairs])
        s.compared[name] = len(pairs)
        value, row = min(pairs, key=lambda p: p[0])
        s.min_speedup[name] = MinSpeedup(value=value, shape=row_label(row))
    return s


def row_label(row: SuiteRow) -> str:
    return f"{row.dtype} {row.variant} {shape_text(row.shape)}"


class PaddingCost(BaseModel):
    """A head dim the tile tables were not measured at, against the native dim whose parameters it takes."""

    dtype: str
    variant: str
    n: int
    head_dim: int
    native_head_dim: int
    tflops: float = Field(description="at head_dim, counting head_dim's own flops")
    native_tflops: float
    ratio: float = Field(description="tflops / native_tflops: below 1 the head dim runs less efficiently")


def first_round_drift(rows: list[SuiteRow]) -> dict[str, float]:
    """Per kernel label (ours, then each baseline): the geomean over the timed rows of the first round's median over
    the median of the later rounds' (TimingStats.round_medians_ms; > 1: the first round read slower). A drift on
    ours alone is the card's clock at the start of a shape (the boost after idle, or a dip after it: --settle),
    not the kernel; rows timed in one round, or before round medians were recorded, are left out."""
    ratios: dict[str, list[float]] = {}
    for row in rows:
        for label, entry in [("ours", row.ours), *row.baselines.items()]:
            rounds = entry.stats.round_medians_ms if entry is not None and entry.stats is not None else []
            if len(rounds) >= 2 and rounds[0] > 0:
                ratios.setdefault(label, []).append(rounds[0] / statistics.median(rounds[1:]))
    return {label: statistics.geometric_mean(r) for label, r in ratios.items()}


def order_split(rows: list[SuiteRow]) -> dict[str, tuple[float, str]]:
    """Per baseline: (split, row label) of the row whose speedup (baseline / ours, from each round's medians) moved
    most with the order inside a round. The split is the mean speedup over the rounds where ours ran first (even
    rounds: right after its own previous block, or the settle) over the mean over those where it ran last
    (time_in_rounds); 1: the order did not matter. Session 26's 16k rounds read 0.91-1.01x cuDNN first and
    1.13-1.29x last (bench.BENCH_SETTLE_EACH). Rows timed in fewer than two rounds, or before round medians were
    recorded, are left out."""
    worst: dict[str, tuple[float, str]] = {}
    for row in rows:
        ours = row.ours.stats.round_medians_ms if row.ours is not None and row.ours.stats is not None else []
        for label, entry in row.baselines.items():
            theirs = entry.stats.round_medians_ms if entry.stats is not None else []
            if len(ours) < 2 or len(theirs) != len(ours) or min(ours) <= 0:
                continue
            speedups = [t / o for o, t in zip(ours, theirs)]
            split = statistics.fmean(speedups[0::2]) / statistics.fmean(speedups[1::2])
            if label not in worst or abs(math.log(split)) > abs(math.log(worst[label][0])):
                worst[label] = (split, row_label(row))
    return worst


def padding_costs(rows: list[SuiteRow]) -> list[PaddingCost]:
    """Per timed row at a non-native head dim: its TF/s over that of the timed row at the same dtype, variant and
    length and at its native head dim (flashgen.translators.plan.native_head_dim); rows without a timed partner are
    left out."""
    from flashgen.translators.plan import native_head_dim

    def tflops(row: SuiteRow) -> float | None:
        return row.ours.tflops if row.status == "timed" and row.ours is not None else None

    timed = {(r.dtype, r.variant, r.shape.N, r.shape.D): r for r in rows if tflops(r)}
    out = []
    for (dtype, variant, n, d), row in timed.items():
        native = timed.get((dtype, variant, n, native_head_dim(d)))
        if native is None or native is row:
            continue
        out.append(PaddingCost(dtype=dtype, variant=variant, n=n, head_dim=d, native_head_dim=native.shape.D,
                               tflops=tflops(row), native_tflops=tflops(native), ratio=tflops(row) / tflops(native)))
    return sorted(out, key=lambda c: (c.dtype, c.variant, c.n, c.head_dim))


# ---------------------------------------------------------------------------------------------
# Running on the GPU
# ---------------------------------------------------------------------------------------------

def git_commit(root: Path | None = None) -> str | None:
    """$FLASHGEN_GIT_COMMIT when set (a copied tree, e.g. on a lent GPU, may carry a stale .git whose HEAD is not
    what runs), else HEAD of the repository (with '+dirty' when the tree differs)."""
    if os.environ.get("FLASHGEN_GIT_COMMIT"):
        return os.environ["FLASHGEN_GIT_COMMIT"]
    root = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                   capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def toolchain_info() -> dict[str, Any]:
    """nvcc release, date and git commit: the parts of the environment the worker does not report."""
    import re

    info: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "git_commit": git_commit()}
    try:
        from flashgen.harness.compile import nvcc_version

        m = re.search(r"release [\d.]+, V([\d.]+)", nvcc_version())
        info["nvcc"] = m.group(1) if m else nvcc_version().splitlines()[-1]
    except FlashgenError as exc:
        info["nvcc"] = None
        info["nvcc_error"] = str(exc)
    return info


def run_suite(gpu: str, suite: str = "fa2", arch_path: str | None = None, *, select: str | None = None,
              baselines: bool = True, flex: FlexMode = "dynamic", min_time_s: float = 0.1, jobs: int | None = None,
              job_timeout_s: float = 300.0, out: Path | None = None, rounds: int = BENCH_ROUNDS,
              settle_s: float = BENCH_SETTLE_S, settle_each: bool = BENCH_SETTLE_EACH,
              progress: Callable[[str], None] = lambda _msg: None) -> SuiteResult:
    """Build, compile (in parallel), verify on verify.QUICK_CASES and time every row beside the baselines, in `rounds`
    rounds (bench.time_in_rounds), after `settle_s` seconds of each kernel untimed (bench.settle_card), and with
    `settle_each` each timed block after an untimed one of its own kernel. Writes `out` after every kernel, so a run
    cut short still leaves what it measured."""
    from flashgen.harness.verify import QUICK_CASES, quick_cases
    from flashgen.harness.worker import GpuWorker, KernelInput, device_arch, have_gpu

    if flex not in FLEX_MODES:
        raise UsageError(f"flex must be one of {', '.join(FLEX_MODES)}")
    if not have_gpu():
        raise UsageError("no CUDA GPU here (cupy cannot see a device); `flashgen bench --suite fa2 --compile-only` "
                         "builds and compiles the kernels without one")
    rows_spec = suite_rows(suite, select)
    target = translation_target(gpu, arch_path)
    t0 = time.monotonic()
    kernels = build_suite_kernels(gpu, rows_spec, arch_path)
    built = time.monotonic()
    arch = device_arch()
    progress(f"built {sum(k.source is not None for k in kernels)}/{len(kernels)} kernels for {target.arch} "
             f"in {built - t0:.1f} s; compiling for {arch}")
    compile_suite_kernels(kernels, arch, jobs)
    compiled = time.monotonic()
    progress(f"compiled in {compiled - built:.1f} s")
    result = SuiteResult(suite=suite, gpu=gpu, arch_path=code_path(target.arch), kernel_arch=target.arch,
                         translation_target=target.name,
                         compile_arch=arch, kernels=kernels,
                         settings={"min_time_s": min_time_s, "rounds": rounds, "settle_s": settle_s,
                                   "settle_each": settle_each, "baselines": baselines, "flex": flex,
                                   "verify_cases": list(QUICK_CASES),
                                   "verify_note": "each kernel is verified on this small subset of "
                                   "harness.verify.default_cases before timing; the full set runs in the GPU tests",
                                   "select": select, "speedup": "baseline median time / ours (> 1: ours is faster)"},
                         seconds={"build": round(built - t0, 2), "compile": round(compiled - built, 2)})
    result.env.update(toolchain_info())
    by_key = {k.key: k for k in kernels}
    for dtype, variant, shape in rows_spec:
        k = by_key[(dtype.value, variant.name, shape.D)]
        row = SuiteRow(dtype=dtype.value, variant=variant.name, causal=variant.causal, shape=shape, kernel=k.name)
        if k.source is None:
            row.status = f"not built: {k.build_error}"
        elif not k.compiled:
            row.status = "compile failed"
        elif k.arch is not None and code_path(k.arch) == "sm_75":
            row.roofline_other = turing_rooflines(k, shape)
        result.rows.append(row)
    with GpuWorker(job_timeout_s=job_timeout_s) as worker:
        env = worker.call("flashgen.harness.worker:environment_info")
        if env.ok:
            result.env.update(env.value)
        for k in kernels:
            if k.source is None or not k.compiled:
                continue
            mine = [r for r in result.rows if (r.dtype, r.variant, r.shape.D) == k.key]
            kernel_input = KernelInput(manifest=k.manifest, source=k.source)
            started = time.monotonic()
            cases = quick_cases(k.manifest)
            report = worker.verify(kernel_input, cases=cases, timeout_s=min(job_timeout_s, 120.0))
            k.verify = {"ok": bool(report.ok), "cases": [c.name for c in cases], "seed": getattr(report, "seed", None),
                        "summary": (report.summary or "")[:1500]}
            if not report.ok:
                for r in mine:
                    r.status = "verify failed"
                progress(f"{k.name}: FAILS verification; not timed")
                _write(result, out)
                continue
            timed = worker.call("flashgen.harness.bench:bench_kernels", timeout_s=job_timeout_s,
                                kernels=[kernel_input], shapes=[r.shape for r in mine], baselines=baselines,
                                min_time_s=min_time_s, flex=flex, rounds=rounds, settle_s=settle_s,
                                settle_each=settle_each)
            if not timed.ok:
                for r in mine:
                    r.status = f"bench failed: {(timed.error or '').splitlines()[0] if timed.error else '?'}"
            else:
                _fill_rows(mine, timed.value.entries, k.name)
                result.env.setdefault("bench_target", timed.value.target)
            result.seconds[f"time {k.name}"] = round(time.monotonic() - started, 2)
            progress(f"{k.name}: {sum(r.status == 'timed' for r in mine)}/{len(mine)} shapes timed in "
                     f"{time.monotonic() - started:.1f} s")
            result.summarize()
            _write(result, out)
    result.seconds["total"] = round(time.monotonic() - t0, 2)
    result.summarize()
    _write(result, out)
    return result


def _fill_rows(rows: list[SuiteRow], entries: list[BenchEntry], kernel_name: str | None) -> None:
    for row in rows:
        text = shape_text(row.shape)
        for e in entries:
            if shape_text(e.shape) != text or e.variant != row.variant or e.dtype != row.dtype:
                continue
            if e.kind == "kernel" and e.name == kernel_name:
                row.ours = e
            elif e.kind == "baseline":
                row.baselines[e.name] = e
        if row.ours is not None and row.ours.ok and row.ours.stats is not None:
            row.status = "timed"
        else:
            why = (row.ours.error or row.ours.skipped) if row.ours is not None else "no entry"
            row.status = f"bench failed: {why}"
        row.fill_speedups()


def _write(result: SuiteResult, out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(result.model_dump_json(indent=1))
    tmp.replace(out)


def load_results(paths: list[str]) -> list[SuiteResult]:
    """Suite JSON files -> SuiteResults; one-line InputError for anything else."""
    from pydantic import ValidationError

    from flashgen.errors import InputError

    out = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{path}: no such file")
        try:
            out.append(SuiteResult.model_validate_json(p.read_text()))
        except (ValidationError, ValueError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
            where = ".".join(map(str, first["loc"])) or "document"
            raise InputError(f"{path}: not a suite result ({where}: {first['msg']}); `flashgen bench --suite` "
                             "writes them") from None
    return out


# ---------------------------------------------------------------------------------------------
# Markdown report (docs/performance.md)
# ---------------------------------------------------------------------------------------------

def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def environment_line(result: SuiteResult) -> str:
    e = result.env
    parts = [f"GPU {e.get('gpu') or '?'} ({e.get('arch') or '?'})", f"driver {e.get('nvidia_driver') or e.get('driver') or '?'}",
             f"CUDA runtime {e.get('cuda_runtime') or '?'}", f"nvcc {e.get('nvcc') or '?'}",
             f"torch {e.get('torch') or '?'}", f"cupy {e.get('cupy') or '?'}",
             f"commit {(e.get('git_commit') or '?')[:12]}", f"date {(e.get('date') or result.created)[:10]}"]
    return "; ".join(parts)


def _path_title(result: SuiteResult) -> str:
    return (f"{result.arch_path} code path (translated for {result.translation_target}, "
            f"{result.kernel_arch or '?'}; compiled for {result.compile_arch or '?'}) on "
            f"{result.env.get('gpu') or result.gpu}")


def render_markdown(results: list[SuiteResult]) -> str:
    """The performance document: per result a table (one row per shape) and its summary; with results
    of two code paths on the same GPU, the ratio between them per shape."""
    lines = ["# Performance", "",
             "Generated by `flashgen bench report` from suite results (`flashgen bench --suite hopper`, `--suite fa2`; "
             "`--suite headdims` adds each in-between head dim's TF/s over its native dim's). TFLOP/s = "
             "4·B·H·D per (query, key) pair the mask leaves, over the median time (`flashgen.roofline.attention_flops`): "
             "N·M without a mask, N·M/2 for causal with N = M as FlashAttention and cuDNN count it (every shape here has "
             "N = M, so these are the usual figures), the exact visible count for a sliding window or causal with N ≠ M; "
             "% roof uses the same count. Each call after an L2 "
             "flush. **× X = X's time / ours**: above 1 our kernel is faster. FLASH, CUDNN and EFFICIENT are torch "
             "SDPA with that backend pinned; Flex is `torch.compile(flex_attention)`.", ""]
    for result in results:
        lines += _result_section(result)
        lines += _padding_cost_section(result)
    lines += _cross_path_section(results)
    return "\n".join(lines).rstrip() + "\n"


def _padding_cost_section(result: SuiteResult) -> list[str]:
    """The headdims suite's comparison: each non-native head dim's TF/s over its native dim's (padding_costs)."""
    costs = padding_costs(result.rows)
    if not costs:
        return []
    lines = [f"### Head dims beside their native dims: {_path_title(result)}", "",
             "TF/s at a head dim the tile tables were not measured at (its Q and K tiles padded to the tensor cores' "
             "k-step inside the kernel where it needs it) over TF/s at the native head dim whose tile parameters it "
             "takes (the nearest at or above), each counting its own D's flops; below 1 it runs less efficiently.", "",
             "| dtype | mask | N | D | native D | D TFLOP/s | native TFLOP/s | ratio |", "|---|---|---|---|---|---|---|---|"]
    for c in costs:
        lines.append(f"| {c.dtype} | {c.variant} | {c.n} | {c.head_dim} | {c.native_head_dim} | {c.tflops:.1f} | "
                     f"{c.native_tflops:.1f} | {c.ratio:.2f} |")
    return lines + [""]

def _rounds_text(settings: dict[str, Any]) -> str:
    """How a suite's kernels and baselines shared the card (runs before rounds: one pass, ours first)."""
    rounds, settle_s = settings.get("rounds", 1), settings.get("settle_s", 0.0)
    settled = f", after {settle_s:g} s of ours untimed" if settle_s else ""
    if settings.get("settle_each"):
        settled += ", each timed block after an untimed one of its own kernel"
    return (f", in {rounds} rounds (ours first, then last; samples pooled){settled}" if rounds > 1
            else f", one pass (ours first, then each baseline){settled}")


def _result_section(result: SuiteResult) -> list[str]:
    s = result.summary if result.summary.rows else summarize(result.rows)
    turing = any(r.roofline_other for r in result.rows)
    head = ["dtype", "D", "mask", "B", "H", "N", "ours TFLOP/s", "% roof"]
    head += [f"{label} TFLOP/s" for label in BASELINE_LABELS.values()]
    head += [f"× {BASELINE_LABELS[n]}" for n in SUMMARY_BASELINES]
    if turing:
        head += [f"{t} roof TFLOP/s" for t in TURING_ROOFLINE_TARGETS]
    lines = [f"## {result.suite}: {_path_title(result)}", "", environment_line(result) + ".", "",
             f"Settings: min time {result.settings.get('min_time_s', '?')} s per measurement"
             f"{_rounds_text(result.settings)}; FlexAttention "
             f"{result.settings.get('flex', '?')}; each kernel verified on {', '.join(result.settings.get('verify_cases', []))} "
             "before timing.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.rows:
        cells = [r.dtype, str(r.shape.D), r.variant, str(r.shape.B), str(r.shape.H), str(r.shape.N)]
        if r.status != "timed":
            why = r.status.replace("|", "/")
            why = why if len(why) <= 80 else why[:77] + "..."
            cells += [why, "-"]
        else:
            cells += [_fmt(r.ours.tflops), _fmt(r.ours.roofline_pct, ".0f")]
        cells += [_fmt(r.baselines[n].tflops) if n in r.baselines else "-" for n in BASELINE_LABELS]
        cells += [_fmt(r.speedup.get(n), ".2f") for n in SUMMARY_BASELINES]
        if turing:
            cells += [_fmt(r.roofline_other.get(t, {}).get("tflops")) for t in TURING_ROOFLINE_TARGETS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Summary ({s.timed} of {s.rows} shapes timed):", ""]
    lines += ["| baseline | geomean × (baseline time / ours) | min × | at | shapes |", "|---|---|---|---|---|"]
    for name, g in s.geomean_speedup.items():
        m = s.min_speedup[name]
        lines.append(f"| {BASELINE_LABELS.get(name, name)} | {g:.3f} | {m.value:.3f} | {m.shape} | {s.compared[name]} |")
    if not s.geomean_speedup:
        lines.append("| (nothing timed) | - | - | - | 0 |")
    failed = [k for k in result.kernels if k.build_error or (k.compile and not k.compiled)
              or (k.verify is not None and not k.verify.get("ok"))]
    if failed:
        lines += ["", "Kernels not timed:", ""]
        for k in failed:
            why = k.build_error or k.compile.get("error") or ("verification failed" if k.verify else "")
            lines.append(f"- {k.dtype} {k.variant} d{k.head_dim}: {why.splitlines()[0] if why else '?'}")
    spills = [k for k in result.kernels if k.compile.get("spills")]
    if spills:
        lines += ["", "Register spills: " + ", ".join(k.name or "?" for k in spills) + "."]
    return lines + [""]


def _cross_path_section(results: list[SuiteResult]) -> list[str]:
    """Per GPU with two paths: (path B TFLOP/s) / (path A TFLOP/s) at every shape both timed."""
    lines: list[str] = []
    by_gpu: dict[str, list[SuiteResult]] = {}
    for r in results:
        by_gpu.setdefault(str(r.env.get("gpu") or r.gpu), []).append(r)
    for gpu, group in by_gpu.items():
        paths = sorted({r.arch_path for r in group}, reverse=True)
        if len(paths) < 2:
            continue
        base = next(r for r in group if r.arch_path == paths[0])
        for other in (r for r in group if r.arch_path != paths[0]):
            ours_base = {row_label(r): r for r in base.rows if r.status == "timed"}
            pairs = [(row, ours_base[row_label(row)]) for row in other.rows
                     if row.status == "timed" and row_label(row) in ours_base]
            lines += [f"## {other.arch_path} path beside the {base.arch_path} path on {gpu}", "",
                      f"Speed of the {other.arch_path} path relative to the {base.arch_path} path at the same shapes "
                      f"({base.arch_path} time / {other.arch_path} time; below 1 the {other.arch_path} path is slower).",
                      "", f"| dtype | D | mask | N | {base.arch_path} TFLOP/s | {other.arch_path} TFLOP/s | ratio |",
                      "|---|---|---|---|---|---|---|"]
            ratios = []
            for row, ref in pairs:
                ratio = speedup(ref.ours.stats.median_ms, row.ours.stats.median_ms)
                ratios.append(ratio)
                lines.append(f"| {row.dtype} | {row.shape.D} | {row.variant} | {row.shape.N} | {_fmt(ref.ours.tflops)} | "
                             f"{_fmt(row.ours.tflops)} | {ratio:.2f} |")
            g = geomean(ratios)
            lines += ["", f"Geomean ratio over {len(ratios)} shapes: {_fmt(g, '.3f')}.", ""]
    return lines


def summary_lines(result: SuiteResult) -> list[str]:
    """A few lines for a terminal: the path, how many shapes were timed, geomean and min speedups."""
    s = result.summary if result.summary.rows else summarize(result.rows)
    out = [f"{result.suite} {result.arch_path} path on {result.env.get('gpu') or result.gpu}: {s.timed}/{s.rows} "
           "shapes timed"]
    for name, g in s.geomean_speedup.items():
        m = s.min_speedup[name]
        out.append(f"  × {BASELINE_LABELS.get(name, name)}: geomean {g:.3f}, min {m.value:.3f} at {m.shape} "
                   f"({s.compared[name]} shapes)")
    drift = first_round_drift(result.rows)
    if drift:
        out.append("  first round / later rounds (geomean, > 1: the first slower): "
                   + ", ".join(f"{BASELINE_LABELS.get(k, k)} {v:.3f}" for k, v in drift.items()))
    split = order_split(result.rows)
    if split:
        out.append("  speedup with ours first / last in a round, the row it moved most (1: the order did not matter): "
                   + ", ".join(f"{BASELINE_LABELS.get(k, k)} {v:.3f} at {where}" for k, (v, where) in split.items()))
    for c in padding_costs(result.rows):
        out.append(f"  d{c.head_dim} beside d{c.native_head_dim} ({c.dtype} {c.variant} N={c.n}): {c.tflops:.1f} / "
                   f"{c.native_tflops:.1f} TF/s = {c.ratio:.2f}")
    return out

# ---------------------------------------------------------------------------------------------
# Score and mask functions: a kernel with them beside the plain one, TF/s over the work the mask leaves
# ---------------------------------------------------------------------------------------------

#: the mods suite (`bench_mods`): name -> the generate keywords of a score or mask function (flashgen.mods.make_mods),
#: each timed beside the plain kernel of the same dtype, variant and shape (issue 15's goal: visible-work TF/s within
#: MOD_GOAL of the plain kernel's).
#: - document512: documents of 512 keys, 1/8 of the pairs at 4k; the kernel skips the key tiles outside a row
#:   block's document (docs/variants.md, Tile skipping), so each row block computes 4 key tiles of 32;
#: - lengths: a per-batch length table, `k_idx < LEN[b]` (a call-time int32 tensor, filled by its rule with
#:   MOD_SEED, the values the visible pairs count); the tiles past a batch's length are skipped;
#: - score_cos: the score function `s + 0.25 * cos(k_idx)` on every pair (no mask).
MOD_SUITE: dict[str, dict[str, Any]] = {
    "document512": {"mask_mod": "q_idx // DOC == k_idx // DOC", "params": {"DOC": 512}},
    "lengths": {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}},
    "score_cos": {"score_mod": "s + 0.25 * cos(k_idx)"},
}
MOD_SUITE_SHAPE = Shape(B=4, H=16, N=4096, M=4096, D=128)
MOD_SUITE_DTYPE = DType.bf16
MOD_GOAL = FUNCTION_GOAL  # visible-work TF/s at least this share of the plain kernel's (flashgen.mods)
MOD_SEED = BENCH_SEED  # the seed the call-time tensors are filled with (bench_kernels' and the visible pairs')
#: rounds of the mods benchmark: each times every kernel once, the plain kernel first in odd rounds and last in even
#: ones, so that a drift of the card's clock over a round (the plain kernel timed first, straight after the
#: verifications left the card idle, read 684 TF/s against the grid's 632 at the same shape on an H100; session 18)
#: weighs on both sides of a ratio alike
MOD_ROUNDS = 4


class ModBench(BaseModel):
    """One kernel with score or mask functions beside the plain kernel: verification, medians, and TF/s over each
    one's own visible pairs."""

    name: str
    score_mod: str | None = None
    mask_mod: str | None = None
    gpu: str = Field(description="the target the kernels were built for (its code path)")
    shape: Shape
    kernel: str | None = None
    ok: bool = False
    error: str | None = None
    verified: str | None = Field(default=None, description="the verification's summary line (every default case)")
    visible_share: float | None = Field(default=None, description="the mask's visible pairs / the plain kernel's")
    ms: float | None = None
    plain_ms: float | None = None
    tflops_visible: float | None = Field(default=None, description="4*B*H*D per visible pair / the mask's time")
    plain_tflops: float | None = None
    ratio: float | None = Field(default=None, description="tflops_visible / plain_tflops, the median of the rounds' "
                                "(the goal: >= MOD_GOAL)")
    round_ratios: list[float] = Field(default_factory=list, description="each round's ratio, its kernel against the "
                                      "plain kernel timed in the same round")


def mods_suite() -> list[tuple[DType, Variant, Shape, str]]:
    """The mods suite's rows: (dtype, variant, shape, name), each at MOD_SUITE_SHAPE, plain variant."""
    return [(MOD_SUITE_DTYPE, Variant(), MOD_SUITE_SHAPE, name) for name in MOD_SUITE]


def build_mask_kernel(gpu: str, dtype: DType | str, variant: Variant, head_dim: int, mods_keywords: dict[str, Any]):
    """(CUDA source, manifest) of the expert's kernel with a mask function, as `flashgen generate` builds it (the
    library's program with the function written in, checked and translated for `gpu`; the manifest's reference_tl
    is that program, as the generate loop records it, so verification compares with the function's meaning)."""
    from flashgen.harness.environment import Environment
    from flashgen.mods import make_mods, reference_program

    env = Environment()
    target = env.target(gpu)
    tl = reference_program(make_mods(**mods_keywords), variant, target, DType(getattr(dtype, "value", dtype)),
                           head_dim, env)
    source, manifest = env.translate(tl, target)
    if manifest.reference_tl is None:  # a mask the translator's small sample shapes do not tell from the variant
        manifest = manifest.model_copy(update={"reference_tl": tl})
    return source, manifest


def bench_mods(gpu: str = "h200", names: list[str] | None = None, min_time_s: float = 0.2,
               timeout_s: float = 1800, rounds: int = MOD_ROUNDS) -> list[ModBench]:
    """Needs a GPU. Each kernel of MOD_SUITE (or `names`) and the plain kernel, built on the CPU for `gpu` (its code
    path: h200 the sm90 path, a100 the sm80 path, compiled for the GPU present); each with functions is verified first
    (the harness's whole verification, against the functions' meaning) and, if it passes, timed with the plain
    kernel in one worker at MOD_SUITE_SHAPE without baselines, in `rounds` rounds (MOD_ROUNDS: the plain kernel first,
    then last). Each one's TF/s counts its own visible pairs (flashgen.mods.visible_pairs, with the call-time tensors
    the timing passes); `ratio` is the median over the rounds of its TF/s over the plain kernel's in the same round,
    and the times are the rounds' medians."""
    from flashgen.harness.device import KernelInput
    from flashgen.harness.worker import GpuWorker
    from flashgen.mods import make_mods, visible_share

    shape, dtype, variant = MOD_SUITE_SHAPE, MOD_SUITE_DTYPE, Variant()
    plain_source, plain_manifest, _ = build_expert_kernel(gpu, dtype, variant, shape.D)
    rows: list[ModBench] = []
    built: list[tuple[ModBench, KernelInput]] = []
    for name in names or list(MOD_SUITE):
        keywords = MOD_SUITE[name]
        row = ModBench(name=name, score_mod=keywords.get("score_mod"), mask_mod=keywords.get("mask_mod"), gpu=gpu,
                       shape=shape)
        rows.append(row)
        try:
            source, manifest = build_mask_kernel(gpu, dtype, variant, shape.D, keywords)
        except Exception as exc:
            row.error = f"build failed: {exc}"
            continue
        row.kernel = manifest.name
        row.visible_share = visible_share(make_mods(**keywords), variant, manifest.call_tensors, shape, MOD_SEED)
        built.append((row, KernelInput(source=source, manifest=manifest)))
    with GpuWorker(job_timeout_s=timeout_s) as worker:
        timed: list[tuple[ModBench, KernelInput]] = []
        for row, kernel in built:
            report = worker.verify(kernel, timeout_s=min(timeout_s, 300.0))
            row.verified = (report.summary or "").splitlines()[0] if report.summary else None
            if report.ok:
                timed.append((row, kernel))
            else:
                row.error = f"fails verification: {row.verified}"
        kernels = [KernelInput(source=plain_source, manifest=plain_manifest), *(kernel for _row, kernel in timed)]
        by_round: list[list] = []  # by_round[r][i]: kernel i's entry in round r (0: the plain kernel)
        for r in range(rounds):
            backwards = r % 2 == 1  # the plain kernel last
            result = worker.call("flashgen.harness.bench:bench_kernels", timeout_s=timeout_s,
                                 kernels=kernels[::-1] if backwards else kernels, shapes=[shape], baselines=False,
                                 min_time_s=min_time_s, seed=MOD_SEED)
            # one entry per kernel, in the call's order (a kernel with functions has its variant's name: the plain's)
            entries = [e for e in result.value.entries if e.kind == "kernel"] if result.ok else []
            if len(entries) != len(kernels):
                why = (f"bench failed: {(result.error or '').splitlines()[0]}" if not result.ok
                       else f"bench returned {len(entries)} entries for {len(kernels)} kernels")
                for row, _kernel in timed:
                    row.error = why
                return rows
            by_round.append(entries[::-1] if backwards else entries)
    for i, (row, _kernel) in enumerate(timed, start=1):
        pairs = [(round_[0], round_[i]) for round_ in by_round]
        failed = next((e for pair in pairs for e in pair if not e.ok), None)
        if failed is not None or row.visible_share is None:
            row.error = (failed.error if failed is not None else None) or "not timed (or the plain kernel was not)"
            continue
        row.round_ratios = [row.visible_share * plain.stats.median_ms / entry.stats.median_ms for plain, entry in pairs]
        row.ms = statistics.median(entry.stats.median_ms for _plain, entry in pairs)
        row.plain_ms = statistics.median(plain.stats.median_ms for plain, _entry in pairs)
        row.plain_tflops = attention_flops(shape, variant) / (row.plain_ms * 1e-3) / 1e12
        row.tflops_visible = attention_flops(shape, variant) * row.visible_share / (row.ms * 1e-3) / 1e12
        row.ratio = statistics.median(row.round_ratios)
        row.ok = True
    return rows
