"""The `flashgen` command. Each layer registers its own commands; this module only assembles them
and turns every error into one line and a non-zero exit: a usage error (unknown option, missing argument, a value
of the wrong type) exits 2, a FlashgenError its exit_code, SIGINT 130 and SIGTERM 143 (after the running command
recorded its end), anything unforeseen 3 ("internal error": a bug)."""

from __future__ import annotations

import importlib
import signal
import sys

import typer
import typer.core

from flashgen import __version__
from flashgen.console import APP_SETTINGS, error_line
from flashgen.console import err as err_console
from flashgen.errors import FlashgenError

# click's exceptions as typer raises them: newer typer vendors click (typer._click), older typer uses click itself
_click = getattr(typer.core, "_click", None) or importlib.import_module("click")
_exceptions = _click.exceptions
_NoArgsIsHelp = getattr(_exceptions, "NoArgsIsHelpError", None) or type("_NeverRaised", (Exception,), {})

app = typer.Typer(no_args_is_help=True, **APP_SETTINGS,
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
                   "flashgen.generate_cli", "flashgen.build_cli", "flashgen.library.cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # that layer is not built yet
                continue
            raise
        mod.register(app)


_register_all()


_signals: list[str] = []  # the signals that stopped this command (SIGINT, SIGTERM)


def _on_signal(signum, _frame) -> None:
    from flashgen.errors import Interrupted

    name = signal.Signals(signum).name
    _signals.append(name)
    raise Interrupted(f"interrupted ({name})", name)


def usage_error_line(exc) -> str:
    """click's usage error as one line: `flashgen generate: No such option: --bogus (see flashgen generate --help)`."""
    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    if ctx is None:
        return message
    return f"{ctx.command_path}: {message} (see {ctx.command_path} --help)"


def take_target_files(argv: list[str]) -> list[str]:
    """`--targets FILE.toml` anywhere on the line (any command): register the file's GPU for this command
    (flashgen/target_files.py) and drop the option before typer parses the rest."""
    rest, args = [], iter(argv)
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        if arg == "--targets" or arg.startswith("--targets="):
            path = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not path:
                raise FlashgenError("--targets needs a target file (--targets FILE.toml)")
            from flashgen.target_files import register_target_file

            register_target_file(path)
            continue
        rest.append(arg)
    return rest


def main(argv: list[str] | None = None) -> None:
    from flashgen.errors import Interrupted, Stopped

    for name in ("SIGINT", "SIGTERM"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _on_signal)
    try:
        argv = take_target_files(sys.argv[1:] if argv is None else list(argv))
        code = app(args=argv, prog_name="flashgen", standalone_mode=False)
        if _signals:  # typer turned the interrupt into exit 130: still one line, and SIGTERM's own code
            err_console.print(f"interrupted ({_signals[0]})")
            sys.exit(143 if _signals[0] == "SIGTERM" else 130)
        if isinstance(code, int) and code != 0:  # typer.Exit(n) and --help's ctx.exit()
            sys.exit(code)
    except _NoArgsIsHelp as exc:  # `flashgen` or `flashgen runs` alone: the help, as before
        if exc.ctx is not None:
            typer.echo(exc.ctx.get_help())
        sys.exit(2)
    except _exceptions.UsageError as exc:
        err_console.print(error_line(usage_error_line(exc)))
        sys.exit(2)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except _exceptions.ClickException as exc:
        err_console.print(error_line(" ".join(exc.format_message().split())))
        sys.exit(exc.exit_code)
    except Stopped as exc:  # a command that recorded its end says what it recorded, in one line
        err_console.print(str(exc))
        sys.exit(exc.exit_code)
    except FlashgenError as exc:
        err_console.print(error_line(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:  # one line: what was interrupted and what was recorded
        err_console.print(str(exc) if isinstance(exc, Interrupted) else "interrupted")
        sys.exit(exc.exit_code if isinstance(exc, Interrupted) else 130)
    except Exception as exc:  # anything unforeseen is still one line, never a traceback
        err_console.print(error_line(f"{type(exc).__name__}: {exc}", "internal error"))
        sys.exit(3)


if __name__ == "__main__":
    main()
