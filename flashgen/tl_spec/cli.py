"""`flashgen tl ...`: check, run, format LLM-TL files and render the library."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from pydantic import ValidationError

from flashgen.console import APP_SETTINGS, err, out, styled
from flashgen.errors import FlashgenError, UsageError, read_text_input

tl_app = typer.Typer(no_args_is_help=True, **APP_SETTINGS,
                     help="LLM-TL: check, run on the CPU, format; the program library.")


def _parse_file(path: str):
    from flashgen.tl_spec.parser import parse

    return parse(read_text_input(path), filename=path)


@tl_app.command("check")
def check_cmd(
    files: list[str] = typer.Argument(..., help="TL files (full programs or sketches)"),
    target: str | None = typer.Option(None, "--target", "-t", help="GPU whose budgets to check against "
                                         "(default: the smallest known GPU of the program's arch)"),
    warnings_as_errors: bool = typer.Option(False, "--strict", help="fail on warnings too"),
) -> None:
    """Parse and check TL files; prints FILE:LINE:COL: message (hint: ...) and exits 1 on any error."""
    from flashgen.targets import get_target
    from flashgen.tl_spec.checker import check
    from flashgen.tl_spec.diagnostics import TLSyntaxError

    resolved = get_target(target) if target else None
    failed = False
    for path in files:
        try:
            program = _parse_file(path)
        except TLSyntaxError as exc:
            for d in exc.diagnostics:
                err.print(str(d))
            failed = True
            continue
        except FlashgenError as exc:
            err.print(f"error: {exc}")
            failed = True
            continue
        diags = check(program, resolved)
        for d in diags:
            err.print(str(d))
        bad = [d for d in diags if d.severity == "error" or warnings_as_errors]
        failed |= bool(bad)
        if not bad:
            kind = "full program" if program.is_full else "sketch"
            out.print(f"{path}: ok ({kind}, {len(program.kernels)} kernel(s))")
    if failed:
        raise typer.Exit(1)


@tl_app.command("run")
def run_cmd(
    file: str = typer.Argument(..., help="a full TL program"),
    shape: str = typer.Option("B=2,H=4,N=200,M=333,D=64", "--shape", help="B=..,H=..,N=..,M=..,D=..[,KVH=..]"
                              "[,DV=..] (DV: V's head dim; default the program's head_dim_v)"),
    seed: int = typer.Option(0, "--seed", help="seed of the random inputs"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
    tol: float = typer.Option(1e-6, "--tol", help="largest relative error that passes"),
) -> None:
    """Interpret a full TL program on the CPU (fp64) and compare with the reference of its declared variant."""
    from flashgen.tl_spec.checker import check
    from flashgen.tl_spec.diagnostics import errors_only
    from flashgen.tl_spec.interpreter import compare
    from flashgen.variant import Shape

    try:
        parsed_shape = Shape.parse(shape)
    except ValidationError as exc:
        msg = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'shape'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors())
        raise UsageError(f"--shape {shape!r}: {msg}") from None
    except ValueError as exc:
        raise UsageError(f"--shape {shape!r}: {exc}") from None
    _check_cpu_size(shape, parsed_shape)
    if not (math.isfinite(tol) and tol >= 0):
        raise UsageError(f"--tol {tol:g}: must be a finite number >= 0")
    program = _parse_file(file)
    problems = errors_only(check(program))
    if problems:
        for d in problems:
            err.print(str(d))
        raise typer.Exit(1)
    if parsed_shape.DV is None and program.target.head_dim_v is not None and parsed_shape.D == program.target.head_dim:
        parsed_shape = parsed_shape.model_copy(update={"DV": program.target.head_dim_v})  # V's own head dim
        _check_cpu_size(shape, parsed_shape)
    result = compare(program, parsed_shape, seed)
    passed = result.rel_err <= tol
    if as_json:
        record = {
            "file": file, "variant": result.variant, "shape": parsed_shape.model_dump(), "seed": seed,
            "max_abs_err": _finite_or_none(result.max_abs_err), "rel_err": _finite_or_none(result.rel_err),
            "tol": tol, "passed": passed, "counts": result.counts.model_dump(),
        }
        out.print(json.dumps(record, indent=2), markup=False)
    else:
        c = result.counts
        status = ("ok", "green") if passed else ("FAIL", "bold red")
        out.print(styled(f"{file}: ", status, f" variant={result.variant} rel_err={result.rel_err:.3e} "
                         f"max_abs_err={result.max_abs_err:.3e} (tol {tol:g})"))
        traffic = ", ".join(f"{k}={v / 1e6:.2f}MB" for k, v in sorted(c.bytes.items()))
        out.print(f"  mma {c.mma_flops / 1e6:.1f} MFLOP, vector {c.vector_flops / 1e6:.2f} MFLOP, "
                  f"sfu {c.sfu_ops / 1e6:.2f} M, {traffic}")
    if not passed:
        raise typer.Exit(1)


# The CPU run holds whole fp64 arrays (Q, K, V, O, and one head's N x M scores in the reference): each at most
# this many values (1 GiB), so that a giant --shape is one line, not a MemoryError after minutes.
MAX_CPU_ARRAY_VALUES = 1 << 27


def _check_cpu_size(text: str, s) -> None:
    sizes = {"B*H*N*D": s.B * s.H * s.N * max(s.D, s.dv), "B*KVH*M*D": s.B * s.kv_heads * s.M * max(s.D, s.dv),
             "N*M": s.N * s.M}
    name, biggest = max(sizes.items(), key=lambda kv: kv[1])
    if biggest > MAX_CPU_ARRAY_VALUES:
        raise UsageError(f"--shape {text!r}: {name} = {biggest} values; a CPU run allows at most "
                         f"{MAX_CPU_ARRAY_VALUES} per array (1 GiB of fp64), use smaller sizes")


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@tl_app.command("fmt")
def fmt_cmd(
    file: str = typer.Argument(..., help="a TL file"),
    check_only: bool = typer.Option(False, "--check", help="exit 1 if the file is not in canonical form"),
    write: bool = typer.Option(False, "--write", help="rewrite the file in canonical form"),
) -> None:
    """Print a TL file in canonical form (or check / rewrite it)."""
    from flashgen.tl_spec.printer import format_program

    if check_only and write:
        raise UsageError("--check and --write exclude each other")
    text = read_text_input(file)
    formatted = format_program(_parse_file(file))
    if check_only:
        if formatted != text:
            err.print(f"{file}: not in canonical form (run `flashgen tl fmt --write {file}`)")
            raise typer.Exit(1)
        out.print(f"{file}: canonical")
    elif write:
        if formatted != text:
            Path(file).write_text(formatted)
            out.print(f"{file}: reformatted")
        else:
            out.print(f"{file}: unchanged")
    else:
        out.print(formatted, end="", markup=False)


@tl_app.command("library")
def library_cmd(
    write: bool = typer.Option(False, "--write", help="re-render the committed program files"),
    show: str | None = typer.Option(None, "--show", help="print one program, e.g. causal"),
    form: str = typer.Option("full", "--form", help="full or sketch (with --show)"),
    arch: str | None = typer.Option(None, "--arch", help="with --show: render it for this arch (sm_90: the Hopper "
                                                         "dataflow) instead of printing the committed sm_80 file"),
    dtype: str = typer.Option("fp16", "--dtype", help="with --arch: fp16, bf16 or fp32"),
) -> None:
    """List the library programs, print one, or re-render the committed files."""
    from flashgen.tl_spec import library
    from flashgen.variant import DType

    if write:
        for path in library.write_all():
            out.print(str(path))
        return
    if show:
        if form not in ("full", "sketch"):
            raise UsageError(f"--form {form!r}: expected full or sketch")
        if arch is None:
            out.print(library.load(show, form), end="", markup=False)  # type: ignore[arg-type]
            return
        if show not in library.PROGRAMS:
            library.load(show, form)  # type: ignore[arg-type]  # the one-line error naming the known programs
        from flashgen.targets import TARGETS

        archs = sorted({t.arch for t in TARGETS.values()})
        if arch not in archs:
            raise UsageError(f"--arch {arch!r}: expected one of {', '.join(archs)}")
        if dtype not in DType.__members__:
            raise UsageError(f"--dtype {dtype!r}: expected fp16, bf16 or fp32")
        text = library.render(library.PROGRAMS[show], dtype=dtype, arch=arch, form=form, name=show)  # type: ignore
        out.print(text, end="", markup=False)
        return
    for name, variant in library.PROGRAMS.items():
        out.print(f"{name:16s} {variant.name}")


def register(app: typer.Typer) -> None:
    app.add_typer(tl_app, name="tl")
