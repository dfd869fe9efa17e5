"""Where flashgen keeps its files: the one place that decides (XDG base directories).

- the record (sqlite store + artifacts): `$FLASHGEN_HOME`, else `$XDG_STATE_HOME/flashgen`, else
  `~/.local/state/flashgen`;
- the user's tuned tables: `$FLASHGEN_HOME/config/tuned`, else `$XDG_CONFIG_HOME/flashgen/tuned`, else
  `~/.config/flashgen/tuned` (config_dir());
- the caches: `$FLASHGEN_HOME/cache`, else `$XDG_CACHE_HOME/flashgen`, else `~/.cache/flashgen`; the compile cache
  (content-addressed, shared by every home) is `$FLASHGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/flashgen/cubin`.

Never the working folder. An XDG variable that is empty or not an absolute path is ignored, as the XDG spec says.
An older record in `./.flashgen` (the location before) is not read unless `FLASHGEN_HOME=./.flashgen`."""

from __future__ import annotations

import os
from pathlib import Path

LEGACY_HOME = ".flashgen"


def _xdg(variable: str, default: str) -> Path:
    value = os.environ.get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / default


def _flashgen_home() -> Path | None:
    value = os.environ.get("FLASHGEN_HOME")
    return Path(value).expanduser() if value else None


def state_dir() -> Path:
    """The record's folder (store.Store's default home)."""
    return _flashgen_home() or _xdg("XDG_STATE_HOME", ".local/state") / "flashgen"


def cache_dir() -> Path:
    """The caches' folder."""
    home = _flashgen_home()
    return home / "cache" if home is not None else _xdg("XDG_CACHE_HOME", ".cache") / "flashgen"


def config_dir() -> Path:
    """The user's settings and tuned tables: `$FLASHGEN_HOME/config`, else `$XDG_CONFIG_HOME/flashgen`, else
    `~/.config/flashgen` (`flashgen tune --write` writes its `tuned/<gpu>.json` here, never into the package)."""
    home = _flashgen_home()
    return home / "config" if home is not None else _xdg("XDG_CONFIG_HOME", ".config") / "flashgen"


def cubin_cache_dir() -> Path:
    """The compile cache: `$FLASHGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/flashgen/cubin` (`~/.cache/flashgen/cubin`).
    `FLASHGEN_HOME` does not move it: its entries are keyed by everything that makes the binary, so every home can
    share them, and a fresh home (a test's, a CI job's) does not recompile every kernel."""
    value = os.environ.get("FLASHGEN_CACHE_DIR")
    return Path(value).expanduser() if value else _xdg("XDG_CACHE_HOME", ".cache") / "flashgen" / "cubin"


def legacy_store(cwd: Path | None = None) -> Path | None:
    """`./.flashgen` when it holds an older record and FLASHGEN_HOME does not point there (for a one-line hint)."""
    folder = (cwd or Path.cwd()) / LEGACY_HOME
    if not (folder / "flashgen.sqlite").is_file():
        return None
    try:
        if folder.resolve() == state_dir().resolve():
            return None
    except OSError:
        return None
    return folder
