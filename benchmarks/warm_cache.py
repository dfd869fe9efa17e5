"""Compile, on this CPU machine, what the next GPU call would compile first, and pack the compile cache to carry there.

On a lent GPU machine the GPU suite's pre-compile pass (conftest) spends device time on nvcc: 1028 distinct
sources, 220 s of wall time on its 16 CPUs in session 25 (1841 s of nvcc summed). The same sources built here for
an sm_90 GPU (the lent H100s and H200s) exactly as that machine builds them (tests/gpu_kernels.every_build,
device.arch_to_run), and the kernels of the suites named, land in a fresh cache that is packed into `--out`.
benchmarks/device_prelude.sh unpacks a carried `.cubin-cache.tar.xz` into FLASHGEN_CACHE_DIR. An entry is keyed by everything that
makes the binary (flashgen.harness.compile: the source, the arch, the flags, `nvcc --version`'s text, the
project's headers), so an entry the other machine's nvcc or tree would not have made is a miss, never a wrong
cubin; the pre-compile line says how many hit ("N from the cache").

    python benchmarks/warm_cache.py [--jobs N] [--suite hopper ...] [--out .cubin-cache.tar.xz] [MODULE ...]

MODULE: GPU test modules (e.g. test_half_first_tile_gpu); none: every one. Carry the output with the wheels:
carry [".whl", ".cubin-cache.tar.xz"]. The carry's 64 MiB count the tracked tree too (about 20 MB), hence xz: about
a ninth of the cubins' size, where gzip packs to a quarter."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCH = "sm_90"  # the lent GPU machines' (H100, H200)
SUITE_GPU = "h200"  # what h200_measure.sh builds the suites for (`--gpu h200`)
PACK = ROOT / ".cubin-cache.tar.xz"  # the name benchmarks/device_prelude.sh unpacks (tests/test_warm_cache.py)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from flashgen.harness.suite import SUITES  # flashgen reads FLASHGEN_CACHE_DIR and FLASHGEN_HOME when it compiles
    from tests.gpu_kernels import build_and_compile, every_build, gpu_module_paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="GPU test modules (default: every one)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel builds and nvcc (default: the usable CPUs)")
    parser.add_argument("--suite", action="append", default=[], choices=SUITES, help="a bench suite's kernels too")
    parser.add_argument("--out", type=Path, default=PACK, help="the packed cache")
    args = parser.parse_args(argv)
    paths = gpu_module_paths(ROOT)
    unknown = set(args.modules) - {p.stem for p in paths}
    if unknown:
        print(f"not GPU test modules with kernels: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    from flashgen.harness.device import arch_to_run
    from flashgen.harness.suite import compile_suite

    # a fresh cache, and a fresh home (the packaged tuned tables only, as on the GPU machine)
    cache = Path(tempfile.mkdtemp(prefix="flashgen-warm-cache-"))
    os.environ["FLASHGEN_CACHE_DIR"] = str(cache)
    os.environ["FLASHGEN_HOME"] = home = tempfile.mkdtemp(prefix="flashgen-warm-home-")
    modules = [importlib.import_module(f"tests.{p.stem}") for p in paths if not args.modules or p.stem in args.modules]
    failed = 0  # kernels that did not build or compile: cached as such, the GPU run fails the same tests
    if modules:
        kernels, stats = build_and_compile(every_build(modules, ARCH), ARCH, jobs=args.jobs,
                                           arch_for=lambda manifest: arch_to_run(manifest, ARCH))
        print(stats.line(), flush=True)
        for key, built in kernels.items():
            if built.error is not None:
                print(f"  {key}: {built.error.splitlines()[0][:200]}")
        failed += stats.failed
    for suite in args.suite:
        started = time.monotonic()
        suite_kernels = compile_suite(SUITE_GPU, suite, jobs=args.jobs)
        bad = [k for k in suite_kernels if not (k.compile or {}).get("ok")]
        failed += len(bad)
        print(f"suite {suite}: {len(suite_kernels)} kernels, {len(bad)} failed, {time.monotonic() - started:.1f} s",
              flush=True)
    files = sum(1 for p in cache.rglob("*") if p.is_file())
    with tarfile.open(args.out, "w:xz") as tar:
        tar.add(cache, arcname=".")
    for folder in (cache, home):
        shutil.rmtree(folder, ignore_errors=True)
    print(f"wrote {args.out}: {files} files, {args.out.stat().st_size / 2**20:.1f} MiB; {failed} kernels failed "
          "to build or compile (cached as such)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
