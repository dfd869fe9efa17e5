"""`flashgen library build SPEC.toml --out DIR`, `flashgen library diff OLD NEW`, `flashgen library show DIR`,
`flashgen library pick DIR --gpu ...`: progress on stderr (rich), the summary table on stdout, `--json` for
machines."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from flashgen.console import APP_SETTINGS, err, out, styled

library_app = typer.Typer(no_args_is_help=True, **APP_SETTINGS,
                          help="Build kernel libraries across cores, GPUs and Ray clusters (docs/batch.md).")


_LABELS = {"build": "build (TL, translate, nvcc)", "gpu": "gpu (verify, bench)",
           "search": "search (candidates on the CPU, timed on the GPU)"}


class RichReporter:
    """Per-stage counts: live bars on a terminal, one line per finished entry elsewhere (logs)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.live = enabled and err.is_terminal
        self.progress = None
        self.tasks: dict[str, int] = {}
        self.failed = {"build": 0, "gpu": 0, "search": 0}
        self.totals: dict[str, int] = {}

    def start(self, totals: dict[str, int]) -> None:
        self.totals = dict(totals)
        if not self.enabled:
            return
        searches = totals.get("search", 0)
        kept = totals["plan"] - totals["build"] - searches
        line = f"library: {totals['plan']} entries, {totals['build']} to build, {kept} kept (same key)"
        line += f", {searches} to search on their GPU (then built or kept)" if searches else ""
        err.print(line + (f", {totals['gpu']} for the GPUs" if totals["gpu"] else ""))
        if not self.live:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err, transient=False)
        self.progress.start()
        if searches:
            self.tasks["search"] = self.progress.add_task(_LABELS["search"], total=searches)
        self.tasks["build"] = self.progress.add_task(_LABELS["build"], total=totals["build"])
        self.tasks["gpu"] = self.progress.add_task(_LABELS["gpu"], total=totals["gpu"])

    def add(self, stage: str, count: int) -> None:
        self.totals[stage] = self.totals.get(stage, 0) + count
        if self.progress is not None and stage in self.tasks:
            self.progress.update(self.tasks[stage], total=self.totals[stage])

    def advance(self, stage: str, ok: bool, path: str) -> None:
        self.failed[stage] = self.failed.get(stage, 0) + (not ok)
        if self.progress is not None and stage in self.tasks:
            failed = f", {self.failed[stage]} failed" if self.failed[stage] else ""
            self.progress.update(self.tasks[stage], advance=1, description=_LABELS[stage] + failed)
        elif self.enabled:
            err.print(f"{stage} {'ok' if ok else 'FAILED'} {path}")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _summary_table(summary) -> Table:
    errors = any(row.error for row in summary.rows)
    tuned = any(row.params_from for row in summary.rows)
    table = Table(title=f"library {summary.out}: {summary.entries} entries, {summary.built} built, {summary.kept} "
                        f"kept, {summary.failed} failed; {summary.wall_s:.1f} s",
                  caption="ran on 'estimated': compiled and estimated (no GPU of its target here); bound: the "
                          "roofline's lower bound at B=4, H=16, N=M=4096"
                          + ("; params: from the search on the entry's GPU (this run's, or the one recorded for the "
                             "same inputs), or the fallback (the packaged or default tables)" if tuned else ""))
    for col in ("entry", "status", "did", *(("params",) if tuned else ()), "ran on", "ms", "x best", "bound ms", "s",
                *(("error",) if errors else ())):
        table.add_column(col, no_wrap=col != "error", overflow="fold")
    for row in summary.rows:
        ran_on = "estimated" if row.ran_on == "compiled and estimated" else row.ran_on
        table.add_row(row.path, row.status, row.action, *((row.params_from or "-",) if tuned else ()), ran_on,
                      f"{row.time_ms:.4g}" if row.time_ms is not None else "-",
                      f"{row.speedup:.2f}" if row.speedup is not None else "-",
                      f"{row.roofline_ms:.3g}" if row.roofline_ms is not None else "-",
                      f"{row.seconds:.1f}" if row.seconds is not None else "-",
                      *(((row.error or "")[:160],) if errors else ()))
    return table


@library_app.command("build")
def build_command(
    spec: str = typer.Argument(..., help="the spec (TOML): gpus, dtypes, variants, head_dims, [provider], [gpu]"),
    out_dir: str | None = typer.Option(None, "--out", help="the library folder (made, or finished: entries whose "
                                       "key is unchanged are kept); default: the spec's `out`"),
    engine: str = typer.Option("local", "--engine", help="local (process pool + one worker per GPU) or ray"),
    address: str | None = typer.Option(None, "--address", help="with --engine ray: the cluster (ray://HOST:10001, "
                                       "HOST:6379 or auto); default: a new local Ray"),
    jobs: int | None = typer.Option(None, "--jobs", min=1, help="CPU build processes (default: the usable cores)"),
    gpus: str | None = typer.Option(None, "--gpus", help="CUDA devices for the GPU stages, e.g. 0,1, or none "
                                    "(default: every visible GPU)"),
    retune: bool = typer.Option(False, "--retune", help='tuned = "search": search again on the GPUs here, even where '
                                "a search for the same inputs is recorded (an entry whose search chooses the same "
                                "parameters is kept)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON (stdout) instead of a table"),
) -> None:
    """Build a kernel library: every entry of the spec, CPU stages over the cores, GPU stages on its target's GPUs
    (with tuned = "search": each entry's parameters searched on its GPU first)."""
    from flashgen.errors import Interrupted, Stopped
    from flashgen.library.job import build
    from flashgen.library.spec import load_spec

    parsed = load_spec(spec)
    chosen = None
    if gpus is not None:
        from flashgen.library.gpus import local_gpus, parse_gpu_list

        chosen = parse_gpu_list(gpus, local_gpus() if gpus.strip().lower() != "none" else [])
    reporter = RichReporter(enabled=True)
    try:
        summary = build(parsed, out_dir, engine=engine, address=address, jobs=jobs, gpus=chosen, reporter=reporter,
                        retune=retune)
    except Interrupted as exc:
        raise Stopped(str(exc), exc.signal_name) from None
    finally:
        reporter.stop()
    if as_json:
        typer.echo(summary.model_dump_json(indent=2))
    else:
        out.print(_summary_table(summary))
        folder = Path(summary.out)
        out.print(styled("wrote ", (str(folder / "library.json"), "bold"), " and ", str(folder / "library.md"),
                         f"; plan {summary.plan_s:.1f} s, builds {summary.build_cpu_s:.0f} s of work in "
                         f"{summary.wall_s:.0f} s wall on {summary.engine.cpu_workers if summary.engine else 0} CPU "
                         f"workers"
                         + (f"; {summary.searched} searched ({summary.search_cpu_s:.0f} s of candidates, "
                            f"{summary.search_gpu_s:.0f} s on the GPUs), {summary.fallback} on the fallback parameters"
                            if summary.searched or summary.fallback else "")))
    if summary.failed:
        raise typer.Exit(1)


@library_app.command("show")
def show_command(
    folder: str = typer.Argument(..., help="a library folder"),
    as_json: bool = typer.Option(False, "--json", help="print the index"),
) -> None:
    """The library's entries: status, code path, where each ran, timings."""
    from flashgen.library.index import index_text, read_index, summary_markdown

    index = read_index(folder, missing_ok=False)
    typer.echo(index_text(index) if as_json else summary_markdown(index), nl=False)


@library_app.command("diff")
def diff_command(
    old: str = typer.Argument(..., help="the older library folder"),
    new: str = typer.Argument(..., help="the newer library folder"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """What changed between two libraries, entry by entry, with the speed of each changed kernel."""
    from flashgen.library.index import diff

    rows = diff(old, new)
    if as_json:
        typer.echo(json.dumps([r.model_dump() | {"speed": r.speed} for r in rows], indent=2))
        return
    changed = [r for r in rows if r.change != "same"]
    table = Table(title=f"{old} -> {new}: {len(changed)} of {len(rows)} entries changed")
    for col in ("entry", "change", "what", "old ms", "new ms", "old/new"):
        table.add_column(col)
    for r in changed:
        table.add_row(r.path, r.change, ", ".join(r.what) or "-", f"{r.old_ms:.4g}" if r.old_ms else "-",
                      f"{r.new_ms:.4g}" if r.new_ms else "-", f"{r.speed:.2f}x" if r.speed else "not timed")
    out.print(table)


@library_app.command("pick")
def pick_command(
    folder: str = typer.Argument(..., help="a library folder"),
    gpu: str | None = typer.Option(None, "--gpu", help="default: the GPU present"),
    dtype: str = typer.Option("fp16", "--dtype"),
    variant: str = typer.Option("plain", "--variant", help="plain, causal, ... (the folder names)"),
    head_dim: int = typer.Option(128, "--head-dim"),
    head_dim_v: int | None = typer.Option(None, "--head-dim-v", help="V's and O's own head dim (default: --head-dim)"),
) -> None:
    """Print the folder of the library's kernel for a call (or say in one line why none fits)."""
    from flashgen.library.index import load

    kernel = load(folder).pick(gpu=gpu, dtype=dtype, head_dim=head_dim, variant=variant, head_dim_v=head_dim_v)
    typer.echo(str(kernel.out_dir))


def register(app: typer.Typer) -> None:
    app.add_typer(library_app, name="library")
