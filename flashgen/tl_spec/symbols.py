"""The checker's records: what it knows of each name (Sym) and where it is in the program (Ctx). Their own module,
so that the checker and its Hopper-dataflow rules (roles.py) both use them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flashgen.tl_spec import ast
from flashgen.variant import DType


@dataclass
class Sym:
    name: str
    kind: str  # builtin | param | loop | let | tensor | input (a call-time tensor: a Tensor line, alibi_slopes)
    loc: ast.Loc | None = None
    level: ast.Level | None = None
    dtype: DType | None = None
    shape: tuple[int, ...] | None = None
    written: bool = False
    accumulator: bool = False
    in_loop: bool = False  # allocated or written inside a sequential loop (multi-buffered)
    reported: bool = False
    written_in_loop: bool = False
    probe: tuple[Any, Any] = (None, None)  # values under the two probe assignments
    stages: int | None = None  # a staged shared buffer (Hopper dataflow): its ring's depth
    fixed_dims: tuple[int, ...] = ()  # a call-time tensor: per axis the number its dim is given as, 0 for a size


@dataclass
class Ctx:
    kernel: ast.Kernel | None = None
    seq_depth: int = 0
    grid_done: bool = False  # a non-grid statement has been seen in this kernel
    kernel_tensors: list[Sym] = field(default_factory=list)
