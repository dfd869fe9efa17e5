"""`python -m flashgen.regenerate [--out DIR] [--check] [--force] [--jobs N] [FILTER ...]`: rebuild the committed
kernels (generated/, a kernel library: its library.json and library.md) with the expert provider (no GPU needed),
through the library job (flashgen.library: the entries over the cores, each kept when its content key and files are
unchanged; --force builds every one again). With --check, build them afresh in a scratch folder and compare instead
of writing; exit non-zero on any difference. FILTER keeps the entries whose path contains every given string.

Works from an installed copy: the kernels go to `--out DIR`; without it, to the current folder's generated/ only when
the current folder is a flashgen checkout (its pyproject.toml names the flashgen project and it holds the flashgen
package), else the command refuses in one line. The user's tuned tables (flashgen tune --write) are not read: the
committed kernels come from the packaged tables alone, whoever regenerates them."""

from __future__ import annotations

import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

from flashgen.agent.outputs import FILES
from flashgen.variant import Variant

GPUS = ("t4", "rtx8000", "a100", "h100", "h200")
DTYPES = ("fp16", "bf16")
VARIANTS = {"plain": Variant(), "causal": Variant(causal=True)}
HEAD_DIMS = (64, 128)
# the committed kernels of the checkout this module runs from (what tests compare against); an installed copy has none
ROOT = Path(__file__).resolve().parents[1] / "generated"
USAGE = "usage: python -m flashgen.regenerate [--out DIR] [--check] [--force] [--jobs N] [FILTER ...]"


def entries() -> list[tuple[str, str, str, int]]:
    return list(itertools.product(GPUS, DTYPES, VARIANTS, HEAD_DIMS))


def relative_dir(gpu: str, dtype: str, variant: str, head_dim: int) -> Path:
    return Path(gpu) / dtype / f"{variant}_d{head_dim}"


def is_checkout(folder: Path) -> bool:
    """Whether `folder` is the root of a flashgen checkout (not merely a folder with a generated/ in it)."""
    try:
        project = (folder / "pyproject.toml").read_text()
    except OSError:
        return False
    return bool(re.search(r'^name\s*=\s*"flashgen"\s*$', project, re.M)) and (folder / "flashgen" / "__init__.py").is_file()


def default_out(cwd: Path | None = None) -> Path | None:
    """The current folder's generated/ when the current folder is a flashgen checkout, else None."""
    folder = cwd or Path.cwd()
    return folder / "generated" if is_checkout(folder) else None


def spec():
    """generated/'s spec: the cross product above, the expert, the packaged tuned tables alone."""
    from flashgen.library.spec import Spec

    return Spec(gpus=list(GPUS), dtypes=list(DTYPES), variants=list(VARIANTS), head_dims=list(HEAD_DIMS),
                tuned="packaged")


def _all_paths() -> list[str]:
    return [relative_dir(*e).as_posix() for e in entries()]


def regenerate(gpu: str, dtype: str, variant: str, head_dim: int, out: Path, store_home: Path) -> None:
    from flashgen.api import generate
    from flashgen.harness.store import Store

    with Store(store_home) as store:
        generate(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=VARIANTS[variant].causal, out=out, store=store)


def parse_args(argv: list[str]) -> tuple[bool, Path | None, list[str], bool, int | None]:
    check, out, filters, force, jobs = False, None, [], False, None
    args = iter(argv)
    for arg in args:
        if arg == "--check":
            check = True
        elif arg == "--force":
            force = True
        elif arg == "--jobs" or arg.startswith("--jobs="):
            value = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not value or not value.isdigit() or int(value) < 1:
                raise SystemExit(f"regenerate: --jobs needs a positive number\n{USAGE}")
            jobs = int(value)
        elif arg == "--out" or arg.startswith("--out="):
            value = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not value:
                raise SystemExit(f"regenerate: --out needs a folder\n{USAGE}")
            out = Path(value)
        elif arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        elif arg.startswith("-"):
            raise SystemExit(f"regenerate: unknown option {arg!r}\n{USAGE}")
        else:
            filters.append(arg)
    return check, out, filters, force, jobs


def main(argv: list[str]) -> int:
    try:
        check, root, filters, force, jobs = parse_args(argv)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
            return 2
        return int(stop.code or 0)
    root = root or default_out()
    if root is None:
        print(f"regenerate: {Path.cwd()} is not a flashgen checkout; give --out DIR for the kernels", file=sys.stderr)
        return 2
    if root.exists() and not root.is_dir():
        print(f"regenerate: --out {root} is a file, expected a folder", file=sys.stderr)
        return 2
    failures = 0
    selected = {relative_dir(*e).as_posix() for e in entries() if all(f in str(relative_dir(*e)) for f in filters)}
    with tempfile.TemporaryDirectory() as scratch:
        saved = {k: os.environ.get(k) for k in ("FLASHGEN_HOME", "FLASHGEN_CACHE_DIR")}
        from flashgen.paths import cubin_cache_dir

        os.environ["FLASHGEN_CACHE_DIR"] = str(cubin_cache_dir())  # the compile cache is keyed by content: shared
        os.environ["FLASHGEN_HOME"] = str(Path(scratch) / "home")  # no user tuned files, no user record
        try:
            from flashgen.library import build
            from flashgen.library.index import INDEX, SUMMARY, read_index

            out = Path(scratch) / "check" if check else root
            summary = build(spec(), out, only=None if selected == set(_all_paths()) else selected, force=force,
                            jobs=jobs, gpus=[], store=Path(scratch) / "store")
            for row in summary.rows:
                if row.status != "ok":
                    print(f"FAIL {row.path}: {row.error}")
                    failures += 1
                elif check:
                    differ = [f for f in FILES if not (root / row.path / f).is_file()
                              or (root / row.path / f).read_bytes() != (out / row.path / f).read_bytes()]
                    print(f"{'DIFF' if differ else 'same'} {row.path} {' '.join(differ)}")
                    failures += bool(differ)
                else:
                    print(f"{'wrote' if row.action == 'built' else 'kept (same key)'} {root / row.path}")
            if check:
                have = (read_index(root) or None, read_index(out))
                old = have[0].by_path() if have[0] is not None else {}
                new = have[1].by_path()
                # keys follow the sources (any edit of the translator changes them): a stale key only means the
                # next regeneration rebuilds that entry, so it is reported, not failed
                strip = lambda e: None if e is None else e.model_dump(exclude={"key"})  # noqa: E731
                stale = [p for p in sorted(selected) if strip(old.get(p)) != strip(new.get(p))]
                if selected == set(_all_paths()):
                    same = (root / SUMMARY).is_file() and (root / SUMMARY).read_text() == (out / SUMMARY).read_text()
                    stale += [] if same else [SUMMARY]
                keys = sum(1 for p in selected if p in old and p in new and old[p].key != new[p].key)
                note = f" ({keys} entries' keys differ: their sources changed, not their files)" if keys else ""
                print(f"{'DIFF' if stale else 'same'} {INDEX} {' '.join(stale)}{note}")
                failures += bool(stale)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
