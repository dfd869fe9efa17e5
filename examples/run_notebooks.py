"""Execute the example notebooks headless (nbclient) and write the executed copies, with an HTML page of each.

    python examples/run_notebooks.py --out OUT [--html] [--limit-s 300] [NOTEBOOK ...]

Each notebook runs in a fresh kernel from examples/ (its cells' relative paths hold), within --limit-s seconds in
all; a cell that raises, or a notebook past its limit, fails the run (exit 1) after the others have run, and its
executed copy up to the failing cell is still written. tests/test_notebooks.py runs the same function on the CPU.
Needs the notebook extra: `pip install -e '.[notebook]'`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
LIMIT_S = 300.0


def notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("[0-9][0-9]_*.ipynb"))


def execute(path: Path, out: Path | None = None, limit_s: float = LIMIT_S, kernel: str = "python3"):
    """Run `path` in a fresh kernel within `limit_s` seconds; returns (the executed notebook, seconds, error or None).
    Writes the executed copy to `out`/<name> when `out` is given, also when a cell failed."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    book = nbformat.read(path, as_version=4)
    started = time.monotonic()
    deadline = started + limit_s
    client = NotebookClient(book, kernel_name=kernel, resources={"metadata": {"path": str(EXAMPLES)}},
                            timeout_func=lambda _cell: max(1, int(deadline - time.monotonic())),
                            allow_errors=False, record_timing=True)
    error = None
    try:
        client.execute()
    except CellTimeoutError:
        error = f"{path.name}: past its limit of {limit_s:g} s"
    except (CellExecutionError, DeadKernelError) as exc:
        error = f"{path.name}: {exc}"
    seconds = time.monotonic() - started
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(book, out / path.name)
    return book, seconds, error


def to_html(book, target: Path) -> None:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(book)
    target.write_text(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the executed copies")
    parser.add_argument("--html", action="store_true", help="also write an HTML page of each executed notebook")
    parser.add_argument("--limit-s", type=float, default=LIMIT_S, help="seconds each notebook may take")
    parser.add_argument("notebook", nargs="*", type=Path, help="default: examples/NN_*.ipynb")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.notebook or notebooks():
        book, seconds, error = execute(path, args.out, args.limit_s)
        if args.html:
            try:
                to_html(book, args.out / (path.stem + ".html"))
            except Exception as exc:  # the executed copy is written; its HTML page is a convenience
                print(f"no HTML page of {path.name}: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
        print(f"{'FAILED' if error else 'ok':6} {path.name} in {seconds:.1f} s" + (f"\n{error}" if error else ""),
              flush=True)
        failed += error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
