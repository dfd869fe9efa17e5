"""`flashgen generate`: run the two-stage pipeline for one GPU, dtype and variant and write the kernel."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from flashgen.api import DEFAULT_DTYPE, DEFAULT_GPU, DEFAULT_HEAD_DIM
from flashgen.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_command(
        gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="target GPU (see `flashgen targets`)"),
        dtype: str = typer.Option(DEFAULT_DTYPE, "--dtype", help="fp16, bf16 or fp32 (bf16 and fp32 on sm_75 run through scaled fp16 tiles; fp32 elsewhere through tf32)"),
        head_dim: int = typer.Option(DEFAULT_HEAD_DIM, "--head-dim", help="D"),
        causal: bool = typer.Option(False, "--causal", help="causal mask (bottom-right aligned)"),
        window: int | None = typer.Option(None, "--window", help="sliding window in keys (needs --causal)"),
        alibi: bool = typer.Option(False, "--alibi", help="ALiBi bias"),
        softcap: float | None = typer.Option(None, "--softcap", help="logit softcap C"),
        kv_heads: int | None = typer.Option(None, "--kv-heads", help="KV heads (GQA/MQA; with --heads)"),
        heads: int | None = typer.Option(None, "--heads", help="query heads, to turn --kv-heads into a group"),
        kv_group: int | None = typer.Option(None, "--kv-group", help="query heads per KV head (GQA)"),
        norm: str = typer.Option("softmax", "--norm", help="softmax | relu | sigmoid"),
        lse: bool = typer.Option(False, "--lse", help="also return the log-sum-exp"),
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
        from flashgen.agent.environment import Environment
        from flashgen.api import default_out_dir, generate, make_variant, parse_dtype

        console = Console(stderr=True)
        group = _kv_group(kv_heads, heads, kv_group)
        if max_iters < 1:
            raise UsageError(f"--max-iters must be at least 1, got {max_iters}")
        env = Environment()
        if resume is None and out is None:
            target = env.target(gpu)
            variant = make_variant(causal=causal, window=window, alibi=alibi, softcap=softcap, norm=norm, lse=lse,
                                   kv_group=group)
            out = default_out_dir(target.name, parse_dtype(dtype), variant, head_dim)
        if resume is not None and out is None:
            raise UsageError("--resume needs --out (where the finished kernel goes)")

        with console.status("generating ...") as status:
            def progress(message: str) -> None:
                console.print(message, highlight=False)
                status.update(message)

            kernel = generate(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=causal, window=window, alibi=alibi,
                              softcap=softcap, kv_group=group, norm=norm, lse=lse, provider=provider, model=model,
                              base_url=base_url, max_iters=max_iters, max_tokens=max_tokens, max_cost_usd=max_cost,
                              max_wall_s=max_wall, goal_speedup=goal, out=out, resume=resume, env=env,
                              progress=progress)
        ver = kernel.meta.get("verification", {})
        console.print(f"[bold green]wrote[/] {out}/  (run {kernel.run_id})", highlight=False)
        if not ver.get("ran"):
            console.print("[yellow]verification did not run[/]: no GPU here; the TL was checked on the CPU against "
                          "the fp64 reference and the CUDA compiled.", highlight=False)
        roof = kernel.meta.get("roofline")
        if roof:
            console.print(f"roofline lower bound at {roof['shape']}: {roof['time_s'] * 1e3:.3g} ms "
                          f"({roof['bound']}-bound, {roof.get('tflops_at_bound', 0):.0f} TFLOP/s)", highlight=False)


def _kv_group(kv_heads: int | None, heads: int | None, kv_group: int | None) -> int:
    if kv_heads is None:
        if heads is not None:
            raise UsageError("--heads only matters with --kv-heads")
        return kv_group or 1
    if kv_group is not None:
        raise UsageError("give --kv-heads (with --heads) or --kv-group, not both")
    if heads is None:
        raise UsageError("--kv-heads K needs --heads H (the kernel is built for the group size H / K)")
    if kv_heads < 1 or heads % kv_heads:
        raise UsageError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    return heads // kv_heads
