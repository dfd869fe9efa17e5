"""Content keys: each library entry is keyed by a sha256 of everything that makes it, so that a rerun redoes only
the entries whose inputs changed (or that are missing).

What goes in (`entry_inputs`): the entry (GPU, dtype, variant, head dim), the target's facts (its whole Target
model: a new target file, or a changed one, changes its entries), the provider and its budgets, the parameters
`choose_params` picks (a tuned table written by `flashgen tune --write` changes the entries it covers), the TL the
expert writes first (the library program at those parameters; a model provider's TL is not known in advance, so its
name and model stand in), the sources (digests of the TL layer, the translator's shared code, the entry's own
backend folder, and the generator: agent, prompts, the harness's build path, the contracts), and the toolchain (the
`nvcc --version` release line). A change to the sm90 backend redoes only the entries that take it.

With `tuned = "search"` the parameters are what the search on the entry's GPU chose (or, where it did not run, the
packaged or default ones), and where they came from ("search" or "fallback") goes in too: a search that chooses
other parameters rebuilds the entry, one that chooses the same keeps it. The search has a key of its own
(flashgen.library.job.search_inputs: the entry, the target, the [search] settings, the fallback parameters, which
are always a candidate, the sources, the search's own code, the toolchain);
a recorded search whose key is unchanged is reused rather than run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
_SKIP_DIRS = {"__pycache__", "tuned"}  # tuned tables reach the key through the parameters they choose
_GENERATOR = ("agent", "prompts", "include", "harness/environment.py", "harness/compile.py", "harness/static_check.py",
              "harness/ptxas.py", "roofline.py", "variant.py", "abi.py", "operators.py", "reference.py", "targets.py",
              "library/stages.py")
# what the search's result follows besides the translator (candidates, translation: the "translator" group): its
# compile filter, verification, timing and the worker that runs them
_SEARCH = ("harness/tune.py", "harness/verify.py", "harness/bench.py", "harness/worker.py", "harness/device.py",
           "harness/compile.py")


def _files(root: Path, skip: set[str] = frozenset()) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file() and not (set(p.relative_to(root).parts[:-1]) & _SKIP_DIRS)
                  and p.suffix != ".pyc" and not any(p.relative_to(root).as_posix().startswith(s + "/") for s in skip))


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@cache
def source_digests(backend: str) -> dict[str, str]:
    """sha256 of the source groups that make an entry taking translator backend `backend` (sm75, sm80, sm90)."""
    backends = PACKAGE / "translators" / "backends"
    others = {p.name for p in backends.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return {
        "tl": _digest(_files(PACKAGE / "tl_spec")),
        "translator": _digest(_files(PACKAGE / "translators", skip={f"backends/{b}" for b in others})),
        f"backend:{backend}": _digest(_files(backends / backend)),
        "generator": _digest([p for part in _GENERATOR for p in _files(PACKAGE / part)]),
    }


@cache
def search_digest() -> str:
    """sha256 of the search's own code (flashgen.harness.tune and what it verifies and times with)."""
    return _digest([p for part in _SEARCH for p in _files(PACKAGE / part)])


@lru_cache(maxsize=1)
def toolchain() -> str:
    """'nvcc 13.0.88' (the release of the nvcc the compile cache would use), or 'no nvcc: ...'."""
    try:
        from flashgen.harness.compile import nvcc_version

        text = nvcc_version()
    except Exception as exc:  # noqa: BLE001 - recorded in the key: entries then fail to compile, each with its error
        return f"no nvcc: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    m = re.search(r"release [\d.]+, V([\d.]+)", text)
    return f"nvcc {m.group(1)}" if m else text.strip().splitlines()[-1]


def key_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


@contextlib.contextmanager
def tuned_mode(mode: str) -> Iterator[None]:
    """`packaged` (and `search`, whose fallback is the packaged tables and whose search results reach the build as a
    tuned file written into this scratch home): the user's tuned tables (and record) are not read while inside
    (FLASHGEN_HOME points at a scratch folder, the compile cache stays where it was); `user`: nothing changes."""
    if mode not in ("packaged", "search"):
        yield
        return
    from flashgen.paths import cubin_cache_dir

    saved = {k: os.environ.get(k) for k in ("FLASHGEN_HOME", "FLASHGEN_CACHE_DIR")}
    cache = str(cubin_cache_dir())
    with tempfile.TemporaryDirectory(prefix="flashgen-packaged-") as scratch:
        os.environ["FLASHGEN_HOME"] = scratch
        os.environ["FLASHGEN_CACHE_DIR"] = cache
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
