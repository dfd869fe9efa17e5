"""Jupyter displays of the harness's objects, drawn with the kit in flashgen.display (no layer above is imported):

- benchmarks: `benchmark_html(result)` for a suite result (`flashgen bench --suite`, benchmarks/results/*.json)
  or a BenchReport (`flashgen bench`): TF/s against N for ours and each baseline, one panel per dtype, mask and
  head dim, with the ratios (baseline time / ours: > 1 means ours is faster);
- a parameter search: `sweep_html(result)` for a tune.SearchResult: a heat map of TF/s over BLOCK_M x BLOCK_N
  (the best of the other parameters in each cell; why each untimed cell left the search) beside the CPU occupancy
  model's score, and the timed candidates;
- a generate run's trace: `trace_html(run, events)` from the Store: one row per model call (what was asked, what
  came back, the outcome and its feedback, the time, tokens and cost), failures marked and their feedback open;
- a kernel's parts: verification, resources (registers, shared memory, spills), timings, roofline, CUDA source;
- a kernel library index (`library.json`, or the meta.json files of a folder such as generated/).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from flashgen import display as d

OURS = "flashgen"
#: plot colour of each implementation (ours first); others cycle through the rest
COLORS = {OURS: "#d62728", "FLASH": "#1f77b4", "CUDNN": "#2ca02c", "EFFICIENT": "#9467bd", "Flex": "#ff7f0e"}
_SPARE = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


# ---------------------------------------------------------------------------------------------
# A kernel's parts (flashgen.explore puts them together for a Kernel)
# ---------------------------------------------------------------------------------------------

def cuda_html(source: str) -> str:
    return d.code(source, d.pygments_lexer("cuda"), language="cuda")


def verification_html(verification: dict[str, Any] | None) -> str:
    v = verification or {}
    if not v.get("ran"):
        return (d.badge("not run on a GPU", "warn") + " " + d.esc(v.get("summary") or "no GPU here: the TL was "
                "checked and interpreted on the CPU against the fp64 reference, the CUDA compiled; the kernel itself "
                "has not run"))
    summary = str(v.get("summary") or "")
    head, _, rest = summary.partition("\n")
    body = d.status_badge(v.get("ok"), "verified", "verification FAILED") + " " + d.esc(head)
    if rest.strip():
        body += d.details("cases", f'<pre class="fg-code">{d.esc(rest)}</pre>')
    return body


def resources_html(resources: dict[str, dict[str, Any]] | None, launches: Sequence[Any] = ()) -> str:
    """Per kernel function: registers, static and dynamic shared memory, spills, stack; per launch: threads."""
    dynamic = {_get(launch, "kernel"): (_get(launch, "smem_bytes"), _get(launch, "threads")) for launch in launches}
    rows, bad = [], []
    for name, usage in (resources or {}).items():
        smem, threads = dynamic.get(name, (None, None))
        spills = int(usage.get("spill_store_bytes", 0) or 0) + int(usage.get("spill_load_bytes", 0) or 0)
        rows.append((name, usage.get("registers"), usage.get("shared_static_bytes", 0),
                     "-" if smem is None else smem, "-" if threads is None else threads,
                     f"{usage.get('spill_store_bytes', 0)} B stored, {usage.get('spill_load_bytes', 0)} B loaded",
                     usage.get("stack_frame_bytes", 0)))
        bad.append(spills > 0)
    if not rows:
        return d.para("no resources recorded (not compiled)", "fg-note")
    return d.table(("kernel", "registers", "static smem B", "dynamic smem B", "threads", "spills", "stack B"), rows,
                   bad=bad)


def timing_html(timing: dict[str, Any] | None) -> str:
    if not timing:
        return d.para("not timed (no GPU here)", "fg-note")
    ours = timing.get("time_ms")
    rows = [(OURS, ours, "")]
    for name, ms in (timing.get("baselines_ms") or {}).items():
        rows.append((name, ms, f"{ms / ours:.3g}x" if ours and ms else "-"))
    return d.para(f"at {timing.get('shape')}") + d.table(("implementation", "median ms", "ours vs it (its time / "
                                                                                       "ours)"), rows)


def roofline_html(roof: dict[str, Any] | None) -> str:
    if not roof:
        return d.para("no roofline estimate", "fg-note")
    terms = [(k.removesuffix("_s"), v * 1e3) for k, v in roof.items()
             if k.endswith("_s") and isinstance(v, (int, float)) and k not in ("time_s", "serial_time_s")]
    line = (f"lower bound at {roof.get('shape')}: {roof['time_s'] * 1e3:.3g} ms, {roof.get('bound')}-bound"
            + (f", {roof['tflops_at_bound']:.0f} TFLOP/s" if roof.get("tflops_at_bound") else ""))
    return d.para(line) + d.table(("term", "ms"), terms)


# ---------------------------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------------------------

class Series:
    """The points of one benchmark, normalised from a suite result or a BenchReport: panel (dtype, mask, head dim)
    -> implementation -> N -> (ms, TF/s)."""

    def __init__(self, title: str):
        self.title = title
        self.panels: dict[tuple[str, str, int], dict[str, dict[int, tuple[float, float | None]]]] = {}
        self.ours: list[str] = []
        self.failures: list[tuple[str, str]] = []

    def add(self, dtype: str, mask: str, head_dim: int, impl: str, n: int, ms: float, tflops: float | None,
            ours: bool = False) -> None:
        self.panels.setdefault((dtype, mask, head_dim), {}).setdefault(impl, {})[n] = (ms, tflops)
        if ours and impl not in self.ours:
            self.ours.append(impl)

    def implementations(self) -> list[str]:
        seen = list(self.ours)
        for impls in self.panels.values():
            seen += [i for i in impls if i not in seen]
        return seen

    def ratios(self) -> tuple[list[str], list[tuple[tuple[str, str, int], str, dict[str, tuple[float, float, float]]]]]:
        """(baselines, [(panel, ours, {baseline: (geomean, min, max) of baseline ms / ours ms over the N both ran})])."""
        baselines = [i for i in self.implementations() if i not in self.ours]
        out = []
        for key in sorted(self.panels, key=_panel_order):
            impls = self.panels[key]
            for ours in [o for o in self.ours if o in impls]:
                row = {}
                for base in baselines:
                    values = [impls[base][n][0] / impls[ours][n][0] for n in impls[ours]
                              if n in impls.get(base, {}) and impls[ours][n][0] > 0]
                    if values:
                        row[base] = (math.exp(sum(map(math.log, values)) / len(values)), min(values), max(values))
                out.append((key, ours, row))
        return baselines, out


def _panel_order(key: tuple[str, str, int]) -> tuple:
    dtype, mask, head_dim = key
    return (dtype != "fp16", dtype, head_dim, mask != "plain", mask)


def _color(impl: str, order: list[str]) -> str:
    if impl in COLORS:
        return COLORS[impl]
    return _SPARE[order.index(impl) % len(_SPARE)] if impl in order else _SPARE[0]


def suite_series(result, labels: dict[str, str] | None = None) -> Series:
    """A suite result (SuiteResult or its JSON as a dict) as Series; `labels` names the baselines."""
    labels = labels or {}
    env = _get(result, "env") or {}
    title = (f"{env.get('gpu') or _get(result, 'gpu')}: {_get(result, 'suite')} suite, the {_get(result, 'arch_path')} "
             f"code path, commit {env.get('git_commit') or '?'}, {str(_get(result, 'created') or '')[:10]}")
    s = Series(title)
    for row in _get(result, "rows") or []:
        shape = _get(row, "shape")
        key = (_get(row, "dtype"), _get(row, "variant"), int(_get(shape, "D")))
        n = int(_get(shape, "N"))
        ours = _get(row, "ours")
        if ours is not None and _get(ours, "stats") is not None:
            s.add(*key, OURS, n, _get(_get(ours, "stats"), "median_ms"), _get(ours, "tflops"), ours=True)
        elif _get(row, "status") != "timed":
            s.failures.append((f"{key[0]} {key[1]} d{key[2]} N={n}", str(_get(row, "status"))))
        for name, entry in (_get(row, "baselines") or {}).items():
            stats = _get(entry, "stats")
            if stats is not None:
                s.add(*key, labels.get(name, name), n, _get(stats, "median_ms"), _get(entry, "tflops"))
    if not s.ours:
        s.ours.append(OURS)
    return s


def report_series(report, labels: dict[str, str] | None = None) -> Series:
    """A BenchReport (or its JSON dict) as Series: our kernels by manifest name, the baselines by their labels."""
    labels = labels or {}
    env = _get(report, "env") or {}
    s = Series(f"{env.get('gpu') or _get(report, 'target') or 'benchmark'}, {str(_get(report, 'created') or '')[:10]}")
    for entry in _get(report, "entries") or []:
        shape = _get(entry, "shape")
        key = (_get(entry, "dtype"), _get(entry, "variant"), int(_get(shape, "D")))
        n = int(_get(shape, "N"))
        stats = _get(entry, "stats")
        ours = _get(entry, "kind") == "kernel"
        name = _get(entry, "name")
        if stats is None or not _get(entry, "ok"):
            if ours or not _get(entry, "skipped"):
                s.failures.append((f"{name} {key[0]} {key[1]} d{key[2]} N={n}",
                                   str(_get(entry, "error") or _get(entry, "skipped") or "not timed")))
            continue
        s.add(*key, name if ours else labels.get(name, name), n, _get(stats, "median_ms"),
              _get(entry, "tflops"), ours=ours)
    return s


def series_svg(s: Series) -> str:
    """TF/s against N, one panel per (dtype, mask, head dim), one line per implementation (SVG group id
    `series-<implementation>-<panel>`)."""
    keys = sorted(s.panels, key=_panel_order)
    if not keys:
        return d.para("nothing was timed", "fg-note")
    dtypes = sorted({k[0] for k in keys}, key=lambda t: (t != "fp16", t))
    per_row = [[k for k in keys if k[0] == t] for t in dtypes]
    ncols = max(len(r) for r in per_row)
    fig = d.new_figure(2.55 * ncols + 0.4, 2.25 * len(dtypes) + 0.5, "the benchmark plot")
    order = s.implementations()
    axes = fig.subplots(len(dtypes), ncols, squeeze=False, sharey="row")
    handles: dict[str, Any] = {}
    for r, row_keys in enumerate(per_row):
        for c in range(ncols):
            ax = axes[r][c]
            if c >= len(row_keys):
                ax.set_visible(False)
                continue
            key = row_keys[c]
            panel = keys.index(key)
            for impl in order:
                points = s.panels[key].get(impl)
                if not points:
                    continue
                ns = sorted(points)
                ys = [points[n][1] if points[n][1] is not None else float("nan") for n in ns]
                ours = impl in s.ours
                (line,) = ax.plot(ns, ys, marker="o", markersize=3.5 if ours else 2.5, linewidth=2.2 if ours else 1.1,
                                  color=_color(impl, order), label=impl, zorder=3 if ours else 2)
                line.set_gid(f"series-{impl}-{panel}")
                handles.setdefault(impl, line)
            ax.set_xscale("log", base=2)
            ns_all = sorted({n for pts in s.panels[key].values() for n in pts})
            ax.set_xticks(ns_all, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ns_all],
                          fontsize=7)
            ax.minorticks_off()
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{key[0]} {key[1]} d{key[2]}", fontsize=9)
            if r == len(dtypes) - 1:
                ax.set_xlabel("N = M", fontsize=8)
            if c == 0:
                ax.set_ylabel("TFLOP/s", fontsize=8)
    fig.legend([handles[i] for i in order if i in handles], [i for i in order if i in handles], loc="outside upper "
               "center", ncols=len(handles), fontsize=8, frameon=False)
    return d.figure_svg(fig)


def ratios_html(s: Series) -> str:
    baselines, rows = s.ratios()
    if not rows:
        return ""
    multi = len(s.ours) > 1
    headers = ["dtype", "mask", "head dim"] + (["kernel"] if multi else []) + [f"x {b}" for b in baselines]
    body = []
    for (dtype, mask, head_dim), ours, ratios in rows:
        cells = [d.esc(dtype), d.esc(mask), str(head_dim)] + ([d.esc(ours)] if multi else [])
        for b in baselines:
            if b in ratios:
                g, lo, hi = ratios[b]
                cells.append(f'<b style="color:{"#116329" if g >= 1 else "#a40e26"}">{g:.2f}x</b> '
                             f'<span class="fg-note">({lo:.2f}-{hi:.2f})</span>')
            else:
                cells.append("-")
        body.append(cells)
    overall = []
    for b in baselines:
        values = [r[b][0] for _, _, r in rows if b in r]
        if values:
            overall.append(f"{b} {math.exp(sum(map(math.log, values)) / len(values)):.2f}x")
    return (d.heading("Ratios: baseline time / ours (> 1: ours is faster), geomean over N (min-max)", 4)
            + d.table(headers, body, raw=True)
            + (d.para("geomean of the panels: " + ", ".join(overall)) if overall else ""))


def benchmark_html(obj, labels: dict[str, str] | None = None) -> str:
    """A suite result or a BenchReport (objects or their JSON dicts); `labels`: the baselines' names in the plot
    (BASELINE_LABELS: bench and suite pass it, so that this module imports neither)."""
    labels = labels or {}
    s = suite_series(obj, labels) if _get(obj, "rows") is not None else report_series(obj, labels)
    parts = [d.heading(s.title), d.plot_or_note(series_svg, s), ratios_html(s)]
    summary = _get(obj, "summary")
    if summary is not None and _get(summary, "rows"):
        geo = _get(summary, "geomean_speedup") or {}
        parts.append(d.para(f"{_get(summary, 'timed')} of {_get(summary, 'rows')} shapes timed; the suite's geomean: "
                            + ", ".join(f"{labels.get(k, k)} {v:.2f}x" for k, v in geo.items())))
    if s.failures:
        parts.append(d.details(d.badge(f"{len(s.failures)} not timed", "fail"),
                               d.table(("what", "why"), s.failures), open_=True))
    return d.page(*parts)


def benchmark_repr(obj) -> str:
    if _get(obj, "rows") is not None:
        rows = _get(obj, "rows") or []
        return (f"SuiteResult({_get(obj, 'suite')} on {_get(obj, 'gpu')}, {_get(obj, 'arch_path')} path, "
                f"{sum(_get(r, 'status') == 'timed' for r in rows)}/{len(rows)} shapes timed)")
    entries = _get(obj, "entries") or []
    kernels = sorted({_get(e, "name") for e in entries if _get(e, "kind") == "kernel"})
    return f"BenchReport({_get(obj, 'target') or '?'}, {len(entries)} entries, kernels {', '.join(kernels) or '-'})"


# ---------------------------------------------------------------------------------------------
# Parameter search (tune.SearchResult)
# ---------------------------------------------------------------------------------------------

def _shape(text: str):
    from flashgen.variant import Shape

    return Shape.parse(text)


def candidate_tflops(result, candidate) -> float | None:
    """Geomean TF/s of a timed candidate over the search's shapes (None when it was not timed on all of them)."""
    from flashgen.roofline import attention_flops
    from flashgen.variant import Variant

    times = _get(candidate, "times_ms") or {}
    shapes = _get(result, "shapes") or []
    if not shapes or _get(candidate, "dropped") or any(not times.get(s) for s in shapes):
        return None
    variant = Variant.model_validate(_get(result, "variant_fields") or {})
    values = [attention_flops(_shape(s), variant) / (times[s] * 1e-3) / 1e12 for s in shapes]  # bench.tflops
    return math.exp(sum(map(math.log, values)) / len(values))


def _stage(dropped: str | None) -> str:
    """A short reason for a heat-map cell: the stage where the candidate left (check, compile, verify, budget)."""
    if not dropped:
        return ""
    stage, _, why = dropped.partition(":")
    why = why.lower()
    if "spill" in why:
        return "spills"
    if "shared" in why or "smem" in why:
        return "smem"
    if "register" in why or "keeps about" in why:
        return "regs"
    if "multiple of" in why:
        return "warps"
    return stage.strip()


_STAGE_RANK = {"": 9, "no fit": 6, "budget": 5, "time": 4, "verify": 4, "spills": 3, "compile": 3, "regs": 2, "smem": 2,
               "warps": 1, "check": 1}


def sweep_cells(result, x: str = "BLOCK_N", y: str = "BLOCK_M"):
    """(xs, ys, cells): cells[(yv, xv)] = (best TF/s or None, the best candidate's label, why the cell's best got no
    further, the best model score, how many candidates)."""
    cands = _get(result, "candidates") or []
    xs = sorted({int(_get(c, "params")[x]) for c in cands if x in _get(c, "params")})
    ys = sorted({int(_get(c, "params")[y]) for c in cands if y in _get(c, "params")})
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for c in cands:
        p = _get(c, "params")
        if x not in p or y not in p:
            continue
        cell = cells.setdefault((int(p[y]), int(p[x])), {"tflops": None, "label": None, "why": None, "score": None,
                                                          "n": 0})
        cell["n"] += 1
        value = candidate_tflops(result, c)
        if value is not None and (cell["tflops"] is None or value > cell["tflops"]):
            cell["tflops"], cell["label"] = value, _get(c, "label")
        model = _get(c, "model")
        score = _get(model, "score") if model is not None and _get(model, "fits", True) else None
        alive_in_check = not (_get(c, "dropped") or "").startswith("check")
        if score is not None and alive_in_check and (cell["score"] is None or score > cell["score"]):
            cell["score"] = score
        why = _stage(_get(c, "dropped")) or ("no fit" if model is not None and not _get(model, "fits", True) else "")
        if cell["why"] is None or _STAGE_RANK.get(why, 0) > _STAGE_RANK.get(cell["why"], 0):
            cell["why"] = why
    return xs, ys, cells


def _heat(ax, fig, xs, ys, cells, field: str, title: str, cmap: str, fmt: str, gid: str):
    import numpy as np

    grid = np.full((len(ys), len(xs)), np.nan)
    for (yv, xv), cell in cells.items():
        if cell[field] is not None:
            grid[ys.index(yv), xs.index(xv)] = cell[field]
    image = ax.imshow(grid, cmap=cmap, origin="lower", aspect="auto")
    image.set_gid(gid)
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], fontsize=8)
    ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=8)
    ax.set_title(title, fontsize=9)
    finite = grid[np.isfinite(grid)]
    mid = float(finite.mean()) if finite.size else 0.0
    for (yv, xv), cell in cells.items():
        value = cell[field]
        text = format(value, fmt) if value is not None else (cell["why"] or "-")
        ax.text(xs.index(xv), ys.index(yv), text, ha="center", va="center", fontsize=7.5,
                color="white" if value is not None and value < mid else "black")
    if finite.size:
        fig.colorbar(image, ax=ax, shrink=0.85).ax.tick_params(labelsize=7)


def sweep_svg(result, x: str = "BLOCK_N", y: str = "BLOCK_M") -> str:
    xs, ys, cells = sweep_cells(result, x, y)
    if not xs or not ys:
        return d.para(f"the search has no {x} x {y} candidates", "fg-note")
    timed = any(cell["tflops"] is not None for cell in cells.values())
    fig = d.new_figure(9.6 if timed else 5.2, 0.55 * len(ys) + 2.2, "the sweep heat map")
    axes = list(fig.subplots(1, 2)) if timed else [fig.subplots(1, 1)]
    shapes = _get(result, "shapes") or []
    if timed:
        _heat(axes[0], fig, xs, ys, cells, "tflops", f"measured TFLOP/s (geomean of {len(shapes)} shapes; "
              f"{_get(result, 'timer')})", "viridis", ".0f", "heat-tflops")
    _heat(axes[-1], fig, xs, ys, cells, "score", "occupancy model score (CPU)", "cividis", ".1f", "heat-model")
    for ax in axes:
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(y, fontsize=8)
    return d.figure_svg(fig)


def sweep_html(result, x: str = "BLOCK_N", y: str = "BLOCK_M", note: str = "") -> str:
    cands = _get(result, "candidates") or []
    timed = [(candidate_tflops(result, c), c) for c in cands]
    timed = sorted([(v, c) for v, c in timed if v is not None], key=lambda p: -p[0])
    env = _get(result, "environment") or {}
    title = (f"Tile search: {_get(result, 'dtype')} {_get(result, 'variant')} d{_get(result, 'head_dim')} on "
             f"{_get(result, 'target')} ({_get(result, 'arch')})"
             + (f", {env.get('gpu')} {str(_get(result, 'created') or '')[:10]}" if env.get("gpu") else ""))
    shapes = _get(result, "shapes") or []
    stages: dict[str, int] = {}
    for c in cands:
        dropped = _get(c, "dropped")
        stage = (dropped.partition(":")[0] if dropped else "timed" if _get(c, "geomean_ms") is not None
                 else "passed the CPU filters" if not shapes else "not timed")
        stages[stage] = stages.get(stage, 0) + 1
    winner = _get(result, "winner_label")
    rows = []
    for value, c in timed:
        times = _get(c, "times_ms") or {}
        res = next(iter((_get(c, "resources") or {}).values()), {})
        rows.append([d.esc(_get(c, "label")) + (" " + d.badge("winner", "ok") if _get(c, "label") == winner else ""),
                     f"{value:.1f}"] + [f"{times.get(s, float('nan')):.4g}" for s in shapes]
                    + [str(res.get("registers", "-")), str(res.get("spill_store_bytes", "-"))])
    parts = [d.heading(title)]
    if note:
        parts.append(d.para(note, "fg-note"))
    others = sorted(set().union(*(set(_get(c, "params")) for c in cands)) - {x, y}) if cands else []
    parts.append(d.para(f"{len(cands)} candidates: " + ", ".join(f"{n} {k}" for k, n in sorted(stages.items()))
                        + f". Each cell: the best over the other parameters ({', '.join(others) or '-'}), or where "
                        "its candidates left the search (warps, regs, smem: the CPU checks; spills, compile: nvcc; "
                        "budget: not reached)."))
    parts.append(d.plot_or_note(sweep_svg, result, x, y))
    if rows:
        parts.append(d.heading("Timed candidates (verified first)", 4))
        heads = [f"ms at N={sh.N} (B={sh.B}, H={sh.H})" for sh in map(_shape, shapes)]
        parts.append(d.table(["candidate", "TFLOP/s"] + heads + ["registers", "spill B"], rows, raw=True))
    dropped = [(_get(c, "label"), _get(c, "dropped")) for c in cands if _get(c, "dropped")]
    if dropped:
        parts.append(d.details(f"{len(dropped)} dropped, and why", d.table(("candidate", "left the search at"),
                                                                          dropped)))
    return d.page(*parts)


def sweep_repr(result) -> str:
    cands = _get(result, "candidates") or []
    return (f"Sweep({_get(result, 'dtype')} {_get(result, 'variant')} d{_get(result, 'head_dim')} on "
            f"{_get(result, 'target')}: {len(cands)} candidates, "
            f"{sum(_get(c, 'geomean_ms') is not None for c in cands)} timed, winner {_get(result, 'winner_label')})")


# ---------------------------------------------------------------------------------------------
# A generate run's trace (the Store's run and events)
# ---------------------------------------------------------------------------------------------

def _seconds(a: str | None, b: str | None) -> float | None:
    import datetime as dt

    try:
        return (dt.datetime.fromisoformat(b) - dt.datetime.fromisoformat(a)).total_seconds()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def trace_steps(events: Iterable[Any]) -> list[dict[str, Any]]:
    """One step per prompt event: what was asked, what came back (reply), what the harness made of it (result,
    candidate), with the event times."""
    steps: list[dict[str, Any]] = []
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.step == "prompt":
            steps.append({"prompt": p, "asked_at": event.created, "reply": None, "results": [], "candidate": None})
        elif event.step == "resume":
            steps.append({"resume": p, "asked_at": event.created, "reply": None, "results": [], "candidate": None})
        elif steps and event.step == "reply":
            steps[-1]["reply"], steps[-1]["replied_at"] = p, event.created
        elif steps and event.step == "result":
            steps[-1]["results"].append(p)
            steps[-1]["judged_at"] = event.created
        elif steps and event.step == "candidate":
            steps[-1]["candidate"] = p
    return steps


def _message_html(text: str, label: str, open_: bool = False, max_chars: int = 20000) -> str:
    from flashgen.harness.transcript import bounded

    return d.details(f"{d.esc(label)} <span class='fg-note'>{len(text):,} chars</span>",
                     f'<pre class="fg-code" style="max-height:300px;white-space:pre-wrap">'
                     f'{d.esc(bounded(text, max_chars))}</pre>', open_=open_)


def _outcome_html(results: list[dict[str, Any]], candidate: dict[str, Any] | None) -> tuple[str, bool]:
    if not results:
        return d.badge("no outcome recorded", "warn"), True
    parts, failed = [], False
    for r in results:
        phase = r.get("phase")
        if r.get("ok"):
            if phase == "translate":
                timing = r.get("timing") or {}
                text = ("compiled; not verified or timed (no GPU)" if r.get("verified") is None
                        else "compiled, verified" + (f", {timing['time_ms']:.4g} ms at {timing.get('shape')}"
                                                     if timing.get("time_ms") else ""))
            else:
                text = f"the {phase} TL was accepted" + (" (checked and run on the CPU)" if phase == "params" else "")
            parts.append(d.badge("ok", "ok") + " " + d.esc(text))
        else:
            slow = r.get("repair") == "repair_slow"  # correct, but slower than the goal: asked for a faster one
            failed = failed or not slow
            what = ("the reply repeated the previous one" if r.get("repeated") else "slower than the goal" if slow
                    else "not accepted")
            feedback = {k: v for k, v in r.items() if k not in ("phase", "ok", "repair", "repeated")}
            text = "\n".join(f"{k}: {v if isinstance(v, str) else v!r}" for k, v in feedback.items() if v)
            parts.append(d.badge(what, "warn" if slow else "fail") + " " + d.esc(f"{phase}: {r.get('repair')}")
                         + (f'<pre class="fg-code" style="max-height:200px;white-space:pre-wrap">{d.esc(text)}</pre>'
                            if text else ""))
    if candidate and candidate.get("resources"):
        usage = ", ".join(f"{name}: {u.get('registers')} regs, spills {u.get('spill_store_bytes', 0)} B"
                          for name, u in candidate["resources"].items())
        parts.append(f'<div class="fg-note">{d.esc(usage)}</div>')
    return "<br>".join(parts), failed


def trace_html(run, events: Sequence[Any], max_chars: int = 20000) -> str:
    meta = _get(run, "meta") or {}
    provider = meta.get("provider") or {}
    task = (meta.get("loop") or {}).get("task") or {}
    summary = _get(run, "summary") if isinstance(_get(run, "summary"), dict) else {}
    steps = trace_steps(events)
    rows, bad = [], []
    total_tokens, total_cost = 0, 0.0
    for i, step in enumerate(steps, 1):
        if "resume" in step:
            rows.append([str(i), "resume", d.esc(step["resume"].get("plan") or f"from iteration "
                                                 f"{step['resume'].get('from_iteration')}"), "", "", "", ""])
            bad.append(False)
            continue
        prompt, reply = step["prompt"], step["reply"]
        messages = prompt.get("messages") or []
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {"content": ""})
        repair = str(prompt.get("stage", "")).startswith("repair") or prompt.get("stage") == "repeated"
        asked = _message_html(user.get("content", ""), f"{'feedback' if repair else 'prompt'} ({prompt.get('stage')})",
                              max_chars=max_chars)
        if reply is None:
            back, cost_cell, took = d.badge("no reply recorded", "warn"), "", "-"
        else:
            back = _message_html(reply.get("text", ""), f"reply from {reply.get('model') or provider.get('name')}",
                                 max_chars=max_chars)
            if reply.get("refused"):
                back = d.badge(reply["refused"], "fail") + back
            usage = reply.get("usage") or {}
            tokens = int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
            cost = reply.get("cost_usd")
            total_tokens += tokens
            total_cost += cost or 0.0
            cost_cell = (f"{usage.get('input_tokens', 0)} in + {usage.get('output_tokens', 0)} out<br>"
                         + ("cost unknown" if cost is None else f"${cost:.4f}")
                         + (f"<br>{reply['attempts']} attempts" if reply.get("attempts", 1) > 1 else ""))
            model_s = _seconds(step["asked_at"], step.get("replied_at"))
            judge_s = _seconds(step.get("replied_at"), step.get("judged_at"))
            took = (f"model {model_s:.2f} s" if model_s is not None else "") + (
                f"<br>checks {judge_s:.2f} s" if judge_s is not None else "")
        outcome, failed = _outcome_html(step["results"], step["candidate"])
        rows.append([str(reply.get("iteration", i) if reply else i),
                     d.esc(f"{prompt.get('phase')} · {prompt.get('stage')}"), asked, back, outcome, took, cost_cell])
        bad.append(failed)
    label = provider.get("name", "?") + (f" ({provider['model']})" if provider.get("model") else "")
    status = _get(run, "status")
    head = (f"run {_get(run, 'id')}: {_get(run, 'kind')}, provider {label}"
            + (f"; {task.get('target')} ({task.get('arch')}), {task.get('dtype')}, head dim {task.get('head_dim')}"
               if task else ""))
    end = [d.badge(str(status), "ok" if status == "done" else "fail" if status in ("failed", "error") else "warn")]
    if summary.get("reason"):
        end.append(d.esc(summary["reason"]))
    failures = sum(bad)
    facts = (f"{len(steps)} steps, {failures} not accepted, {total_tokens:,} tokens, ${total_cost:.4f}"
             + (f", {_seconds(_get(run, 'created'), _get(run, 'finished')):.1f} s in all"
                if _get(run, "finished") and _seconds(_get(run, "created"), _get(run, "finished")) is not None else ""))
    resume = summary.get("resume") if isinstance(summary.get("resume"), dict) else {}
    return d.page(d.heading(head), "<p>" + " ".join(end) + "</p>", d.para(facts, "fg-note"),
                  d.table(("#", "step", "asked", "came back", "outcome (feedback)", "took", "tokens / cost"), rows,
                          raw=True, bad=bad),
                  d.para(f"resume: {resume['how']}", "fg-note") if resume.get("how") else "")


def trace_repr(run, events: Sequence[Any]) -> str:
    steps = trace_steps(events)
    return f"Trace(run {_get(run, 'id')}, {_get(run, 'status')}, {len(steps)} steps)"


# ---------------------------------------------------------------------------------------------
# A kernel library's index
# ---------------------------------------------------------------------------------------------

def library_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """One index entry (a library.json entry or a generated kernel's meta.json) in the fields the table shows."""
    target = entry.get("target")
    target_name = target.get("name") if isinstance(target, dict) else target
    verification = entry.get("verification") if isinstance(entry.get("verification"), dict) else {}
    timing = entry.get("timings") or entry.get("timing") or {}
    resources = entry.get("resources") or {}
    usage = next(iter(resources.values()), {}) if isinstance(resources, dict) else {}
    ran_on = entry.get("ran_on")
    return {
        "target": target_name, "dtype": entry.get("dtype"), "variant": entry.get("variant"),
        "head_dim": entry.get("head_dim"), "kernel": entry.get("kernel") or entry.get("name") or entry.get("path"),
        "ran": verification.get("ran", entry.get("verified") is not None),
        "ok": verification.get("ok", entry.get("verified")),
        "error": entry.get("error") or ("failed" if entry.get("status") == "failed" else None),
        "ran_on": ran_on.get("name") or ran_on.get("device") if isinstance(ran_on, dict) else ran_on,
        "time_ms": timing.get("time_ms") if isinstance(timing, dict) else None,
        "shape": timing.get("shape") if isinstance(timing, dict) else None,
        "params": entry.get("parameters") or entry.get("params") or {},
        "registers": usage.get("registers"), "spills": usage.get("spill_store_bytes"),
        "backend": entry.get("backend") or ((entry.get("code_path") or {}).get("backend")
                                            if isinstance(entry.get("code_path"), dict) else None),
    }


def library_html(entries: Sequence[dict[str, Any]], title: str = "Kernel library") -> str:
    rows, bad = [], []
    for raw in entries:
        e = library_entry(raw)
        if e["error"]:
            status = d.badge("failed", "fail") + " " + d.esc(str(e["error"])[:200])
        elif not e["ran"]:
            status = d.badge("compiled, not run", "warn")
        else:
            status = d.status_badge(e["ok"], "verified", "verification FAILED") + (
                f' <span class="fg-note">on {d.esc(e["ran_on"])}</span>' if e["ran_on"] else "")
        rows.append([d.esc(e["target"]), d.esc(e["dtype"]), d.esc(e["variant"]), d.esc(e["head_dim"]),
                     d.esc(e["kernel"]), d.esc(e["backend"] or "-"), status,
                     "-" if e["time_ms"] is None else f"{e['time_ms']:.4g} ms at {d.esc(e['shape'])}",
                     d.esc(", ".join(f"{k}={v}" for k, v in e["params"].items())), d.esc(e["registers"]),
                     d.esc(e["spills"])])
        bad.append(bool(e["error"]) or e["ok"] is False)
    counts = {"entries": len(rows), "verified": sum(1 for r in entries if library_entry(r)["ok"]),
              "failed": sum(bad)}
    return d.page(d.heading(title), d.para(", ".join(f"{v} {k}" for k, v in counts.items())),
                  d.table(("target", "dtype", "variant", "head dim", "kernel", "backend", "verification", "time",
                           "parameters", "registers", "spill B"), rows, raw=True, bad=bad))
