"""`flashgen verify`, `flashgen bench`, `flashgen runs list|show`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from flashgen.console import APP_SETTINGS, styled
from flashgen.console import out as console
from flashgen.errors import FlashgenError, InputError, UsageError, read_text_input
from flashgen.harness.bench_tables import print_bench, print_compiled


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
    runs_app = typer.Typer(no_args_is_help=True, **APP_SETTINGS, help="The record of past runs (sqlite under $FLASHGEN_HOME, else "
                                                      "$XDG_STATE_HOME/flashgen, else ~/.local/state/flashgen).")
    app.add_typer(runs_app, name="runs")

    @app.command("verify")
    def verify_command(kernel_dir: str = typer.Argument(..., help="directory with kernel.cu + manifest.json"),
                       seed: int = typer.Option(None, help="base seed (default: random, printed)"),
                       timeout: float = typer.Option(300.0, help="seconds before a hung kernel is killed")) -> None:
        """Verify a kernel against the fp64 reference on the GPU (poisoned outputs, reused buffers)."""
        from flashgen.harness.store import Store
        from flashgen.harness.worker import GpuWorker, have_gpu

        _positive("--timeout", timeout)
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
        console.print(report.summary)
        console.print(f"recorded as run {run_id}", style="dim")
        if not report.ok:
            raise typer.Exit(1)

    @app.command("bench")
    def bench_command(kernel_dirs: list[str] = typer.Argument(None, help="kernel directories (kernel.cu + manifest.json); "
                                                              "or `report RESULTS.json...` to render suite results"),
                      shapes: str = typer.Option(None, help='e.g. "B=8,H=16,N=2048,M=2048,D=128;B=4,..."'),
                      suite: str = typer.Option(None, help="a preset: fa2, hopper (with d256), variants (the variants beside plain at bf16 d128 4k), or headdims (head dims such as 40, 80, 112 beside the native ones, bf16 4k). Without kernel directories our kernels are "
                                                "built for it (expert pipeline), verified and timed"),
                      gpu: str = typer.Option(None, help="the GPU the suite builds for (default: the one present)"),
                      arch_path: str = typer.Option(None, help="suite: the code path to build, sm_90, sm_80 or sm_75 "
                                                    "(default: the GPU's own); compiled for the GPU present"),
                      select: str = typer.Option(None, help="suite: only rows matching all these words, e.g. "
                                                 "fp16,d64,causal,n4096"),
                      compile_only: bool = typer.Option(False, "--compile-only", help="suite: build and compile the "
                                                        "kernels (no GPU needed), report registers, smem and spills"),
                      jobs: int = typer.Option(None, help="suite: parallel nvcc processes (default: all cores)"),
                      out: str = typer.Option(None, help="JSON path (default benchmarks/results/DATE-GPU-NAME.json)"),
                      baselines: bool = typer.Option(True, help="time torch SDPA backends and FlexAttention too"),
                      flex: bool = typer.Option(True, help="time FlexAttention among the baselines"),
                      flex_compile: str = typer.Option(None, help="dynamic (one compile per dtype/D/mask, reused "
                                                       "across N; the suite's default) or static (one per shape)"),
                      verify: bool = typer.Option(True, help="verify each kernel before timing it"),
                      min_time: float = typer.Option(None, help="seconds of kernel time per measurement "
                                                     "(default 0.2; 0.1 for a suite)"),
                      rounds: int = typer.Option(None, help="rounds the kernels of a shape and their baselines are "
                                                 "timed in together, ours first then last, samples pooled (default 4 "
                                                 "with baselines, else 1): a card at its power cap clocks down "
                                                 "whatever runs first"),
                      settle: float = typer.Option(None, help="seconds the first kernel of each shape runs untimed "
                                                   "before its rounds, so that the card's clock settles under its "
                                                   "power cap first (default 0.3; 0: none)"),
                      settle_each: bool = typer.Option(None, "--settle-each/--no-settle-each",
                                                       help="before each timed block of the rounds, run its kernel "
                                                       "untimed as long again, so that each block runs under its own "
                                                       "kernel's power draw, not the previous one's (default off: "
                                                       "bench.BENCH_SETTLE_EACH)"),
                      timeout: float = typer.Option(600.0, help="seconds before the worker is killed"),
                      doc: str = typer.Option(None, help="report: the markdown file to write (e.g. docs/performance.md)")
                      ) -> None:
        """Benchmark kernels beside torch SDPA (flash / efficient / cudnn) and FlexAttention; with
        `--suite fa2` and no kernel directories, build our kernels for the whole suite and time them;
        `flashgen bench report RESULTS.json... --doc docs/performance.md` renders suite results."""
        _positive("--timeout", timeout)
        if min_time is not None:
            _positive("--min-time", min_time)
        if rounds is not None and rounds < 1:
            raise UsageError("--rounds must be at least 1")
        if settle is not None and not (settle >= 0 and settle != float("inf")):  # NaN fails the first test
            raise UsageError(f"--settle {settle:g}: must be a number of seconds, 0 or more")
        from flashgen.harness.bench import BENCH_ROUNDS, BENCH_SETTLE_EACH, BENCH_SETTLE_S

        settle = BENCH_SETTLE_S if settle is None else settle
        settle_each = BENCH_SETTLE_EACH if settle_each is None else settle_each

        rounds = rounds if rounds is not None else (BENCH_ROUNDS if baselines else 1)
        dirs = list(kernel_dirs or [])
        if dirs and dirs[0] == "report":
            return _report(dirs[1:], doc)
        if doc:
            raise UsageError("--doc belongs to `flashgen bench report RESULTS.json...`")
        if flex_compile is not None and flex_compile not in ("dynamic", "static"):
            raise UsageError(f"--flex-compile must be dynamic or static, got {flex_compile!r}")
        flex_mode = "off" if not flex else (flex_compile or ("dynamic" if suite and not dirs else "static"))
        if suite and not dirs:
            return _suite(suite, gpu, arch_path, select, compile_only, jobs, out, baselines, flex_mode,
                          0.1 if min_time is None else min_time, timeout, rounds, settle, settle_each=settle_each)
        for name, given in (("--gpu", gpu), ("--arch-path", arch_path), ("--select", select), ("--jobs", jobs)):
            if given is not None:
                raise UsageError(f"{name} applies to a suite built from our kernels (--suite fa2 without kernel directories)")
        if compile_only:
            raise UsageError("--compile-only applies to --suite fa2 without kernel directories")
        min_time = 0.2 if min_time is None else min_time
        from flashgen.harness.bench import (
            SUITE_GRIDS,
            default_output_path,
            parse_shapes,
        )
        from flashgen.harness.store import Store
        from flashgen.harness.worker import GpuWorker, have_gpu

        kernels = [load_kernel_dir(d) for d in dirs]
        if not kernels:
            raise UsageError("give at least one kernel directory (kernel.cu + manifest.json), or --suite fa2 to build ours")
        if suite and shapes:
            raise UsageError("give --shapes or --suite, not both")
        if suite:
            if suite not in SUITE_GRIDS:
                raise UsageError(f"unknown suite {suite!r}; known: {', '.join(SUITE_GRIDS)}")
            shape_list = sorted({s for _, _, s in SUITE_GRIDS[suite]()}, key=lambda s: (s.D, s.N))
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
        with GpuWorker(job_timeout_s=timeout) as worker:
            runnable = []
            for kernel in kernels:
                store.add_event(run_id, "kernel", {"manifest": kernel.manifest.model_dump(mode="json")},
                                {"kernel.cu": kernel.source or ""})
                if verify:
                    report = worker.verify(kernel)
                    store.add_event(run_id, "verify", report.model_dump(mode="json"), {"summary.txt": report.summary})
                    if not report.ok:
                        console.print(f"{kernel.label} fails verification; not timed", style="red")
                        console.print(report.summary)
                        continue
                runnable.append(kernel)
            if not runnable:
                store.finish_run(run_id, "failed", {"reason": "no kernel passed verification"})
                raise FlashgenError("no kernel passed verification; nothing timed")
            result = worker.call("flashgen.harness.bench:bench_kernels", timeout_s=timeout, kernels=runnable,
                                 shapes=shape_list, baselines=baselines, min_time_s=min_time, flex=flex_mode,
                                 rounds=rounds, settle_s=settle, settle_each=settle_each)
        if not result.ok:
            store.add_event(run_id, "bench", {"error": result.error})
            store.finish_run(run_id, "failed", {"error": result.error})
            raise FlashgenError(f"benchmark failed: {(result.error or '').splitlines()[0]}")
        merged = result.value
        store.add_event(run_id, "bench", merged.model_dump(mode="json"))
        path = Path(out) if out else default_output_path(merged.env, suite or "_".join(k.label for k in runnable)[:60])
        _write_text(path, merged.model_dump_json(indent=2))
        store.finish_run(run_id, "ok", {"json": str(path)})
        print_bench(merged, console)
        console.print(f"wrote {path}; recorded as run {run_id}", style="dim")

    @runs_app.command("list")
    def runs_list(kind: str = typer.Option(None, help="only runs of this kind"),
                  limit: int = typer.Option(30, help="how many, newest first"),
                  as_json: bool = typer.Option(False, "--json", help="print JSON (one object per run) instead of a table")) -> None:
        """List recorded runs."""
        from flashgen.harness.store import Store

        if limit < 1:
            raise UsageError(f"--limit {limit}: must be at least 1")
        store = Store()
        records = store.runs(kind=kind, limit=limit)
        if as_json:
            typer.echo(json.dumps([{**r.model_dump(mode="json"), "resume": resume_advice(r)} for r in records]))
            return
        _legacy_hint(store)
        table = Table(title=f"flashgen runs ({store.home})")
        for col in ("id", "kind", "status", "created", "meta"):
            table.add_column(col)
        for r in records:
            table.add_row(str(r.id), r.kind, r.status, r.created, json.dumps(r.meta)[:80])
        console.print(table)

    @runs_app.command("show")
    def runs_show(run_id: int = typer.Argument(..., help="a run id from `flashgen runs list`"),
                  as_json: bool = typer.Option(False, "--json", help="print the run and its events as JSON"),
                  transcript: bool = typer.Option(False, "--transcript", help="print a generate run's conversation: "
                                                  "prompts, replies and feedback, step by step"),
                  max_chars: int = typer.Option(None, "--max-chars", help="--transcript: the most characters shown "
                                                "of one message, head and tail (default 6000; 0: all)")) -> None:
        """Show one run: its events and artifacts, how it ended and whether `--resume` can help; `--transcript`: the
        conversation with the model."""
        from flashgen.harness.store import Store
        from flashgen.harness.transcript import DEFAULT_MAX_CHARS
        from flashgen.harness.transcript import transcript as transcript_lines

        if max_chars is not None and not transcript:
            raise UsageError("--max-chars belongs to --transcript")
        if max_chars is not None and max_chars < 0:
            raise UsageError(f"--max-chars {max_chars}: must be 0 (all) or more")
        if transcript and as_json:
            raise UsageError("give --transcript or --json, not both")
        store = Store()
        r = store.run(run_id)
        events = store.events(run_id)
        if transcript:
            if r.kind != "generate":
                raise UsageError(f"run {run_id} is a {r.kind!r} run: only `flashgen generate` runs have a transcript")
            for line in transcript_lines(r, events, DEFAULT_MAX_CHARS if max_chars is None else max_chars):
                console.print(line)
            return
        advice = resume_advice(r)
        if as_json:
            typer.echo(json.dumps({**r.model_dump(mode="json"), "resume": advice,
                                   "events": [e.model_dump(mode="json") for e in events]}))
            return
        console.print(styled((f"run {r.id}", "bold"), f" {r.kind} [{r.status}] created {r.created} "
                             f"finished {r.finished or '-'}"))
        console.print(f"meta: {json.dumps(r.meta)[:500]}")
        for line in provider_lines(r, events):
            console.print(line)
        if r.summary is not None:
            console.print(f"summary: {json.dumps(r.summary)[:500]}")
        if advice is not None:
            console.print(f"resume: {advice['how']}")
        table = Table()
        for col in ("#", "step", "created", "payload", "artifacts"):
            table.add_column(col)
        for e in events:
            table.add_row(str(e.seq), e.step, e.created, json.dumps(e.payload)[:160], "\n".join(e.artifacts.values()))
        console.print(table)


def provider_lines(run, events) -> list[str]:
    """A generate run's provider, and each resume that went on with another (`--resume N --provider P --model M`)."""
    if run.kind != "generate":
        return []

    def label(info: dict) -> str:
        return f"{info.get('name')}" + (f" ({info['model']})" if info.get("model") else "")

    current = (run.meta or {}).get("provider") or {}
    out = [f"provider: {label(current)}"]
    for e in events:
        given = e.payload.get("provider") if e.step == "resume" and isinstance(e.payload, dict) else None
        if given and label(given) != label(current):
            out.append(f"provider: {label(given)} from iteration {e.payload.get('from_iteration', 0) + 1} (a resume)")
            current = given
    return out


def resume_advice(run) -> dict | None:
    """Whether `flashgen generate --resume` can help a run (generate runs only): what the loop recorded at its end,
    or, for one still marked running, whether its process is alive."""
    if run.kind != "generate":
        return None
    summary = run.summary if isinstance(run.summary, dict) else {}
    if isinstance(summary.get("resume"), dict):
        return summary["resume"]
    cmd = f"flashgen generate --resume {run.id} --out DIR"
    if run.status == "running":
        process = (run.meta or {}).get("process") or {}
        alive = _process_alive(process)
        if alive:
            return {"helps": False, "how": f"still running (pid {process.get('pid')}); wait for it"}
        gone = "its process is gone" if alive is False else "if its process is gone (killed)"
        return {"helps": True, "how": f"{gone}: `{cmd}` continues it from its last recorded step"}
    if run.status == "done":
        return {"helps": False, "how": "nothing to resume: the run is done"}
    if run.status == "failed":
        return {"helps": True, "how": f"`{cmd} --provider P --model M` asks another model the request that ended it "
                                      "(the same model would repeat its replies)"}
    return {"helps": True, "how": f"`{cmd}` continues it (with a larger budget if one was spent)"}


def _process_alive(process: dict) -> bool | None:
    """True/False for a pid on this host; None when it cannot be told (another host, no pid)."""
    import os
    import socket

    pid = process.get("pid")
    if not isinstance(pid, int) or process.get("host") != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def _legacy_hint(store) -> None:
    from flashgen.console import err
    from flashgen.paths import legacy_store

    old = legacy_store()
    if old is not None and old.resolve() != store.home.resolve():
        err.print(f"note: older runs are in {old} (the record moved to {store.home}); FLASHGEN_HOME={old} reads them")


def _positive(flag: str, seconds: float) -> None:
    if not seconds > 0:  # nan too
        raise UsageError(f"{flag} {seconds:g}: must be a number of seconds greater than 0")


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _suite(suite: str, gpu: str | None, arch_path: str | None, select: str | None, compile_only: bool,
           jobs: int | None, out: str | None, baselines: bool, flex_mode: str, min_time: float, timeout: float,
           rounds: int = 1, settle_s: float = 0.0, *, settle_each: bool = False) -> None:
    """`flashgen bench --suite fa2 [--gpu] [--arch-path] [--compile-only]`: our kernels, built for the suite."""
    from flashgen.harness import suite as suite_mod
    from flashgen.harness.bench import default_output_path

    if suite not in suite_mod.SUITES:
        raise UsageError(f"unknown suite {suite!r}; known: {', '.join(suite_mod.SUITES)}")
    if arch_path is not None and arch_path not in suite_mod.ARCH_PATHS:
        raise UsageError(f"--arch-path must be one of {', '.join(suite_mod.ARCH_PATHS)}, got {arch_path!r}")
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if min_time <= 0:
        raise UsageError("--min-time must be positive")
    if compile_only:
        if gpu is None:
            raise UsageError("--compile-only needs --gpu (which GPU's arch to compile for)")
        from flashgen.targets import get_target

        get_target(gpu)
        kernels = suite_mod.compile_suite(gpu, suite, arch_path, select, jobs)
        print_compiled(kernels, console)
        bad = [k for k in kernels if k.build_error or not k.compiled]
        if bad:
            raise FlashgenError(f"{len(bad)} of {len(kernels)} suite kernels did not build or compile: "
                                + "; ".join(f"{k.dtype} {k.variant} d{k.head_dim}: "
                                            f"{(k.build_error or k.compile.get('error') or '?').splitlines()[0]}"
                                            for k in bad)[:600])
        return
    from flashgen.harness.worker import have_gpu

    if not have_gpu():
        raise UsageError("no CUDA GPU here (cupy cannot see a device); --compile-only builds and compiles the suite's "
                         "kernels without one")
    if gpu is None:
        from flashgen.harness.bench import _target_name
        from flashgen.harness.worker import environment_info

        gpu = _target_name(environment_info().get("gpu"))
        if gpu is None:
            raise UsageError("this GPU is not a known target; name the one to build for with --gpu")
    from flashgen.targets import get_target

    get_target(gpu)
    name = f"{suite}-{suite_mod.code_path(suite_mod.translation_target(gpu, arch_path).arch)}"
    path = Path(out) if out else default_output_path({"gpu": gpu}, name)
    _write_text(path, "{}")  # fail early on an unwritable path, not after minutes of timing
    result = suite_mod.run_suite(gpu, suite, arch_path, select=select, baselines=baselines, flex=flex_mode,
                                 min_time_s=min_time, jobs=jobs, job_timeout_s=timeout, out=path, rounds=rounds,
                                 settle_s=settle_s, settle_each=settle_each,
                                 progress=lambda msg: console.print(msg, style="dim"))
    for line in suite_mod.summary_lines(result):
        console.print(line)
    console.print(f"wrote {path}", style="dim")
    if result.summary.timed == 0:
        raise FlashgenError(f"no shape of the suite was timed (see {path})")


def _report(paths: list[str], doc: str | None) -> None:
    """`flashgen bench report RESULTS.json... [--doc docs/performance.md]`."""
    from flashgen.harness import suite as suite_mod

    if not paths:
        raise UsageError("give suite result files: flashgen bench report RESULTS.json... [--doc docs/performance.md]")
    results = suite_mod.load_results(paths)
    text = suite_mod.render_markdown(results)
    if doc:
        _write_text(Path(doc), text)
    else:
        console.print(text)
    for result in results:
        for line in suite_mod.summary_lines(result):
            console.print(line)
    if doc:
        console.print(f"wrote {doc}", style="dim")
