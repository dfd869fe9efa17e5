"""benchmarks/warm_cache.py: the compile cache filled on a CPU machine is the one a GPU machine's pre-compile pass
reads (conftest: the same builds, the same arch per kernel), so a carried pack turns its nvcc into cache hits."""

from __future__ import annotations

import importlib
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "warm_cache.py"
MODULE = "test_half_first_tile_gpu"  # a few sm_90a kernels: a few seconds of nvcc each

# conftest's pre-compile pass on an sm_90 GPU, with the cache FLASHGEN_CACHE_DIR names
PRECOMPILE = f"""
import importlib, sys
sys.path.insert(0, {str(ROOT)!r})
from flashgen.harness.device import arch_to_run
from tests.gpu_kernels import build_and_compile, every_build
module = importlib.import_module("tests.{MODULE}")
print(build_and_compile(every_build([module], "sm_90"), "sm_90", arch_for=lambda m: arch_to_run(m, "sm_90"))[1].line())
"""


def _run(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, **env})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_a_packed_cache_serves_the_gpu_machines_pre_compile_pass(tmp_path):
    kernels = len(importlib.import_module(f"tests.{MODULE}").KERNELS)  # each its own source
    pack = tmp_path / runpy.run_path(str(SCRIPT))["PACK"].name  # carried into the device's checkout under that name
    done = _run([str(SCRIPT), MODULE, "--out", str(pack)])
    assert done.returncode == 0, done.stderr
    assert f"[gpu pre-compile] {kernels} kernels ({kernels} distinct sources)" in done.stdout
    assert f"wrote {pack}: {2 * kernels} files" in done.stdout and "; 0 kernels failed" in done.stdout  # cubin, entry
    # unpacked as a device call does: device_prelude.sh sourced where the pack lies (there: the repo root)
    unpacked = tmp_path / "unpacked"
    prelude = subprocess.run(["bash", "-c", f". {ROOT}/benchmarks/device_prelude.sh && echo $FLASHGEN_CACHE_DIR"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env={**os.environ, "NO_WHEELS": "1", "FLASHGEN_CACHE_DIR": str(unpacked),
                                  "OUT": str(tmp_path / "out")})
    assert prelude.returncode == 0 and prelude.stdout.strip() == str(unpacked), prelude.stdout + prelude.stderr
    assert sum(1 for p in unpacked.rglob("*") if p.is_file()) == 2 * kernels
    again = _run(["-c", PRECOMPILE], FLASHGEN_CACHE_DIR=str(unpacked))
    assert again.returncode == 0, again.stderr
    assert f"0 compiled, {kernels} from the cache, 0 failed" in again.stdout, again.stdout


def test_an_unknown_module_is_one_line_and_a_non_zero_exit(tmp_path):
    done = _run([str(SCRIPT), "test_no_such_module", "--out", str(tmp_path / "x.tgz")])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "not GPU test modules with kernels: test_no_such_module"
    assert not (tmp_path / "x.tgz").exists()
