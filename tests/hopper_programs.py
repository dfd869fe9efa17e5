"""Hopper-dataflow programs for the tests/test_tl_hopper_*.py modules: the library's sm_90 rendering and its
mutants (one line dropped, moved or changed)."""

from __future__ import annotations

from flashgen.tl_spec import library
from flashgen.tl_spec.library import PROGRAMS
from flashgen.variant import Shape, Variant

#: sm_90 tiles the sm90 kernel takes: two consumer warpgroups
PARAMS = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8, "STAGES": 2}
#: the variant families (decode_splitkv keeps the plain form on sm_90)
FAMILIES = [name for name, v in PROGRAMS.items() if not v.split_kv]
#: more key tiles than stages, N != M, partial tiles
SHAPE = Shape(B=1, H=2, N=300, M=333, D=64)


def hopper(name: str = "causal", dtype: str = "bf16", params: dict | None = None, head_dim: int = 64,
           variant: Variant | None = None) -> str:
    return library.render(variant or PROGRAMS[name], dtype=dtype, arch="sm_90", params=params or PARAMS,
                          head_dim=head_dim, name=name, roles=True)


def plain(name: str = "causal", dtype: str = "bf16", params: dict | None = None, head_dim: int = 64) -> str:
    return library.render(PROGRAMS[name], dtype=dtype, arch="sm_90", params=params or PARAMS, head_dim=head_dim,
                          name=name, roles=False)


def line_of(text: str, line: str, nth: int = 0) -> int:
    """1-based number of the nth line whose stripped text is `line`."""
    hits = [i for i, t in enumerate(text.splitlines(), 1) if t.strip() == line]
    assert len(hits) > nth, (line, hits)
    return hits[nth]


def drop(text: str, line: str, nth: int = 0) -> str:
    lines = text.splitlines(keepends=True)
    del lines[line_of(text, line, nth) - 1]
    return "".join(lines)


def move_after(text: str, line: str, after: str) -> str:
    """`line` taken out and put after the first line reading `after` (same indentation)."""
    lines = drop(text, line).splitlines(keepends=True)
    at = next(i for i, t in enumerate(lines) if t.strip() == after)
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 1, indent + line + "\n")
    return "".join(lines)


def replace_line(text: str, line: str, new: str, nth: int = 0) -> str:
    lines = text.splitlines(keepends=True)
    i = line_of(text, line, nth) - 1
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + new + "\n"
    return "".join(lines)
