"""`flashgen tune`: choose tile parameters for one GPU, dtype, variant and head dim.

Without a GPU it lists the candidates that pass the CPU filters (TL checker budgets, the translator's
limits), in the search's order, with the occupancy model's estimates and a roofline lower bound per
candidate, says that timing needs a GPU, and exits 0 (the listing is the answer a CPU can give; --write
without a GPU is an error, exit 2, since nothing was measured). With a GPU it compiles (dropping real spills),
verifies and times them (flashgen.harness.tune.search) and, with --write, stores the winner in the user's tuned file
(`$FLASHGEN_HOME/config/tuned/<gpu>.json`, else `$XDG_CONFIG_HOME/flashgen/tuned/<gpu>.json`, else
`~/.config/flashgen/tuned/<gpu>.json`; never into the installed package), which choose_params reads before the
packaged flashgen/translators/tuned/<gpu>.json.

The GPU path ran on an H200 (`--limit 3`, bf16 d128 non-causal: of three candidates two were verified and
timed, one dropped over the spill tolerance; benchmarks/results/2026-11-30-h200-tune-bf16-plain-d128-857e8f5.json).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from flashgen import variant_options as opts
from flashgen.errors import UsageError
from flashgen.variant import DType, Shape, Variant, check_head_dim, parse_dtype

# the interpreter counts work at this small size for the per-candidate roofline (the full benchmark size
# takes seconds per candidate); tile waste and K/V re-reads already show there
ROOFLINE_N = 512


def default_shapes(variant: Variant, head_dim: int) -> list[Shape]:
    """FlashAttention-2's benchmark family at three lengths: B*N = 16k tokens, H*D about 2048
    (flashgen.harness.tune.default_shapes, which the library job's search times too)."""
    from flashgen.harness.tune import default_shapes as shapes

    return shapes(variant, head_dim)


def parse_shape_list(text: str, head_dim: int, variant: Variant) -> list[Shape]:
    from flashgen.harness.bench import parse_shapes

    try:
        shapes = parse_shapes(text)
    except ValueError as exc:
        raise UsageError(f"--shapes: {exc}") from None
    for shape in shapes:
        if shape.D != head_dim:
            raise UsageError(f"--shapes: D={shape.D} differs from --head-dim {head_dim}")
        if shape.H // shape.kv_heads != variant.kv_group:
            raise UsageError(f"--shapes: H/KVH = {shape.H // shape.kv_heads} differs from the kv group "
                             f"{variant.kv_group}")
    return shapes


def roofline_at_small_size(record, variant: Variant, target, dtype: DType, head_dim: int) -> tuple[float, str]:
    """(lower-bound seconds, bound) of one candidate's TL program at N = M = ROOFLINE_N, one kv head."""
    from flashgen.roofline import estimate
    from flashgen.tl_spec import interpret, parse

    shape = Shape(B=1, H=variant.kv_group, KVH=1, N=ROOFLINE_N, M=ROOFLINE_N, D=head_dim)
    counts = interpret(parse(record.tl, "kernel.tl"), shape, seed=0).counts
    est = estimate(counts, target, dtype)
    return est.time_s, est.bound


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_command(
        gpu: str = typer.Option(..., "--gpu", help="target GPU (see `flashgen targets`)"),
        dtype: str = typer.Option(..., "--dtype", help="fp16, bf16 or fp32"),
        head_dim: int = typer.Option(..., "--head-dim", help="D"),
        causal: opts.Causal = False,
        window: opts.Window = None,
        alibi: opts.Alibi = False,
        softcap: opts.Softcap = None,
        kv_heads: opts.KvHeads = None,
        heads: opts.Heads = None,
        kv_group: opts.KvGroup = None,
        norm: opts.NormName = "softmax",
        lse: opts.Lse = False,
        shapes: str | None = typer.Option(None, "--shapes", help='timed shapes, e.g. "B=4,H=16,N=4096,D=128;..." '
                                          "(default: B*N = 16k tokens at N = 1k, 4k, 16k)"),
        budget: float = typer.Option(900.0, "--budget", help="seconds the GPU search may take"),
        min_time: float = typer.Option(0.1, "--min-time", help="seconds of timing per kernel and shape"),
        limit: int | None = typer.Option(None, "--limit", help="only the first N candidates (in the search's order)"),
        roofline: bool = typer.Option(True, "--roofline/--no-roofline",
                                      help=f"per-candidate roofline bound at N=M={ROOFLINE_N} in the CPU listing"),
        write: bool = typer.Option(False, "--write", help="store the winner in the user's tuned file "
                                   "(FLASHGEN_HOME/config/tuned/GPU.json, else XDG_CONFIG_HOME/flashgen/tuned/GPU.json), "
                                   "read before the packaged table"),
        json_out: Path | None = typer.Option(None, "--json", help="also write the whole search result here"),
    ) -> None:
        """Choose tile parameters: CPU filters and a listing without a GPU, a timed search with one."""
        from flashgen.console import out as console
        from flashgen.harness.worker import have_gpu
        from flashgen.translators.params import choose_params_with_source
        from flashgen.translators.search import resolve_target, screen_candidates

        if limit is not None and limit < 1:
            raise UsageError(f"--limit must be at least 1, got {limit}")
        for flag, value in (("--budget", budget), ("--min-time", min_time)):
            if not value > 0:  # nan too
                raise UsageError(f"{flag} {value:g}: must be a number of seconds greater than 0")
        variant = opts.variant_from_options(causal=causal, window=window, alibi=alibi, softcap=softcap,
                                            kv_heads=kv_heads, heads=heads, kv_group=kv_group, norm=norm, lse=lse)
        dt = parse_dtype(dtype)
        target = resolve_target(gpu)
        from flashgen.translators.backends import backend_for

        check_head_dim(head_dim, "--head-dim")
        if (problem := backend_for(target).head_dim_problem(head_dim)) is not None:
            raise UsageError(problem)
        timed_shapes = parse_shape_list(shapes, head_dim, variant) if shapes else default_shapes(variant, head_dim)
        choice = choose_params_with_source(variant, target, dt, head_dim)
        title = f"{variant.name} {dt.value} d{head_dim} on {target.name} ({target.arch})"
        console.print(f"today's choice for {title}: {_label(choice.params)} from {choice.source} "
                      f"({choice.detail})")
        for line in choice.by_size:
            console.print(f"  and at {line.condition}: {_label({**choice.params, **line.params})}")

        if not have_gpu():
            if write:
                raise UsageError("--write needs a GPU: nothing was timed here, so there is no winner to store")
            records = screen_candidates(variant, target, dt, head_dim)
            alive = [r for r in records if r.alive]
            shown = alive[:limit] if limit is not None else alive
            table = Table(title=f"candidates for {title} that pass the CPU filters, likeliest first")
            for col in ("#", "params", "regs (model)", "smem B", "blocks/SM", "model score"):
                table.add_column(col, justify="right" if col != "params" else "left")
            if roofline:
                table.add_column(f"roofline N=M={ROOFLINE_N}", justify="right")
            for i, record in enumerate(shown, 1):
                m = record.model
                row = [str(i), record.label, str(m.registers) + ("" if m.fits else " !"), str(m.smem_bytes),
                       str(m.blocks_per_sm), f"{m.score:.1f}"]
                if roofline:
                    seconds, bound = roofline_at_small_size(record, variant, target, dt, head_dim)
                    row.append(f"{seconds * 1e6:.3g} us ({bound})")
                table.add_row(*row)
            console.print(table)
            console.print(f"{len(alive)} of {len(records)} candidates pass the CPU filters"
                          + (f" ({len(shown)} shown)" if len(shown) < len(alive) else "")
                          + "; '!' marks register estimates over the model's budget (the checker's own passed).",
                          highlight=False)
            console.print("no GPU here: timing the candidates needs one; this listing is all a CPU can give "
                          "(nothing was written)")
            return

        from flashgen.harness.tune import GpuTimer, record_winner, search

        timer = GpuTimer(min_time_s=min_time)
        try:
            result = search(variant, target, dt, head_dim, timed_shapes, timer=timer, budget_s=budget,
                            max_candidates=limit, progress=console.print)
        finally:
            timer.close()
        table = Table(title=f"search for {title} on {result.environment.get('gpu') if result.environment else '?'}")
        for col in ("params", "geomean ms", "status"):
            table.add_column(col)
        for record in result.candidates:
            if record.model is not None and (record.alive or not (record.dropped or "").startswith("check")):
                table.add_row(record.label, f"{record.geomean_ms:.4g}" if record.geomean_ms else "-",
                              str(record.dropped or "timed"))
        console.print(table)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(result.model_dump_json(indent=1))
        if result.winner is None:
            raise UsageError(f"no candidate was verified and timed within {budget:g} s; nothing chosen")
        console.print(f"winner: {result.winner_label} at {result.winner_geomean_ms:.4g} ms geomean over "
                      f"{len(result.shapes)} shapes")
        for line in result.winner_by_size:
            console.print(f"  and at {line.condition}: " + ", ".join(f"{k}={v}" for k, v in line.params.items()))
        if write:
            path = record_winner(result)
            console.print(f"wrote {path}")


def _label(params: dict[str, int]) -> str:
    from flashgen.translators.search import params_label

    return params_label(params)
