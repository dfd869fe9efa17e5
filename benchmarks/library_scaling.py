"""The library job's figures (docs/batch.md), in one run:

    python benchmarks/library_scaling.py [--jobs N] [--only FILTER] [--skip-sequential] [--nvcc K] [--out FILE.json]

1. generated/'s spec (40 entries, CPU only: the expert's TL, the CPU checks, translation, nvcc) built by the library
   job on N build processes (default: the usable cores), against today's one-by-one regeneration
   (flashgen.regenerate.regenerate, entry after entry, one process), each with a cold compile cache of its own and
   the same scratch record; the two outputs are compared file by file. The ratio is sequential / library wall time.
2. With --nvcc K: nvcc throughput against cores: K distinct kernel sources (generated/'s kernel.cu files, compiled
   for their own arch) compiled one at a time, then K at a time on N threads, cold caches; the efficiency is
   (K / wall at N) / (N x K / wall at 1), the goal 0.8 or more.
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


def nvcc_throughput(scratch: Path, count: int, jobs: int) -> dict:
    from flashgen.harness.compile import compile_many

    sources = sorted((REPO / "generated").glob("*/*/*/kernel.cu"))[:count]
    by_arch: dict[str, list[str]] = {}
    for path in sources:
        arch = json.loads((path.parent / "manifest.json").read_text())["arch"]
        by_arch.setdefault(arch, []).append(path.read_text())
    out = {}
    for n in (1, jobs):
        os.environ["FLASHGEN_CACHE_DIR"] = str(scratch / f"nvcc-cache-{n}")
        started = time.monotonic()
        results = [r for arch, texts in by_arch.items() for r in compile_many(texts, arch, jobs=n)]
        out[n] = {"wall_s": round(time.monotonic() - started, 2), "ok": sum(r.ok for r in results),
                  "compiles": len(results)}
    rate1 = out[1]["compiles"] / out[1]["wall_s"]
    rate_n = out[jobs]["compiles"] / out[jobs]["wall_s"]
    return {"kernels": len(sources), "jobs": jobs, "one_at_a_time": out[1], "parallel": out[jobs],
            "compiles_per_s_1": round(rate1, 3), "compiles_per_s_n": round(rate_n, 3),
            "efficiency": round(rate_n / (jobs * rate1), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--only", default="", help="entries whose path contains this (default: all 40)")
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--nvcc", type=int, default=0, help="also time K nvcc compiles, 1 vs N at a time")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from flashgen import regenerate
    from flashgen.agent.outputs import FILES
    from flashgen.library.engines import usable_cpus

    jobs = args.jobs or usable_cpus()
    paths = [regenerate.relative_dir(*e).as_posix() for e in regenerate.entries()
             if args.only in regenerate.relative_dir(*e).as_posix()]
    result: dict = {"machine": {"cpus": usable_cpus(), "os_cpus": os.cpu_count(), "python": platform.python_version(),
                                "load_before": os.getloadavg()}, "entries": len(paths), "jobs": jobs}
    scratch = Path(tempfile.mkdtemp(prefix="flashgen-scaling-"))
    try:
        lib_s, summary = library(scratch, paths, jobs)
        result["library"] = {"wall_s": round(lib_s, 2), "built": summary.built, "failed": summary.failed,
                             "plan_s": summary.plan_s, "build_work_s": summary.build_cpu_s,
                             "per_entry_s": [r.seconds for r in summary.rows]}
        print(f"library job: {len(paths)} entries in {lib_s:.1f} s on {jobs} build processes "
              f"({summary.build_cpu_s:.0f} s of build work, plan {summary.plan_s:.1f} s)", flush=True)
        if not args.skip_sequential:
            seq_s = sequential(scratch, paths)
            differ = [f"{p}/{f}" for p in paths for f in FILES
                      if (scratch / "seq" / p / f).read_bytes() != (scratch / "lib" / p / f).read_bytes()]
            result["sequential"] = {"wall_s": round(seq_s, 2)}
            result["ratio"] = round(seq_s / lib_s, 3)
            result["outputs_differ"] = differ
            print(f"one by one: {seq_s:.1f} s; ratio {seq_s / lib_s:.2f}x; outputs differ: {differ or 'none'}",
                  flush=True)
        if args.nvcc:
            result["nvcc"] = nvcc_throughput(scratch, args.nvcc, jobs)
            print(f"nvcc: {json.dumps(result['nvcc'])}", flush=True)
        result["machine"]["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "library"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
