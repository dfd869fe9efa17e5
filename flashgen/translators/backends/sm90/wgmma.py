"""The wgmma wrappers a Hopper kernel needs, written out for the N it uses.

A wgmma names its accumulator registers one by one (N/2 fp32 per thread for m64nNk16), so each N is its own
inline-asm statement; these are generated for exactly the N values a kernel instantiates rather than kept as a
header of 32 near-identical functions.
"""

from __future__ import annotations

from collections.abc import Iterable

_PTX_TYPE = {"fp16": "f16", "bf16": "bf16"}


def _regs(first: int, count: int) -> str:
    return ", ".join(f"%{i}" for i in range(first, first + count))


def _ss(n: int, dtype: str) -> str:
    """D (+)= A * B^T with A (64 x 16) and B (N x 16) both K-major in shared memory."""
    r = n // 2
    ty = _PTX_TYPE[dtype]
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    return f"""__device__ __forceinline__ void ss_m64n{n}k16_{dtype}(float (&d)[{r}], uint64_t a, uint64_t b, int accumulate) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{_regs(0, r)}}}, %{r}, %{r + 1}, p, 1, 1, 0, 0;\\n}}\\n"
      : {outs}
      : "l"(a), "l"(b), "r"(accumulate));
}}
"""


def _rs(n: int, dtype: str) -> str:
    """D += A * B with A (64 x 16) in registers (the accumulator layout of a previous wgmma, packed to 16 bits)
    and B (16 x N) MN-major in shared memory (trans-b = 1: its rows are the reduction dimension)."""
    r = n // 2
    ty = _PTX_TYPE[dtype]
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    return f"""__device__ __forceinline__ void rs_m64n{n}k16_{dtype}(float (&d)[{r}], const uint32_t (&a)[4], uint64_t b) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 5}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{_regs(0, r)}}}, {{{_regs(r, 4)}}}, %{r + 4}, p, 1, 1, 1;\\n}}\\n"
      : {outs}
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}}
"""


def wrappers(dtype: str, ss_n: Iterable[int], rs_n: Iterable[int]) -> str:
    """C++ for namespace fg::wgmma: ss_m64n{N}k16_{dtype} for each N in ss_n, rs_m64n{N}k16_{dtype} for rs_n, each
    behind an include guard of its own."""
    for n in (*ss_n, *rs_n):
        if n % 8 or not 8 <= n <= 256:
            raise ValueError(f"wgmma N={n}: must be a multiple of 8 in 8..256")
    body = "".join(_guarded(f"ss_m64n{n}k16_{dtype}", _ss(n, dtype)) for n in sorted(set(ss_n))) \
        + "".join(_guarded(f"rs_m64n{n}k16_{dtype}", _rs(n, dtype)) for n in sorted(set(rs_n)))
    return f"namespace fg {{\nnamespace wgmma {{\n{body}}}  // namespace wgmma\n}}  // namespace fg\n"


def _guarded(name: str, definition: str) -> str:
    # kernels of one source (tiles per range of sizes: flashgen.translators.lower.translate) may need the same one
    guard = f"FG_WGMMA_{name.upper()}"
    return f"#ifndef {guard}\n#define {guard}\n{definition}#endif\n"
