"""`flashgen bench`'s tables, readable wherever they are printed: the full rich table in a terminal wide enough for
it; else (a narrower terminal, or stdout not a terminal: a pipe, a log) a plain layout with fewer columns, one block
per shape, that fits the console's width (80 columns when it is not a terminal) and keeps every row, every ratio and
every note. All of it is plain text, never markup (flashgen.console)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

RATIO_NOTE = "× = this row's time / ours (> 1: ours is faster)"
NOTE_CHARS = 70  # what the full table's note column shows of a note (the plain layout wraps it whole)
INDENT = "  "


def print_fitting(console: Console, table: Table, plain: Callable[[int], list[str]]) -> None:
    """`table` where a terminal shows it whole, else the lines `plain(width)`: a table squeezed into fewer columns
    than it needs wraps every cell into an unreadable column, and box characters in a log help nobody."""
    unbounded = console.options.update_width(1 << 16)  # rich clamps a measure to the width it is given
    if console.is_terminal and console.measure(table, options=unbounded).maximum <= console.width:
        console.print(table)
        return
    for line in plain(console.width):
        console.print(Text(line), soft_wrap=True)


def _wrapped(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width=max(width, 20), initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False) or [indent]


# ------------------------------------------------------------------------------------------------ timings


def _title(report) -> str:
    return f"flashgen bench on {report.env.get('gpu')} (target {report.target or '?'})"


def _ratio(entry, ref: float | None) -> str:
    return f"{entry.stats.median_ms / ref:.2f}" if ref and entry.kind == "baseline" and entry.stats else ""


def _note(entry) -> str:
    if entry.stats is None:
        return entry.skipped or entry.error or ""
    return ("UNDERTIMED: " + entry.stats.note) if entry.stats.undertimed else entry.note


def _groups(report):
    """(dtype, variant, shape) -> (its entries, our median there or None: what each ratio divides by)."""
    for key, entries in report.groups().items():
        ours = [e for e in entries if e.kind == "kernel" and e.ok and e.stats is not None]
        yield key, entries, (ours[0].stats.median_ms if ours else None)


def bench_table(report) -> Table:
    """Ours beside each baseline, every column (the terminal's table)."""
    table = Table(title=f"{_title(report)}; {RATIO_NOTE}")
    for col in ("dtype", "variant", "shape", "name", "median ms", "IQR ms", "TFLOP/s", "% roofline", "× (this/ours)",
                "note"):
        table.add_column(col)
    for (dtype, variant, shape), entries, ref in _groups(report):
        for e in entries:
            if e.stats is None:
                table.add_row(dtype, variant, shape, e.name, "-", "-", "-", "-", "-", _note(e)[:NOTE_CHARS])
                continue
            table.add_row(dtype, variant, shape, e.name, f"{e.stats.median_ms:.4g}",
                          f"{e.stats.q1_ms:.3g}-{e.stats.q3_ms:.3g}", f"{e.tflops:.1f}" if e.tflops else "-",
                          f"{e.roofline_pct:.0f}" if e.roofline_pct is not None else "-", _ratio(e, ref),
                          _note(e)[:NOTE_CHARS])
    return table


# the plain layout's number columns (header, width); the IQR stays in the JSON
_NUMBERS = (("median ms", 9), ("TFLOP/s", 8), ("% roof", 6), ("×", 6))


def _number_cells(e, ref: float | None) -> list[str]:
    if e.stats is None:
        return ["-", "-", "-", "-"]
    return [f"{e.stats.median_ms:.4g}", f"{e.tflops:.1f}" if e.tflops else "-",
            f"{e.roofline_pct:.0f}" if e.roofline_pct is not None else "-", _ratio(e, ref)]


def bench_lines(report, width: int = 80) -> list[str]:
    """The plain layout: a title, then per shape its header line and one row per kernel and baseline (name, median
    ms, TFLOP/s, % of the roofline, the ratio), a note on the lines below its row; every line within `width` (a
    name too long for its column gets a line of its own, the numbers on the next)."""
    numbers = "".join(f"  {cell:>{w}}" for cell, w in _NUMBERS)
    names = [e.name for _, entries, _ in _groups(report) for e in entries]
    name_width = max([len("name")] + [len(n) for n in names if len(INDENT) + len(n) + len(numbers) <= width])
    lines = _wrapped(_title(report), width, "") + _wrapped(RATIO_NOTE, width, "")
    for (dtype, variant, shape), entries, ref in _groups(report):
        lines += ["", f"{dtype} {variant} {shape}", INDENT + "name".ljust(name_width) + numbers]
        for e in entries:
            cells = "".join(f"  {cell:>{w}}" for cell, (_, w) in zip(_number_cells(e, ref), _NUMBERS))
            if len(e.name) > name_width:
                lines += _wrapped(e.name, width, INDENT) + [(INDENT + "".ljust(name_width) + cells).rstrip()]
            else:
                lines.append((INDENT + e.name.ljust(name_width) + cells).rstrip())
            if note := _note(e):
                lines += _wrapped(note, width, INDENT * 2)
    return lines


def print_bench(report, console: Console) -> None:
    print_fitting(console, bench_table(report), lambda width: bench_lines(report, width))


# ------------------------------------------------------------------------------------------------ compile-only


def _compiled_row(k) -> tuple[dict, int | str, str]:
    resources = next(iter(k.compile.get("resources", {}).values()), {})
    spills = resources.get("spill_store_bytes", 0) + resources.get("spill_load_bytes", 0) if resources else "-"
    problem = k.build_error or k.compile.get("error") or ""
    return resources, spills, problem.splitlines()[0] if problem else ""


def compiled_table(kernels) -> Table:
    """Per suite kernel: the code path, registers, smem, spills, compile time or the error (every column)."""
    table = Table(title="suite kernels (built and compiled)")
    for col in ("dtype", "variant", "D", "written for", "built for", "regs", "smem B", "spills", "s", "problem"):
        table.add_column(col)
    for k in kernels:
        res, spills, problem = _compiled_row(k)
        table.add_row(k.dtype, k.variant, str(k.head_dim), k.arch or "-", k.compile.get("arch", "-"),
                      str(res.get("registers", "-")), str(res.get("shared_static_bytes", "-")), str(spills),
                      str(k.compile.get("seconds", "-")), problem[:80])
    return table


def compiled_lines(kernels, width: int = 80) -> list[str]:
    """The plain layout: one line per kernel (what it is, then its numbers), its problem on the lines below."""
    lines = ["suite kernels (built and compiled)"]
    for k in kernels:
        res, spills, problem = _compiled_row(k)
        what = (f"{k.dtype} {k.variant} d{k.head_dim}: written for {k.arch or '-'}, built for "
                f"{k.compile.get('arch', '-')}; {res.get('registers', '-')} regs, {res.get('shared_static_bytes', '-')} "
                f"B smem, {spills} B spills, {k.compile.get('seconds', '-')} s")
        lines += _wrapped(what, width, INDENT)
        if problem:
            lines += _wrapped(problem, width, INDENT * 2)
    return lines


def print_compiled(kernels, console: Console) -> None:
    print_fitting(console, compiled_table(kernels), lambda width: compiled_lines(kernels, width))
