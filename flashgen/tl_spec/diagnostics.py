"""Diagnostics of the TL parser, checker and interpreter: `FILE:LINE:COL: message (hint: ...)`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from flashgen.errors import FlashgenError


class Diagnostic(BaseModel):
    """One problem found in a TL program."""

    file: str = "<tl>"
    line: int = 1
    col: int = 1
    severity: Literal["error", "warning"] = "error"
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        prefix = "" if self.severity == "error" else "warning: "
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{self.file}:{self.line}:{self.col}: {prefix}{self.message}{hint}"


def errors_only(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


class TLSyntaxError(FlashgenError):
    """A TL text that does not parse. `diagnostics` lists every problem; str() is the first one
    (one line, as the CLI prints errors) plus how many more there are."""

    exit_code = 1

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        first = str(self.diagnostics[0]) if self.diagnostics else "syntax error"
        more = len(self.diagnostics) - 1
        super().__init__(first + (f" (and {more} more)" if more > 0 else ""))


class TLRuntimeError(FlashgenError):
    """The interpreter cannot run a program as written (an index out of range of a tile, a name
    with no value, a shape that does not match). The message starts with FILE:LINE:COL."""

    exit_code = 1


class TLBudgetError(TLRuntimeError):
    """The interpreter stopped a program that does far more work than its shape needs (its operation
    budget, `interpreter.op_budget`) or that would allocate an array past its size limit."""
