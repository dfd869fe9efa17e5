"""The library job's figures (docs/batch.md), in one run:

    python benchmarks/library_scaling.py [--jobs N] [--only FILTER] [--skip-sequential] [--skip-library] [--nvcc [K]]
                                         [--out FILE.json]

1. generated/'s spec (40 entries, CPU only: the expert's TL, the CPU checks, translation, nvcc) built by the library
   job on N build processes (default: the usable cores), against today's one-by-one regeneration
   (flashgen.regenerate.regenerate, entry after entry, one process), each with a cold compile cache of its own and
   the same scratch record; the two outputs are compared file by file. The ratio is sequential / library wall time.
2. With --nvcc: nvcc throughput against cores. K compiles, each a real one (cold caches of their own, no cache
   hit): every distinct committed kernel source under generated/ for its own arch (24 of the 40 entries: h100 and
   h200, t4 and rtx8000 share their sources), and where those are fewer than K, each again with a define of its own
   (-DFLASHGEN_SCALING_COPY=i: the same work, another cache key). K defaults to those or 4 x N, whichever is more;
   fewer than 4 x N is refused (with K near N the wall at N is the longest single compile, an sm_90a kernel's ~3x
   an sm_80 one's, and says nothing about throughput). The K compiles run one at a time, then on N workers (one pool
   over every arch), in the same order: spawned processes, as the library job's build pool runs them (the default),
   or threads of one process, as compile_many does (--nvcc-workers thread, or process,thread for both; on the
   H200's 16 cores the Python around each nvcc, ~85 ms of it, runs one thread at a time under the GIL). Reported: both walls; the makespan bound at N, max(the one-at-a-time
   compile seconds / N, the longest single compile); the list schedule of the one-at-a-time compile seconds on N
   workers (the wall at N if compiles did not slow each other); each compile's mean seconds at 1 and at N (how much
   running N at once slows each); the efficiency raw, (K / wall at N) / (N x K / wall at 1) (issue 16's goal: 0.8
   or more), and against the bound, bound / wall at N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _env(home: Path, cache: Path) -> None:
    os.environ["FLASHGEN_HOME"] = str(home)
    os.environ["FLASHGEN_CACHE_DIR"] = str(cache)


def sequential(scratch: Path, paths: list[str]) -> float:
    from flashgen import regenerate

    _env(scratch / "home-seq", scratch / "cache-seq")
    started = time.monotonic()
    for entry in regenerate.entries():
        rel = regenerate.relative_dir(*entry)
        if rel.as_posix() in paths:
            regenerate.regenerate(*entry, out=scratch / "seq" / rel, store_home=scratch / "store-seq")
    return time.monotonic() - started


def library(scratch: Path, paths: list[str], jobs: int):
    from flashgen import regenerate
    from flashgen.library import build

    _env(scratch / "home-lib", scratch / "cache-lib")
    only = None if len(paths) == 40 else set(paths)
    started = time.monotonic()
    summary = build(regenerate.spec(), scratch / "lib", only=only, jobs=jobs, gpus=[], store=scratch / "store-lib")
    return time.monotonic() - started, summary


def distinct_kernels() -> list[tuple[str, str, str]]:
    """(folder, source, arch) of generated/'s kernels, one per distinct (arch, source): h100's and h200's kernels
    (and t4's and rtx8000's) are one source each, which would be one compile and a cache hit."""
    kernels, seen = [], set()
    for path in sorted((REPO / "generated").glob("*/*/*/kernel.cu")):
        arch, source = json.loads((path.parent / "manifest.json").read_text())["arch"], path.read_text()
        if (arch, source) not in seen:
            seen.add((arch, source))
            kernels.append((path.parent.relative_to(REPO / "generated").as_posix(), source, arch))
    return kernels


def nvcc_jobs(count: int) -> list[tuple[str, str, str, list[str]]]:
    """(label, source, arch, nvcc options) x `count`: the distinct kernels for their own arch (evenly spread over
    them when `count` is fewer), then again, each copy with its own define."""
    kernels = distinct_kernels()
    out = []
    for i in range(count):
        copy, k = divmod(i, len(kernels)) if count >= len(kernels) else (0, i * len(kernels) // count)
        label, source, arch = kernels[k]
        out.append((label + (f"#{copy}" if copy else ""), source, arch,
                    [f"-DFLASHGEN_SCALING_COPY={copy}"] if copy else []))
    return out


def list_schedule(seconds: list[float], threads: int) -> float:
    """The makespan of running these durations in this order on `threads` threads (each takes the next job when
    free): the wall at N if the compiles did not slow each other."""
    import heapq

    free = [0.0] * threads
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def _compile_job(job: tuple[str, str, str, list[str]]):
    """One compile in a build process: what the library job's pool runs (flashgen.library.engines)."""
    from flashgen.harness.compile import compile_cuda

    result = compile_cuda(job[1], job[2], options=job[3])
    return result.ok, result.cache_hit, result.seconds


def _warm(_: int) -> None:
    import flashgen.harness.compile  # noqa: F401  (the import a build process pays once)

    time.sleep(0.3)  # held, so that every worker of the pool starts before the timing


def _run_compiles(work, n: int, kind: str):
    """The compiles on n workers: `process` (spawned processes, as the library job's build pool) or `thread` (one
    process, as compile_many: the Python around each nvcc holds the GIL, so it runs one thread at a time)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    if kind == "thread":
        with ThreadPoolExecutor(max_workers=n) as pool:
            started = time.monotonic()
            results = list(pool.map(_compile_job, work))
            return time.monotonic() - started, results
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_warm, range(n)))
        started = time.monotonic()
        results = list(pool.map(_compile_job, work))
        return time.monotonic() - started, results


def nvcc_throughput(scratch: Path, count: int, jobs: int, kinds: tuple[str, ...] = ("process",)) -> dict:
    """One run one at a time, then one on `jobs` workers per kind; the first kind's figures are the top level,
    each further kind's parallel figures go under `by_workers`."""
    out = _throughput(scratch, nvcc_jobs(count), jobs, kinds[0], None)
    out["by_workers"] = {kind: _throughput(scratch, nvcc_jobs(count), jobs, kind, out["_one"]) for kind in kinds[1:]}
    for other in out["by_workers"].values():
        for key in ("_one", "seconds_1", "labels", "archs", "one_at_a_time"):
            other.pop(key)
    out.pop("_one")
    return out


def _throughput(scratch: Path, work, jobs: int, kind: str, one: dict | None) -> dict:
    runs = {1: one} if one is not None else {}
    for n in (1, jobs):
        if n in runs:
            continue
        os.environ["FLASHGEN_CACHE_DIR"] = str(scratch / f"nvcc-cache-{kind}-{n}")  # cold, its own: all real
        wall, results = _run_compiles(work, n, kind)
        seconds = [s for _ok, _hit, s in results]
        runs[n] = {"wall_s": round(wall, 2), "compiles": len(results), "ok": sum(ok for ok, _h, _s in results),
                   "cache_hits": sum(hit for _ok, hit, _s in results), "compile_s_sum": round(sum(seconds), 2),
                   "compile_s_mean": round(sum(seconds) / len(seconds), 3), "compile_s_max": round(max(seconds), 2),
                   "longest": work[seconds.index(max(seconds))][0], "seconds": [round(x, 3) for x in seconds]}
    one, par = runs[1], runs[jobs]
    longest = one["compile_s_max"]
    bound = max(one["compile_s_sum"] / jobs, longest)  # no schedule of these compiles on N threads is shorter
    by_arch: dict[str, list[float]] = {}
    for (_label, _source, arch, _opts), s in zip(work, one["seconds"], strict=True):
        by_arch.setdefault(arch, []).append(s)
    return {"workers": kind, "compiles": len(work), "jobs": jobs, "distinct_kernels": len({w[0].split("#")[0] for w in work}),
            "archs": {a: {"compiles": len(v), "mean_s": round(sum(v) / len(v), 2)} for a, v in sorted(by_arch.items())},
            "one_at_a_time": {k: v for k, v in one.items() if k != "seconds"},
            "parallel": {k: v for k, v in par.items() if k != "seconds"},
            "makespan_bound_s": round(bound, 2), "longest_compile_s": longest,
            "list_schedule_s": round(list_schedule(one["seconds"], jobs), 2),
            "slowdown_per_compile": round(par["compile_s_mean"] / one["compile_s_mean"], 3),
            "compiles_per_s_1": round(len(work) / one["wall_s"], 3),
            "compiles_per_s_n": round(len(work) / par["wall_s"], 3),
            "efficiency": round(one["wall_s"] / (jobs * par["wall_s"]), 3),
            "efficiency_vs_bound": round(bound / par["wall_s"], 3),
            "seconds_1": one["seconds"], "seconds_n": par["seconds"], "labels": [w[0] for w in work], "_one": one}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--only", default="", help="entries whose path contains this (default: all 40)")
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--skip-library", action="store_true", help="only the nvcc step (with --nvcc)")
    parser.add_argument("--nvcc", type=int, nargs="?", const=-1, default=0, metavar="K",
                        help="also time K nvcc compiles, 1 vs N at a time (default K: the committed kernels or 4 x N, "
                             "whichever is more; at least 4 x N)")
    parser.add_argument("--nvcc-workers", default="process", help="process (the library job's build pool: spawned "
                        "processes), thread (compile_many's threads), or both, comma-separated: process,thread")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from flashgen import regenerate
    from flashgen.agent.outputs import FILES
    from flashgen.library.engines import usable_cpus

    jobs = args.jobs or usable_cpus()
    if not set(args.nvcc_workers.split(",")) <= {"process", "thread"}:
        parser.error(f"--nvcc-workers {args.nvcc_workers}: process, thread, or process,thread")
    nvcc_count = max(len(distinct_kernels()), 4 * jobs) if args.nvcc == -1 else args.nvcc
    if args.nvcc and nvcc_count < 4 * jobs:
        parser.error(f"--nvcc {nvcc_count}: at least 4 x N = {4 * jobs} compiles (with K near N the wall at N is the "
                     "longest single compile); --nvcc alone takes the default")
    if args.skip_library and not args.nvcc:
        parser.error("--skip-library leaves nothing to measure without --nvcc")
    paths = [regenerate.relative_dir(*e).as_posix() for e in regenerate.entries()
             if args.only in regenerate.relative_dir(*e).as_posix()]
    result: dict = {"machine": {"cpus": usable_cpus(), "os_cpus": os.cpu_count(), "python": platform.python_version(),
                                "load_before": os.getloadavg()}, "entries": len(paths), "jobs": jobs}
    scratch = Path(tempfile.mkdtemp(prefix="flashgen-scaling-"))
    try:
        if not args.skip_library:
            lib_s, summary = library(scratch, paths, jobs)
            result["library"] = {"wall_s": round(lib_s, 2), "built": summary.built, "failed": summary.failed,
                                 "plan_s": summary.plan_s, "build_work_s": summary.build_cpu_s,
                                 "per_entry_s": [r.seconds for r in summary.rows]}
            print(f"library job: {len(paths)} entries in {lib_s:.1f} s on {jobs} build processes "
                  f"({summary.build_cpu_s:.0f} s of build work, plan {summary.plan_s:.1f} s)", flush=True)
        if not args.skip_sequential and not args.skip_library:
            seq_s = sequential(scratch, paths)
            differ = [f"{p}/{f}" for p in paths for f in FILES
                      if (scratch / "seq" / p / f).read_bytes() != (scratch / "lib" / p / f).read_bytes()]
            result["sequential"] = {"wall_s": round(seq_s, 2)}
            result["ratio"] = round(seq_s / lib_s, 3)
            result["outputs_differ"] = differ
            print(f"one by one: {seq_s:.1f} s; ratio {seq_s / lib_s:.2f}x; outputs differ: {differ or 'none'}",
                  flush=True)
        if args.nvcc:
            result["nvcc"] = nv = nvcc_throughput(scratch, nvcc_count, jobs, tuple(args.nvcc_workers.split(",")))
            # one line per worker kind (the first kind's figures are the top level, the others under by_workers)
            for kind in (nv, *nv["by_workers"].values()):
                print(f"nvcc: {nv['compiles']} compiles ({nv['distinct_kernels']} kernels): "
                      f"{nv['one_at_a_time']['wall_s']} s one at a time, {kind['parallel']['wall_s']} s on {jobs} "
                      f"{kind['workers']} workers (bound {nv['makespan_bound_s']} s, longest compile "
                      f"{nv['longest_compile_s']} s, list schedule {nv['list_schedule_s']} s, each compile "
                      f"{kind['slowdown_per_compile']}x slower); efficiency {kind['efficiency']} raw, "
                      f"{kind['efficiency_vs_bound']} against the bound; cache hits "
                      f"{nv['one_at_a_time']['cache_hits']} + {kind['parallel']['cache_hits']}", flush=True)
        result["machine"]["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = {k: v for k, v in result.items() if k != "library"}
    if "nvcc" in shown:
        shown["nvcc"] = {k: v for k, v in shown["nvcc"].items() if k not in ("seconds_1", "seconds_n", "labels")}
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
