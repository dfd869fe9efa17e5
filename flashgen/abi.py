"""The kernel contract between translators (and models) and the harness.

A translated kernel is CUDA source plus a KernelManifest. The source defines each entry point as
`extern "C" __global__ void NAME(const FlashgenAttnParams p)` (flashgen/include/flashgen_abi.cuh);
the manifest says how to launch them, in order. Grid sizes are small integer expressions over the
runtime sizes, evaluated by `eval_size` (no Python eval).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from flashgen.variant import DType, Variant

ABI_HEADER = Path(__file__).parent / "include" / "flashgen_abi.cuh"
ABI_INCLUDE = "flashgen_abi.cuh"
_LAUNCH_BOUNDS = r"(?:__launch_bounds__\([^)]*\)\s+)?"
# CUDA accepts __launch_bounds__ either before or after the return type.
ENTRY_SIGNATURE = re.compile(
    r'extern\s+"C"\s+__global__\s+' + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS
    + r"(\w+)\s*\(\s*const\s+FlashgenAttnParams\s+\w+\s*\)"
)

SIZE_NAMES = ("B", "H", "KVH", "N", "M", "D", "SPLITS")


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kernel: str = Field(description="entry symbol, extern \"C\"")
    grid: tuple[str, str, str] = Field(description="expressions over B,H,KVH,N,M,D,SPLITS; cdiv(a,b) allowed")
    threads: int = Field(ge=32, le=1024)
    smem_bytes: int = Field(default=0, ge=0, description="dynamic shared memory")


class KernelManifest(BaseModel):
    """Everything the harness needs to run and check a kernel, besides its source."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arch: str = Field(description="compute capability it was written for, e.g. sm_80")
    dtype: DType
    head_dim: int
    variant: Variant
    launches: list[Launch]
    workspace_floats: str = Field(default="0", description="fp32 workspace size, an expression like the grid's")
    num_splits: str = Field(default="1", description="split-KV chunk count, an expression over the sizes")
    params: dict[str, int | str] = Field(default_factory=dict, description="tile parameters, for the record")
    reference_tl: str | None = Field(
        default=None,
        description="a full TL program whose fp64 interpretation is the reference, for kernels that compute "
        "something `variant` does not describe (a custom mask or score function); None: flashgen.reference",
    )
    notes: str = ""


class FlashgenAttnParams(ctypes.Structure):
    """Host mirror of the C struct, field for field (a test compiles the header and compares offsets)."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        *[(f"{t}_stride_{a}", ctypes.c_longlong) for t, axes in (("q", "bhn"), ("k", "bhm"), ("v", "bhm"), ("o", "bhn")) for a in axes],
        ("lse_stride_b", ctypes.c_longlong),
        ("lse_stride_h", ctypes.c_longlong),
        ("batch", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int),
        ("num_splits", ctypes.c_int),
        ("scale", ctypes.c_float),
    ]


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(.))")


def eval_size(expr: str, sizes: dict[str, int]) -> int:
    """Evaluate an integer size expression: + - * / (floor) % parentheses, names from `sizes`,
    and cdiv(a, b) / max(a, b) / min(a, b). Raises ValueError on anything else."""
    tokens: list[tuple[str, str]] = []
    for num, name, op in _TOKEN.findall(expr):
        if num:
            tokens.append(("num", num))
        elif name:
            tokens.append(("name", name))
        elif op.strip():
            if op not in "+-*/%(),":
                raise ValueError(f"size expression {expr!r}: unexpected {op!r}")
            tokens.append(("op", op))
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def take(value: str | None = None) -> tuple[str, str]:
        nonlocal pos
        tok = peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ValueError(f"size expression {expr!r}: expected {value or 'a term'}")
        pos += 1
        return tok

    def atom() -> int:
        kind, text = take()
        if kind == "num":
            return int(text)
        if kind == "op" and text == "(":
            value = add()
            take(")")
            return value
        if kind == "op" and text == "-":
            return -atom()
        if kind == "name" and text in ("cdiv", "max", "min"):
            take("(")
            a = add()
            take(",")
            b = add()
            take(")")
            return {"cdiv": lambda: -(-a // b), "max": lambda: max(a, b), "min": lambda: min(a, b)}[text]()
        if kind == "name" and text in sizes:
            return int(sizes[text])
        raise ValueError(f"size expression {expr!r}: unknown name {text!r}")

    def mul() -> int:
        value = atom()
        while (tok := peek()) and tok[1] in ("*", "/", "%"):
            take()
            rhs = atom()
            value = value * rhs if tok[1] == "*" else value // rhs if tok[1] == "/" else value % rhs
        return value

    def add() -> int:
        value = mul()
        while (tok := peek()) and tok[1] in ("+", "-"):
            take()
            rhs = mul()
            value = value + rhs if tok[1] == "+" else value - rhs
        return value

    result = add()
    if peek() is not None:
        raise ValueError(f"size expression {expr!r}: trailing {peek()[1]!r}")
    return result
