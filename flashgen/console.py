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


#: every typer app's settings: no shell completion, our own one-line errors (flashgen.cli), and help read as Markdown
#: (our help strings only, never user text), whose paragraphs wrap to the terminal where typer's "rich" mode keeps
#: the source's line breaks in the command lists
APP_SETTINGS = dict(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown")

out = make_console(soft_wrap=True)
err = make_console(stderr=True, soft_wrap=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings and (text, style) pairs: styled("wrote ", (path, "bold")); no markup read."""
    return Text.assemble(*parts)


def error_line(exc: BaseException | str, label: str = "error") -> Text:
    """`error: MESSAGE` (label in bold red), the message as plain text."""
    return styled((f"{label}:", "bold red"), " ", str(exc))
