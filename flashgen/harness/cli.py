"""`flashgen verify`, `flashgen bench`, `flashgen runs list|show`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flashgen.errors import FlashgenError, InputError, UsageError, read_text_input

console = Console()


def load_kernel_dir(path: str):
    """A kernel directory (kernel.cu + manifest.json) -> worker.KernelInput; one-line errors."""
    from pydantic import ValidationError

    from flashgen.abi import KernelManifest
    from flashgen.harness.worker import KernelInput

    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such kernel directory")
    if not p.is_dir():
        raise InputError(f"{path}: expected a kernel directory holding kernel.cu and manifest.json")
    missing = [n for n in ("kernel.cu", "manifest.json") if not (p / n).is_file()]
    if missing:
        raise InputError(f"{path}: missing {' and '.join(missing)} (a kernel directory holds kernel.cu and manifest.json)")
    source = read_text_input(str(p / "kernel.cu"))
    try:
        manifest = KernelManifest.model_validate_json(read_text_input(str(p / "manifest.json")))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"{path}/manifest.json: {'.'.join(map(str, first['loc'])) or 'document'}: {first['msg']}") from None
    return KernelInput(manifest=manifest, source=source)


def _record_env(store, run_id: int, env: dict) -> None:
    store.add_event(run_id, "environment", env)


def register(app: typer.Typer) -> None:
    runs_app = typer.Typer(no_args_is_help=True, help="The record of past runs (sqlite under .flashgen/).")
    app.add_typer(runs_app, name="runs")

    @app.command("verify")
    def verify_command(kernel_dir: str = typer.Argument(..., help="directory with kernel.cu + manifest.json"),
                       seed: int = typer.Option(None, help="base seed (default: random, printed)"),
                       timeout: float = typer.Option(300.0, help="seconds before a hung kernel is killed")) -> None:
        """Verify a kernel against the fp64 reference on the GPU (poisoned outputs, reused buffers)."""
        from flashgen.harness.store import Store
        from flashgen.harness.worker import GpuWorker, have_gpu

        kernel = load_kernel_dir(kernel_dir)
        if not have_gpu():
            raise UsageError("no CUDA GPU here (cupy cannot see a device): verification runs kernels")
        store = Store()
        run_id = store.new_run("verify", {"kernel": kernel.label, "dir": str(kernel_dir)})
        store.add_event(run_id, "kernel", {"manifest": kernel.manifest.model_dump(mode="json")},
                        {"kernel.cu": kernel.source or ""})
        with GpuWorker(job_timeout_s=timeout) as worker:
            report = worker.verify(kernel, seed=seed)
        store.add_event(run_id, "verify", report.model_dump(mode="json"), {"summary.txt": report.summary})
        store.finish_run(run_id, "ok" if report.ok else "failed", {"ok": report.ok})
        console.print(report.summary, highlight=False, soft_wrap=True, markup=False)
        console.print(f"[dim]recorded as run {run_id}[/]")
        if not report.ok:
            raise typer.Exit(1)

    @app.command("bench")
    def bench_command(kernel_dirs: list[str] = typer.Argument(None, help="kernel directories (kernel.cu + manifest.json)"),
                      shapes: str = typer.Option(None, help='e.g. "B=8,H=16,N=2048,M=2048,D=128;B=4,..."'),
                      suite: str = typer.Option(None, help="a preset: fa2"),
                      out: str = typer.Option(None, help="JSON path (default benchmarks/results/<date>-<gpu>-<name>.json)"),
                      baselines: bool = typer.Option(True, help="time torch SDPA backends and FlexAttention too"),
                      verify: bool = typer.Option(True, help="verify each kernel before timing it"),
                      min_time: float = typer.Option(0.2, help="seconds of kernel time per measurement"),
                      timeout: float = typer.Option(600.0, help="seconds before the worker is killed")) -> None:
        """Benchmark kernels beside torch SDPA (flash / efficient / cudnn) and FlexAttention."""
        from flashgen.harness.bench import BenchReport, default_output_path, fa2_suite, parse_shapes
        from flashgen.harness.store import Store
        from flashgen.harness.worker import GpuWorker, have_gpu

        kernels = [load_kernel_dir(d) for d in (kernel_dirs or [])]
        if not kernels:
            raise UsageError("give at least one kernel directory (kernel.cu + manifest.json)")
        if suite and shapes:
            raise UsageError("give --shapes or --suite, not both")
        if suite:
            if suite != "fa2":
                raise UsageError(f"unknown suite {suite!r}; known: fa2")
            shape_list = sorted({s for _, _, s in fa2_suite()}, key=lambda s: (s.D, s.N))
        elif shapes:
            try:
                shape_list = parse_shapes(shapes)
            except ValueError as exc:
                raise UsageError(f"--shapes: {exc}") from None
        else:
            raise UsageError('give --shapes "B=..,H=..,N=..,M=..,D=.." or --suite fa2')
        if not have_gpu():
            raise UsageError("no CUDA GPU here (cupy cannot see a device): benchmarking runs kernels")
        store = Store()
        run_id = store.new_run("bench", {"kernels": [k.label for k in kernels], "shapes": [s.model_dump() for s in shape_list]})
        merged = BenchReport()
        with GpuWorker(job_timeout_s=timeout) as worker:
            runnable = []
            for kernel in kernels:
                store.add_event(run_id, "kernel", {"manifest": kernel.manifest.model_dump(mode="json")},
                                {"kernel.cu": kernel.source or ""})
                if verify:
                    report = worker.verify(kernel)
                    store.add_event(run_id, "verify", report.model_dump(mode="json"), {"summary.txt": report.summary})
                    if not report.ok:
                        console.print(f"[red]{escape(kernel.label)} fails verification; not timed[/]")
                        console.print(report.summary, highlight=False, markup=False)
                        continue
                runnable.append(kernel)
            if not runnable:
                store.finish_run(run_id, "failed", {"reason": "no kernel passed verification"})
                raise FlashgenError("no kernel passed verification; nothing timed")
            result = worker.bench(runnable, shape_list, baselines=baselines, timeout_s=timeout, min_time_s=min_time)
        if not result.ok:
            store.add_event(run_id, "bench", {"error": result.error})
            store.finish_run(run_id, "failed", {"error": result.error})
            raise FlashgenError(f"benchmark failed: {(result.error or '').splitlines()[0]}")
        merged = result.value
        store.add_event(run_id, "bench", merged.model_dump(mode="json"))
        path = Path(out) if out else default_output_path(merged.env, suite or "_".join(k.label for k in runnable)[:60])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(merged.model_dump_json(indent=2))
        except OSError as exc:
            raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
        store.finish_run(run_id, "ok", {"json": str(path)})
        print_bench(merged)
        console.print(f"[dim]wrote {path}; recorded as run {run_id}[/]")

    @runs_app.command("list")
    def runs_list(kind: str = typer.Option(None, help="only runs of this kind"),
                  limit: int = typer.Option(30, help="how many, newest first")) -> None:
        """List recorded runs."""
        from flashgen.harness.store import Store

        table = Table(title=f"flashgen runs ({Store().home})")
        for col in ("id", "kind", "status", "created", "meta"):
            table.add_column(col)
        for r in Store().runs(kind=kind, limit=limit):
            table.add_row(str(r.id), r.kind, r.status, r.created, escape(json.dumps(r.meta)[:80]))
        console.print(table)

    @runs_app.command("show")
    def runs_show(run_id: int = typer.Argument(..., help="a run id from `flashgen runs list`")) -> None:
        """Show one run: its events and artifacts."""
        from flashgen.harness.store import Store

        store = Store()
        r = store.run(run_id)
        console.print(f"[bold]run {r.id}[/] {r.kind} [{r.status}] created {r.created} finished {r.finished or '-'}")
        console.print(f"meta: {json.dumps(r.meta)[:500]}", highlight=False, markup=False)
        if r.summary is not None:
            console.print(f"summary: {json.dumps(r.summary)[:500]}", highlight=False, markup=False)
        table = Table()
        for col in ("#", "step", "created", "payload", "artifacts"):
            table.add_column(col)
        for e in store.events(run_id):
            table.add_row(str(e.seq), e.step, e.created, escape(json.dumps(e.payload)[:160]), "\n".join(e.artifacts.values()))
        console.print(table)


def print_bench(report) -> None:
    """Ours beside each baseline, with ratios (ours' time / baseline's: < 1 means ours is faster)."""
    table = Table(title=f"flashgen bench on {report.env.get('gpu')} (target {report.target or '?'})")
    for col in ("dtype", "variant", "shape", "name", "median ms", "IQR ms", "TFLOP/s", "% roofline", "ours/this", "note"):
        table.add_column(col)
    for (dtype, variant, shape), entries in report.groups().items():
        ours = [e for e in entries if e.kind == "kernel" and e.ok]
        ref = ours[0].stats.median_ms if ours else None
        for e in entries:
            if e.stats is None:
                table.add_row(dtype, variant, shape, e.name, "-", "-", "-", "-", "-", escape((e.skipped or e.error or "")[:70]))
                continue
            ratio = f"{ref / e.stats.median_ms:.2f}x" if ref and e.kind == "baseline" else ""
            note = ("UNDERTIMED: " + e.stats.note) if e.stats.undertimed else ""
            table.add_row(dtype, variant, shape, e.name, f"{e.stats.median_ms:.4g}",
                          f"{e.stats.q1_ms:.3g}-{e.stats.q3_ms:.3g}", f"{e.tflops:.1f}" if e.tflops else "-",
                          f"{e.roofline_pct:.0f}" if e.roofline_pct is not None else "-", ratio, escape(note[:70]))
    console.print(table)
