"""The GPU tests' kernels, built and compiled once per session before any test runs, and verified in batches.

A GPU test module that builds kernels defines

    def gpu_kernels(items, arch) -> dict[key, Build]

the kernels its selected `items` need (cheap: recipes, nothing is built here). After collection, conftest's
`pytest_collection_finish` asks every selected GPU module for them and runs `build_and_compile` once over all of
them: the builds (library TL -> check -> translate, pure Python) in a pool of spawned processes, nvcc on every
distinct source in a thread pool (nvcc is a subprocess), as many of each as there are usable CPUs, into the
content-addressed compile cache (flashgen.harness.compile), where the GPU worker then only finds cubins. The
module fixture `prebuilt_kernels` (conftest) hands a module its kernels.

`verify_many` runs a module's verifications on several GPU workers at once: the checks themselves are unchanged
(every default case, two seeds each, in the worker); only the fp64 reference and comparisons on the CPU overlap.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from threading import Lock
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

HOOK = "gpu_kernels"


class Build(NamedTuple):
    """One kernel's recipe: fn(*args, **kwargs) returns (source, manifest, ...) or an object with .source and
    .manifest (a Translation). fn must be importable by its module and name: a spawned process runs it."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = {}


def param_keys(items, name: str = "key") -> set:
    """The values of the parameter `name` over the selected test items that have it (a module's kernel keys)."""
    keys: set = set()
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if name in params:
            keys.add(params[name])
    return keys


class Built(NamedTuple):
    source: str | None
    manifest: Any
    error: str | None  # the build's exception or the compiler's feedback; None when it built and compiled


class PassStats(NamedTuple):
    kernels: int
    sources: int
    compiled: int
    cache_hits: int
    failed: int
    jobs: int
    wall_s: float
    nvcc_s: float

    def line(self) -> str:
        return (f"[gpu pre-compile] {self.kernels} kernels ({self.sources} distinct sources): {self.compiled} "
                f"compiled, {self.cache_hits} from the cache, {self.failed} failed; {self.jobs} jobs; "
                f"{self.wall_s:.1f} s wall (nvcc {self.nvcc_s:.0f} s summed)")


# ---------------------------------------------------------------------------------------------
# Every kernel of every GPU test module, on a machine without a GPU (tests/test_kernel_hashes.py hashes them,
# benchmarks/warm_cache.py compiles them into a compile cache to carry to a GPU machine)
# ---------------------------------------------------------------------------------------------

def gpu_module_paths(root: Path) -> list[Path]:
    """The test modules under root/tests that define the HOOK."""
    return sorted(p for p in (root / "tests").glob("test_*.py") if f"def {HOOK}(" in p.read_text())


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def _parametrizations(fn) -> list[dict]:
    """Every params dict pytest would give `fn` (the product of its parametrize marks; [{}] without any)."""
    axes = []
    for mark in _marks(fn):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for value in values:
            if hasattr(value, "values") and hasattr(value, "marks"):  # pytest.param(...)
                row = tuple(value.values)
            else:
                row = (value,) if len(names) == 1 else tuple(value)
            rows.append(dict(zip(names, row, strict=True)))
        axes.append(rows)
    return [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in itertools.product(*axes)]


def stand_in_items(module) -> list:
    """Stand-ins for the module's GPU test items, as conftest hands them to the hook: originalname, and
    callspec.params where parametrized."""
    module_gpu = any(m.name == "gpu" for m in _marks(module))
    items = []
    for name, fn in vars(module).items():
        if not (name.startswith("test_") and callable(fn)):
            continue
        if not (module_gpu or any(m.name == "gpu" for m in _marks(fn))):
            continue
        for params in _parametrizations(fn):
            item = SimpleNamespace(originalname=name, name=name)
            if params:
                item.callspec = SimpleNamespace(params=params)
            items.append(item)
    return items


def every_build(modules: list[ModuleType], arch: str) -> dict[tuple[str, Hashable], Build]:
    """{(module label, key): Build} of each module's HOOK over every parametrization of its GPU tests (not only a
    session's selection), as conftest's pre-compile pass asks for them on a GPU of `arch`; the label is the file
    name without test_."""
    return {(Path(module.__file__).stem.removeprefix("test_"), key): build
            for module in modules for key, build in getattr(module, HOOK)(stand_in_items(module), arch).items()}


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _build(build: Build) -> tuple[str | None, Any, str | None]:
    """(Runs in a pool process.) (source, manifest, None), or (None, None, why) when the build raises."""
    try:
        out = build.fn(*build.args, **build.kwargs)
        if hasattr(out, "source") and hasattr(out, "manifest"):
            return out.source, out.manifest, None
        return out[0], out[1], None
    except Exception as exc:
        return None, None, f"build failed: {type(exc).__name__}: {exc}"


def build_and_compile(builds: dict[Hashable, Build], arch: str, jobs: int | None = None,
                      arch_for: Callable[[Any], str] | None = None) -> tuple[dict[Hashable, Built], PassStats]:
    """Build every recipe and compile every distinct source into the compile cache, `jobs` builds and `jobs` nvcc
    at a time (default: the usable CPUs); a source is handed to nvcc as soon as it is built. Each kernel is compiled
    for `arch_for(manifest)` when given (what the worker will ask for: worker.runnable_arch), else for `arch`."""
    import multiprocessing as mp

    from flashgen.harness.compile import compile_cuda

    started = time.monotonic()
    jobs = max(1, min(jobs or usable_cpus(), max(1, len(builds))))
    keys = list(builds)
    built: dict[Hashable, tuple] = {}
    compiles: dict[tuple[str, str], Any] = {}  # (source, arch) -> future of its CompileResult
    if keys:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as builders, \
                ThreadPoolExecutor(max_workers=jobs) as nvcc:
            for key, (source, manifest, error) in zip(keys, builders.map(_build, [builds[k] for k in keys],
                                                                         chunksize=4)):
                target = None
                if error is None:
                    try:
                        target = arch_for(manifest) if arch_for is not None else arch
                    except Exception as exc:  # e.g. a kernel written for a newer GPU than this one
                        error = f"no arch to build for: {exc}"
                built[key] = (source, manifest, error, target)
                if target is not None and (source, target) not in compiles:
                    compiles[(source, target)] = nvcc.submit(compile_cuda, source, target)
            results = {what: future.result() for what, future in compiles.items()}
    else:
        results = {}
    kernels: dict[Hashable, Built] = {}
    for key, (source, manifest, error, target) in built.items():
        if error is None and not results[(source, target)].ok:
            error = f"does not compile for {target}: {results[(source, target)].feedback_text(1500)}"
        kernels[key] = Built(source, manifest, error)
    stats = PassStats(kernels=len(keys), sources=len(results), compiled=sum(not r.cache_hit for r in results.values()),
                      cache_hits=sum(r.cache_hit for r in results.values()),
                      failed=sum(k.error is not None for k in kernels.values()), jobs=jobs,
                      wall_s=time.monotonic() - started,
                      nvcc_s=sum(r.seconds for r in results.values() if not r.cache_hit))
    return kernels, stats


class Kernels(dict):
    """{key: Built}; kernels[key] is (source, manifest), and fails the calling test with the build's or the
    compiler's error when that kernel has one (the module's other tests still run)."""

    def __getitem__(self, key):
        built = super().__getitem__(key)
        if built.error is not None:
            raise AssertionError(f"kernel {key}: {built.error}")
        return built.source, built.manifest

    def ready(self) -> dict:
        """{key: (source, manifest)} of the kernels that built and compiled."""
        return {key: (b.source, b.manifest) for key, b in self.items() if b.error is None}


def verify_workers() -> int:
    """How many GPU workers verify at once: $FLASHGEN_TEST_VERIFY_WORKERS, else half the usable CPUs, 1 to 8."""
    chosen = os.environ.get("FLASHGEN_TEST_VERIFY_WORKERS")
    return max(1, int(chosen)) if chosen else max(1, min(8, usable_cpus() // 2))


def verify_many(kernels: dict[Hashable, Any], workers: int | None = None, job_timeout_s: float = 240,
                extra_cases: Callable[[Any], list] | None = None) -> dict:
    """{key: VerifyReport} of every KernelInput, through `workers` GpuWorkers (one process each, one GPU) taking
    kernels in order. Each verification is GpuWorker.verify's own: default cases, fresh seeds, two runs a case;
    a crash or hang fails that kernel's report and restarts only its worker. `extra_cases(manifest)`: cases run
    after the default ones."""
    from flashgen.harness.verify import default_cases
    from flashgen.harness.worker import GpuWorker

    todo, lock, reports = deque(kernels), Lock(), {}

    def drain(_: int) -> None:
        with GpuWorker(job_timeout_s=job_timeout_s) as worker:
            while True:
                with lock:
                    if not todo:
                        return
                    key = todo.popleft()
                kernel = kernels[key]
                if extra_cases is None:
                    reports[key] = worker.verify(kernel)
                else:
                    reports[key] = worker.verify(
                        kernel, cases=default_cases(kernel.manifest) + extra_cases(kernel.manifest))

    count = max(1, min(workers or verify_workers(), len(kernels)))
    with ThreadPoolExecutor(max_workers=count) as pool:
        list(pool.map(drain, range(count)))
    return reports


# ---- kernels under an sm90 schedule switch (tests/test_bit_masks*.py, tests/test_half_first_tile*.py) ------------

def sm90_plan(variant: Any, head_dim: int, name: str, **tiles):
    """The bf16 plan the rules give `variant` on the H200's sm90 path, with `tiles` (block_m, block_n, ...) in place
    of the table's and the warps that block_m takes."""
    from flashgen.translators.rules import plan_for_variant
    from flashgen.variant import DType

    plan = plan_for_variant(variant, "h200", DType.bf16, head_dim, name=name, backend="sm90")
    if tiles:
        plan = plan.model_copy(update=dict(tiles, warps=tiles.get("block_m", plan.block_m) // 16))
    return plan


def assert_compiles_asynchronous(switch: str, plans: list) -> None:
    """Each plan rendered with the sm90 schedule switch `switch` on compiles for sm_90a (in parallel), and ptxas
    keeps its wgmma asynchronous (no "serialized" info line)."""
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.ptxas import serialized_wgmma
    from flashgen.translators.backends.sm90 import kernel
    from flashgen.translators.render import render

    with kernel.schedule_overrides(**{switch: True}):
        sources = [render(plan)[0] for plan in plans]
    with ThreadPoolExecutor(len(sources)) as pool:
        results = list(pool.map(lambda source: compile_cuda(source, "sm_90a"), sources))
    for plan, result in zip(plans, results, strict=True):
        assert result.ok, result.log
        assert not serialized_wgmma(result.log), f"{plan.name}: {serialized_wgmma(result.log)}"


def build_under_switch(switch: str, marker: str, dtype: str, variant: Any, head_dim: int, mods: dict | None = None):
    """(source, manifest) of the H200 kernel `flashgen generate` builds (with `mods`: the mask suite's kernel of
    those keywords), rendered with the sm90 schedule switch `switch` on, checked to have taken effect: `marker` in
    the source."""
    from flashgen.harness.suite import build_expert_kernel, build_mask_kernel
    from flashgen.translators.backends.sm90 import kernel

    with kernel.schedule_overrides(**{switch: True}):
        if mods is not None:
            source, manifest = build_mask_kernel("h200", dtype, variant, head_dim, mods)
        else:
            source, manifest, _ = build_expert_kernel("h200", dtype, variant, head_dim)
    assert marker in source, f"{switch} did not take effect"
    return source, manifest


def verify_prebuilt(prebuilt_kernels) -> dict:
    """{key: VerifyReport} of every kernel a module's `prebuilt_kernels` fixture built without error (verify_many)."""
    from flashgen.harness.worker import KernelInput

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items()})


# ---- guard columns: a kernel reads no column past its head dims and writes none past O's -----------------------

GUARD_COLS = 16  # wider than any padding (8 columns) and a whole number of 16-byte chunks for every dtype
GUARD_SHAPE = dict(B=2, H=3, N=197, M=133)  # ragged tiles, N > M: causal rows that see no key
_NAN_BITS = {"fp16": 0x7E00, "bf16": 0x7FC0, "fp32": 0x7FC00000}
_SENTINEL_BITS = {"fp16": 0x1234, "bf16": 0x1234, "fp32": 0x12345678}


def guard_column_checks(gpu_worker, source: str, manifest, seeds=(1, 2)):
    """(seed, check_guard_columns' result) for each seed, run in `gpu_worker` at GUARD_SHAPE; the call itself must
    succeed (asserted here), what it found is the caller's to assert."""
    from flashgen.harness.worker import KernelInput

    kernel_json = KernelInput(manifest=manifest, source=source).model_dump_json()
    for seed in seeds:
        result = gpu_worker.call("tests.gpu_kernels:check_guard_columns", kernel_json=kernel_json, shape=GUARD_SHAPE,
                                 seed=seed)
        assert result.ok, result.error
        yield seed, result.value


def check_guard_columns(kernel_json: str, shape: dict, seed: int) -> dict:
    """(Runs in a GPU worker: `worker.call("tests.gpu_kernels:check_guard_columns", ...)`.) One launch with Q and K
    as the first D columns of buffers GUARD_COLS wider, V as the first Dv (the extra columns NaN), O as the first Dv
    of one whose extra columns hold a sentinel (its own columns poisoned, as the harness does). Returns the
    harness's comparison with the fp64 reference (compare_outputs), how many guard elements of O changed
    (`guard_changed`) and O's shape (`o_shape`)."""
    import numpy as np

    from flashgen.harness.device import KernelInput, _cupy, ensure_compiled, launch, load_kernel, runnable_arch
    from flashgen.harness.verify import (
        POISON_BITS,
        compare_outputs,
        from_dtype_bits,
        reference_outputs,
        to_dtype_bits,
    )
    from flashgen.reference import random_inputs
    from flashgen.variant import DType, Shape

    cp = _cupy()
    kernel = KernelInput.model_validate_json(kernel_json)
    manifest = kernel.manifest
    dtype, d, dv = manifest.dtype, manifest.head_dim, manifest.dv
    loaded = load_kernel(ensure_compiled(kernel, runnable_arch(manifest))[1], manifest)
    s = Shape(**shape, D=d, DV=manifest.head_dim_v)
    bits = [to_dtype_bits(x, dtype) for x in random_inputs(s, seed)]
    wide32 = dtype is DType.fp32
    word, host_word = (cp.uint32, np.uint32) if wide32 else (cp.uint16, np.uint16)
    as_kernel_dtype = {DType.fp16: cp.float16, DType.bf16: cp.uint16, DType.fp32: cp.float32}[dtype]

    def wide(data, cols: int, guard_bits: int):
        rows = data.shape[:3] if data is not None else (s.B, s.H, s.N)
        buffer = cp.full((*rows, cols + GUARD_COLS), guard_bits, dtype=word)
        buffer[..., :cols] = cp.asarray(np.ascontiguousarray(data).view(host_word)) if data is not None \
            else int(POISON_BITS[dtype])
        return buffer, buffer.view(as_kernel_dtype)[..., :cols]

    (_, q), (_, k), (_, v) = (wide(x, cols, _NAN_BITS[dtype.value]) for x, cols in zip(bits, (d, d, dv)))
    o_buffer, o = wide(None, dv, _SENTINEL_BITS[dtype.value])
    launch(manifest, loaded, q, k, v, o)
    cp.cuda.runtime.deviceSynchronize()
    host = cp.asnumpy(o_buffer)
    o_bits = host[..., :dv]
    o_bits = o_bits.view(np.float32) if wide32 else o_bits.view(np.float16) if dtype is DType.fp16 else o_bits
    o_ref, _ = reference_outputs(manifest, *(from_dtype_bits(x, dtype) for x in bits))
    check = compare_outputs(from_dtype_bits(o_bits, dtype), o_ref, dtype, manifest.variant, s.M,
                            o_unwritten=host[..., :dv] == POISON_BITS[dtype], seed=seed)
    out = check.model_dump()
    out["guard_changed"] = int((host[..., dv:] != _SENTINEL_BITS[dtype.value]).sum())
    out["o_shape"] = list(o.shape)
    return out
