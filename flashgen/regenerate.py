"""`python -m flashgen.regenerate [--check] [FILTER ...]`: rebuild the committed kernels under
generated/ with the expert provider (no GPU needed). With --check, compare instead of writing and
exit non-zero on any difference. FILTER keeps the entries whose path contains every given string."""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

from flashgen.agent.outputs import FILES
from flashgen.variant import Variant

GPUS = ("t4", "rtx8000", "a100", "h100", "h200")
DTYPES = ("fp16", "bf16")
VARIANTS = {"plain": Variant(), "causal": Variant(causal=True)}
HEAD_DIMS = (64, 128)
ROOT = Path(__file__).resolve().parents[1] / "generated"


def entries() -> list[tuple[str, str, str, int]]:
    return list(itertools.product(GPUS, DTYPES, VARIANTS, HEAD_DIMS))


def relative_dir(gpu: str, dtype: str, variant: str, head_dim: int) -> Path:
    return Path(gpu) / dtype / f"{variant}_d{head_dim}"


def regenerate(gpu: str, dtype: str, variant: str, head_dim: int, out: Path, store_home: Path) -> None:
    from flashgen.api import generate
    from flashgen.harness.store import Store

    with Store(store_home) as store:
        generate(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=VARIANTS[variant].causal, out=out, store=store)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    filters = [a for a in argv if a != "--check"]
    failures = 0
    with tempfile.TemporaryDirectory() as scratch:
        for entry in entries():
            rel = relative_dir(*entry)
            if not all(f in str(rel) for f in filters):
                continue
            out = Path(scratch) / rel  # a failed entry must not leave partial files under generated/
            try:
                regenerate(*entry, out=out, store_home=Path(scratch) / "store")
            except Exception as exc:  # report every entry, then fail
                print(f"FAIL {rel}: {exc}")
                failures += 1
                continue
            if check:
                differ = [f for f in FILES if (ROOT / rel / f).read_bytes() != (out / f).read_bytes()]
                print(f"{'DIFF' if differ else 'same'} {rel} {' '.join(differ)}")
                failures += bool(differ)
            else:
                (ROOT / rel).mkdir(parents=True, exist_ok=True)
                for name in FILES:
                    (ROOT / rel / name).write_bytes((out / name).read_bytes())
                print(f"wrote {rel}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
