"""Errors a user can act on. The CLI prints them as one line and exits non-zero, never a traceback."""


class FlashgenError(Exception):
    """Base for every error flashgen reports to a user. `exit_code` is what the CLI returns."""

    exit_code = 2


class UsageError(FlashgenError):
    """Bad arguments: an unknown GPU or dtype, a malformed shape, an unsupported combination."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped a command (a KeyboardInterrupt, so Python callers see the usual kind); the
    message says what was recorded. The CLI prints it as one line and exits 130 (SIGINT) or 143 (SIGTERM)."""

    def __init__(self, message: str = "interrupted", signal_name: str = "SIGINT"):
        super().__init__(message)
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return 143 if self.signal_name == "SIGTERM" else 130


class Stopped(FlashgenError):
    """The CLI's form of Interrupted: a FlashgenError, so that it reaches flashgen.cli.main through typer (which turns
    a KeyboardInterrupt into a silent exit 130); printed as its message alone."""

    def __init__(self, message: str, signal_name: str = "SIGINT"):
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = 143 if signal_name == "SIGTERM" else 130


class InputError(FlashgenError):
    """An input file that cannot be read as what it should be (binary, empty, too large, truncated)."""


MAX_INPUT_BYTES = 1 << 20


def join_lines_capped(lines: list[str], max_chars: int) -> str:
    """The lines joined one per line within max_chars, the ones that do not fit counted in a last line
    ('... and N more'): feedback a model or a user can read whole."""
    kept: list[str] = []
    used = 0
    for n, line in enumerate(lines):
        if kept and used + len(line) + 1 > max_chars - 30:
            kept.append(f"... and {len(lines) - n} more")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)[:max_chars]


def read_text_input(path: str) -> str:
    """Read a user's text file with the checks every command needs; raises InputError with one line."""
    from pathlib import Path

    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"{path}: no such file")
        if p.is_dir():
            raise InputError(f"{path}: is a directory, expected a file")
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise InputError(f"{path}: {size} bytes is larger than the {MAX_INPUT_BYTES}-byte limit for an input file")
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise InputError(f"{path}: binary file (contains NUL bytes), expected text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise InputError(f"{path}: empty file")
    return text


def check_option(flag: str, value, model, field: str) -> None:
    """Refuse a command-line value that `model.field` would refuse, as one line naming the flag and the allowed
    range ('--goal -1: must be greater than 0'); the range itself stays in the model (one place per fact)."""
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    info = model.model_fields[field]
    try:
        TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
    except ValidationError as exc:
        raise UsageError(f"{flag} {shown(value)}: {pydantic_message(exc.errors()[0])}") from None


def shown(value) -> str:
    """A flag's value as a user would have typed it (-1, not -1.0)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def pydantic_message(error: dict) -> str:
    """A pydantic error's message as the tail of a one-line usage error ('must be greater than 0')."""
    msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return msg.replace("Input should be", "must be", 1)
