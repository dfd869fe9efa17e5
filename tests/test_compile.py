import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from flashgen.abi import ABI_HEADER, FlashgenAttnParams
from flashgen.errors import UsageError
from flashgen.harness import compile as compile_mod
from flashgen.harness.compile import CompileResult, CompilerNotFound, compile_cuda
from flashgen.harness.ptxas import (
    CompileError,
    parse_diagnostics,
    parse_resource_report,
)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

KERNEL = """#include "flashgen_abi.cuh"
#include <cuda_fp16.h>

extern "C" __global__ __launch_bounds__(128) void fg_test(const FlashgenAttnParams p) {
  __shared__ float tile[256];
  int i = threadIdx.x;
  tile[i] = p.scale * i;
  __syncthreads();
  if (i < p.seqlen_q) ((__half*)p.o)[i] = __float2half(tile[(i + 1) % 128]);
}
"""

# A run-time-indexed local array and a 32-register cap force spills.
SPILLER = """extern "C" __global__ void spiller(float* x, int idx) {
  float a[256];
  #pragma unroll
  for (int i = 0; i < 256; i++) a[i] = x[i * blockDim.x + threadIdx.x];
  #pragma unroll
  for (int i = 0; i < 256; i++) a[(i * 7) & 255] += a[i] * x[i];
  x[threadIdx.x] = a[idx & 255];
}
"""

BROKEN = """#include "flashgen_abi.cuh"
extern "C" __global__ void broken(const FlashgenAttnParams p) {
  float acc = 0.f;
  acc += undefined_name;
  ((float*)p.o)[0] = acc;
}
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cubin-cache")


@pytest.fixture(scope="module")
def compiled(cache_dir) -> dict[str, CompileResult]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    return {arch: compile_cuda(KERNEL, arch, cache_dir=cache_dir) for arch in ("sm_75", "sm_80", "sm_90a")}


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90a"])
def test_abi_kernel_compiles_and_reports_resources(compiled, arch):
    result = compiled[arch]
    assert result.ok, result.feedback_text()
    assert not result.cache_hit and result.errors == []
    data = Path(result.cubin_path).read_bytes()
    assert data[:4] == b"\x7fELF" and hashlib.sha256(data).hexdigest() == result.cubin_sha256
    usage = result.kernels["fg_test"]
    assert usage.registers > 0 and usage.arch == arch
    assert usage.shared_static_bytes == 256 * 4 and usage.barriers == 1 and not usage.spills
    assert "-gencode=arch=compute_90a,code=sm_90a" in result.command if arch == "sm_90a" else True
    assert "fg_test" in result.feedback_text() and "registers" in result.feedback_text()


@needs_nvcc
def test_cache_hits_and_misses(compiled, cache_dir):
    first = compiled["sm_80"]
    again = compile_cuda(KERNEL, "sm_80", cache_dir=cache_dir)
    assert again.cache_hit and again.cubin_path == first.cubin_path and again.kernels == first.kernels
    other_option = compile_cuda(KERNEL, "sm_80", cache_dir=cache_dir, options=["-DFLASHGEN_TEST=1"])
    other_source = compile_cuda(KERNEL + "\n// changed\n", "sm_80", cache_dir=cache_dir)
    for result in (other_option, other_source):
        assert result.ok and not result.cache_hit and result.cache_key != first.cache_key


@needs_nvcc
def test_header_contents_are_part_of_the_key(tmp_path, monkeypatch):
    extra = tmp_path / "inc"
    (extra / "flashgen").mkdir(parents=True)
    header = extra / "flashgen" / "consts.cuh"
    header.write_text("#pragma once\n#define FG_CONST 1.0f\n")
    monkeypatch.setattr(compile_mod, "include_dirs", lambda: [ABI_HEADER.parent, extra])
    source = '#include "flashgen/consts.cuh"\nextern "C" __global__ void k(float* x) { x[0] = FG_CONST; }\n'
    first = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert first.ok and not first.cache_hit
    assert compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache").cache_hit
    header.write_text("#pragma once\n#define FG_CONST 2.0f\n")
    changed = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert changed.ok and not changed.cache_hit and changed.cubin_sha256 != first.cubin_sha256


@needs_nvcc
def test_spilling_kernel_reports_spill_bytes(cache_dir):
    result = compile_cuda(SPILLER, "sm_75", options=["-maxrregcount=32"], cache_dir=cache_dir)
    assert result.ok
    usage = result.kernels["spiller"]
    assert usage.registers <= 32 and usage.spill_store_bytes > 0 and usage.spill_load_bytes > 0
    assert usage.stack_frame_bytes > 0 and "SPILLS" in result.feedback_text()


@needs_nvcc
def test_compile_error_points_at_the_line(cache_dir):
    result = compile_cuda(BROKEN, "sm_80", cache_dir=cache_dir)
    assert not result.ok and result.cubin_path is None
    err = result.errors[0]
    assert (err.file, err.line, err.column, err.severity) == ("kernel.cu", 4, 10, "error")
    assert "undefined_name" in err.message
    assert "> 4 |   acc += undefined_name;" in err.excerpt and "  3 |" in err.excerpt and "  5 |" in err.excerpt
    feedback = result.feedback_text()
    assert feedback.startswith("kernel.cu:4:10: error:") and len(feedback) <= 2000
    assert compile_cuda(BROKEN, "sm_80", cache_dir=cache_dir).cache_hit  # deterministic failures are cached


@needs_nvcc
def test_ptxas_error_in_inline_asm_is_traced_to_source(tmp_path):
    source = 'extern "C" __global__ void k(float* x) {\n  x[0] = 1.f;\n  asm volatile("bogus.op;");\n}\n'
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path)
    assert not result.ok
    err = result.errors[0]
    assert err.tool == "ptxas" and err.file == "kernel.cu" and err.line == 3 and "bogus.op" in err.message


def _fake_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "nvcc"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake nvcc {time.time()}"; exit 0; fi
sleep 30 &
echo $! > {pid_file}
wait
""")
    script.chmod(0o755)
    return script, pid_file


def test_timeout_kills_the_process_group(tmp_path, monkeypatch):
    script, pid_file = _fake_nvcc(tmp_path)
    monkeypatch.setenv("FLASHGEN_NVCC", str(script))
    started = time.monotonic()
    result = compile_cuda(KERNEL, "sm_80", timeout_s=0.5, cache_dir=tmp_path / "cache")
    assert time.monotonic() - started < 10
    assert result.timed_out and not result.ok and result.errors[0].severity == "timeout"
    assert "timed out" in result.feedback_text()
    assert not list((tmp_path / "cache").rglob("*.json"))  # timeouts are not cached
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("nvcc's child process survived the timeout")


def test_bad_arguments_are_usage_errors(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="unknown arch"):
        compile_cuda(KERNEL, "sm_70")
    with pytest.raises(UsageError, match="not allowed"):
        compile_cuda(KERNEL, "sm_80", options=["-o", "/tmp/x.cubin"])
    with pytest.raises(UsageError, match="list of strings"):
        compile_cuda(KERNEL, "sm_80", options="-O0")
    monkeypatch.setenv("FLASHGEN_NVCC", str(tmp_path / "missing-nvcc"))
    with pytest.raises(CompilerNotFound, match="FLASHGEN_NVCC"):
        compile_cuda(KERNEL, "sm_80", cache_dir=tmp_path)


def test_parse_resource_report():
    report = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooILi4EEvPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooILi4EEvPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 16 bytes cumulative stack size, 400 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compiling entry function 'attn' for 'sm_90a'
ptxas info    : Function properties for attn
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 90 registers, used 2 barriers, 49152 bytes smem
ptxas info    : Function properties for _Z6helperv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
    usages = parse_resource_report(report)
    foo = usages["_Z3fooILi4EEvPf"]
    assert (foo.registers, foo.spill_store_bytes, foo.spill_load_bytes, foo.stack_frame_bytes) == (168, 8, 12, 16)
    assert foo.const_bytes == 408 and foo.cumulative_stack_bytes == 16 and foo.is_entry and foo.spills
    attn = usages["attn"]
    assert (attn.registers, attn.barriers, attn.shared_static_bytes, attn.const_bytes) == (90, 2, 49152, 0)
    assert attn.demangled == "attn" and not usages["_Z6helperv"].is_entry
    if shutil.which("c++filt") or shutil.which("cu++filt"):
        assert foo.demangled == "void foo<4>(float*)"


def test_parse_diagnostics_formats():
    source = "line one\nline two\nline three\n"
    log = """kernel.cu(2:5): error: something odd
kernel.cu(3): warning #177-D: variable "x" was declared but never referenced
    int x;
        ^

At end of source: error: expected a "}"
kernel.cu:1:2: error: host compiler complaint
ptxas /tmp/tmpxft_1_kernel.ptx, line 7; error   : Unknown modifier '.foo'
ptxas warning : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized
ptxas fatal   : Ptx assembly aborted due to errors
nvlink error   : Undefined reference to '_Z1gv' in 'kernel.o'
nvcc fatal   : Unknown option '-bogus'
2 errors detected in the compilation of "kernel.cu".
"""
    errs = parse_diagnostics(log, {"kernel.cu": source})
    assert [(e.tool, e.severity, e.line) for e in errs] == [
        ("nvcc", "error", 2), ("nvcc", "warning", 3), ("nvcc", "error", None), ("host", "error", 1),
        ("ptxas", "error", 7), ("ptxas", "warning", None), ("nvlink", "error", None), ("nvcc", "fatal", None)]
    assert errs[0].column == 5 and errs[0].excerpt.splitlines()[1] == "> 2 | line two"
    assert errs[1].code == "177-D" and errs[1].column is None  # the echoed line is not the real line 3
    assert errs[4].file == "tmpxft_1_kernel.ptx" and errs[5].code == "C7515"
    assert "Undefined reference" in errs[6].message and errs[7].message == "Unknown option '-bogus'"


# ptxas -v for an sm_90a kernel whose wgmma ptxas serialized (nvcc 13.0; session 10's h_causal_128 with one P V
# issued on a data-dependent branch): the serialization is an info line among the resource report.
SERIALIZED_LOG = """ptxas info    : (C7519) warpgroup.arrive is injected in around line 2453 by compiler to allow use of registers in GMMA in function 'h_causal_128'
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function 'h_causal_128'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'h_causal_128' for 'sm_90a'
ptxas info    : Function properties for h_causal_128
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers
ptxas info    : Compile time = 506.590 ms
"""
C7520 = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
         "program dependence on compiler-inserted WG.AR in divergent path in the function 'fg_xxx'")


def test_a_serialized_wgmma_info_line_is_a_ptxas_warning():
    (err,) = parse_diagnostics(C7520)
    assert (err.tool, err.severity, err.code, err.file, err.line) == ("ptxas", "warning", "C7520", None, None)
    assert err.message == ("Potential Performance Loss: wgmma.mma_async instructions are serialized due to program "
                           "dependence on compiler-inserted WG.AR in divergent path in the function 'fg_xxx'")
    # the wording and the code vary; the match is on the content, in any case
    (other,) = parse_diagnostics("ptxas info    : (C7510) WGMMA.MMA_ASYNC instructions are Serialized in 'k'")
    assert (other.severity, other.code) == ("warning", "C7510")
    (uncoded,) = parse_diagnostics("ptxas info    : wgmma serialization in the function 'k'")
    assert uncoded.code is None and uncoded.message == "wgmma serialization in the function 'k'"


def test_other_ptxas_info_lines_are_ignored():
    harmless = """ptxas info    : (C7519) warpgroup.arrive is injected in around line 2445 by compiler to allow use of registers in GMMA in function 'h_causal_128'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'h_causal_128' for 'sm_90a'
ptxas info    : Function properties for h_causal_128
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 400 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 523.479 ms
"""
    assert parse_diagnostics(harmless) == []
    for line in harmless.splitlines():
        assert parse_diagnostics(line) == [], line


def test_a_full_ptxas_log_with_serialized_wgmma_yields_one_warning():
    (err,) = parse_diagnostics(SERIALIZED_LOG)
    assert (err.tool, err.severity, err.code) == ("ptxas", "warning", "C7514")
    assert err.message.startswith("Potential Performance Loss: wgmma.mma_async instructions are serialized due to")
    assert err.message.endswith("in the function 'h_causal_128'")
    usage = parse_resource_report(SERIALIZED_LOG)["h_causal_128"]  # the resource report still reads the same
    assert (usage.registers, usage.barriers, usage.is_entry, usage.spills) == (168, 16, True, False)
    # after a front-end warning (its block ends at the first ptxas line), among other diagnostics, in order
    log = ('kernel.cu(3): warning #177-D: variable "x" was declared but never referenced\n' + C7520 + "\n"
           + SERIALIZED_LOG + "ptxas warning : (C7515) Potential Performance Loss: wgmma.mma_async instructions "
           "are serialized\n")
    errs = parse_diagnostics(log)
    assert [(e.tool, e.severity, e.code) for e in errs] == [
        ("nvcc", "warning", "177-D"), ("ptxas", "warning", "C7520"), ("ptxas", "warning", "C7514"),
        ("ptxas", "warning", "C7515")]
    assert errs[0].message == 'variable "x" was declared but never referenced'


def test_a_serialized_wgmma_warning_reaches_the_feedback():
    kernel = parse_resource_report(SERIALIZED_LOG)["h_causal_128"]
    warnings = parse_diagnostics(SERIALIZED_LOG)
    text = CompileResult(ok=True, arch="sm_90a", kernels={"h_causal_128": kernel}, warnings=warnings).feedback_text()
    assert text.splitlines()[0].startswith("h_causal_128 (sm_90a): 168 registers")
    assert "ptxas: warning [C7514]: Potential Performance Loss: wgmma.mma_async instructions are serialized" in text
    assert "C7519" not in text and "warpgroup.arrive" not in text


def test_feedback_text_is_bounded():
    errors = [CompileError(file="kernel.cu", line=n, message="x" * 150, excerpt=f"> {n} | code") for n in range(1, 60)]
    text = CompileResult(ok=False, arch="sm_80", errors=errors).feedback_text(max_chars=1000)
    assert len(text) <= 1000 and text.startswith("kernel.cu:1: error:") and text.rstrip().endswith("more")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
def test_ctypes_mirror_matches_the_c_struct(tmp_path):
    fields = [name for name, _ in FlashgenAttnParams._fields_]
    program = tmp_path / "offsets.cpp"
    program.write_text(
        "#define __global__\n#include <cstdio>\n#include <cstddef>\n"
        f'#include "{ABI_HEADER}"\n'
        "int main() {\n  std::printf(\"size %zu\\n\", sizeof(FlashgenAttnParams));\n"
        + "".join(f'  std::printf("{f} %zu\\n", offsetof(FlashgenAttnParams, {f}));\n' for f in fields)
        + "  return 0;\n}\n")
    exe = tmp_path / "offsets"
    subprocess.run(["g++", "-std=c++17", str(program), "-o", str(exe)], check=True, capture_output=True, timeout=60)
    printed = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                           check=True).stdout.splitlines())
    assert int(printed.pop("size")) == ctypes.sizeof(FlashgenAttnParams)
    assert {f: int(v) for f, v in printed.items()} == {f: getattr(FlashgenAttnParams, f).offset for f in fields}


# ---------------------------------------------------------------------------------------------
# Untrusted sources: nothing outside our folders is read, nothing of the host comes back
# ---------------------------------------------------------------------------------------------

def _secret_header(tmp_path: Path) -> Path:
    secret = tmp_path / "host-secrets" / "secret.h"
    secret.parent.mkdir(parents=True)
    secret.write_text("FLASHGEN_SECRET_TOKEN_4711 ;\n")
    return secret


def _everything_returned(result: CompileResult) -> str:
    return result.model_dump_json() + result.feedback_text()


def test_a_computed_include_is_refused_before_nvcc(tmp_path, monkeypatch):
    secret = _secret_header(tmp_path)
    script = tmp_path / "nvcc"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo fake; exit 0; fi\ntouch {tmp_path}/ran\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("FLASHGEN_NVCC", str(script))
    source = f'#define F "{secret}"\nconst char s[] = {{\n#include F\n}};\nextern "C" __global__ void k(float* x) {{}}\n'
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok and result.errors[0].tool == "harness" and "computed include" in result.feedback_text()
    assert not (tmp_path / "ran").exists()  # nvcc never ran


@needs_nvcc
def test_a_disguised_include_the_static_check_misses_is_refused_and_withheld(tmp_path, monkeypatch):
    """What if the text check had a hole: the preprocessor's own list of opened files still refuses the build."""
    secret = _secret_header(tmp_path)
    monkeypatch.setattr(compile_mod, "file_access_issues", lambda source: [])
    source = (f'#define F "{secret}"\n__device__ int s[] = {{\n#include F\n}};\n'
              'extern "C" __global__ void k(int* x) { x[0] = s[0]; }\n')
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok and result.cubin_path is None and result.log == ""
    assert "outside the build folder" in result.feedback_text()
    text = _everything_returned(result)
    assert "FLASHGEN_SECRET_TOKEN_4711" not in text and str(secret) not in text and "host-secrets" not in text
    assert not list((tmp_path / "cache").rglob("*.json"))  # not cached


@needs_nvcc
def test_an_assembler_file_directive_the_static_check_misses_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_mod, "file_access_issues", lambda source: [])
    source = ('#define EMPTY\nextern "C" __global__ void k(float* x) {\n'
              '  asm volatile(".inc" EMPTY "bin \\"/etc/hostname\\"");\n}\n')
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok and result.log == "" and "assembler directive" in result.feedback_text()


def test_nvcc_runs_in_the_build_folder_with_a_scrubbed_environment(tmp_path, monkeypatch):
    dump = tmp_path / "env.txt"
    script = tmp_path / "nvcc"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fake nvcc env"; exit 0; fi\n'
                      f'case "$*" in *-dryrun*) exit 0;; esac\n'
                      f'pwd > {dump}.cwd\nenv > {dump}\nls > {dump}.ls\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("FLASHGEN_NVCC", str(script))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-flashgen-test-secret")
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DSNUCK_IN=1")
    compile_cuda(KERNEL, "sm_80", cache_dir=tmp_path / "cache")
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert "OPENAI_API_KEY" not in env and "NVCC_APPEND_FLAGS" not in env
    assert set(env) - {"PWD", "SHLVL", "_", "OLDPWD"} <= {*compile_mod.PASSED_ENV, "HOME", "TMPDIR", "LC_ALL", "LANG"}
    work = dump.with_suffix(".txt.cwd").read_text().strip()
    assert env["HOME"] == env["TMPDIR"] == work and Path(work).name.startswith("flashgen-nvcc-")
    assert dump.with_suffix(".txt.ls").read_text().split() == ["kernel.cu"]


@needs_nvcc
def test_compiler_output_shows_no_host_paths(tmp_path):
    from flashgen.harness.compile import find_nvcc, toolkit_layout

    source = ('#define FlashgenTensorMaps 1\n#include "flashgen_abi.cuh"\n#include <cuda_fp16.h>\n'
              'extern "C" __global__ void k(float* x) { __half h = __hadd(1, 2, 3); }\n')
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok
    text = result.log + result.feedback_text() + " ".join(e.file or "" for e in result.errors + result.warnings)
    assert "<cuda>/targets/" in text or "<cuda>/include" in text  # the toolkit's notes, by toolkit path
    for host in (str(compile_mod.PROJECT_ROOT), toolkit_layout(find_nvcc()).root, "/tmp/", str(Path.home())):
        assert host not in text, host


@needs_nvcc
def test_compiler_output_is_capped(tmp_path):
    name = "x" * 5000
    source = 'extern "C" __global__ void k(float* x) {\n' + f"  x[0] = {name}_a + {name}_b;\n" * 30 + "}\n"
    result = compile_cuda(source, "sm_80", cache_dir=tmp_path / "cache")
    assert not result.ok and len(result.log) <= compile_mod.LOG_LIMIT + 100
    assert all(len(e.message) <= compile_mod.MESSAGE_LIMIT + 100 for e in result.errors)
    assert len(result.errors) <= compile_mod.MAX_DIAGNOSTICS and len(result.feedback_text()) <= 2000


def test_path_scrubber_and_dependency_lists(tmp_path):
    from flashgen.harness.compile import PathScrubber, outside_files, read_deps

    scrub = PathScrubber("/tmp/flashgen-nvcc-abc", None, ["/usr/include"])
    text = scrub(f"/tmp/flashgen-nvcc-abc/kernel.ptx, line 3 {compile_mod.PROJECT_ROOT}/flashgen/include/x.cuh(2) "
                 "/usr/include/stdint.h /home/someone/secret.txt a/b x = y /z")
    assert text == ("kernel.ptx, line 3 flashgen/include/x.cuh(2) <system>/stdint.h <path> a/b x = y /z")
    deps = tmp_path / "kernel.deps"
    deps.write_text("kernel.o: kernel.cu /usr/include/stdc-predef.h \\\n /opt/my\\ dir/a.h /etc/hostname\n")
    assert read_deps(deps) == ["kernel.cu", "/usr/include/stdc-predef.h", "/opt/my dir/a.h", "/etc/hostname"]
    assert outside_files(read_deps(deps), "/tmp/w", ["/usr/include", "/opt/my dir"]) == ["/etc/hostname"]
    assert outside_files(["/usr/include/../../etc/hostname"], "/tmp/w", ["/usr/include"]) == \
        ["/usr/include/../../etc/hostname"]
    assert read_deps(tmp_path / "missing.deps") is None
