"""The loops of a kernel's SASS and what each holds: per backward branch, the instructions it spans, its HGMMAs, MUFU
ops and float ops, and (given two folders) the opcodes whose counts differ between the two kernels' key-tile loops
(the shortest loop that issues both an S and a P V). Session 21: overlap_tiles' key-tile loop held 44 more integer instructions
than production's (Q's descriptors rebuilt in every S), which the A/B's 6-8 % had not explained on its own.

    python benchmarks/kernel_dev/sass_loops.py DIR [DIR2]

Needs cuobjdump on PATH (the nvidia-cuda-cuobjdump wheel carries one)."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

USAGE = "usage: python benchmarks/kernel_dev/sass_loops.py DIR [DIR2] (hopper_build.py kernel folders: kernel.cubin)"
LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FLOAT_OPS = ("FFMA", "FMUL", "FADD", "FMNMX")


def instructions(cubin: Path) -> list[tuple[int, str]]:
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2)) for m in map(LINE.match, sass.splitlines()) if m]


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int, list[str]]]:
    """(start, end, instructions) of each backward branch over more than 64 instructions."""
    found = []
    for address, text in ins:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address - 0x400:
            start = int(target.group(1), 16)
            found.append((start, address, [t for a, t in ins if start <= a <= address]))
    return found


def key_tile_loop(ins):
    """The shortest loop that issues both an S and a P V (the longer ones span the whole walk): a guess, so the
    listing of every loop is printed beside it; where the compiler rotated the loop it can pick another."""
    with_both = [loop for loop in loops(ins) if any("HGMMA" in t and "tnspB" in t for t in loop[2])
                 and any("HGMMA" in t and "tnspB" not in t for t in loop[2])]
    if not with_both:  # the sm80 / sm75 paths (mma.sync: HMMA, S and P V alike): the shortest loop with any
        with_both = [loop for loop in loops(ins) if any(opcode(t).startswith("HMMA") for t in loop[2])]
    return min(with_both, key=lambda loop: len(loop[2]))


def main() -> int:
    dirs = [Path(d) for d in sys.argv[1:]]
    if not 1 <= len(dirs) <= 2:
        print(USAGE)
        return 2
    counts = []
    for d in dirs:
        ins = instructions(d / "kernel.cubin")
        print(f"{d.name}: {len(ins)} instructions")
        for start, end, body in loops(ins):
            print(f"  loop {start:#x}-{end:#x}: {len(body)} instructions, HGMMA {sum('HGMMA' in t for t in body)}, "
                  f"HMMA {sum(opcode(t).startswith('HMMA') for t in body)}, "
                  f"MUFU {sum('MUFU' in t for t in body)}, float {sum(opcode(t).startswith(FLOAT_OPS) for t in body)}")
        start, end, body = key_tile_loop(ins)
        print(f"  key-tile loop: {start:#x}-{end:#x}, {len(body)} instructions")
        counts.append(collections.Counter(opcode(t) for t in body))
    if len(counts) == 2:
        for op in sorted(set(counts[0]) | set(counts[1])):
            if counts[0][op] != counts[1][op]:
                print(f"  {op}: {counts[0][op]} -> {counts[1][op]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
