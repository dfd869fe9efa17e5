"""`flashgen generate`: run the two-stage pipeline for one GPU, dtype and variant and write the kernel (the
command of flashgen.api.generate, so it stands above the API, beside the other top-level commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from flashgen import variant_options as opts
from flashgen.console import err as console
from flashgen.console import styled
from flashgen.api import DEFAULT_DTYPE, DEFAULT_GPU, DEFAULT_HEAD_DIM
from flashgen.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_command(
        gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="target GPU (see `flashgen targets`)"),
        dtype: str = typer.Option(DEFAULT_DTYPE, "--dtype", help="fp16, bf16 or fp32 (bf16 and fp32 on sm_75 run through scaled fp16 tiles; fp32 elsewhere through tf32)"),
        head_dim: int = typer.Option(DEFAULT_HEAD_DIM, "--head-dim", help="D"),
        causal: opts.Causal = False,
        window: opts.Window = None,
        alibi: opts.Alibi = False,
        softcap: opts.Softcap = None,
        kv_heads: opts.KvHeads = None,
        heads: opts.Heads = None,
        kv_group: opts.KvGroup = None,
        norm: opts.NormName = "softmax",
        lse: opts.Lse = False,
        provider: str = typer.Option("expert", "--provider", help="expert | openai | anthropic | openai-compatible"),
        model: str | None = typer.Option(None, "--model", help="model name for an LLM provider"),
        base_url: str | None = typer.Option(None, "--base-url", help="endpoint of an OpenAI-compatible server"),
        max_iters: int = typer.Option(12, "--max-iters", help="model calls at most"),
        max_tokens: int | None = typer.Option(None, "--max-tokens", help="token budget"),
        max_cost: float | None = typer.Option(None, "--max-cost", help="cost budget in USD"),
        max_wall: float | None = typer.Option(None, "--max-wall", help="wall-time budget in seconds"),
        goal: float = typer.Option(1.0, "--goal", help="stop at this speedup over the best baseline"),
        out: Path | None = typer.Option(None, "--out", help="output folder (default generated/GPU/DTYPE/VARIANT_dD)"),
        resume: str | None = typer.Option(None, "--resume", help="continue run RUN_ID from its last step"),
    ) -> None:
        """Generate a FlashAttention kernel: LLM-TL sketch -> full TL -> CUDA, checked, compiled, verified."""
        from flashgen.harness.environment import Environment
        from flashgen.agent.loop import Budget, LoopConfig
        from flashgen.api import check_out_dir, default_out_dir, generate, parse_dtype
        from flashgen.errors import check_option

        # every flag is checked here, before any work: one line naming the flag and its allowed range
        group = opts.kv_group_from(kv_heads, heads, kv_group)
        for flag, field, value in (("--max-iters", "max_iters", max_iters), ("--max-tokens", "max_tokens", max_tokens),
                                   ("--max-cost", "max_cost_usd", max_cost), ("--max-wall", "max_wall_s", max_wall)):
            check_option(flag, value, Budget, field)
        check_option("--goal", goal, LoopConfig, "goal_speedup")
        if head_dim < 1:
            raise UsageError(f"--head-dim {head_dim}: must be a positive integer")
        env = Environment()
        if resume is None:
            target = env.target(gpu)
            variant = opts.variant_from_options(causal=causal, window=window, alibi=alibi, softcap=softcap,
                                                kv_heads=kv_heads, heads=heads, kv_group=kv_group, norm=norm,
                                                lse=lse)
            if out is None:
                out = default_out_dir(target.name, parse_dtype(dtype), variant, head_dim)
        if resume is not None and out is None:
            raise UsageError("--resume needs --out (where the finished kernel goes)")
        check_out_dir(out, "--out")

        with console.status("generating ...") as status:
            def progress(message: str) -> None:
                console.print(message)
                status.update(styled(message))

            kernel = generate(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=causal, window=window, alibi=alibi,
                              softcap=softcap, kv_group=group, norm=norm, lse=lse, provider=provider, model=model,
                              base_url=base_url, max_iters=max_iters, max_tokens=max_tokens, max_cost_usd=max_cost,
                              max_wall_s=max_wall, goal_speedup=goal, out=out, resume=resume, env=env,
                              progress=progress)
        ver = kernel.meta.get("verification", {})
        console.print(styled(("wrote", "bold green"), f" {out}/  (run {kernel.run_id})"))
        if not ver.get("ran"):
            console.print(styled(("verification did not run", "yellow"), ": no GPU here; the TL was checked on the "
                                 "CPU against the fp64 reference and the CUDA compiled."))
        roof = kernel.meta.get("roofline")
        if roof:
            console.print(f"roofline lower bound at {roof['shape']}: {roof['time_s'] * 1e3:.3g} ms "
                          f"({roof['bound']}-bound, {roof.get('tflops_at_bound', 0):.0f} TFLOP/s)")

