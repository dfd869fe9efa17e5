"""`flashgen targets`: the GPU table."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from flashgen.console import out
from flashgen.errors import UsageError


def _rate(value: float | None) -> str:
    return f"{value:g}" if value else "-"


def register(app: typer.Typer) -> None:
    @app.command("targets")
    def targets_command(
        name: str | None = typer.Argument(None, help="show one GPU in full (name or alias, e.g. h100-sxm); or `add` "
                                          "FILE.toml (a GPU the table lacks), or `detect` (the GPU present)"),
        file: str | None = typer.Argument(None, help="with `add`: the target file (docs/batch.md, New hardware)"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
        out_file: str | None = typer.Option(None, "--out", help="with `detect`: write the target file here "
                                            "(default: print it)"),
        device: int = typer.Option(0, "--device", help="with `detect`: the CUDA device to read"),
    ) -> None:
        """List the GPUs flashgen knows, with the numbers its checker and roofline use; `targets add FILE.toml` adds
        one, `targets detect` writes the file of the GPU present."""
        from flashgen.targets import TARGETS, get_target, load_user_targets

        if name in ("add", "detect"):
            from flashgen.targets_extra_cli import add_command, detect_command

            add_command(file, as_json) if name == "add" else detect_command(file, out_file, device)
            return
        if file is not None:
            raise UsageError(f"flashgen targets {name} {file}: one GPU name at a time (or `targets add FILE.toml`)")
        load_user_targets()
        if name is not None:
            target = get_target(name)
            if as_json:
                typer.echo(target.model_dump_json(indent=2))
                return
            table = Table(title=f"{target.marketing_name} ({target.name})", show_header=False)
            for field, value in target.model_dump(exclude={"mma"}).items():
                table.add_row(field, str(value))
            for shape in target.mma:
                table.add_row("mma", f"{shape.instruction} {'/'.join(shape.input_dtypes)} -> {shape.accumulate}"
                              + (f" (needs {shape.requires_arch})" if shape.requires_arch else ""))
            out.print(table)
            return
        if as_json:
            typer.echo(json.dumps({key: t.model_dump(mode="json") for key, t in TARGETS.items()}, indent=2))
            return
        table = Table(title="flashgen targets (dense tensor TFLOP/s, fp32 accumulate)")
        for col in ("name", "GPU", "arch", "SMs", "smem/block KB", "L2 MB", "fp16", "bf16", "tf32", "fp32 FMA",
                    "GB/s"):
            table.add_column(col)
        for t in TARGETS.values():
            table.add_row(t.name, t.marketing_name, t.arch, str(t.sm_count), f"{t.smem_per_block_bytes // 1024}",
                          f"{t.l2_bytes // (1024 * 1024)}", _rate(t.peak_tflops.get("fp16")),
                          _rate(t.peak_tflops.get("bf16")), _rate(t.peak_tflops.get("tf32")),
                          _rate(t.peak_tflops.get("fp32")), f"{t.mem_bandwidth_gbs:g}")
        out.print(table)
