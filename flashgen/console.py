"""The one way a command prints: rich consoles with markup and highlighting off, so that user text (a GPU
name, a file name, an error message, an install hint such as `pip install 'flashgen[llm]'`, a run's `[done]`)
prints exactly as it is. Style comes from `styled(...)` pieces or a `style=` argument, never from markup in
strings; table cells and titles are plain text too (the console's markup setting applies to them)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def make_console(*, stderr: bool = False, soft_wrap: bool = False) -> Console:
    """A console that never reads its text as markup (stdout, or stderr for progress and errors)."""
    return Console(stderr=stderr, markup=False, highlight=False, emoji=False, soft_wrap=soft_wrap)


out = make_console(soft_wrap=True)
err = make_console(stderr=True, soft_wrap=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings and (text, style) pairs: styled("wrote ", (path, "bold")); no markup read."""
    return Text.assemble(*parts)


def error_line(exc: BaseException | str, label: str = "error") -> Text:
    """`error: MESSAGE` (label in bold red), the message as plain text."""
    return styled((f"{label}:", "bold red"), " ", str(exc))
