"""README's performance sentences, computed from the newest committed results: the Hopper grid of the sm90 path
(`flashgen bench --suite hopper`, *-hopper-sm_90-*.json) and the FA2 grid of the sm_80 path (*-fa2-sm_80-*.json).

    python benchmarks/readme_figures.py            # print the sentence
    python benchmarks/readme_figures.py --write    # rewrite README.md between the figures markers
    python benchmarks/readme_figures.py --check    # exit 1 when README.md differs (tests/test_readme_figures.py)

"Newest" is the result whose `created` time is latest among benchmarks/results/*-fa2-sm_80-*.json (the files
`flashgen bench --suite fa2 --arch-path sm_80` writes; docs/performance.md renders the same files). Speedups are
baseline time / our time, as everywhere in flashgen: FlashAttention-2 is torch SDPA's flash backend.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def newest_result(results: Path = RESULTS, arch_path: str = "sm_80", suite: str = "fa2") -> Path:
    paths = sorted(results.glob(f"*-{suite}-{arch_path}-*.json"))
    if not paths:
        raise SystemExit(f"no *-{suite}-{arch_path}-*.json under {results}")
    return max(paths, key=lambda p: (dt.datetime.fromisoformat(json.loads(p.read_text())["created"]), p.name))


def _x(value: float) -> str:
    return f"{value:.2f}x"


def figures(path: Path) -> str:
    """The sentence, from one suite result: geomean, min and max over the timed shapes against FlashAttention-2,
    the geomean against FlexAttention and cuDNN."""
    result = json.loads(path.read_text())
    summary = result["summary"]
    geo = summary["geomean_speedup"]
    flash = [row["speedup"]["sdpa_flash"] for row in result["rows"] if "sdpa_flash" in row.get("speedup", {})]
    if not flash or "sdpa_flash" not in geo:
        raise SystemExit(f"{path.name}: no shape timed beside FlashAttention-2")
    gpu = result.get("env", {}).get("gpu") or result["gpu"]
    text = (f"Measured on an {gpu} (docs/performance.md, from benchmarks/results/{path.name}): the generated "
            f"sm_80-path kernels (the Ampere and Ada path) run at {_x(geo['sdpa_flash'])} FlashAttention-2 (geomean over the {len(flash)} shapes of the FA2 grid, "
            f"{_x(min(flash))} to {_x(max(flash))})")
    if "flex" in geo:
        text += f" and {_x(geo['flex'])} FlexAttention"
    cudnn = geo.get("sdpa_cudnn")
    if cudnn is not None and math.isfinite(cudnn):
        text += (f"; cuDNN is faster still (ours at {_x(cudnn)})" if cudnn < 1
                 else f"; {_x(cudnn)} cuDNN")
    return textwrap.fill(text + ".", width=110, break_long_words=False, break_on_hyphens=False)


def hopper_figures(path: Path) -> str:
    """The Hopper path's sentence: geomeans against cuDNN, FlashAttention-2 and Flex, the range against cuDNN."""
    result = json.loads(path.read_text())
    geo = result["summary"]["geomean_speedup"]
    cudnn = [row["speedup"]["sdpa_cudnn"] for row in result["rows"] if "sdpa_cudnn" in row.get("speedup", {})]
    if not cudnn:
        raise SystemExit(f"{path.name}: no shape timed beside cuDNN")
    gpu = result.get("env", {}).get("gpu") or result["gpu"]
    text = (f"On the H100/H200 the kernels take the Hopper path (TMA, wgmma, warp specialization). Measured on an "
            f"{gpu} (benchmarks/results/{path.name}, the {len(cudnn)} shapes of the Hopper grid, d64/d128/d256): "
            f"{_x(geo['sdpa_cudnn'])} cuDNN ({_x(min(cudnn))} to {_x(max(cudnn))}), "
            f"{_x(geo['sdpa_flash'])} FlashAttention-2")
    if "flex" in geo:
        text += f", {_x(geo['flex'])} FlexAttention"
    return textwrap.fill(text + ".", width=110, break_long_words=False, break_on_hyphens=False)


def readme_text(results: Path = RESULTS) -> str:
    """The whole figures block: the Hopper path's sentence (where a result exists), then the sm_80 path's."""
    hopper = sorted(results.glob("*-hopper-sm_90-*.json"))
    parts = [hopper_figures(newest_result(results, "sm_90", "hopper"))] if hopper else []
    return "\n".join(parts + [figures(newest_result(results))])


def block(text: str) -> str:
    """README's text between the markers (without them), or raise."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return text[start + len(BEGIN):end].strip("\n")


def with_block(text: str, body: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return text[:start + len(BEGIN)] + "\n" + body + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite README.md's figures block")
    mode.add_argument("--check", action="store_true", help="exit 1 when README.md's block is not what is computed")
    args = parser.parse_args(argv)
    want = readme_text()
    readme = README.read_text()
    if args.write:
        README.write_text(with_block(readme, want))
        print(f"README.md: {want}")
    elif args.check:
        if block(readme) != want:
            print(f"README.md's figures are stale; run python benchmarks/readme_figures.py --write\n"
                  f"  README:   {block(readme)}\n  computed: {want}", file=sys.stderr)
            return 1
    else:
        print(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
