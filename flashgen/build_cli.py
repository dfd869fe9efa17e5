"""`flashgen build FILE.tl --gpu GPU --dtype DTYPE [--out DIR]`: a user's own TL program, through the generate
loop (flashgen.api.build): checked, interpreted on the CPU against its own fp64 meaning, translated, compiled and,
where the GPU is present, verified against the TL's fp64 interpretation and timed; recorded in the run store and
written as `generate` writes a kernel. `--provider NAME --model M` lets a model repair or speed up the program."""

from __future__ import annotations

from pathlib import Path

import typer

from flashgen.console import err as console
from flashgen.console import out as result_console
from flashgen.console import styled
from flashgen.errors import UsageError

COMPILED_AND_ESTIMATED = "compiled and estimated"  # what a kernel built where its GPU is absent is (as the library's)


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build_command(
        file: str = typer.Argument(..., help="a full LLM-TL program (docs/llm-tl.md), e.g. examples/my_score.tl"),
        gpu: str = typer.Option(..., "--gpu", help="target GPU (see `flashgen targets`)"),
        dtype: str = typer.Option(..., "--dtype", help="fp16, bf16 or fp32: the dtype of the program's Target line"),
        out: Path | None = typer.Option(None, "--out", help="output folder (default build/GPU/DTYPE/FILE-STEM)"),
        provider: str | None = typer.Option(None, "--provider", help="a model that repairs or speeds up the program "
                                            "from its feedback: openai | anthropic | openai-compatible (default: "
                                            "none, the program is built as it is)"),
        model: str | None = typer.Option(None, "--model", help="model name for --provider"),
        base_url: str | None = typer.Option(None, "--base-url", help="endpoint of an OpenAI-compatible server"),
        max_iters: int | None = typer.Option(None, "--max-iters", help="steps at most, the program's own included "
                                             "(default 12; with --provider)"),
        goal: float | None = typer.Option(None, "--goal", help="with --provider: ask for a faster program until this "
                                          "speedup over the best baseline (default 1)"),
        as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout"),
    ) -> None:
        """Build your own LLM-TL program: checked, interpreted on the CPU against its own fp64 meaning, translated,
        compiled; on its GPU verified and timed. Recorded like `flashgen generate`. Results go to stdout, progress
        to stderr."""
        from typing import get_args

        from flashgen.agent.loop import Budget, LoopConfig, Phase
        from flashgen.agent.providers import check_base_url
        from flashgen.api import build, check_out_dir, default_build_dir, parse_dtype
        from flashgen.errors import Interrupted, Stopped, check_option, read_text_input
        from flashgen.harness.environment import Environment

        # every flag is checked before any work: one line naming it
        env = Environment()
        target = env.target(gpu)
        dtype_value = parse_dtype(dtype)
        if provider is None:
            for flag, given in (("--model", model), ("--base-url", base_url), ("--max-iters", max_iters),
                                ("--goal", goal)):
                if given is not None:
                    raise UsageError(f"{flag} needs --provider (a model to repair or speed up the program); without "
                                     "one the program is built as it is")
        if max_iters is not None:
            check_option("--max-iters", max_iters, Budget, "max_iters")
            if max_iters < len(get_args(Phase)):
                raise UsageError(f"--max-iters {max_iters}: too small, the program's own steps take "
                                 f"{len(get_args(Phase))} ({', '.join(get_args(Phase))})")
        if goal is not None:
            check_option("--goal", goal, LoopConfig, "goal_speedup")
        if base_url is not None:
            check_base_url(base_url)
        text = read_text_input(file)  # a missing, empty or binary file: one line
        if out is None:
            out = default_build_dir(target.name, dtype_value, file)
        check_out_dir(out, "--out")

        with console.status("building ...") as status:
            def progress(message: str) -> None:
                console.print(message)
                status.update(styled(message))

            try:
                kernel = build(text, gpu, dtype, out=out, provider=provider, model=model, base_url=base_url,
                               max_iters=max_iters, goal_speedup=goal, name=file, env=env, progress=progress)
            except Interrupted as exc:  # recorded by the loop; typer would swallow a KeyboardInterrupt's message
                raise Stopped(str(exc), exc.signal_name) from None
        reference = "tl" if kernel.manifest.reference_tl else "variant"
        ran_on = "gpu" if kernel.meta.get("verification", {}).get("ran") else COMPILED_AND_ESTIMATED
        if as_json:
            import json

            typer.echo(json.dumps({"run_id": kernel.run_id, "out": str(out), "kernel": kernel.manifest.name,
                                   "verified": kernel.verified, "reference": reference, "ran_on": ran_on,
                                   "meta": kernel.meta, "summary": kernel.summary.model_dump(mode="json")},
                                  sort_keys=True))
            return
        from flashgen.agent.summary import summary_lines, summary_row

        # the same end as generate's (flashgen.agent.summary), and what the program was verified against
        for line in summary_lines(kernel.summary, command="build"):
            result_console.print(line)
        result_console.print(summary_row("program", f"{file} -> {out}/: verified against " + (
            "its own fp64 interpretation (it computes what no variant describes)" if reference == "tl" else
            f"the {kernel.manifest.variant.name} variant's fp64 reference (its Variant line)")))
