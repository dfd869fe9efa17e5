"""The score- and mask-function benchmark (issue 15: functions no variant describes within 15 % of the plain
kernel's speed), on the GPU present, for the sm90 path (the h200 target) and the sm80 path (a100), both compiled for
that GPU:

    python benchmarks/mods_bench.py [--gpu h200 a100] [--min-time 0.2] [--switch NAME=on|off|INT ...] --out FILE.json

Each kernel of flashgen.harness.suite.MOD_SUITE (a document mask of 512 keys, a per-batch length mask
`k_idx < LEN[b]`, the score function `s + 0.25 * cos(k_idx)`; bf16 d128, B=4, H=16, N=M=4k), verified first (the
harness's whole verification), then timed with the plain kernel in one worker without baselines, in MOD_ROUNDS
rounds (the plain kernel first, then last); TF/s over each kernel's own visible pairs and the median of the rounds'
ratios to plain (the goal: >= MOD_GOAL). The JSON holds the rows, the environment and the commit. --switch renders
every kernel with an sm90 schedule switch set (flashgen.translators.backends.sm90.kernel.schedule_overrides), for a
development A/B: two runs, each kernel's ratio to the plain kernel of its own rounds."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", nargs="+", default=["h200", "a100"], help="targets whose code paths to time")
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--switch", action="append", default=[], metavar="NAME=on|off|INT",
                        help="an sm90 schedule switch to render with (development A/B), or a count (o_stage_chunks=1)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from flashgen.harness.device import environment_info
    from flashgen.harness.suite import MOD_GOAL, bench_mods
    from flashgen.translators.backends.sm90.kernel import schedule_overrides

    switches = {}
    for text in args.switch:
        name, _, value = text.partition("=")
        if value not in ("on", "off") and not value.isdigit():
            parser.error(f"--switch {text}: give NAME=on, NAME=off or NAME=<count>")
        switches[name] = int(value) if value.isdigit() else value == "on"
    with ExitStack() as stack:
        try:
            stack.enter_context(schedule_overrides(**switches))
        except ValueError as exc:  # an unknown switch
            parser.error(str(exc))
        rows = [row for gpu in args.gpu for row in bench_mods(gpu, min_time_s=args.min_time)]
    for row in rows:
        if not row.ok:
            print(f"{row.gpu} {row.name}: {row.error}")
            continue
        what = " and ".join(f for f in (row.score_mod, row.mask_mod) if f)
        print(f"{row.gpu} {row.name} ({what}): verified ({row.verified}); {row.ms:.3f} ms, "
              f"{row.tflops_visible:.0f} visible-work TF/s (visible share {row.visible_share:.3f}); plain {row.plain_ms:.3f} "
              f"ms, {row.plain_tflops:.0f} TF/s; ratio {row.ratio:.2f} (rounds: "
              f"{' '.join(f'{r:.3f}' for r in row.round_ratios)}; goal >= {MOD_GOAL})")
    args.out.write_text(json.dumps({"env": {**environment_info(), "git_commit": os.environ.get("FLASHGEN_GIT_COMMIT")},
                                    "goal": MOD_GOAL, "switches": switches, "rows": [row.model_dump(mode="json") for row in rows]},
                                   indent=1) + "\n")
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
