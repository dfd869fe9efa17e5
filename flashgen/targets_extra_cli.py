"""`flashgen targets add FILE.toml` and `flashgen targets detect` (flashgen/target_files.py does the work)."""

from __future__ import annotations

from pathlib import Path

import typer

from flashgen.console import out, styled
from flashgen.errors import UsageError


def add_command(file: str | None, as_json: bool) -> None:
    from flashgen.target_files import add_target_file

    if file is None:
        raise UsageError("flashgen targets add: give the target file (flashgen targets add FILE.toml)")
    target, dest = add_target_file(file)
    if as_json:
        typer.echo(target.model_dump_json(indent=2))
        return
    peaks = ", ".join(f"{k} {v:g}" for k, v in sorted(target.peak_tflops.items()))
    out.print(styled("added ", (target.name, "bold"), f" ({target.marketing_name}, {target.arch}, {target.sm_count} "
                     f"SMs; dense TFLOP/s {peaks}; {target.mem_bandwidth_gbs:g} GB/s) as {dest}"))


def detect_command(file: str | None, out_file: str | None, device: int) -> None:
    from flashgen.target_files import detected_toml, parse_target_file, read_device

    if file is not None:
        raise UsageError(f"flashgen targets detect: unexpected argument {file!r} (--out FILE writes the file)")
    text, missing = detected_toml(read_device(device))
    note = (f"fill in {', '.join(missing)} (marked FILL IN), then `flashgen targets add FILE`" if missing
            else "check it against the datasheet, then `flashgen targets add FILE`")
    if not missing:
        try:
            parse_target_file(text, "detected")  # what it wrote loads as it is
        except UsageError as exc:
            note = f"as written it does not load ({str(exc).removeprefix('detected: ')})"
    if out_file is None:
        typer.echo(text, nl=False)
        out.print(f"# {note}")
        return
    Path(out_file).write_text(text)
    out.print(f"wrote {out_file}: {note}")
