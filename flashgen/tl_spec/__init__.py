"""LLM-TL: the language a model writes a kernel's dataflow in (docs/llm-tl.md).

parse(text, filename) -> Program          raises TLSyntaxError (FILE:LINE:COL: message (hint: ...))
check(program, target=None) -> [Diagnostic]
format_program(program) -> str            parse(format_program(p)) == p
interpret(program, shape, seed) -> InterpretResult (outputs O/LSE in fp64, OpCounts)
compare(program, shape, seed) -> CompareResult (max_abs_err, rel_err vs flashgen.reference)
library.render(variant, dtype=, arch=, params=, form=, roles=) -> str; library.load(name, form)

Programs for sm_90 (fp16/bf16) are written in the Hopper dataflow: Role blocks, staged buffers, async copies and the
Acquire/Wait/Release handshakes (docs/llm-tl.md); roles.py holds the checker's rules for it.
"""

from flashgen.tl_spec import ast
from flashgen.tl_spec.checker import check
from flashgen.tl_spec.diagnostics import Diagnostic, TLBudgetError, TLRuntimeError, TLSyntaxError
from flashgen.tl_spec.interpreter import (
    CompareResult,
    InterpretResult,
    compare,
    interpret,
)
from flashgen.tl_spec.parser import parse
from flashgen.tl_spec.printer import format_program

__all__ = [
    "CompareResult",
    "Diagnostic",
    "InterpretResult",
    "TLBudgetError",
    "TLRuntimeError",
    "TLSyntaxError",
    "ast",
    "check",
    "compare",
    "format_program",
    "interpret",
    "parse",
]
