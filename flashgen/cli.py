"""The `flashgen` command. Each layer registers its own commands; this module only assembles them
and turns every error into one line and a non-zero exit."""

from __future__ import annotations

import sys

import typer

from flashgen import __version__
from flashgen.console import err as err_console
from flashgen.console import error_line
from flashgen.errors import FlashgenError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Generate, check, verify and benchmark FlashAttention kernels.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"flashgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Generate, check, verify and benchmark FlashAttention kernels."""


def _register_all() -> None:
    # Each module exposes register(app); imported here so that `flashgen --help` lists everything.
    import importlib

    for module in ("flashgen.targets_cli", "flashgen.tl_spec.cli", "flashgen.harness.cli", "flashgen.harness.tune_cli",
                   "flashgen.generate_cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # that layer is not built yet
                continue
            raise
        mod.register(app)


_register_all()


def main() -> None:
    try:
        app()  # standalone: typer prints its own usage errors and exits 2
    except FlashgenError as exc:
        err_console.print(error_line(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # anything unforeseen is still one line, never a traceback
        err_console.print(error_line(f"{type(exc).__name__}: {exc}", "internal error"))
        sys.exit(3)


if __name__ == "__main__":
    main()
