"""`flashgen targets`: the GPU table."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command("targets")
    def targets_command() -> None:
        """List the GPUs flashgen knows, with the numbers its checker and roofline use."""
        from flashgen.targets import TARGETS

        table = Table(title="flashgen targets")
        for col in ("name", "GPU", "arch", "SMs", "smem/block KB", "fp16 TFLOP/s", "bf16 TFLOP/s", "GB/s"):
            table.add_column(col)
        for t in TARGETS.values():
            table.add_row(t.name, t.marketing_name, t.arch, str(t.sm_count), f"{t.smem_per_block_bytes // 1024}",
                          f"{t.peak_tflops.get('fp16', 0):g}", f"{t.peak_tflops.get('bf16', 0) or '-'}",
                          f"{t.mem_bandwidth_gbs:g}")
        Console().print(table)
