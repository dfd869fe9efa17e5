"""Exploring kernels in a notebook (examples/*.ipynb): each helper returns an object that shows itself in Jupyter
(`_repr_html_`) and prints as one short line.

    from flashgen import explore
    explore.gpu_note()                          # what this machine can run: live on a GPU, else committed results
    explore.attention_map(tl_text)              # the TL interpreted on a small shape beside the fp64 reference
    explore.check(tl_text, reference=...)       # a program of your own: checked, interpreted against your reference,
                                                # translated, compiled, and on a GPU verified and timed
    explore.roofline(kernel)                    # the kernel's dataflow bounded on every GPU of the table
    explore.compare(kernel_a, kernel_b)         # TL and timings side by side
    explore.benchmark()                         # the newest committed Hopper suite result, plotted
    explore.sweep()                             # a tile-parameter search as a heat map (recorded, or run on a GPU)
    explore.trace(kernel)                       # the generate run's steps, from the record
    explore.library("generated")                # a kernel library's index
    explore.targets()                           # the GPU table

The top layer, beside flashgen.api (whose Kernel displays itself through kernel_html here); it never imports
flashgen.api or the agent. Plots need matplotlib, highlighting pygments (`pip install 'flashgen[notebook]'`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flashgen import display as d
from flashgen.errors import UsageError
from flashgen.harness import display as hd
from flashgen.variant import Shape, Variant

REPO_ROOT = Path(__file__).resolve().parents[1]
#: where the committed benchmark results live (a source checkout; pass a folder where the package is installed)
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
Reference = Callable[[np.ndarray, np.ndarray, np.ndarray, float], np.ndarray]


class Shown:
    """Something a notebook shows: HTML for Jupyter, one line for print and repr."""

    def _repr_html_(self) -> str:
        return self.html()

    def html(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------

def have_gpu() -> bool:
    from flashgen.harness.device import have_gpu as _have_gpu

    return bool(_have_gpu())


class GpuNote(Shown):
    def __init__(self, gpu: str | None, results: str):
        self.gpu, self.results = gpu, results

    def text(self) -> str:
        if self.gpu:
            return f"GPU here: {self.gpu}. The cells below run live (generate, verify, time, search)."
        return ("No GPU here: the cells below run from committed results (" + self.results + ") and on the CPU "
                "(the TL interpreter against the fp64 reference, translation, nvcc where installed); nothing is "
                "timed and no kernel runs.")

    def html(self) -> str:
        return d.page("<p>" + d.badge("GPU" if self.gpu else "no GPU", "ok" if self.gpu else "warn") + " "
                      + d.esc(self.text()) + "</p>")

    def __repr__(self) -> str:
        return self.text()


def gpu_note(results: str = "benchmarks/results") -> GpuNote:
    """The first cell of every example notebook: whether this machine runs the kernels, or the notebook shows
    committed results."""
    name = None
    if have_gpu():
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(0)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        except Exception:  # any CUDA trouble: still a GPU, unnamed
            name = "a CUDA GPU"
    return GpuNote(name, results)


# ---------------------------------------------------------------------------------------------
# A kernel (flashgen.api.Kernel, or a folder that `flashgen generate --out` wrote)
# ---------------------------------------------------------------------------------------------

class KernelFiles:
    """A generated folder read back (sketch.tl, kernel.tl, kernel.cu, manifest.json, meta.json, report.md): the
    attributes of a Kernel that the displays use; shows itself like one."""

    def __init__(self, folder: str | Path):
        from flashgen.abi import KernelManifest

        self.out_dir = Path(folder)
        if not (self.out_dir / "kernel.tl").is_file():
            raise UsageError(f"{folder}: not a generated kernel folder (no kernel.tl)")

        def read(name: str) -> str:
            path = self.out_dir / name
            return path.read_text() if path.is_file() else ""

        self.tl, self.sketch, self.source, self.report = (read(n) for n in ("kernel.tl", "sketch.tl", "kernel.cu",
                                                                             "report.md"))
        self.manifest = KernelManifest.model_validate_json(read("manifest.json"))
        self.meta = json.loads(read("meta.json") or "{}")
        self.run_id = None

    @property
    def verified(self) -> bool | None:
        return (self.meta.get("verification") or {}).get("ok")

    def _repr_html_(self) -> str:
        return kernel_html(self)

    def __repr__(self) -> str:
        return kernel_repr(self)


def load(folder: str | Path) -> KernelFiles:
    """A kernel folder written by `flashgen generate` (e.g. generated/h200/bf16/causal_d128)."""
    return KernelFiles(folder)


def kernel_repr(kernel) -> str:
    m = kernel.manifest
    dv = f", dv={m.head_dim_v}" if m.head_dim_v is not None else ""
    return f"Kernel({m.name}, {m.arch}, {m.dtype.value}, d={m.head_dim}{dv}, verified={kernel.verified})"


def kernel_html(kernel) -> str:
    """A kernel: its sketch, full TL and CUDA side by side, verification, resources, timings, roofline."""
    from flashgen.tl_spec.highlight import tl_html

    m, meta = kernel.manifest, kernel.meta or {}
    target = meta.get("target") or {}
    path = meta.get("code_path") or {}
    gen = meta.get("generation") or {}
    title = (f"{m.name}: {m.variant.name}, {m.dtype.value}, head dim {m.head_dim}, "
             f"{target.get('gpu') or target.get('name') or ''} ({m.arch}"
             + (f", {path['backend']} backend" if path.get("backend") else "") + ")")
    facts = []
    if gen:
        facts.append(f"generated by the {gen.get('provider')} provider"
                     + (f" ({gen['model']})" if gen.get("model") else "")
                     + f" in {gen.get('model_calls')} model calls: {gen.get('status')} ({gen.get('reason')})"
                     + (f"; {gen.get('tokens'):,} tokens, ${gen.get('cost_usd') or 0:.4f}" if gen.get("tokens") else ""))
    run_id = getattr(kernel, "run_id", None)
    if run_id is not None:
        facts.append(f"run {run_id} in the record: explore.trace(kernel) shows its steps")
    if getattr(kernel, "out_dir", None) is not None:
        facts.append(f"files in {kernel.out_dir}")
    params = meta.get("parameters") or m.params
    source = meta.get("parameters_source") or {}
    param_line = ", ".join(f"{k}={v}" for k, v in params.items()) + (
        f" (from {source.get('source')}: {source.get('detail')})" if source else "")
    launches = [(launch.kernel, " x ".join(launch.grid), launch.threads, launch.smem_bytes) for launch in m.launches]
    parts = [
        d.heading(title),
        "<p>" + hd.verification_html(meta.get("verification")) + "</p>",
        "".join(d.para(f, "fg-note") for f in facts),
        d.highlight_note(),
        d.columns([("Sketch TL", tl_html(kernel.sketch or "(no sketch)")), ("Full TL", tl_html(kernel.tl or "")),
                   (f"CUDA ({len(kernel.source.splitlines())} lines)", hd.cuda_html(kernel.source))]),
        d.heading("Parameters", 4), d.para(param_line or "-"),
        d.heading("Resources", 4), hd.resources_html(meta.get("resources"), m.launches),
        d.table(("launch", "grid", "threads", "dynamic smem B"), launches),
        d.heading("Timings", 4), hd.timing_html(meta.get("timings")),
        d.heading("Roofline", 4), hd.roofline_html(meta.get("roofline")),
    ]
    return d.page(*parts)


# ---------------------------------------------------------------------------------------------
# A TL program on the CPU: its attention map, and a program of the user's own checked end to end
# ---------------------------------------------------------------------------------------------

def _program(tl):
    from flashgen.tl_spec import parse

    if hasattr(tl, "kernels"):
        return tl
    text = getattr(tl, "tl", tl)
    if not isinstance(text, str):
        raise UsageError("expected TL text, a parsed Program or a kernel (anything with .tl)")
    return parse(text, "<tl>")


def insert_after(tl: str, anchor: str, line: str) -> str:
    """`tl` with `line` added after the first line that holds `anchor`, at that line's indentation (a score or mask
    function is one `Compute` line after the scale line)."""
    lines = tl.splitlines(keepends=True)
    for i, text in enumerate(lines):
        if anchor in text:
            indent = text[:len(text) - len(text.lstrip())]
            return "".join(lines[:i + 1] + [indent + line.strip() + "\n"] + lines[i + 1:])
    raise UsageError(f"no line of the program holds {anchor!r}")


def dense_reference(variant: Variant | None = None, score: Callable | None = None,
                    mask: Callable | None = None) -> Reference:
    """An fp64 reference written densely, as a user states a function: scores s = scale * q k^T (natural units),
    then `score(s, q_pos, k_pos)` (your score function, numpy), the variant's visible keys and `mask(q_pos, k_pos)`
    (True: visible), then the variant's normalisation. k_pos is the key's position, q_pos the query's position on
    the same axis: row i sits at i + M - N (bottom-right aligned; in the TL, `q_idx + M - N`)."""
    from flashgen.reference import attend, visible_mask

    variant = variant or Variant()

    def reference(q, k, v, scale):
        b, h, n, _ = q.shape
        kvh, m = k.shape[1], k.shape[2]
        group = h // kvh
        q_idx, k_idx = np.arange(n)[:, None] + (m - n), np.arange(m)[None, :]  # positions on the key axis
        visible = visible_mask(n, m, variant)
        if mask is not None:
            visible = visible & np.broadcast_to(mask(q_idx, k_idx), (n, m))
        out = np.zeros((b, h, n, v.shape[-1]))
        for bi in range(b):
            for hi in range(h):
                s = scale * (q[bi, hi] @ k[bi, hi // group].T)
                if score is not None:
                    s = np.broadcast_to(score(s, q_idx, k_idx), (n, m)).astype(np.float64)
                out[bi, hi] = attend(s, visible, v[bi, hi // group], variant.norm)[0]
        return out

    return reference


def _variant_reference(variant: Variant) -> Reference:
    from flashgen.reference import attention

    return lambda q, k, v, scale: attention(q, k, v, variant, scale)[0]


def _probe_maps(program, shape: Shape, seed: int, reference: Reference) -> tuple[np.ndarray, np.ndarray]:
    """(P of the TL, P of the reference), each (B, H, N, M): O with V = identity columns is P, so the interpreter
    yields the attention map without a special mode (M > D: one run per D keys)."""
    from flashgen.reference import random_inputs
    from flashgen.tl_spec import interpret
    from flashgen.variant import default_scale

    q, k, _ = random_inputs(shape, seed)
    scale = default_scale(shape.D)
    tl_map = np.zeros((shape.B, shape.H, shape.N, shape.M))
    ref_map = np.zeros_like(tl_map)
    for start in range(0, shape.M, shape.dv):  # V's columns: Dv where V has a head dim of its own
        width = min(shape.dv, shape.M - start)
        v = np.zeros((shape.B, shape.kv_heads, shape.M, shape.dv))
        v[:, :, start + np.arange(width), np.arange(width)] = 1.0
        out = interpret(program, shape, inputs={"Q": q, "K": k, "V": v}, scale=scale).outputs["O"]
        tl_map[..., start:start + width] = out[..., :width]
        ref_map[..., start:start + width] = reference(q, k, v, scale)[..., :width]
    return tl_map, ref_map


def _small_shape(program, n: int | None, m: int | None) -> Shape:
    variant, head_dim = program.variant, program.target.head_dim
    n = n or 256
    return Shape(B=1, H=variant.kv_group, KVH=1, N=n, M=m or n, D=head_dim, DV=program.target.head_dim_v)


class AttentionMap(Shown):
    def __init__(self, tl_map: np.ndarray, ref_map: np.ndarray, shape: Shape, name: str, batch: int, head: int,
                 tolerance: float):
        self.tl_map, self.ref_map, self.shape, self.name = tl_map, ref_map, shape, name
        self.batch, self.head, self.tolerance = batch, head, tolerance
        self.diff = np.abs(tl_map - ref_map)
        self.max_abs_err = float(self.diff.max()) if self.diff.size else 0.0

    @property
    def ok(self) -> bool:
        return self.max_abs_err <= self.tolerance

    def _svg(self) -> str:
        import matplotlib
        from matplotlib.colors import LogNorm, Normalize

        fig = d.new_figure(11.5, 3.9, "the attention map")
        axes = fig.subplots(1, 3)
        b, h = self.batch, self.head
        top = max(float(self.tl_map[b, h].max()), float(self.ref_map[b, h].max()), 1e-300)
        weights = matplotlib.colormaps["magma"].with_extremes(bad="#d9d9d9")  # grey: exactly 0, a masked key
        log = LogNorm(vmin=top * 1e-4, vmax=top, clip=True)
        worst = max(float(self.diff[b, h].max()), 1e-300)
        for ax, data, title, cmap, norm, gid in (
                (axes[0], self.tl_map[b, h], "TL, interpreted (fp64)", weights, log, "map-tl"),
                (axes[1], self.ref_map[b, h], "reference (fp64)", weights, log, "map-reference"),
                (axes[2], self.diff[b, h], f"|difference|, max {self.max_abs_err:.2g}", "Reds",
                 Normalize(0.0, worst), "map-difference")):
            shown = np.where(data > 0, data, np.nan) if gid != "map-difference" else data
            image = ax.imshow(shown, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
            image.set_gid(gid)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query row", fontsize=8)
            ax.tick_params(labelsize=7)
            fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
        return d.figure_svg(fig)

    def html(self) -> str:
        status = d.status_badge(self.ok, f"matches (max |diff| {self.max_abs_err:.2g} <= {self.tolerance:g})",
                                f"DIFFERS: max |diff| {self.max_abs_err:.3g} > {self.tolerance:g}")
        return d.page(d.heading(f"Attention map of {self.name} at {shape_label(self.shape)} (batch {self.batch}, head "
                                f"{self.head})"), f"<p>{status}</p>", d.plot_or_note(self._svg),
                      d.para("Each row is one query's weights over the keys (the probabilities P that multiply V), "
                             "on a log scale; grey: exactly 0 (a masked key).", "fg-note"))

    def __repr__(self) -> str:
        return (f"AttentionMap({self.name} at {shape_label(self.shape)}: max |TL - reference| {self.max_abs_err:.3g}, "
                f"{'ok' if self.ok else 'DIFFERS'})")


def shape_label(shape: Shape) -> str:
    from flashgen.harness.bench import shape_text

    return shape_text(shape)


def attention_map(tl, n: int | None = None, m: int | None = None, *, seed: int = 0, reference: Reference | None = None,
                  batch: int = 0, head: int = 0, tolerance: float = 1e-9) -> AttentionMap:
    """Interpret a TL program (text, Program or kernel) on a small shape (N = M = 256 unless given) and show its
    attention map beside the fp64 reference's (the declared variant's, or `reference(q, k, v, scale) -> O`, e.g.
    dense_reference(score=...)) and their difference."""
    program = _program(tl)
    shape = _small_shape(program, n, m)
    ref = reference or _variant_reference(program.variant)
    tl_map, ref_map = _probe_maps(program, shape, seed, ref)
    name = program.kernels[0].name if program.kernels else "program"
    return AttentionMap(tl_map, ref_map, shape, name, batch, head, tolerance)


#: the shapes a program of one's own is checked at on the CPU: tile tails, N != M both ways
CHECK_SHAPES = ((200, 333), (128, 128), (253, 130))


class Check(Shown):
    """A program of one's own, end to end: checker, CPU interpretation against a reference, translation, nvcc, and on
    a GPU verification and timing."""

    def __init__(self):
        self.stages: list[tuple[str, bool | None, str]] = []  # (stage, ok or None for not run, detail HTML)
        self.program = self.translation_source = self.manifest = None
        self.cpu_errors: list[tuple[str, float]] = []
        self.map: AttentionMap | None = None

    def add(self, stage: str, ok: bool | None, detail: str) -> None:
        self.stages.append((stage, ok, detail))

    @property
    def ok(self) -> bool:
        return all(ok is not False for _, ok, _ in self.stages)

    def html(self) -> str:
        rows = [(d.esc(stage), d.status_badge(ok, "ok", "FAILED", "not run"), detail) for stage, ok, detail in
                self.stages]
        parts = [d.heading("Checked end to end"), d.table(("stage", "result", "detail"), rows, raw=True,
                                                          bad=[ok is False for _, ok, _ in self.stages])]
        if self.map is not None:
            parts += [d.heading(f"Attention map at {shape_label(self.map.shape)}: the TL beside the reference", 4),
                      d.plot_or_note(self.map._svg)]
        return d.page(*parts)

    def __repr__(self) -> str:
        return "Check(" + ", ".join(f"{s}: {'ok' if ok else 'not run' if ok is None else 'FAILED'}"
                                    for s, ok, _ in self.stages) + ")"


def _gpu_for(program, gpu: str | None):
    from flashgen.targets import TARGETS, get_target

    if gpu is not None:
        return get_target(gpu)
    arch = program.target.arch
    same = [t for t in TARGETS.values() if t.arch == arch]
    if not same:
        raise UsageError(f"no GPU of the table has {arch}; pass gpu=")
    return same[-1]  # the newest of that arch in the table (h200 for sm_90, a100 for sm_80)


def check(tl, reference: Reference | None = None, *, gpu: str | None = None, seed: int = 0,
          tolerance: float = 1e-9, shapes: Sequence[tuple[int, int]] = CHECK_SHAPES, time: bool = True) -> Check:
    """Your own TL program (a score or mask function the variants do not describe): the checker; the interpreter on
    the CPU against `reference(q, k, v, scale) -> O` (default: the declared variant's fp64 reference) at tile tails
    and N != M; its attention map; the translation to CUDA (the TL becomes the kernel's reference); nvcc where it is
    installed; on a GPU, verification against the TL's fp64 interpretation and a timing beside the baselines."""
    from flashgen.harness.environment import Environment
    from flashgen.tl_spec import TLSyntaxError, interpret
    from flashgen.tl_spec import check as tl_check

    result = Check()
    try:
        program = _program(tl)
    except TLSyntaxError as exc:
        result.add("parse", False, f'<pre class="fg-code">{d.esc(exc)}</pre>')
        return result
    result.program = program
    target = _gpu_for(program, gpu)
    diagnostics = tl_check(program, target)
    errors = [x for x in diagnostics if getattr(x, "severity", "error") == "error"]
    result.add("check", not errors, d.esc(f"against {target.name}'s budgets: "
                                          + ("; ".join(map(str, diagnostics)) or "no diagnostics")))
    if errors:
        return result
    from flashgen.reference import random_inputs
    from flashgen.variant import default_scale

    ref = reference or _variant_reference(program.variant)
    worst = 0.0
    for n, m in shapes:
        shape = Shape(B=1, H=2 * program.variant.kv_group, KVH=2, N=n, M=m, D=program.target.head_dim,
                      DV=program.target.head_dim_v)
        q, k, v = random_inputs(shape, seed)
        scale = default_scale(shape.D)
        out = interpret(program, shape, inputs={"Q": q, "K": k, "V": v}, scale=scale).outputs["O"]
        err = float(np.max(np.abs(out - ref(q, k, v, scale))))
        result.cpu_errors.append((shape_label(shape), err))
        worst = max(worst, err)
    cpu_ok = bool(worst <= tolerance)
    result.add("CPU: interpreted vs reference", cpu_ok,
               d.esc(", ".join(f"{s}: max |diff| {e:.2g}" for s, e in result.cpu_errors) + f" (tolerance {tolerance:g})"))
    result.map = attention_map(program, 192 if program.target.head_dim >= 96 else 128, seed=seed, reference=ref,
                               tolerance=tolerance)
    env = Environment()
    try:
        source, manifest = env.translate(program_text(program), target)
    except Exception as exc:  # the translator's one-line UsageError/UnsupportedConstruct, shown where it stands
        result.add("translate", False, d.esc(f"{type(exc).__name__}: {exc}"))
        return result
    result.translation_source, result.manifest = source, manifest
    result.add("translate", True, d.esc(f"{manifest.name}: {len(source.splitlines())} lines of CUDA; "
                                        + ("the TL is the kernel's reference (what it computes is not a Variant)"
                                           if manifest.reference_tl else "the variant's fp64 reference")))
    import shutil

    if shutil.which("nvcc") is None:
        result.add("nvcc", None, "nvcc is not installed here")
        result.add("GPU verification", None, "no nvcc here" + ("" if env.gpu_available() else ", and no GPU"))
        return result
    build = env.build(source, manifest, target)
    if not build.ok:
        result.add("nvcc", False, f'<pre class="fg-code">{d.esc(build.feedback[:3000])}</pre>')
        return result
    result.add("nvcc", True, hd.resources_html(build.resources, manifest.launches))
    if not env.gpu_available():
        result.add("GPU verification", None, "no GPU here")
        return result
    try:
        verification = env.verify(source, manifest, build)
        result.add("GPU verification", verification.ok, hd.verification_html(verification.model_dump()))
        if verification.ok and time:
            timing = env.bench(source, manifest, build, target)
            result.add("GPU timing", timing.ran, hd.timing_html(timing.model_dump() if timing.ran else None))
    finally:
        worker = getattr(env, "_gpu_worker", None)
        if worker is not None:
            worker.close()
    return result


def program_text(program) -> str:
    from flashgen.tl_spec import format_program

    return format_program(program)


# ---------------------------------------------------------------------------------------------
# Roofline of a kernel on every target
# ---------------------------------------------------------------------------------------------

class Roofline(Shown):
    def __init__(self, name: str, dtype: str, shape: Shape, flops: float, dram_bytes: float, estimates: list,
                 measured: dict[str, float]):
        self.name, self.dtype, self.shape, self.flops, self.dram_bytes = name, dtype, shape, flops, dram_bytes
        self.estimates, self.measured = estimates, measured  # measured: target name -> TF/s

    @property
    def intensity(self) -> float:
        return self.flops / self.dram_bytes if self.dram_bytes else math.inf

    def _svg(self) -> str:
        from flashgen.targets import TARGETS

        fig = d.new_figure(8.8, 4.6, "the roofline plot")
        ax = fig.subplots()
        xs = np.logspace(0, 4, 200)
        colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                  "#17becf"]
        for i, est in enumerate(self.estimates):
            t = TARGETS[est.target]
            color = colors[i % len(colors)]
            roof = np.minimum(est.tensor_tflops, xs * t.mem_bandwidth_gbs / 1e3)
            (line,) = ax.plot(xs, roof, color=color, linewidth=1.2, label=f"{t.name} ({t.arch})")
            line.set_gid(f"roof-{t.name}")
            attained = self.flops / est.time_s / 1e12
            point = ax.scatter([self.intensity], [attained], color=color, s=28, zorder=3, edgecolors="black",
                               linewidths=0.4)
            point.set_gid(f"bound-{t.name}")
            if t.name in self.measured:
                ax.scatter([self.intensity], [self.measured[t.name]], marker="*", s=120, color=color, zorder=4,
                           edgecolors="black", linewidths=0.5).set_gid(f"measured-{t.name}")
        ax.axvline(self.intensity, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)", fontsize=8)
        ax.set_ylabel("TFLOP/s", fontsize=8)
        ax.set_title(f"{self.name} at {shape_label(self.shape)}: dot = the bound on each GPU"
                     + (", star = measured" if self.measured else ""), fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="lower right", ncols=2)
        return d.figure_svg(fig)

    def html(self) -> str:
        from flashgen.targets import TARGETS

        rows = []
        for est in self.estimates:
            t = TARGETS[est.target]
            rows.append((t.name, t.arch, est.bound, est.time_s * 1e3, self.flops / est.time_s / 1e12,
                         *(v * 1e3 for v in est.terms().values()),
                         "-" if t.name not in self.measured else f"{self.measured[t.name]:.0f}",
                         est.tensor_note or ""))
        return d.page(d.heading(f"Roofline of {self.name} ({self.dtype}) on every GPU of the table"),
                      d.para(f"{self.flops / 1e12:.3g} TFLOP visible work, {self.dram_bytes / 1e9:.3g} GB compulsory "
                             f"DRAM traffic: {self.intensity:.0f} FLOP/byte. The bound is the largest of the terms "
                             "(units overlapping perfectly): no kernel of this dataflow runs faster.", "fg-note"),
                      d.plot_or_note(self._svg),
                      d.table(("target", "arch", "bound", "ms at bound", "TF/s at bound", "tensor ms", "vector ms",
                               "sfu ms", "memory ms", "shared ms", "measured TF/s", "note"), rows))

    def __repr__(self) -> str:
        best = min(self.estimates, key=lambda e: e.time_s)
        return f"Roofline({self.name} on {len(self.estimates)} GPUs; fastest bound {best.target} {best.time_s * 1e3:.3g} ms)"


def roofline(kernel, shape: Shape | str | None = None, targets: Sequence[str] | None = None) -> Roofline:
    """The kernel's dataflow (its TL, interpreted for the operation counts at `shape`, by default the benchmark's
    B=4,H=16,N=M=4096) bounded on every GPU of the table (or `targets`); the kernel's own timing, where it ran,
    as a star."""
    from flashgen.harness.environment import ROOFLINE_SHAPE
    from flashgen.harness.suite import interpreted_counts
    from flashgen.roofline import DRAM_KEYS, attention_flops, estimate
    from flashgen.targets import TARGETS, get_target

    program = _program(kernel)
    variant, head_dim = program.variant, program.target.head_dim
    if isinstance(shape, str):
        shape = Shape.parse(shape)
    big = shape or ROOFLINE_SHAPE
    shape = Shape(B=big.B, H=big.H, KVH=big.H // variant.kv_group, N=big.N, M=big.M, D=head_dim,
                  DV=program.target.head_dim_v)
    counts = interpreted_counts(program, variant, shape)
    dtype = program.target.dtype.value
    chosen = [get_target(t) for t in targets] if targets else list(TARGETS.values())
    estimates = [estimate(counts, t, dtype) for t in chosen]
    flops = attention_flops(shape, variant)
    dram = sum(counts.bytes.get(k, 0.0) for k in DRAM_KEYS) or sum(v for k, v in counts.bytes.items()
                                                                   if k.startswith("global"))
    measured = {}
    meta = getattr(kernel, "meta", None) or {}
    timing = meta.get("timings") or {}
    if timing.get("tflops") and (meta.get("target") or {}).get("name") and timing.get("shape"):
        timed = Shape.parse(timing["shape"])
        if (timed.B, timed.H, timed.kv_heads, timed.N, timed.M) == (shape.B, shape.H, shape.kv_heads, shape.N, shape.M):
            measured[meta["target"]["name"]] = timing["tflops"]
    name = getattr(getattr(kernel, "manifest", None), "name", None) or program.kernels[0].name
    return Roofline(name, dtype, shape, flops, dram, estimates, measured)


# ---------------------------------------------------------------------------------------------
# Two kernels side by side
# ---------------------------------------------------------------------------------------------

class Comparison(Shown):
    def __init__(self, a, b, labels: tuple[str, str]):
        self.a, self.b, self.labels = a, b, labels

    def _side(self, k) -> dict[str, Any]:
        meta = getattr(k, "meta", None) or {}
        usage = next(iter((meta.get("resources") or {}).values()), {})
        timing = meta.get("timings") or {}
        manifest = getattr(k, "manifest", None)
        return {"name": manifest.name if manifest else "-", "params": meta.get("parameters") or
                (manifest.params if manifest else {}), "registers": usage.get("registers"),
                "spills": usage.get("spill_store_bytes"), "verified": (meta.get("verification") or {}).get("ok"),
                "time_ms": timing.get("time_ms"), "shape": timing.get("shape"),
                "bound_ms": ((meta.get("roofline") or {}).get("time_s") or 0) * 1e3 or None,
                "smem": sum(launch.smem_bytes for launch in manifest.launches) if manifest else None}

    def html(self) -> str:
        import difflib

        from flashgen.tl_spec.highlight import tl_html

        sa, sb = self._side(self.a), self._side(self.b)
        keys = sorted(set(sa["params"]) | set(sb["params"]))
        rows = [("kernel", sa["name"], sb["name"])]
        rows += [(f"param {k}", sa["params"].get(k, "-"), sb["params"].get(k, "-")) for k in keys]
        rows += [("registers", sa["registers"], sb["registers"]), ("spill B", sa["spills"], sb["spills"]),
                 ("dynamic smem B", sa["smem"], sb["smem"]), ("verified", sa["verified"], sb["verified"]),
                 ("time ms", sa["time_ms"], sb["time_ms"]), ("roofline bound ms", sa["bound_ms"], sb["bound_ms"])]
        if sa["time_ms"] and sb["time_ms"]:
            rows.append(("speed ratio", "1", f"{sa['time_ms'] / sb['time_ms']:.3g}x ({self.labels[1]} vs "
                                             f"{self.labels[0]})"))
        bad = [r[1] != r[2] and r[0].startswith("param") for r in rows]
        ta, tb = (getattr(k, "tl", "") or "" for k in (self.a, self.b))
        diff = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), self.labels[0], self.labels[1], n=1,
                                         lineterm=""))
        diff_html = "".join(
            f'<span style="background:{"#dafbe1" if line.startswith("+") else "#ffebe9" if line.startswith("-") else "transparent"}">'
            f"{d.esc(line)}</span>\n" for line in diff)
        return d.page(d.heading(f"{self.labels[0]} vs {self.labels[1]}"),
                      d.table(("", self.labels[0], self.labels[1]), rows, bad=bad),
                      d.heading(f"TL difference ({sum(1 for x in diff if x[:1] in '+-') - 2 if diff else 0} lines)", 4),
                      f'<pre class="fg-code">{diff_html or "(the same TL)"}</pre>',
                      d.columns([(self.labels[0], tl_html(ta)), (self.labels[1], tl_html(tb))]))

    def __repr__(self) -> str:
        return f"Comparison({self.labels[0]} vs {self.labels[1]})"


def compare(a, b, labels: tuple[str, str] | None = None) -> Comparison:
    """Two kernels (Kernel objects or generated folders) side by side: parameters, resources, timings, TL diff."""
    a, b = (load(k) if isinstance(k, (str, Path)) else k for k in (a, b))
    names = tuple(getattr(getattr(k, "manifest", None), "name", "kernel") for k in (a, b))
    if labels is None:
        labels = names if names[0] != names[1] else ("A", "B")
    return Comparison(a, b, labels)


# ---------------------------------------------------------------------------------------------
# Recorded results: benchmarks, searches, runs, libraries, targets
# ---------------------------------------------------------------------------------------------

def newest_result(pattern: str = "*-hopper-sm_90-*.json", folder: str | Path | None = None) -> Path:
    """The newest result file matching `pattern`: the latest `created` time it records, then its name (the rule
    benchmarks/readme_figures.py takes for README's figures)."""
    import datetime as dt

    where = Path(folder) if folder is not None else RESULTS_DIR
    found = sorted(where.glob(pattern))
    if not found:
        raise UsageError(f"no result matching {pattern} in {where}")

    def created(path: Path) -> dt.datetime:
        try:
            return dt.datetime.fromisoformat(json.loads(path.read_text())["created"])
        except (ValueError, KeyError, TypeError, OSError):
            return dt.datetime.min.replace(tzinfo=dt.timezone.utc)

    return max(found, key=lambda p: (created(p), p.name))


def benchmark(path: str | Path | None = None):
    """A suite result (default: the newest committed Hopper suite file); it shows itself as TF/s plots and ratios."""
    from flashgen.harness.suite import load_results

    return load_results([str(path or newest_result())])[0]


class Sweep(Shown):
    def __init__(self, result, source: str):
        self.result, self.source = result, source

    def html(self) -> str:
        return hd.sweep_html(self.result, note=self.source)

    def __repr__(self) -> str:
        return hd.sweep_repr(self.result)


def sweep(result=None, *, run: bool | None = None, gpu: str = "h200", dtype: str = "bf16", head_dim: int = 128,
          causal: bool = False, shapes: Sequence[str] = ("B=16,H=16,N=1024,M=1024,D=128",
                                                         "B=4,H=16,N=4096,M=4096,D=128"),
          budget_s: float = 240.0, max_candidates: int | None = 12) -> Sweep:
    """A tile-parameter search shown as a heat map of TF/s over BLOCK_M x BLOCK_N. `result`: a SearchResult or its
    JSON file; by default, on a GPU (or with run=True) a search is run now (`flashgen tune`'s, within `budget_s`),
    else the newest committed search (benchmarks/results/*-tune-*.json) is shown."""
    from flashgen.harness.tune import SearchResult

    if result is not None:
        if isinstance(result, (str, Path)):
            return Sweep(SearchResult.model_validate_json(Path(result).read_text()), f"recorded: {result}")
        return Sweep(result, "")
    if run is None:
        run = have_gpu()
    if not run:
        path = newest_result("*-tune-*.json")
        return Sweep(SearchResult.model_validate_json(path.read_text()),
                     f"recorded on a GPU: {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    from flashgen.harness.tune import GpuTimer, search
    from flashgen.variant import DType

    timer = GpuTimer()
    try:
        found = search(Variant(causal=causal), gpu, DType(dtype), head_dim,
                       [Shape.parse(s.replace("D=128", f"D={head_dim}")) for s in shapes], timer=timer,
                       budget_s=budget_s, max_candidates=max_candidates)
    finally:
        timer.close()
    return Sweep(found, f"searched now on this GPU in {found.seconds:.0f} s (budget {budget_s:g} s)")


def screen(gpu: str = "h200", dtype: str = "bf16", head_dim: int = 128, causal: bool = False) -> Sweep:
    """Today's search space for one kernel, screened on the CPU only (the TL checker's budgets and the translator's
    limits, then the occupancy model's score): what a search would compile and time."""
    from flashgen.harness.tune import SearchResult
    from flashgen.translators.search import resolve_target, screen_candidates
    from flashgen.variant import DType

    target = resolve_target(gpu)
    variant = Variant(causal=causal)
    records = screen_candidates(variant, target, DType(dtype), head_dim)
    result = SearchResult(target=target.name, arch=target.arch, dtype=dtype, variant=variant.name,
                          variant_fields=variant.model_dump(mode="json"), head_dim=head_dim, shapes=[],
                          candidates=records, timer="none (CPU screen)", budget_s=0.0)
    return Sweep(result, "screened on the CPU now: nothing compiled or timed")


class Trace(Shown):
    def __init__(self, run, events):
        self.run, self.events = run, events

    def html(self) -> str:
        return hd.trace_html(self.run, self.events)

    def __repr__(self) -> str:
        return hd.trace_repr(self.run, self.events)


def trace(kernel_or_run, store=None) -> Trace:
    """A generate run's steps from the record: a Kernel (its run_id) or a run id."""
    from flashgen.harness.store import Store

    run_id = getattr(kernel_or_run, "run_id", kernel_or_run)
    if run_id is None:
        raise UsageError("this kernel has no run in the record (read from a folder): pass a run id "
                         "(`flashgen runs list`)")
    store = store or Store()
    return Trace(store.run(int(run_id)), store.events(int(run_id)))


class Library(Shown):
    def __init__(self, entries: list[dict[str, Any]], title: str):
        self.entries, self.title = entries, title

    def html(self) -> str:
        return hd.library_html(self.entries, self.title)

    def __repr__(self) -> str:
        return f"Library({self.title}: {len(self.entries)} entries)"


def library(folder: str | Path = REPO_ROOT / "generated") -> Library:
    """A kernel library's index: `library.json` in `folder` (its entries), else the meta.json of every kernel folder
    under it (generated/ as `flashgen generate` wrote it)."""
    folder = Path(folder)
    index = folder / "library.json"
    if index.is_file():
        data = json.loads(index.read_text())
        entries = data.get("entries", data) if isinstance(data, dict) else data
        entries = list(entries.values()) if isinstance(entries, dict) else list(entries)
        for entry in entries:  # the index holds no resources: its kernel folder's meta.json does
            meta = folder / str(entry.get("path", "")) / "meta.json"
            if "resources" not in entry and entry.get("path") and meta.is_file():
                entry["resources"] = json.loads(meta.read_text()).get("resources")
        return Library(entries, f"Kernel library {folder}")
    metas = sorted(folder.glob("**/meta.json"))
    if not metas:
        raise UsageError(f"{folder}: no library.json and no kernel folders (meta.json)")
    return Library([json.loads(p.read_text()) for p in metas], f"Kernels under {folder}")


class Targets(Shown):
    def __init__(self, targets):
        self.targets = list(targets)

    def html(self) -> str:
        return d.targets_html(self.targets)

    def __repr__(self) -> str:
        return f"Targets({', '.join(t.name for t in self.targets)})"


def targets() -> Targets:
    from flashgen.targets import TARGETS

    return Targets(TARGETS.values())
