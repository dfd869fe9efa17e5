"""Rich displays for Jupyter: the HTML kit every `_repr_html_` of the package is built from (a contract module:
it imports nothing of the layers above; each layer renders its own objects with it: flashgen.tl_spec.highlight,
flashgen.harness.display, flashgen.explore).

The notebook libraries are optional (`pip install -e '.[notebook]'`): matplotlib for the plots, pygments for the
highlighting. Without them a display still shows its tables and text; where a plot or the highlighting would be, one
line says what to install. Plots are matplotlib `Figure`s drawn without pyplot (no backend, no global state) and
inlined as SVG with their text kept as text, so an executed notebook shows them and a test can read them.
"""

from __future__ import annotations

import html
import importlib
from collections.abc import Iterable, Sequence
from typing import Any

from flashgen.errors import FlashgenError

NOTEBOOK_EXTRA = "pip install 'flashgen[notebook]'"
#: the optional packages: module -> the distribution that provides it
OPTIONAL = {"matplotlib": "matplotlib", "pygments": "pygments", "nbformat": "nbformat", "nbclient": "nbclient"}

STYLE = """<style>
.fg{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:13px;line-height:1.4;color:inherit}
.fg h3{font-size:15px;margin:6px 0 4px 0}.fg h4{font-size:13px;margin:8px 0 3px 0}
.fg table.fg-t{border-collapse:collapse;margin:4px 0}
.fg table.fg-t th,.fg table.fg-t td{border:1px solid #d0d7de;padding:2px 7px;text-align:left;vertical-align:top}
.fg table.fg-t th{background:rgba(127,127,127,.12)}
.fg td.num{text-align:right;font-variant-numeric:tabular-nums}
.fg .fg-cols{display:flex;gap:8px;align-items:flex-start}
.fg .fg-col{flex:1 1 0;min-width:0}
.fg pre.fg-code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11.5px;line-height:1.35;margin:0;
 padding:6px;max-height:420px;overflow:auto;border:1px solid #d0d7de;border-radius:4px;white-space:pre}
.fg .fg-badge{display:inline-block;padding:0 7px;border-radius:9px;font-weight:600;font-size:12px}
.fg .fg-ok{background:#dafbe1;color:#116329}.fg .fg-fail{background:#ffebe9;color:#a40e26}
.fg .fg-warn{background:#fff8c5;color:#7d4e00}.fg .fg-info{background:#ddf4ff;color:#0a3069}
.fg .fg-note{color:#57606a;font-size:12px}.fg .fg-missing{color:#7d4e00;font-size:12px}
.fg details>summary{cursor:pointer}
.fg tr.fg-bad td{background:rgba(255,80,80,.10)}
.fg table{font-size:inherit}.fg .fg-plot svg{max-width:100%;height:auto}
</style>"""


class MissingPackage(FlashgenError):
    """An optional notebook package is not installed (one line: what needs it and how to install it)."""


def need(module: str, what: str = "this display") -> Any:
    """The optional `module`, imported; else MissingPackage in one line naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackage(f"{what} needs {OPTIONAL.get(module, module)}: {NOTEBOOK_EXTRA}") from None


def have(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_html(exc: MissingPackage) -> str:
    return f'<p class="fg-missing">{esc(str(exc))}</p>'


# ---------------------------------------------------------------------------------------------
# HTML pieces
# ---------------------------------------------------------------------------------------------

def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def page(*parts: str) -> str:
    """One display: the style once, then its parts, in a `.fg` block."""
    return STYLE + '<div class="fg">' + "".join(parts) + "</div>"


def heading(text: str, level: int = 3) -> str:
    return f"<h{level}>{esc(text)}</h{level}>"


def para(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>"


def badge(text: str, kind: str = "info") -> str:
    """kind: ok | fail | warn | info."""
    return f'<span class="fg-badge fg-{kind}">{esc(text)}</span>'


def status_badge(ok: bool | None, yes: str = "passed", no: str = "FAILED", unknown: str = "not run") -> str:
    return badge(yes, "ok") if ok else badge(unknown, "warn") if ok is None else badge(no, "fail")


def details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


def columns(blocks: Sequence[tuple[str, str]]) -> str:
    """Side by side: (title, HTML body) each."""
    cols = "".join(f'<div class="fg-col"><h4>{esc(title)}</h4>{body}</div>' for title, body in blocks)
    return f'<div class="fg-cols">{cols}</div>'


def num(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, raw: bool = False,
          bad: Iterable[bool] | None = None, cls: str = "fg-t") -> str:
    """An HTML table; cells are escaped unless `raw` (then they are HTML already); numbers are right-aligned.
    `bad`: per row, True marks it (a failure, a dropped candidate)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    flags = list(bad) if bad is not None else None
    body = []
    for i, row in enumerate(rows):
        cells = []
        for cell in row:
            numeric = isinstance(cell, (int, float)) and not isinstance(cell, bool)
            text = num(cell) if numeric else (str(cell) if raw else esc(cell))
            cells.append(f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>")
        mark = ' class="fg-bad"' if flags is not None and i < len(flags) and flags[i] else ""
        body.append(f"<tr{mark}>{''.join(cells)}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def key_values(pairs: Iterable[tuple[str, Any]], raw: bool = False) -> str:
    """A two-column table of (name, value); values are HTML already when `raw`."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v if raw else esc(num(v))}</td></tr>" for k, v in pairs)
    return f'<table class="fg-t"><tbody>{rows}</tbody></table>'


def code(text: str, lexer: Any = None, language: str = "") -> str:
    """A scrollable code block, highlighted with `lexer` (a pygments lexer instance) when pygments is here."""
    highlighted = None
    if lexer is not None:
        try:
            formatters = importlib.import_module("pygments.formatters")
            pygments = importlib.import_module("pygments")
            highlighted = pygments.highlight(text, lexer, formatters.HtmlFormatter(nowrap=True, noclasses=True,
                                                                                 style="default"))
        except ImportError:
            highlighted = None
    body = highlighted if highlighted is not None else esc(text)
    return f'<pre class="fg-code" data-language="{esc(language)}">{body}</pre>'


def pygments_lexer(name: str) -> Any:
    """A pygments lexer by its alias (e.g. 'cuda'), or None without pygments."""
    try:
        lexers = importlib.import_module("pygments.lexers")
    except ImportError:
        return None
    return lexers.get_lexer_by_name(name)


def highlight_note() -> str:
    """One line when the code blocks cannot be highlighted, else ''."""
    return "" if have("pygments") else f'<p class="fg-missing">no highlighting: pygments is not installed ' \
                                        f'({esc(NOTEBOOK_EXTRA)})</p>'


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

def new_figure(width: float, height: float, what: str = "this plot"):
    """A matplotlib Figure drawn without pyplot (no backend state touched); MissingPackage without matplotlib."""
    need("matplotlib", what)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_svg(fig) -> str:
    """The figure as inline SVG, its text kept as text (searchable, selectable), without the XML prologue."""
    import io

    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "axes.unicode_minus": False}):
        fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    start = text.find("<svg")
    return f'<div class="fg-plot">{text[start:] if start >= 0 else text}</div>'


def plot_or_note(draw, *args, **kwargs) -> str:
    """draw(*args, **kwargs) -> SVG HTML, or the one-line note when matplotlib is missing."""
    try:
        return draw(*args, **kwargs)
    except MissingPackage as exc:
        return missing_html(exc)


# ---------------------------------------------------------------------------------------------
# Target (flashgen.targets.Target: the contract layer's own object)
# ---------------------------------------------------------------------------------------------

def target_repr(target) -> str:
    return f"Target({target.name}: {target.marketing_name}, {target.arch}, {target.sm_count} SMs)"


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 4 or 1) == 0:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def target_html(target) -> str:
    peaks = ", ".join(f"{dtype} {tflops:g}" for dtype, tflops in target.peak_tflops.items())
    measured = ", ".join(f"{k} {v:g}" for k, v in target.measured.items()) or "-"
    features = [name for name, on in (("cp.async", target.has_cp_async), ("bf16 mma", target.has_bf16_mma),
                                      ("TMA", target.has_tma)) if on]
    pairs = [
        ("GPU", target.marketing_name), ("arch", f"{target.arch} (compute capability "
                                                 f"{target.compute_capability[0]}.{target.compute_capability[1]})"
                                         + (f", nvcc {target.feature_arch} for its extra instructions"
                                            if target.feature_arch else "")),
        ("SMs", target.sm_count), ("boost clock", f"{target.boost_clock_mhz:g} MHz"),
        ("shared memory", f"{_bytes(target.smem_per_sm_bytes)} per SM, {_bytes(target.smem_per_block_bytes)} per "
                          "block (opt-in)"),
        ("registers", f"{target.regs_per_sm} per SM, at most {target.max_regs_per_thread} per thread"),
        ("threads", f"{target.max_threads_per_sm} per SM, {target.max_threads_per_block} per block, "
                    f"{target.max_blocks_per_sm} blocks per SM"),
        ("L2", _bytes(target.l2_bytes)),
        ("peak TFLOP/s (dense)", peaks),
        ("bandwidth", f"DRAM {target.mem_bandwidth_gbs:g} GB/s, L2 {target.l2_bandwidth_gbs:g} GB/s"),
        ("measured ceilings", measured),
        ("features", ", ".join(features) or "-"),
        ("tensor-core instructions", "; ".join(f"{m.instruction} ({'/'.join(m.input_dtypes)})" for m in target.mma)),
    ]
    if target.aliases:
        pairs.append(("also called", ", ".join(target.aliases)))
    return page(heading(f"{target.name}: {target.marketing_name}"), key_values(pairs))


def targets_html(targets: Iterable) -> str:
    """The whole table, one row per GPU."""
    rows = [(t.name, t.marketing_name, t.arch, t.sm_count, t.peak_tflops.get("fp16") or "-",
             t.peak_tflops.get("bf16") or "-", t.mem_bandwidth_gbs, _bytes(t.smem_per_block_bytes), _bytes(t.l2_bytes))
            for t in targets]
    return page(heading("GPU targets"), table(("name", "GPU", "arch", "SMs", "fp16 TF/s", "bf16 TF/s", "DRAM GB/s",
                                                "smem/block", "L2"), rows))
