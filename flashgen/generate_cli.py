"""`flashgen generate`: run the two-stage pipeline for one GPU, dtype and variant and write the kernel (the
command of flashgen.api.generate, so it stands above the API, beside the other top-level commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from flashgen import variant_options as opts
from flashgen.api import DEFAULT_DTYPE, DEFAULT_GPU, DEFAULT_HEAD_DIM
from flashgen.console import err as console
from flashgen.console import out as result_console
from flashgen.console import styled
from flashgen.errors import UsageError
from flashgen.variant import HEAD_DIM_STEP, SUPPORTED_HEAD_DIMS, check_head_dim, check_head_dim_v


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_command(
        gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="target GPU (see `flashgen targets`)"),
        dtype: str = typer.Option(DEFAULT_DTYPE, "--dtype", help="fp16, bf16 or fp32 (bf16 and fp32 on sm_75 run through scaled fp16 tiles; fp32 elsewhere through tf32)"),
        head_dim: int = typer.Option(DEFAULT_HEAD_DIM, "--head-dim", help=f"D: a multiple of {HEAD_DIM_STEP} from "
                                     f"{SUPPORTED_HEAD_DIMS[0]} to {SUPPORTED_HEAD_DIMS[-1]}"),
        head_dim_v: int | None = typer.Option(None, "--head-dim-v", help="Dv, V's and O's own head dim (e.g. 128 with "
                                              "--head-dim 192, DeepSeek-style prefill), by the rule of D (default: D)"),
        causal: opts.Causal = False,
        window: opts.Window = None,
        alibi: opts.Alibi = False,
        softcap: opts.Softcap = None,
        kv_heads: opts.KvHeads = None,
        heads: opts.Heads = None,
        kv_group: opts.KvGroup = None,
        norm: opts.NormName = "softmax",
        lse: opts.Lse = False,
        split_kv: opts.SplitKv = False,
        num_splits: int | None = typer.Option(None, "--num-splits", help="split-KV: this many splits whatever the "
                                              "sizes (default: chosen at each launch from B, H, N and M)"),
        softmax_scale: float | None = typer.Option(None, "--softmax-scale", help="the softmax scale the CPU check, "
                                                   "verification and timing use (default 1/sqrt(D)); in meta.json"),
        score_mod: str | None = typer.Option(None, "--score-mod", help="a score function: an expression over the "
                                             "score s, q_idx, k_idx, b, h, the sizes and --param names, e.g. "
                                             "'s + 0.25 * cos(k_idx)' (docs/variants.md)"),
        mask_mod: str | None = typer.Option(None, "--mask-mod", help="a mask function: a condition over the same "
                                            "names, e.g. 'q_idx // DOC == k_idx // DOC'; keys where it is false are "
                                            "masked"),
        param: list[str] | None = typer.Option(None, "--param", help="NAME=VALUE: a constant the functions read "
                                               "(repeatable)"),
        tensor: list[str] | None = typer.Option(None, "--tensor", help="NAME=DTYPE[DIMS][:LO..HI][:sorted]: a tensor "
                                                "the functions read as NAME[i], given at each call, e.g. "
                                                "LEN=int32[B]:0..M (repeatable; docs/variants.md)"),
        provider: str | None = typer.Option(None, "--provider", help="expert (default) | openai | anthropic | "
                                            "openai-compatible; on --resume: go on with this one instead of the "
                                            "run's"),
        model: str | None = typer.Option(None, "--model", help="model name for an LLM provider (on --resume: "
                                         "instead of the run's)"),
        base_url: str | None = typer.Option(None, "--base-url", help="endpoint of an OpenAI-compatible server"),
        max_iters: int | None = typer.Option(None, "--max-iters", help="model calls at most (default 12; on --resume: "
                                             "as recorded)"),
        max_tokens: int | None = typer.Option(None, "--max-tokens", help="token budget"),
        max_cost: float | None = typer.Option(None, "--max-cost", help="cost budget in USD"),
        max_wall: float | None = typer.Option(None, "--max-wall", help="wall-time budget in seconds, for the whole run "
                                              "(model calls and every stage included)"),
        request_timeout: float | None = typer.Option(None, "--request-timeout", help="seconds one HTTP request to a "
                                                     "model provider may take (default 300)"),
        retries: int | None = typer.Option(None, "--retries", help="retries of a failed model request (default 5); "
                                           "one model call ends within 900 s in all, or --max-wall"),
        goal: float = typer.Option(1.0, "--goal", help="stop at this speedup over the best baseline"),
        out: Path | None = typer.Option(None, "--out", help="output folder (default generated/GPU/DTYPE/VARIANT_dD, "
                                        "VARIANT_dDvDV with --head-dim-v)"),
        resume: str | None = typer.Option(None, "--resume", help="continue run RUN_ID from its last step (budget "
                                          "flags, --provider, --model and --base-url given replace the recorded "
                                          "ones; it says first what it will ask)"),
        as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout"),
    ) -> None:
        """Generate a FlashAttention kernel: LLM-TL sketch -> full TL -> CUDA, checked, compiled, verified.
        Results go to stdout, progress to stderr."""
        from flashgen.agent.loop import Budget, LoopConfig, check_makes_a_kernel
        from flashgen.agent.providers import RetryPolicy, check_base_url
        from flashgen.api import check_out_dir, default_out_dir, generate, parse_dtype
        from flashgen.errors import Interrupted, Stopped, check_option
        from flashgen.harness.environment import Environment

        # every flag is checked here, before any work: one line naming the flag and its allowed range
        group = opts.kv_group_from(kv_heads, heads, kv_group)
        for flag, field, value in (("--max-iters", "max_iters", max_iters), ("--max-tokens", "max_tokens", max_tokens),
                                   ("--max-cost", "max_cost_usd", max_cost), ("--max-wall", "max_wall_s", max_wall)):
            if value is not None:
                check_option(flag, value, Budget, field)
        if max_iters is not None and resume is None:  # a resume's budget counts the calls already made
            check_makes_a_kernel(max_iters, "--max-iters")
        check_option("--goal", goal, LoopConfig, "goal_speedup")
        for flag, field, value in (("--softmax-scale", "softmax_scale", softmax_scale),
                                   ("--num-splits", "num_splits", num_splits)):
            if value is not None:
                check_option(flag, value, LoopConfig, field)
        if num_splits is not None and not split_kv and resume is None:
            raise UsageError(f"--num-splits {num_splits}: only with --split-kv")
        width, window_size = opts.window_from_option(window)
        if request_timeout is not None:
            check_option("--request-timeout", request_timeout, RetryPolicy, "timeout_s")
        if retries is not None and not 0 <= retries <= 99:
            raise UsageError(f"--retries {retries}: must be from 0 to 99")
        if base_url is not None:
            check_base_url(base_url)
        check_head_dim(head_dim, "--head-dim")
        if head_dim_v is not None and resume is not None:
            raise UsageError("--head-dim-v starts a new run; a resume keeps the run's own head dims")
        head_dim_v = check_head_dim_v(head_dim_v, head_dim, "--head-dim-v")
        mods, mod_args = None, {}
        if score_mod is not None or mask_mod is not None or param or tensor:  # score and mask functions (flashgen.mods)
            from flashgen.mods import make_mods, params_from_options, tensors_from_options

            if resume is not None:
                raise UsageError("--score-mod, --mask-mod, --param and --tensor start a new run; a resume keeps the "
                                 "run's own")
            mod_args = {"score_mod": score_mod, "mask_mod": mask_mod, "params": params_from_options(param),
                        "tensors": tensors_from_options(tensor)}
            mods = make_mods(**mod_args, cli=True)  # a bad expression: one line, exit 2, before any model call
        env = Environment()
        if resume is None:
            target = env.target(gpu)
            variant = opts.variant_from_options(causal=causal, window=window, alibi=alibi, softcap=softcap,
                                                kv_heads=kv_heads, heads=heads, kv_group=kv_group, norm=norm,
                                                lse=lse, split_kv=split_kv)
            if out is None:
                out = default_out_dir(target.name, parse_dtype(dtype), variant, head_dim, mods=mods,
                                      head_dim_v=head_dim_v)
        if resume is not None and out is None:
            raise UsageError("--resume needs --out (where the finished kernel goes)")
        check_out_dir(out, "--out")

        with console.status("generating ...") as status:
            def progress(message: str) -> None:
                console.print(message)
                status.update(styled(message))

            try:
                kernel = generate(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=causal, window=width, alibi=alibi,
                                  softcap=softcap, kv_group=group, norm=norm, lse=lse, provider=provider, model=model,
                                  base_url=base_url, max_iters=max_iters, max_tokens=max_tokens, max_cost_usd=max_cost,
                                  max_wall_s=max_wall, goal_speedup=goal, out=out, resume=resume,
                                  request_timeout_s=request_timeout, retries=retries, env=env, progress=progress,
                                  window_size=window_size, softmax_scale=softmax_scale, split_kv=split_kv,
                                  num_splits=num_splits, **mod_args,
                                  **({"head_dim_v": head_dim_v} if head_dim_v is not None else {}))
            except Interrupted as exc:  # recorded by the loop; typer would swallow a KeyboardInterrupt's message
                raise Stopped(str(exc), exc.signal_name) from None
        if as_json:  # stdout stays one JSON object: the summary as data, nothing printed beside it
            import json

            typer.echo(json.dumps({"run_id": kernel.run_id, "out": str(out), "kernel": kernel.manifest.name,
                                   "verified": kernel.verified, "meta": kernel.meta,
                                   "summary": kernel.summary.model_dump(mode="json")}, sort_keys=True))
            return
        from flashgen.agent.summary import summary_lines

        for line in summary_lines(kernel.summary):
            result_console.print(line)

