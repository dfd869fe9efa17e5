"""Inlining our headers into a generated source: each `#include "flashgen/x.cuh"` becomes the header's text behind an
include guard, so a kernel is self-contained but for flashgen_abi.cuh (and several kernels of one arch can share a
translation unit). Shared by the skeleton renderer (render.py) and backends that render themselves (sm90)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from flashgen.errors import UsageError
from flashgen.translators.backends.base import SHARED_INCLUDE

_INCLUDE = re.compile(r'^\s*#include\s+"(flashgen/[\w./]+)"\s*$', re.MULTILINE)


def inline_headers(source: str, include_dirs: Sequence[Path] = (SHARED_INCLUDE,)) -> str:
    """Replace each `#include "flashgen/x.cuh"` with the header's text (the first of `include_dirs` that has it)
    behind an include guard."""
    def find(rel: str) -> Path:
        for root in include_dirs:
            if (root / rel).is_file():
                return root / rel
        raise UsageError(f"header {rel} not found in {', '.join(map(str, include_dirs))}")

    def expand(text: str, seen: set[str]) -> str:
        def repl(match: re.Match) -> str:
            rel = match.group(1)
            guard = "FG_INLINED_" + re.sub(r"\W", "_", rel).upper()
            if rel in seen:
                return ""
            seen.add(rel)
            body = find(rel).read_text().replace("#pragma once\n", "")
            return f"#ifndef {guard}\n#define {guard}\n// ---- {rel} ----\n{expand(body, seen)}\n#endif  // {guard}"
        return _INCLUDE.sub(repl, text)
    return expand(source, set())
