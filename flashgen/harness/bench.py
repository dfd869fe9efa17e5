"""Benchmarking: CUDA events with an L2 flush before every repetition, warm-up, adaptive repetition,
median and quartiles, TFLOP/s (4*B*H*D per (query, key) pair the mask leaves: flashgen.roofline.attention_flops,
N*M/2 for causal with N = M as FlashAttention counts it) and % of the target's roofline,
with every available baseline timed on the same shapes in the same process.

Not to be fooled by work left running elsewhere: the whole device is synchronized before events
are read, and the kernel is also timed on the host clock with a device synchronize after every call;
a kernel whose event time is far below the fastest of those calls is flagged `undertimed`.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flashgen.harness.baselines import FlexMode
from flashgen.roofline import OpCounts, attention_flops, visible_work
from flashgen.variant import DType, Shape, Variant

# How FlexAttention is compiled: "static" recompiles per shape (the fastest kernels, one compile per
# shape), "dynamic" compiles one shape-generic graph per (dtype, D, mask) and reuses it across N (a
# few percent slower at worst, far fewer compiles), "off" skips it.
FLEX_MODES: tuple[str, ...] = ("static", "dynamic", "off")

UNDERTIME_FACTOR = 2.0   # host time per call above this multiple of the event median ...
UNDERTIME_SLACK_MS = 0.2  # ... plus this much launch/sync overhead is flagged
#: how reports name the baselines (the suite's tables, the Jupyter plots)
BASELINE_LABELS = {"sdpa_flash": "FLASH", "sdpa_cudnn": "CUDNN", "sdpa_efficient": "EFFICIENT", "flex": "Flex"}


class TimingStats(BaseModel):
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    mean_ms: float
    reps: int
    host_ms_per_call: float | None = Field(default=None, description="host clock, device-synchronized per call: "
                                                                        "the fastest call (over rounds: the mean of "
                                                                        "each round's fastest)")
    undertimed: bool = False
    note: str = ""
    rounds: int = Field(default=1, description="rounds the samples were gathered in (time_in_rounds), pooled")
    round_medians_ms: list[float] = Field(default_factory=list, description=(
        "each round's median, in the order the rounds ran (time_in_rounds): a first round slower or faster than "
        "the others is the card's clock moving under its power cap, not the kernel"))


def timing_stats(samples_ms: list[float], host_ms_per_call: float | None = None, rounds: int = 1,
                 round_medians_ms: list[float] | None = None) -> TimingStats:
    """Median and quartiles (inclusive method) of the event samples, and the under-timing verdict."""
    if not samples_ms:
        raise ValueError("no timing samples")
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    median = statistics.median(ordered)
    flagged = host_ms_per_call is not None and is_undertimed(median, host_ms_per_call)
    note = (f"event time {median:.4g} ms is far below the host-clock {host_ms_per_call:.4g} ms per synchronized call: "
            "work is running outside the timed stream" if flagged else "")
    return TimingStats(median_ms=median, q1_ms=q1, q3_ms=q3, min_ms=ordered[0], mean_ms=statistics.fmean(ordered),
                       reps=len(ordered), host_ms_per_call=host_ms_per_call, undertimed=flagged, note=note,
                       rounds=rounds, round_medians_ms=list(round_medians_ms or []))


def is_undertimed(event_ms: float, host_ms_per_call: float) -> bool:
    return host_ms_per_call > UNDERTIME_FACTOR * event_ms + UNDERTIME_SLACK_MS


def speedup(baseline_ms: float, ours_ms: float) -> float:
    """How many times faster ours is: the baseline's time over ours (> 1: ours is faster)."""
    if not (baseline_ms > 0 and ours_ms > 0):
        raise ValueError(f"times must be positive, got {baseline_ms!r} and {ours_ms!r} ms")
    return baseline_ms / ours_ms


def geomean(values: list[float]) -> float | None:
    """Geometric mean (the mean of ratios that treats 2x faster and 2x slower symmetrically); None if empty."""
    if not values:
        return None
    if any(not v > 0 for v in values):
        raise ValueError("geomean needs positive values")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def tflops(shape: Shape, variant: Variant | bool, ms: float) -> float:
    """TFLOP/s by flashgen.roofline.attention_flops: 4*B*H*D per (query, key) pair the variant's mask leaves (causal
    with N = M: N*M/2, FlashAttention's count). A bool is the nominal N*M formula, halved for causal."""
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms!r} ms")
    return attention_flops(shape, variant) / (ms * 1e-3) / 1e12


def attention_counts(shape: Shape, variant: Variant, dtype: DType) -> OpCounts:
    """Minimal work of one attention call, for the roofline, by the same count as `tflops`: the FLOPs of the pairs
    the mask leaves, one exp per such score, the Q rows that see a key and the K, V rows some row sees read once,
    O (and LSE) written once (every row: a row that sees nothing still writes O = 0)."""
    work = visible_work(variant, shape.N, shape.M)
    item = dtype.itemsize
    if shape.DV is None:
        reads = (shape.B * shape.H * work.rows * shape.D + 2 * shape.B * shape.kv_heads * work.keys * shape.D) * item
    else:  # K's rows at D, V's at Dv
        reads = (shape.B * shape.H * work.rows * shape.D
                 + shape.B * shape.kv_heads * work.keys * (shape.D + shape.DV)) * item
    writes = shape.B * shape.H * shape.N * shape.dv * item + (4 * shape.B * shape.H * shape.N if variant.return_lse else 0)
    return OpCounts(mma_flops=attention_flops(shape, variant), sfu_ops=shape.B * shape.H * work.counted_pairs,
                    bytes={"global_read": float(reads), "global_write": float(writes),
                           "dram_read": float(reads), "dram_write": float(writes)})


def roofline_percent(shape: Shape, variant: Variant, dtype: DType, target_name: str | None, ms: float) -> float | None:
    if not target_name:
        return None
    try:
        from flashgen.roofline import estimate, percent_of_roofline
        from flashgen.targets import get_target

        est = estimate(attention_counts(shape, variant, dtype), get_target(target_name), dtype)
        return percent_of_roofline(ms * 1e-3, est)
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Timing on the GPU
# ---------------------------------------------------------------------------------------------

def time_callable(fn: Callable[[], Any], *, stream=None, l2_bytes: int | None = None, min_time_s: float = 0.2,
                  min_reps: int = 10, max_reps: int = 1000, warmup: int = 3, host_reps: int = 20) -> TimingStats:
    """Time `fn` (which enqueues GPU work on `stream`) with CUDA events around each call and an L2
    flush (a write of 2x the L2 size) before each; repeat until min_time_s of kernel time or max_reps.
    Then time `host_reps` calls on the host clock with a device synchronize after each: the fastest of them is
    the host's time per call."""
    return timing_stats(*time_samples(fn, stream=stream, l2_bytes=l2_bytes, min_time_s=min_time_s, min_reps=min_reps,
                                      max_reps=max_reps, warmup=warmup, host_reps=host_reps))


def time_samples(fn: Callable[[], Any], *, stream=None, l2_bytes: int | None = None, min_time_s: float = 0.2,
                 min_reps: int = 10, max_reps: int = 1000, warmup: int = 3, host_reps: int = 20
                 ) -> tuple[list[float], float]:
    """time_callable's measurement: (the event samples in ms, the host clock's ms per synchronized call)."""
    from flashgen.harness.device import _cupy

    cp = _cupy()
    stream = stream or cp.cuda.get_current_stream()
    if l2_bytes is None:
        l2_bytes = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id).get("l2CacheSize", 64 << 20))
    flush = cp.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=cp.uint32)
    sync = cp.cuda.runtime.deviceSynchronize
    with stream:
        for _ in range(warmup):
            fn()
        sync()
        events: list[tuple[Any, Any]] = []
        total_ms, reps = 0.0, 0
        while reps < max_reps and (reps < min_reps or total_ms < min_time_s * 1e3):
            batch = []
            for _ in range(min(10, max_reps - reps)):
                flush.fill(reps)
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                fn()
                end.record(stream)
                batch.append((start, end))
            sync()  # the whole device, not just this stream
            for start, end in batch:
                total_ms += cp.cuda.get_elapsed_time(start, end)
            events += batch
            reps += len(batch)
        samples = [cp.cuda.get_elapsed_time(s, e) for s, e in events]
        sync()
        # The fastest of these calls: work hidden on another stream slows every one of them, while another
        # process on the same GPU (the GPU tests run in parallel) slows some: with the mean, a 1 ms kernel beside
        # five pytest workers read 2.1 ms a call and was flagged (H100, session 26).
        host_ms = math.inf
        for _ in range(max(1, min(host_reps, reps))):
            t0 = time.perf_counter()
            fn()
            sync()
            host_ms = min(host_ms, (time.perf_counter() - t0) * 1e3)
    del flush
    return samples, host_ms


def settle_card(fn: Callable[[], Any], seconds: float, stream=None) -> None:
    """Run fn, untimed, for `seconds` of wall time (in batches of 10 calls, each batch synchronized), so that a card
    under its power cap reaches its settled clock before the first sample of a shape: there, whichever kernel
    `flashgen bench` listed first read 1-5 % faster at causal 4k in three runs, though the rounds alternate the order
    (NOTES.md, session 23; bench_kernels' settle_s, the CLI's --settle)."""
    from flashgen.harness.device import _cupy

    cp = _cupy()
    deadline = time.perf_counter() + seconds
    with stream or cp.cuda.get_current_stream():
        while time.perf_counter() < deadline:
            for _ in range(10):
                fn()
            cp.cuda.runtime.deviceSynchronize()


#: rounds of a benchmark with baselines (the CLI's default): each kernel is timed in every round, ours first in even
#: rounds and last in odd ones (an even count: as often first as last), and each one's samples are pooled. A card at its power cap does not hold its clock: after a lighter phase it
#: boosts, draws past the cap, and the controller pulls the clock down (an H100 dipped to 1245 MHz against a settled
#: ~1500 at 700 W); whichever kernel a shape timed first took that dip. One pass put plain bf16 d128 / d256 at 16k at
#: 0.90 / 0.84x cuDNN (ours' samples spread 3.10-3.84 ms, cuDNN's 3.18-3.36), where blocks alternating with cuDNN
#: at the settled clock read 1.02 / 1.00x (benchmarks/kernel_dev/clock_watch.py; NOTES.md, session 19).
BENCH_ROUNDS = 4

#: seconds the first kernel of each shape runs untimed before its rounds (settle_card; the CLI's and the suite's
#: default). The rounds alone left a bias: one kernel against its own renamed twin, the first listed read 2.3 %
#: faster at causal bf16 d128 4k (H100, session 25; 1-5 % in three runs of session 23). With 0.3 s, both orders:
#: +0.7 / -0.6 % at d128, -1.2 / +1.8 % at d64 (noise, no side), level at N = 512. It costs 0.3 s a shape. Longer
#: does not help at 16k: settle 0 / 0.3 / 1 / 2 s read ours against cuDNN at 1.16 / 1.17 / 1.03 / 1.04x, the clock
#: swinging +-12 % between rounds of one run, in no order (H100, settle_call.sh; NOTES.md, session 26).
BENCH_SETTLE_S = 0.3

#: whether each timed block of the rounds follows an untimed block of its own kernel, as long as itself (the CLI's
#: --settle-each). Off until measured. Why it may be wanted: at plain bf16 d128 16k the ratio to cuDNN of one round
#: hangs on the order within it. In session 26's four settle runs (H100; each block 25 ms, a few calls), the rounds
#: where ours ran first, right after its own previous block or the settle, read 0.91-1.01x; those where it ran last,
#: after FLASH, read 1.13-1.29x, and cuDNN's own blocks split the same way (3.19-3.63 ms after EFFICIENT, 3.56-4.13
#: right after its own). A block right after a lighter kernel runs in the boost that the card's power cap then takes
#: back; the warm block puts every kernel under its own draw. It costs min_time_s again per kernel and shape (the
#: Hopper grid: ~36 s). At 512 and 4k the rounds hold within 1 % without it.
BENCH_SETTLE_EACH = False


def time_in_rounds(runs: list[tuple[Any, Callable[[], Any]]], rounds: int,
                   timer: Callable[[Callable[[], Any]], tuple[list[float], float]],
                   settle: Callable[[Callable[[], Any]], None] | None = None,
                   warm: Callable[[Callable[[], Any]], None] | None = None) -> dict[int, Any]:
    """Each (key, fn) of `runs` timed by `timer` in every one of `rounds` rounds, the runs in order in even rounds and
    in reverse in odd ones; per index of `runs`: TimingStats of the pooled samples (host time: the mean of the
    rounds' fastest calls), or the exception its timing raised (that run is not timed again), with each round's
    median in round order. `settle`, where given, runs the first run untimed before the first round (settle_card);
    `warm`, where given, runs each run untimed right before each of its timings (BENCH_SETTLE_EACH)."""
    samples: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    round_medians: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    hosts: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    failed: dict[int, Exception] = {}
    if settle is not None and runs:
        try:
            settle(runs[0][1])
        except Exception as exc:  # the first run fails as its timing would have (and is not timed)
            failed[0] = exc
    for r in range(rounds):
        order = list(range(len(runs))) if r % 2 == 0 else list(range(len(runs)))[::-1]
        for i in order:
            if i in failed:
                continue
            try:
                if warm is not None:
                    warm(runs[i][1])
                got, host_ms = timer(runs[i][1])
            except Exception as exc:
                failed[i] = exc
                continue
            samples[i] += got
            round_medians[i].append(statistics.median(got))
            hosts[i].append(host_ms)
    return {i: failed[i] if i in failed else timing_stats(samples[i], statistics.fmean(hosts[i]), rounds=rounds,
                                                           round_medians_ms=round_medians[i])
            for i in range(len(runs))}


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

class BenchEntry(BaseModel):
    name: str = Field(description="our kernel's manifest name, or a baseline (sdpa_flash, sdpa_efficient, sdpa_cudnn, flex)")
    kind: str = Field(description="kernel | baseline")
    dtype: str
    variant: str
    shape: Shape
    ok: bool
    skipped: str | None = None
    error: str | None = None
    stats: TimingStats | None = None
    tflops: float | None = None
    roofline_pct: float | None = None
    note: str = ""


class BenchReport(BaseModel):
    env: dict[str, Any] = Field(default_factory=dict)
    target: str | None = None
    created: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    entries: list[BenchEntry] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict, description="how the samples were taken: bench_kernels' "
                                     "min_time_s, rounds, settle_s, settle_each, baselines, flex")
    compile: dict[str, Any] = Field(default_factory=dict, description="per kernel: compile feedback and resources")

    def groups(self) -> dict[tuple[str, str, str], list[BenchEntry]]:
        """Entries keyed by (dtype, variant, shape text), ours first."""
        out: dict[tuple[str, str, str], list[BenchEntry]] = {}
        for e in self.entries:
            out.setdefault((e.dtype, e.variant, shape_text(e.shape)), []).append(e)
        return out

    def __repr__(self) -> str:
        from flashgen.harness.display import benchmark_repr

        return benchmark_repr(self)

    __str__ = __repr__  # print() too: one line (the fields are in model_dump())

    def _repr_html_(self) -> str:  # Jupyter: TF/s against N per dtype, mask and head dim, with the ratios
        from flashgen.harness.display import benchmark_html

        return benchmark_html(self, BASELINE_LABELS)


def shape_text(s: Shape) -> str:
    kvh = f",KVH={s.kv_heads}" if s.kv_heads != s.H else ""
    return f"B={s.B},H={s.H}{kvh},N={s.N},M={s.M},D={s.D}" + (f",DV={s.DV}" if s.DV is not None else "")


def parse_shapes(text: str) -> list[Shape]:
    """'B=8,H=16,N=2048,M=2048,D=128;B=...' -> shapes (M defaults to N)."""
    shapes = []
    for item in filter(None, (p.strip() for p in text.split(";"))):
        if "M=" not in item.replace(" ", ""):
            n = re.search(r"N\s*=\s*(\d+)", item)
            if n:
                item += f",M={n.group(1)}"
        shapes.append(Shape.parse(item))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def fa2_suite() -> list[tuple[DType, Variant, Shape]]:
    """FlashAttention-2's benchmark grid: fp16/bf16 x D 64/128 x causal or not x N = M in
    {512 .. 16k}, B*N = 16k tokens, H*D = 2048."""
    out = []
    for dtype in (DType.fp16, DType.bf16):
        for d in (64, 128):
            for causal in (False, True):
                for n in (512, 1024, 2048, 4096, 8192, 16384):
                    out.append((dtype, Variant(causal=causal), Shape(B=16384 // n, H=2048 // d, N=n, M=n, D=d)))
    return out


def hopper_suite() -> list[tuple[DType, Variant, Shape]]:
    """The Hopper grid: the FA2 grid with head dim 256 too (fp16/bf16 x D 64/128/256 x causal or not x N = M in
    {512 .. 16k}, B*N = 16k tokens, H*D = 2048), the shapes FlashAttention-3 and cuDNN are measured on."""
    out = []
    for dtype in (DType.fp16, DType.bf16):
        for d in (64, 128, 256):
            for causal in (False, True):
                for n in (512, 1024, 2048, 4096, 8192, 16384):
                    out.append((dtype, Variant(causal=causal), Shape(B=16384 // n, H=2048 // d, N=n, M=n, D=d)))
    return out


def variants_suite() -> list[tuple[DType, Variant, Shape]]:
    """The variants beside the plain kernel at one shape (bf16, d128, N = M = 4k, B = 4, H = 16): sliding window 256,
    ALiBi, softcap 30 and GQA 8:1, each expected within 10 % of the plain kernel's TF/s (the mask, bias and score
    code stays off the full tiles)."""
    shape = Shape(B=4, H=16, N=4096, M=4096, D=128)
    variants = (Variant(), Variant(causal=True), Variant(causal=True, window=256), Variant(alibi=True),
                Variant(softcap=30.0), Variant(kv_group=8))
    return [(DType.bf16, v, shape.model_copy(update={"KVH": shape.H // v.kv_group}) if v.kv_group > 1 else shape)
            for v in variants]


#: the head dims the "headdims" suite times beside the native ones whose tile parameters they take
PADDED_SUITE_DIMS: tuple[int, ...] = (40, 80, 112, 160, 192, 224)


def headdims_suite() -> list[tuple[DType, Variant, Shape]]:
    """The cost of a head dim the tile tables were not measured at (padded inside the kernel where the tensor cores'
    k-step needs it): each of PADDED_SUITE_DIMS beside the native dim it takes its parameters from
    (flashgen.translators.plan.native_head_dim), bf16, not causal, N = M = 4k, B = 4 (B*N = 16k tokens),
    H = round(2048 / D) (H*D about 2048). suite.padding_costs compares their TF/s, each counting its own D's flops."""
    from flashgen.translators.plan import native_head_dim  # the translators are a second's import; timing needs none

    dims = sorted(set(PADDED_SUITE_DIMS) | {native_head_dim(d) for d in PADDED_SUITE_DIMS})
    n = 4096
    return [(DType.bf16, Variant(), Shape(B=16384 // n, H=round(2048 / d), N=n, M=n, D=d)) for d in dims]


SUITE_GRIDS = {"fa2": fa2_suite, "hopper": hopper_suite, "variants": variants_suite, "headdims": headdims_suite}


def default_output_path(env: dict[str, Any], name: str, root: str | Path = "benchmarks/results") -> Path:
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", str(env.get("gpu") or "nogpu")).strip("-").lower()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "bench"
    return Path(root) / f"{_dt.date.today().isoformat()}-{gpu}-{safe}.json"


# ---------------------------------------------------------------------------------------------
# The core entry point
# ---------------------------------------------------------------------------------------------

def _random_device(cp, shape: tuple[int, ...], dtype: DType, seed: int):
    rng = cp.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=cp.float32)
    if dtype is DType.fp16:
        return x.astype(cp.float16)
    if dtype is DType.fp32:
        return x
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)  # bf16 words, round to nearest even


def _as_torch(x, dtype: DType):
    import torch

    t = torch.from_dlpack(x)
    return t.view(torch.bfloat16) if dtype is DType.bf16 else t


#: the seed of a timing run's inputs and call-time tensors where the caller gives none (`flashgen generate`'s timing;
#: what its visible-pairs count of a mask function fills the same tensors with)
BENCH_SEED = 0


def bench_kernels(kernels: list, shapes: list[Shape], baselines: bool = True, min_time_s: float = 0.2,
                  seed: int = BENCH_SEED, flex: FlexMode = "static", scale: float | None = None,
                  rounds: int = 1, settle_s: float = 0.0, settle_each: bool = False) -> BenchReport:
    """Time each kernel (device.KernelInput, or (source | cubin path, manifest) pairs) on each shape,
    and every baseline on the same (dtype, variant, shape) once, beside the first kernel timed there. Needs a GPU;
    runs in-process (the worker calls it). A shape whose D differs from a kernel's head_dim is skipped for that
    kernel. `flex` says how FlexAttention is compiled (FlexMode). `scale`: the softmax scale of ours and the
    baselines (None: 1/sqrt(D)). `rounds`: every kernel of a shape and the baselines beside them are timed in that
    many rounds, min_time_s shared among them, the kernels first then last (time_in_rounds; BENCH_ROUNDS says why),
    after `settle_s` seconds of the first of them untimed (settle_card; 0: none), and with `settle_each` each timed
    block after an untimed one of its own kernel (BENCH_SETTLE_EACH)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if settle_s < 0:
        raise ValueError(f"settle_s must not be negative, got {settle_s}")
    if flex not in FLEX_MODES:
        raise ValueError(f"flex must be one of {', '.join(FLEX_MODES)}, got {flex!r}")
    from flashgen.harness.device import (
        KernelInput,
        _cupy,
        ensure_compiled,
        environment_info,
        is_sticky_cuda_error,
        load_kernel,
        prepare_launch,
        runnable_arch,
    )

    cp = _cupy()
    env = environment_info()
    target = _target_name(env.get("gpu"))
    report = BenchReport(env=env, target=target,
                         settings={"min_time_s": min_time_s, "rounds": rounds, "settle_s": settle_s,
                                   "settle_each": settle_each, "baselines": baselines, "flex": flex})
    inputs = [k if isinstance(k, KernelInput) else _kernel_input(k) for k in kernels]
    stream = cp.cuda.Stream(non_blocking=True)
    l2 = int(env.get("l2_bytes") or 64 << 20)
    baseline_done: set[tuple[str, str, str]] = set()
    loaded_kernels = []
    for kernel in inputs:
        man = kernel.manifest
        try:
            info, cubin = ensure_compiled(kernel, runnable_arch(man))
            report.compile[man.name] = info.model_dump(exclude={"log"})
            loaded_kernels.append((man, load_kernel(cubin, man)))
        except Exception as exc:
            report.compile[man.name] = {"ok": False, "error": str(exc)}
            for shape in shapes:
                report.entries.append(BenchEntry(name=man.name, kind="kernel", dtype=man.dtype.value,
                                                 variant=man.variant.name, shape=shape, ok=False, error=str(exc)))

    def timer(fn):
        return time_samples(fn, stream=stream, l2_bytes=l2, min_time_s=min_time_s / rounds)

    settle = (lambda fn: settle_card(fn, settle_s, stream)) if settle_s > 0 else None
    warm = (lambda fn: settle_card(fn, min_time_s / rounds, stream)) if settle_each else None

    def time_shape(base_shape: Shape) -> None:
        """Every loaded kernel at this shape and the baselines beside them, timed in the same rounds: a clock that
        drifts (a card at its power cap) then moves all of them alike, where timed one kernel after another the
        same pair of kernels read apart by more than their difference (NOTES.md, session 22: DA against cur -4 % in
        one `flashgen bench`, +1.3 % in clock_watch's blocks minutes later). The tensors live as long as this call
        does."""
        # each run's key: its entry, and the shape and manifest its TFLOP/s are counted for
        runs: list[tuple[tuple[BenchEntry, Shape, Any], Callable[[], Any]]] = []
        with ExitStack() as stack:
            for man, loaded in loaded_kernels:
                shape = base_shape
                if shape.D == man.head_dim and shape.DV is None and man.head_dim_v is not None:
                    shape = shape.model_copy(update={"DV": man.head_dim_v})  # a shape of D alone: the kernel's own Dv
                if shape.D != man.head_dim or shape.dv != man.dv:
                    built = f"D={man.head_dim}" + (f", DV={man.head_dim_v}" if man.head_dim_v is not None else "")
                    report.entries.append(BenchEntry(name=man.name, kind="kernel", dtype=man.dtype.value,
                                                     variant=man.variant.name, shape=shape, ok=False,
                                                     skipped=f"kernel is built for {built}"))
                    continue
                if man.variant.kv_group > 1 and shape.KVH is None:
                    shape = shape.model_copy(update={"KVH": max(1, shape.H // man.variant.kv_group)})
                softmax_scale = 1.0 / math.sqrt(shape.D) if scale is None else scale
                q = _random_device(cp, (shape.B, shape.H, shape.N, shape.D), man.dtype, seed)
                k = _random_device(cp, (shape.B, shape.kv_heads, shape.M, shape.D), man.dtype, seed + 1)
                v = _random_device(cp, (shape.B, shape.kv_heads, shape.M, shape.dv), man.dtype, seed + 2)
                o = cp.empty((shape.B, shape.H, shape.N, shape.dv), dtype=q.dtype)
                lse = cp.empty((shape.B, shape.H, shape.N), dtype=cp.float32) if man.variant.return_lse else None
                slopes, tensors = _call_time_inputs(cp, man, shape, seed)
                entry = BenchEntry(name=man.name, kind="kernel", dtype=man.dtype.value, variant=man.variant.name,
                                   shape=shape, ok=False)
                try:
                    runs.append(((entry, shape, man), prepare_launch(
                        man, loaded, q, k, v, o, lse=lse, scale=scale, stream=stream, step=f"bench {shape_text(shape)}",
                        alibi_slopes=slopes, tensors=tensors)))
                except Exception as exc:
                    if is_sticky_cuda_error(exc):
                        raise
                    entry.error = str(exc)
                report.entries.append(entry)
                key = (man.dtype.value, man.variant.name, shape_text(shape))
                if baselines and key not in baseline_done:
                    baseline_done.add(key)
                    base = stack.enter_context(_baseline_runs(man.variant, man.dtype, shape, q, k, v, softmax_scale,
                                                              stream, flex, slopes))
                    report.entries += [e for e, _fn in base]
                    runs += [((e, shape, man), fn) for e, fn in base if fn is not None]
            timings = time_in_rounds(runs, rounds, timer, settle, warm)
            for ((timed, shape, man), _fn), stats in zip(runs, timings.values(), strict=True):
                if isinstance(stats, Exception):
                    if is_sticky_cuda_error(stats):
                        raise stats
                    timed.error = (str(stats) if timed.kind == "kernel" else
                                   f"{type(stats).__name__}: {str(stats).splitlines()[0] if str(stats) else ''}")
                    continue
                timed.stats, timed.ok = stats, True
                timed.tflops = tflops(shape, man.variant, stats.median_ms)
                timed.roofline_pct = roofline_percent(shape, man.variant, man.dtype, target, stats.median_ms)

    for base_shape in shapes:
        time_shape(base_shape)
    return report


def _call_time_inputs(cp, manifest, shape: Shape, seed: int):
    """What an ALiBi kernel and one with call-time tensors are timed with: the standard slopes passed as the caller's
    (H) tensor, as FlashAttention is called (the baselines get the same), and the tensors filled by their rules."""
    import numpy as np

    from flashgen.tl_spec.tensors import fill_all, sizes_of
    from flashgen.variant import alibi_slope

    slopes = None
    if manifest.variant.alibi:
        slopes = cp.asarray(np.array([alibi_slope(h, shape.H) for h in range(shape.H)], dtype=np.float32))
    tensors = {name: cp.asarray(x) for name, x in fill_all(manifest.call_tensors, sizes_of(shape), seed).items()}
    return slopes, tensors


_flex_dynamic_failed: str | None = None  # why a dynamic compile failed in this process (static from then on)


@contextmanager
def _baseline_runs(variant: Variant, dtype: DType, shape: Shape, q, k, v, scale: float, stream,
                   flex: FlexMode = "static", alibi_slopes=None) -> Iterator[list[tuple[BenchEntry, Any]]]:
    """Every baseline at this shape as (entry, callable or None where it does not run: the entry says why), made and
    timed on our stream (torch's view of it, current inside the context)."""
    from flashgen.harness.baselines import BASELINE_NAMES, make_baselines

    try:
        import torch

        tq, tk, tv = (_as_torch(x, dtype) for x in (q, k, v))
        slopes = torch.from_dlpack(alibi_slopes) if alibi_slopes is not None else None  # the slopes ours ran with
        torch_stream = torch.cuda.ExternalStream(stream.ptr)
    except Exception as exc:
        yield [(BenchEntry(name=n, kind="baseline", dtype=dtype.value, variant=variant.name, shape=shape, ok=False,
                           skipped=f"torch not usable: {exc}"), None) for n in BASELINE_NAMES]
        return
    global _flex_dynamic_failed
    if flex == "dynamic" and _flex_dynamic_failed:
        flex = "static"
    flex_note = f"compiled with dynamic={flex == 'dynamic'}" if flex != "off" else ""
    if _flex_dynamic_failed and flex == "static":
        flex_note += f" (a dynamic compile failed earlier: {_flex_dynamic_failed})"
    with torch.cuda.stream(torch_stream):
        made = make_baselines(variant, tq, tk, tv, scale, flex=flex, alibi_slopes=slopes)
        if flex == "dynamic" and any(n == "flex" and fn is None and (r or "").startswith("unsupported here")
                                     for n, fn, r in made):
            # a shape-generic compile this torch cannot do: static compiles from here on
            _flex_dynamic_failed = next(r for n, _, r in made if n == "flex")
            made = make_baselines(variant, tq, tk, tv, scale, flex="static", alibi_slopes=slopes)
            flex_note = f"compiled with dynamic=False (the dynamic compile failed: {_flex_dynamic_failed})"
        yield [(BenchEntry(name=name, kind="baseline", dtype=dtype.value, variant=variant.name, shape=shape, ok=False,
                           skipped=reason, note=flex_note if name == "flex" else ""), fn) for name, fn, reason in made]


def _kernel_input(pair):
    from flashgen.harness.device import KernelInput

    src, manifest = pair
    text = str(src)
    if text.endswith(".cubin") and Path(text).exists():
        return KernelInput(manifest=manifest, cubin_path=text)
    return KernelInput(manifest=manifest, source=text)


def _target_name(gpu: str | None) -> str | None:
    if not gpu:
        return None
    try:
        from flashgen.targets import get_target

        for candidate in (gpu.lower(), gpu.lower().removeprefix("nvidia ").strip(),
                          *re.findall(r"[a-z]?\d{2,4}[a-z]*", gpu.lower())):
            try:
                return get_target(candidate).name
            except Exception:
                continue
    except Exception:
        return None
    return None
