import pytest

from flashgen.abi import KernelManifest, Launch
from flashgen.harness.static_check import (
    blank_comments_and_strings,
    format_issues,
    static_check,
)
from flashgen.variant import DType, Variant

GOOD = '''#include "flashgen_abi.cuh"
#include <cuda_fp16.h>
#include <cuda/std/cstdint>
#include "flashgen/mma_sm80.cuh"
// cudaMalloc, printf and new in a comment are fine; so is a string:
/* cudaMemcpy(dst, src) <<<grid, block>>> */
namespace fg {
__device__ __forceinline__ float scale_it(float x, float s) { return x * s; }
template <int N> __host__ __device__ constexpr int tiles(int n) { return (n + N - 1) / N; }
struct Acc { float v[4]; __device__ void clear() { for (int i = 0; i < 4; i++) v[i] = 0.f; } };
}  // namespace fg
__constant__ float kTable[2] = {1.f, 2.f};
extern "C" __global__ __launch_bounds__(128) void attn_fwd(const FlashgenAttnParams p) {
  const char* tag = "cudaDeviceSynchronize printf";
  int big = 1'000;
  if (threadIdx.x == 0) ((float*)p.o)[0] = fg::scale_it(p.scale, kTable[0]) + big + tag[0];
}
extern "C" __global__ void __launch_bounds__(256, 1) attn_combine(const FlashgenAttnParams params) {}
'''


def manifest(*launches: tuple[str, int]) -> KernelManifest:
    return KernelManifest(name="t", arch="sm_80", dtype=DType.fp16, head_dim=64, variant=Variant(),
                          launches=[Launch(kernel=k, grid=("1", "1", "1"), threads=t) for k, t in launches])


def rules(source: str, m: KernelManifest | None = None) -> set[str]:
    return {issue.rule for issue in static_check(source, m)}


def test_clean_source_has_no_issues():
    assert static_check(GOOD, manifest(("attn_fwd", 128), ("attn_combine", 256))) == []


def test_blanking_keeps_offsets_and_extern_c():
    no_comments, code = blank_comments_and_strings(GOOD)
    assert len(code) == len(GOOD) == len(no_comments) and code.count("\n") == GOOD.count("\n")
    assert "cudaMalloc" not in code and "cudaDeviceSynchronize" not in code and 'extern "C"' in code
    assert '#include "flashgen_abi.cuh"' in no_comments and "cudaMalloc" not in no_comments


@pytest.mark.parametrize("line,rule", [
    ("#include <vector>", "include"),
    ('#include "../secret.h"', "include"),
    ("#include </usr/include/stdio.h>", "include"),
    ("#include <cublas_v2.h>", "library"),
    ("#include <cutlass/gemm/device/gemm.h>", "library"),
    ("#include <torch/extension.h>", "library"),
    ("__device__ void f() { thrust::sort(0, 0); }", "library"),
    ("__device__ void f() { cudaDeviceSynchronize(); }", "host-api"),
    ("__device__ void f(float** p) { cudaMalloc(p, 4); }", "host-api"),
    ("__device__ void f() { cuLaunchKernel(0); }", "host-api"),
    ("__device__ void f() { float* p = (float*)malloc(4); }", "allocation"),
    ("__device__ void f() { float* p = new float[4]; }", "allocation"),
    ('__device__ void f() { printf("%d", 1); }', "io"),
    ('__device__ void f() { fopen("x", "r"); }', "io"),
    ("int helper(int x) { return x; }", "host-function"),
    ("__host__ int helper(int x) { return x; }", "host-function"),
    ("int main() { return 0; }", "host-function"),
    ("__device__ void f() { g<<<1, 32>>>(); }", "launch"),
    ("__global__ void other(float* x) {}", "entry-signature"),
    ('extern "C" __global__ void other(FlashgenAttnParams p) {}', "entry-signature"),
    ("template <int N> __global__ void tk(const FlashgenAttnParams p) {}", "entry-signature"),
    ("struct FlashgenAttnParams { int x; };", "abi"),
])
def test_each_rule_flags_its_violation_with_the_line(line, rule):
    source = GOOD + line + "\n"
    issues = [i for i in static_check(source) if i.rule == rule]
    assert issues, f"{rule} not flagged for {line!r}"
    assert issues[0].line == source.count("\n")  # the appended line
    assert rules(GOOD) == set()


def test_abi_header_must_be_included():
    source = GOOD.replace('#include "flashgen_abi.cuh"\n', "").replace('#include "flashgen/mma_sm80.cuh"\n', "")
    assert rules(source) == {"abi"}


def test_manifest_kernels_must_exist_and_fit_launch_bounds():
    assert rules(GOOD, manifest(("attn_missing", 128))) == {"manifest"}
    issues = static_check(GOOD, manifest(("attn_fwd", 256), ("attn_combine", 512)))
    assert [i.rule for i in issues] == ["manifest", "manifest"] and "__launch_bounds__(128)" in issues[0].message
    assert "__launch_bounds__(256)" in issues[1].message


def test_issue_text_is_compact():
    issues = static_check(GOOD + "int helper(int x) { return x; }\n" * 40)
    assert str(issues[0]).startswith(f"line {GOOD.count(chr(10)) + 1}: helper:") and "[host-function]" in str(issues[0])
    text = format_issues(issues, max_chars=500)
    assert len(text) <= 500 and text.endswith("more")


# ---------------------------------------------------------------------------------------------
# Model-written code is untrusted: every way of making the preprocessor (or an assembler) read a file
# ---------------------------------------------------------------------------------------------

HOST_FILE = "/etc/hostname"


@pytest.mark.parametrize("snippet,rule", [
    (f'#define F "{HOST_FILE}"\nconst char s[] = {{\n#include F\n}};', "include"),          # computed include
    (f"#define F <{HOST_FILE}>\n#include F", "include"),
    (f'#inc\\\nlude "{HOST_FILE}"', "include"),                                              # line splice
    (f'#inc\\  \nlude "{HOST_FILE}"', "include"),                                            # gcc: blanks after \
    (f'#/* a comment */include "{HOST_FILE}"', "include"),                                   # comment in a directive
    (f'#/*\n\n*/include "{HOST_FILE}"', "include"),                                          # ... joining lines
    (f'%:include "{HOST_FILE}"', "include"),                                                 # digraph
    (f'??=include "{HOST_FILE}"', "include"),                                                # trigraph
    (f"char c = L'/*';\n#include \"{HOST_FILE}\"\n// */", "include"),                        # prefixed char literal
    (f'const char* s = u8R"x(\n)x";\n#include "{HOST_FILE}"', "include"),                   # prefixed raw string
    ("#include_next <cuda_fp16.h>", "include"),
    ('#import "kernel.h"', "include"),
    (f'const char s[] = {{\n#embed "{HOST_FILE}"\n}};', "include"),
    ('#if __has_include("/etc/shadow")\n#error yes\n#endif', "preprocessor"),
    ("#if __has_include_next(<cuda_fp16.h>)\n#endif", "preprocessor"),
    ('#pragma GCC dependency "/etc/passwd"', "preprocessor"),
    ('#pragma GCC system_header', "preprocessor"),
    ('_Pragma("GCC dependency \\"/etc/passwd\\"")', "preprocessor"),
    ("#define CAT(a, b) a##b", "preprocessor"),                                              # pasting builds names
    ('#line 1 "/usr/include/x.h"', "preprocessor"),
    ('# 1 "/usr/include/x.h" 3', "preprocessor"),
    ('#ident "x"', "preprocessor"),
    (f'__device__ void f() {{ asm(".incbin \\"{HOST_FILE}\\""); }}', "asm"),
    (f'__device__ void f() {{ __asm__ volatile(".include \\"{HOST_FILE}\\""); }}', "asm"),
    (f'__device__ void f() {{ asm(".inc" /* split */ "bin \\"{HOST_FILE}\\""); }}', "asm"),
    ('#define S(x) #x\n__device__ void f() { asm(S(.incbin "/etc/hostname")); }', "asm"),
])
def test_each_way_to_read_a_host_file_is_refused(snippet, rule):
    from flashgen.harness.static_check import file_access_issues

    source = GOOD + snippet + "\n"
    issues = [i for i in static_check(source) if i.rule == rule]
    assert issues, f"{rule} not flagged for {snippet!r}"
    first_line = GOOD.count("\n") + 1
    assert first_line <= issues[0].line <= source.count("\n")
    assert all("\n" not in str(i) for i in issues)  # one line each
    assert file_access_issues(source)  # compile_cuda refuses it too, before nvcc runs
    assert file_access_issues(GOOD) == [] and rules(GOOD) == set()


def test_allowed_directives_and_pragmas_pass():
    source = GOOD + ("#pragma unroll 4\n#pragma nv_diag_suppress 177\n#pragma once\n#define TWICE(x) ((x) + (x))\n"
                     "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n#elif 1\n#else\n#endif\n#undef TWICE\n"
                     "// #include </etc/passwd> in a line comment is only a comment\n")
    assert static_check(source) == []


def test_expert_and_test_kernels_pass_the_file_checks():
    from pathlib import Path

    from flashgen.harness.static_check import file_access_issues

    root = Path(__file__).resolve().parents[1]
    files = sorted(root.glob("generated/*/*/*/kernel.cu")) + sorted((root / "flashgen").rglob("*.cu*"))
    assert len(files) > 40
    for path in files:
        assert file_access_issues(path.read_text()) == [], path
